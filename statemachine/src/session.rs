//! The client session table: exactly-once answers for retried commands.
//!
//! A client that times out cannot know whether its command was applied, so it retries with the
//! same `(client_id, seq)`. Without this table a retried `take` that had in fact won would come
//! back `TAKEN` and the winner would believe it lost. The table remembers each client's recent
//! responses, forgets those the client acknowledged (`acked_below`), keeps at most
//! [`MAX_REPLIES_PER_CLIENT`] per client and [`MAX_REPLY_BYTES`] in all, and forgets clients idle
//! longer than [`SESSION_IDLE_TTL_MS`] of store time (far longer than any client retries). It is
//! part of the state, so it is replicated and snapshotted like everything else.
//!
//! The byte bound is there because an answer is a full copy: a ~100-byte request (an offer
//! repeated on a ticket holding a 1 MiB payload) can make the table remember a megabyte, on every
//! replica and in every snapshot. When the table outgrows it, the client remembering the most
//! bytes forgets its oldest answer first, so a client flooding large answers loses its own before
//! anyone else does. As with every forgotten answer, a retry of it is told `SessionExpired`
//! (outcome unknown) and is never applied a second time; so is a request of that client older
//! than the answer forgotten that was not applied yet (stuck in a failover, say), which then never
//! runs. Only the client remembering the most, past 256 MiB, can meet this.
//!
//! A whole client is forgotten only once idle: after an hour, or, when [`MAX_CLIENTS`] crowd the
//! table, after [`SESSION_RETRY_WINDOW_MS`]. A retry of a forgotten client's request would find
//! no session and be applied again, so a new client that finds the table full of clients seen
//! more recently is turned away (it waits, as for a busy node) rather than one of them forgotten.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::command::{Origin, Response};

/// Store time after which an idle client's session is forgotten (one hour).
pub const SESSION_IDLE_TTL_MS: u64 = 60 * 60 * 1000;
/// Most unacknowledged responses remembered per client.
pub const MAX_REPLIES_PER_CLIENT: usize = 4096;
/// Most clients remembered at once; beyond it the longest-idle client is forgotten, if it has
/// been idle for [`SESSION_RETRY_WINDOW_MS`] (see [`Sessions::admits`]).
pub const MAX_CLIENTS: usize = 200_000;
/// A client seen this recently, in store time, is never forgotten to make room for a new one: it
/// may still be retrying a request whose answer was lost, and its retry, finding no session,
/// would be applied a second time. The new client is turned away instead, until the longest-idle
/// client has been idle this long. Twenty times a client's default deadline (15 s).
pub const SESSION_RETRY_WINDOW_MS: u64 = 5 * 60 * 1000;
/// Most bytes of remembered answers (see [`weight`]) in all clients together, give or take the
/// answer just recorded, which is never the one forgotten to make room (its reply may yet be
/// lost, and its retry must get it).
pub const MAX_REPLY_BYTES: u64 = 256 << 20;
/// What one remembered answer costs besides its encoding: its seq and its place in the table.
/// Also bounds, through [`MAX_REPLY_BYTES`], how many small answers all clients remember.
const ENTRY_BYTES: u64 = 16;

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
    /// What `replies` weigh (see [`weight`]); derived, so not in the snapshot.
    #[serde(skip)]
    bytes: u64,
}

/// All client sessions.
///
/// Only `clients` and `by_idle` are encoded (the layout snapshots have always had); the byte
/// accounting is derived from them when a snapshot is read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "SessionsImage")]
pub struct Sessions {
    clients: BTreeMap<u64, ClientSession>,
    /// `(last_seen_ms, client_id)` for expiry and eviction in order of idleness.
    by_idle: BTreeSet<(u64, u64)>,
    /// `(bytes, client_id)` of every client remembering answers, to find the heaviest.
    #[serde(skip)]
    by_bytes: BTreeSet<(u64, u64)>,
    /// The sum of every client's `bytes`.
    #[serde(skip)]
    bytes: u64,
}

/// The encoded part of [`Sessions`].
#[derive(Deserialize)]
struct SessionsImage {
    clients: BTreeMap<u64, ClientSession>,
    by_idle: BTreeSet<(u64, u64)>,
}

impl From<SessionsImage> for Sessions {
    fn from(image: SessionsImage) -> Self {
        let mut sessions = Sessions {
            clients: image.clients,
            by_idle: image.by_idle,
            by_bytes: BTreeSet::new(),
            bytes: 0,
        };
        for (&client_id, session) in &mut sessions.clients {
            session.bytes = session.replies.values().map(weight).sum();
            sessions.bytes += session.bytes;
            if session.bytes > 0 {
                sessions.by_bytes.insert((session.bytes, client_id));
            }
        }
        sessions
    }
}

/// What remembering `response` costs: its size as a snapshot encodes it, plus [`ENTRY_BYTES`].
/// Deterministic, so every replica evicts the same answers. It changes with the encoding of
/// responses, a refusal's wording included: past [`MAX_REPLY_BYTES`] such a change is an
/// apply-rule change (docs/operations.md, upgrades).
fn weight(response: &Response) -> u64 {
    let mut size = bincode::enc::write::SizeWriter::default();
    // Encoding into a counter cannot fail: every response is encoded into the log and snapshots.
    let _ = bincode::serde::encode_into_writer(response, &mut size, bincode::config::standard());
    size.bytes_written as u64 + ENTRY_BYTES
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

    /// Whether a request from `origin` may be applied at store time `clock_ms`: always from a
    /// client the table knows; from a new one while the table has room, or its longest-idle
    /// client (the one to be forgotten to make room) has been idle for
    /// [`SESSION_RETRY_WINDOW_MS`].
    pub fn admits(&self, origin: &Origin, clock_ms: u64) -> bool {
        self.clients.len() < MAX_CLIENTS
            || self.clients.contains_key(&origin.client_id)
            || self.by_idle.first().is_some_and(|&(last_seen, _)| {
                last_seen.saturating_add(SESSION_RETRY_WINDOW_MS) <= clock_ms
            })
    }

    /// Remembers the response to a newly applied request.
    pub fn record(&mut self, origin: &Origin, response: Response, clock_ms: u64) {
        self.record_within(origin, response, clock_ms, MAX_REPLY_BYTES);
    }

    fn record_within(&mut self, origin: &Origin, response: Response, clock_ms: u64, budget: u64) {
        let client_id = origin.client_id;
        let session = self.clients.entry(client_id).or_default();
        let bytes_before = session.bytes;
        self.by_idle
            .remove(&(session.last_seen_ms, origin.client_id));
        session.last_seen_ms = session.last_seen_ms.max(clock_ms);
        self.by_idle
            .insert((session.last_seen_ms, origin.client_id));

        if origin.acked_below > session.floor {
            session.floor = origin.acked_below;
            let kept = session.replies.split_off(&session.floor);
            let acknowledged = std::mem::replace(&mut session.replies, kept);
            session.bytes -= acknowledged.values().map(weight).sum::<u64>();
        }
        session.bytes += weight(&response);
        if let Some(replaced) = session.replies.insert(origin.seq, response) {
            session.bytes -= weight(&replaced);
        }
        // The client keeps its seqs within this window (api.md), so nothing it has not been
        // answered yet lies under the raised floor.
        while session.replies.len() > MAX_REPLIES_PER_CLIENT {
            forget_oldest(session);
        }
        let bytes_after = session.bytes;
        self.reweigh(client_id, bytes_before, bytes_after);
        while self.bytes > budget && self.forget_heaviest_oldest(origin) {}
        while self.clients.len() > MAX_CLIENTS {
            self.evict_idlest();
        }
    }

    /// Bytes of answers remembered, in all clients (see `MAX_REPLY_BYTES`).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Moves a client's entry in `by_bytes` and the total from `before` to `after` bytes.
    fn reweigh(&mut self, client_id: u64, before: u64, after: u64) {
        if before > 0 {
            self.by_bytes.remove(&(before, client_id));
        }
        if after > 0 {
            self.by_bytes.insert((after, client_id));
        }
        self.bytes = self.bytes - before + after;
    }

    /// The client remembering the most bytes forgets its oldest answer — unless that is the
    /// answer to `recorded`, just recorded: then the next heaviest client does. False if no
    /// other answer is left to forget.
    fn forget_heaviest_oldest(&mut self, recorded: &Origin) -> bool {
        let clients = &self.clients;
        let just_recorded = |client_id: u64| {
            client_id == recorded.client_id
                && clients
                    .get(&client_id)
                    .and_then(|session| session.replies.keys().next())
                    == Some(&recorded.seq)
        };
        let Some(&(before, client_id)) = self
            .by_bytes
            .iter()
            .rev()
            .find(|(_, client_id)| !just_recorded(*client_id))
        else {
            return false;
        };
        let Some(session) = self.clients.get_mut(&client_id) else {
            return false;
        };
        forget_oldest(session);
        let after = session.bytes;
        self.reweigh(client_id, before, after);
        true
    }

    /// Forgets at most `most` clients idle for longer than [`SESSION_IDLE_TTL_MS`], the longest
    /// idle first; returns how many.
    pub fn expire_idle(&mut self, clock_ms: u64, most: usize) -> usize {
        let mut expired = 0;
        while expired < most && self.idle_due(clock_ms) {
            self.evict_idlest();
            expired += 1;
        }
        expired
    }

    /// Whether a client has been idle for longer than [`SESSION_IDLE_TTL_MS`] at `clock_ms`.
    pub fn idle_due(&self, clock_ms: u64) -> bool {
        let cutoff = clock_ms.saturating_sub(SESSION_IDLE_TTL_MS);
        self.by_idle
            .first()
            .is_some_and(|&(last_seen, _)| last_seen < cutoff)
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
            if let Some(session) = self.clients.remove(&client_id) {
                self.reweigh(client_id, session.bytes, 0);
            }
        }
    }
}

/// Forgets a session's oldest answer: a retry of it, or of anything older, is told it was
/// forgotten.
fn forget_oldest(session: &mut ClientSession) {
    if let Some((oldest, response)) = session.replies.pop_first() {
        session.floor = session.floor.max(oldest.saturating_add(1));
        session.bytes -= weight(&response);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
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

    /// An answer carrying `len` bytes of text, as an effect's recorded result does.
    fn large(len: usize) -> Response {
        Response::Answer(Ok(Reply::EffectResult("r".repeat(len))))
    }

    fn from(client_id: u64, seq: u64) -> Origin {
        Origin {
            client_id,
            seq,
            acked_below: 0,
        }
    }

    /// The byte accounting agrees with the answers remembered, and survives a snapshot.
    fn assert_accounted(s: &Sessions) {
        let recounted: u64 = s
            .clients
            .values()
            .flat_map(|c| c.replies.values())
            .map(weight)
            .sum();
        assert_eq!(s.bytes(), recounted);
        let config = bincode::config::standard();
        let image = bincode::serde::encode_to_vec(s, config).unwrap();
        let (restored, _): (Sessions, usize) =
            bincode::serde::decode_from_slice(&image, config).unwrap();
        assert_eq!(&restored, s);
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
    fn the_heaviest_client_forgets_its_oldest_answers_first_when_bytes_run_over() {
        const BUDGET: u64 = 64 << 10;
        let mut s = Sessions::default();
        // A client with small answers, then one flooding 10 KiB answers far past the budget.
        for seq in 1..=50 {
            s.record_within(&from(1, seq), answer(seq), 10, BUDGET);
        }
        for seq in 1..=40 {
            s.record_within(&from(2, seq), large(10 << 10), 10, BUDGET);
        }
        assert!(s.bytes() <= BUDGET, "{} bytes remembered", s.bytes());
        assert!(
            s.bytes() > BUDGET - (11 << 10),
            "{} bytes remembered",
            s.bytes()
        );
        assert_accounted(&s);
        // The flood's own oldest answers went; its newest and every small answer are still told.
        assert_eq!(s.lookup(&from(2, 1)), SessionLookup::Forgotten);
        assert_eq!(s.lookup(&from(2, 40)), SessionLookup::Seen(large(10 << 10)));
        for seq in 1..=50 {
            assert_eq!(s.lookup(&from(1, seq)), SessionLookup::Seen(answer(seq)));
        }
        // Acknowledging answers gives their bytes back.
        s.record_within(
            &Origin {
                client_id: 2,
                seq: 41,
                acked_below: 41,
            },
            answer(41),
            11,
            BUDGET,
        );
        assert_eq!(s.lookup(&from(2, 40)), SessionLookup::Forgotten);
        assert!(s.bytes() < 4 << 10, "{} bytes remembered", s.bytes());
        assert_accounted(&s);
    }

    #[test]
    fn many_small_answers_are_bounded_by_bytes_too() {
        const BUDGET: u64 = 4 << 10;
        let mut s = Sessions::default();
        // A client with a few answers, then many clients with more answers each (each answer
        // weighs its encoding and its place in the table).
        for seq in 1..=3 {
            s.record_within(&from(1, seq), answer(seq), 10, BUDGET);
        }
        for client in 2..=100 {
            for seq in 1..=10 {
                s.record_within(&from(client, seq), answer(seq), 10, BUDGET);
            }
        }
        assert!(s.bytes() <= BUDGET, "{} bytes remembered", s.bytes());
        assert!(s.bytes() > BUDGET - 2 * weight(&answer(10)));
        assert_accounted(&s);
        // The lightest client's answers are all still told.
        for seq in 1..=3 {
            assert_eq!(s.lookup(&from(1, seq)), SessionLookup::Seen(answer(seq)));
        }
        assert_eq!(s.lookup(&from(2, 1)), SessionLookup::Forgotten);
    }

    #[test]
    fn the_answer_just_recorded_is_never_the_one_forgotten() {
        const BUDGET: u64 = 64 << 10;
        let mut s = Sessions::default();
        // Many clients with an answer of 10 KiB each, nearly filling the budget; then one
        // answer larger than any of them, which makes its client the heaviest.
        for client in 1..=5 {
            s.record_within(&from(client, 1), large(10 << 10), 10, BUDGET);
        }
        s.record_within(&from(9, 1), large(20 << 10), 10, BUDGET);
        assert_eq!(s.lookup(&from(9, 1)), SessionLookup::Seen(large(20 << 10)));
        assert!(s.bytes() <= BUDGET, "{} bytes remembered", s.bytes());
        // The next heaviest went instead (ties go to the higher client id).
        assert_eq!(s.lookup(&from(5, 1)), SessionLookup::Forgotten);
        assert_accounted(&s);
        // Alone, an answer over the whole budget is still remembered.
        let mut alone = Sessions::default();
        alone.record_within(&from(1, 1), large(100 << 10), 10, BUDGET);
        assert_eq!(
            alone.lookup(&from(1, 1)),
            SessionLookup::Seen(large(100 << 10))
        );
        assert_accounted(&alone);
    }

    #[test]
    fn forgotten_clients_give_their_bytes_back() {
        let mut s = Sessions::default();
        s.record(&from(1, 1), large(1000), 0);
        s.record(&from(2, 1), large(10), SESSION_IDLE_TTL_MS);
        assert_eq!(s.expire_idle(SESSION_IDLE_TTL_MS + 1, usize::MAX), 1);
        assert_eq!(s.bytes(), weight(&large(10)));
        assert_accounted(&s);
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
        assert_eq!(s.expire_idle(SESSION_IDLE_TTL_MS + 1, usize::MAX), 1);
        assert_eq!(s.lookup(&origin(1, 0)), SessionLookup::New);
        assert_eq!(s.lookup(&other), SessionLookup::Seen(answer(1)));
    }
}
