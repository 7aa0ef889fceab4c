//! The client session table: exactly-once answers for retried commands.
//!
//! A client that times out cannot know whether its command was applied, so it retries with the
//! same `(client_id, seq)`. Without this table a retried `take` that had in fact won would come
//! back `TAKEN` and the winner would believe it lost. The table remembers each client's recent
//! responses, forgets those the client acknowledged (`acked_below`), keeps at most
//! [`MAX_REPLIES_PER_CLIENT`] per client, and forgets clients idle longer than
//! [`SESSION_IDLE_TTL_MS`] of store time (far longer than any client retries). It is part of the
//! state, so it is replicated and snapshotted like everything else.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::command::{Origin, Response};

/// Store time after which an idle client's session is forgotten (one hour).
pub const SESSION_IDLE_TTL_MS: u64 = 60 * 60 * 1000;
/// Most unacknowledged responses remembered per client.
pub const MAX_REPLIES_PER_CLIENT: usize = 4096;
/// Most clients remembered at once; beyond it the longest-idle client is forgotten.
pub const MAX_CLIENTS: usize = 200_000;

/// What the table knows about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // a lookup is short-lived and never stored
pub enum SessionLookup {
    /// Never seen: apply it.
    New,
    /// Already applied: this is the response it produced.
    Seen(Response),
    /// Older than what is remembered: the outcome cannot be told.
    Forgotten,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ClientSession {
    last_seen_ms: u64,
    /// Every seq below this has been forgotten.
    floor: u64,
    replies: BTreeMap<u64, Response>,
}

/// All client sessions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sessions {
    clients: BTreeMap<u64, ClientSession>,
    /// `(last_seen_ms, client_id)` for expiry and eviction in order of idleness.
    by_idle: BTreeSet<(u64, u64)>,
}

impl Sessions {
    /// Looks a request up without changing anything.
    pub fn lookup(&self, origin: &Origin) -> SessionLookup {
        let Some(session) = self.clients.get(&origin.client_id) else {
            return SessionLookup::New;
        };
        if origin.seq < session.floor {
            return SessionLookup::Forgotten;
        }
        match session.replies.get(&origin.seq) {
            Some(response) => SessionLookup::Seen(response.clone()),
            None => SessionLookup::New,
        }
    }

    /// Remembers the response to a newly applied request.
    pub fn record(&mut self, origin: &Origin, response: Response, clock_ms: u64) {
        let session = self.clients.entry(origin.client_id).or_default();
        self.by_idle
            .remove(&(session.last_seen_ms, origin.client_id));
        session.last_seen_ms = session.last_seen_ms.max(clock_ms);
        self.by_idle
            .insert((session.last_seen_ms, origin.client_id));

        if origin.acked_below > session.floor {
            session.floor = origin.acked_below;
            session.replies = session.replies.split_off(&session.floor);
        }
        session.replies.insert(origin.seq, response);
        while session.replies.len() > MAX_REPLIES_PER_CLIENT {
            if let Some((oldest, _)) = session.replies.pop_first() {
                session.floor = session.floor.max(oldest + 1);
            }
        }
        while self.clients.len() > MAX_CLIENTS {
            self.evict_idlest();
        }
    }

    /// Forgets clients idle for longer than [`SESSION_IDLE_TTL_MS`]; returns how many.
    pub fn expire_idle(&mut self, clock_ms: u64) -> usize {
        let cutoff = clock_ms.saturating_sub(SESSION_IDLE_TTL_MS);
        let mut expired = 0;
        while let Some(&(last_seen, _)) = self.by_idle.first() {
            if last_seen >= cutoff {
                break;
            }
            self.evict_idlest();
            expired += 1;
        }
        expired
    }

    /// Number of clients remembered.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether no client is remembered.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    fn evict_idlest(&mut self) {
        if let Some((_, client_id)) = self.by_idle.pop_first() {
            self.clients.remove(&client_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Reply;

    fn origin(seq: u64, acked_below: u64) -> Origin {
        Origin {
            client_id: 7,
            seq,
            acked_below,
        }
    }

    fn answer(n: u64) -> Response {
        Response::Answer(Ok(Reply::Swept { expired: n }))
    }

    #[test]
    fn a_recorded_request_is_answered_with_its_first_response() {
        let mut s = Sessions::default();
        assert_eq!(s.lookup(&origin(1, 0)), SessionLookup::New);
        s.record(&origin(1, 0), answer(1), 10);
        assert_eq!(s.lookup(&origin(1, 0)), SessionLookup::Seen(answer(1)));
        assert_eq!(s.lookup(&origin(2, 0)), SessionLookup::New);
    }

    #[test]
    fn acknowledged_requests_are_forgotten_and_reported_as_such() {
        let mut s = Sessions::default();
        s.record(&origin(1, 0), answer(1), 10);
        s.record(&origin(2, 2), answer(2), 11);
        assert_eq!(s.lookup(&origin(1, 0)), SessionLookup::Forgotten);
        assert_eq!(s.lookup(&origin(2, 0)), SessionLookup::Seen(answer(2)));
    }

    #[test]
    fn the_window_per_client_is_bounded() {
        let mut s = Sessions::default();
        for seq in 1..=(MAX_REPLIES_PER_CLIENT as u64 + 10) {
            s.record(&origin(seq, 0), answer(seq), 10);
        }
        assert_eq!(s.lookup(&origin(1, 0)), SessionLookup::Forgotten);
        assert_eq!(s.lookup(&origin(10, 0)), SessionLookup::Forgotten);
        assert_eq!(s.lookup(&origin(11, 0)), SessionLookup::Seen(answer(11)));
    }

    #[test]
    fn idle_clients_expire_and_active_ones_stay() {
        let mut s = Sessions::default();
        s.record(&origin(1, 0), answer(1), 0);
        let other = Origin {
            client_id: 8,
            seq: 1,
            acked_below: 0,
        };
        s.record(&other, answer(1), SESSION_IDLE_TTL_MS);
        assert_eq!(s.expire_idle(SESSION_IDLE_TTL_MS + 1), 1);
        assert_eq!(s.lookup(&origin(1, 0)), SessionLookup::New);
        assert_eq!(s.lookup(&other), SessionLookup::Seen(answer(1)));
    }
}
