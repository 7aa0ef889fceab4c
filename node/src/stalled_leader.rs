//! A leader that commits nothing is treated as gone: followers stop taking its messages.
//!
//! Why: a follower elects a new leader only when it stops hearing from the old one (its election
//! timer, and the leader lease openraft refuses votes under, restart with every AppendEntries it
//! accepts). Hearing from a leader is not the same as the leader working. When a leader's links
//! are slower than its AppendEntries deadline (`raft.heartbeat`), every request it sends arrives
//! and every answer arrives too late: it commits nothing, while its retries keep reaching the
//! followers, so no one ever stands against it and the cluster stays unavailable for as long as
//! the links stay slow. Raft's answer is check-quorum (thesis §6.2): a leader that has not heard
//! from a quorum within an election timeout steps down. openraft 0.9 has no check-quorum and no
//! way to make a leader step down.
//!
//! So each voter watches its leader's progress instead. Every AppendEntries says how far the
//! leader's log reaches (its last entry, or for a heartbeat the entry before) and how far it has
//! committed. Entries beyond the commit index of a working leader are committed within a round
//! trip; when a leader has held entries beyond its commit index for [`STALL_LEASES`] leases
//! without committing anything, this voter refuses its AppendEntries and snapshots for
//! [`REFUSAL_LEASES`] leases. Its lease and openraft's run out, its election timer fires, and it
//! holds a pre-vote: the other followers, which saw the same leader stall, say yes once their
//! own refusals ran out their leases, and one of them becomes the next leader.
//!
//! Refusing messages is losing them, which Raft tolerates at any time: safety is unchanged. A
//! leader that commits again (its links were slow for a moment) is taken again at its next
//! message. A leader with nothing to commit is not judged: a slow leader of an idle cluster
//! answers no reads (read-index needs a quorum's heartbeat answers), and is replaced only once it
//! has a write to commit (a client's, or its sweeper's within a minute).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::types::NodeId;

/// A leader that holds entries beyond its commit index this many leases without committing is
/// stalled. Two, not one: under load a working leader's commits can lag a lease behind its
/// entries (a slow sync, a CPU-starved machine), and a wrongly deposed leader costs an election.
pub const STALL_LEASES: u32 = 2;

/// How many leases a stalled leader's messages are refused for: one for this voter's lease to run
/// out, one for its election timer (at most a lease), and two for the other followers' refusals,
/// which start when their own view of the stall does (their copies of the entries may arrive
/// later), to overlap with this one.
pub const REFUSAL_LEASES: u32 = 4;

/// The leader a voter follows, as an AppendEntries names it.
pub type Vote = openraft::Vote<NodeId>;

/// What one AppendEntries tells of its leader's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The leader that sent it.
    pub vote: Vote,
    /// The index of the last entry it carries, or for a heartbeat of the entry before.
    pub sent: Option<u64>,
    /// The leader's commit index.
    pub committed: Option<u64>,
}

/// Why a leader's message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "leader {leader} (term {term}) has committed nothing for {} ms while holding entries; its \
     messages are refused for {} ms more so that its followers can elect another",
    .stalled_for.as_millis(),
    .refusing_for.as_millis()
)]
pub struct Stalled {
    /// The stalled leader.
    pub leader: NodeId,
    /// Its term.
    pub term: u64,
    /// How long it has held entries without committing.
    pub stalled_for: Duration,
    /// How much longer its messages are refused.
    pub refusing_for: Duration,
}

/// One voter's view of its leader's progress.
#[derive(Debug, Default)]
pub struct Progress {
    /// The leader watched; a new one starts a fresh view.
    leader: Option<Vote>,
    /// The highest commit index it reported.
    committed: Option<u64>,
    /// Since when it has held entries beyond `committed` (without committing since).
    waiting_since: Option<Instant>,
    /// Its messages are refused until then.
    refusing_until: Option<Instant>,
}

impl Progress {
    /// Judges one AppendEntries that arrived at `now`, given the leader lease: `Err` refuses it.
    pub fn judge(&mut self, report: &Report, lease: Duration, now: Instant) -> Result<(), Stalled> {
        if self.leader != Some(report.vote) {
            *self = Self {
                leader: Some(report.vote),
                ..Self::default()
            };
        }
        if report.committed > self.committed {
            // Progress: whatever was waiting may have been committed, and a refusal is lifted.
            self.committed = report.committed;
            self.waiting_since = None;
            self.refusing_until = None;
        }
        if let Some(until) = self.refusing_until {
            if now < until {
                return Err(self.stalled(now, until));
            }
            // The refusal ran out and the leader is still there: judged afresh from now.
            self.refusing_until = None;
            self.waiting_since = None;
        }
        if report.sent > self.committed && self.waiting_since.is_none() {
            self.waiting_since = Some(now);
        }
        match self.waiting_since {
            Some(since) if now.duration_since(since) > lease * STALL_LEASES => {
                let until = now + lease * REFUSAL_LEASES;
                self.refusing_until = Some(until);
                Err(self.stalled(now, until))
            }
            _ => Ok(()),
        }
    }

    /// Whether a message of `vote` arriving at `now` is refused: a snapshot, which reports no
    /// commit index, is refused while the AppendEntries of its leader are.
    pub fn refuses(&self, vote: &Vote, now: Instant) -> bool {
        self.leader.as_ref() == Some(vote) && self.refusing_until.is_some_and(|until| now < until)
    }

    fn stalled(&self, now: Instant, until: Instant) -> Stalled {
        let vote = self.leader.unwrap_or_default();
        Stalled {
            leader: vote.leader_id().voted_for().unwrap_or_default(),
            term: vote.leader_id().term,
            stalled_for: self
                .waiting_since
                .map_or(Duration::ZERO, |since| now.duration_since(since)),
            refusing_for: until.duration_since(now),
        }
    }
}

/// [`Progress`] shared by a node's Raft connections.
#[derive(Clone, Default)]
pub struct Watch(Arc<Mutex<Progress>>);

impl Watch {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Progress::judge`] now; a refusal that starts is logged.
    pub fn judge(&self, report: &Report, lease: Duration) -> Result<(), Stalled> {
        let mut progress = self.progress();
        let was_refusing = progress.refusing_until.is_some();
        let verdict = progress.judge(report, lease, Instant::now());
        match &verdict {
            Err(stalled) if !was_refusing => tracing::warn!(%stalled, "leader stalled"),
            Ok(()) if was_refusing => {
                tracing::info!("leader commits again; its messages are taken")
            }
            _ => {}
        }
        verdict
    }

    /// [`Progress::refuses`] now.
    pub fn refuses(&self, vote: &Vote) -> bool {
        self.progress().refuses(vote, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const LEASE: Duration = Duration::from_millis(100);

    fn vote(term: u64, leader: NodeId) -> Vote {
        Vote::new_committed(term, leader)
    }

    fn report(vote: Vote, sent: u64, committed: u64) -> Report {
        Report {
            vote,
            sent: Some(sent),
            committed: Some(committed),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_leader_that_commits_what_it_sends_is_never_refused() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(2, 1);
        // Every entry is committed by the next message, for far longer than the stall limit.
        for i in 0..100u64 {
            let at = start + ms(i * 20);
            assert!(progress.judge(&report(leader, i + 1, i), LEASE, at).is_ok());
        }
    }

    #[test]
    fn a_leader_that_commits_slowly_but_commits_is_never_refused() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(2, 1);
        // Always entries beyond the commit index, but the commit index moves every 1.5 leases.
        for i in 0..40u64 {
            let at = start + ms(i * 50);
            let committed = (i / 3) * 10;
            assert!(progress
                .judge(&report(leader, committed + 10, committed), LEASE, at)
                .is_ok());
        }
    }

    #[test]
    fn a_leader_holding_entries_uncommitted_past_the_limit_is_refused_for_the_refusal_time() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(3, 2);
        assert!(progress.judge(&report(leader, 10, 9), LEASE, start).is_ok());
        // Heartbeats from an older point (the leader's view of this follower never moved) do
        // not reset the clock: only a commit does.
        let limit = LEASE * STALL_LEASES;
        assert!(progress
            .judge(&report(leader, 9, 9), LEASE, start + limit)
            .is_ok());
        let stalled = progress
            .judge(&report(leader, 10, 9), LEASE, start + limit + ms(1))
            .unwrap_err();
        assert_eq!((stalled.leader, stalled.term), (2, 3));
        assert_eq!(stalled.stalled_for, limit + ms(1));
        assert_eq!(stalled.refusing_for, LEASE * REFUSAL_LEASES);
        let refusing_from = start + limit + ms(1);
        assert!(progress.refuses(&leader, refusing_from + ms(1)));
        assert!(!progress.refuses(&vote(4, 3), refusing_from + ms(1)));
        // Heartbeats are refused through the refusal...
        let last = refusing_from + LEASE * REFUSAL_LEASES - ms(1);
        assert!(progress.judge(&report(leader, 9, 9), LEASE, last).is_err());
        // ...and after it the leader is judged afresh: taken, until it stalls a limit again.
        let after = refusing_from + LEASE * REFUSAL_LEASES;
        assert!(!progress.refuses(&leader, after));
        assert!(progress.judge(&report(leader, 10, 9), LEASE, after).is_ok());
        assert!(progress
            .judge(&report(leader, 10, 9), LEASE, after + limit)
            .is_ok());
        assert!(progress
            .judge(&report(leader, 10, 9), LEASE, after + limit + ms(1))
            .is_err());
    }

    #[test]
    fn a_commit_lifts_a_refusal_at_once() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(3, 2);
        let limit = LEASE * STALL_LEASES;
        assert!(progress.judge(&report(leader, 10, 9), LEASE, start).is_ok());
        assert!(progress
            .judge(&report(leader, 10, 9), LEASE, start + limit + ms(1))
            .is_err());
        // The leader committed (with the other follower, say): taken again.
        assert!(progress
            .judge(&report(leader, 10, 10), LEASE, start + limit + ms(2))
            .is_ok());
        assert!(!progress.refuses(&leader, start + limit + ms(3)));
    }

    #[test]
    fn a_new_leader_starts_with_a_clean_slate() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let old = vote(3, 2);
        let limit = LEASE * STALL_LEASES;
        assert!(progress.judge(&report(old, 10, 9), LEASE, start).is_ok());
        assert!(progress
            .judge(&report(old, 10, 9), LEASE, start + limit + ms(1))
            .is_err());
        // Its successor reports a lower commit index than the old leader's highest (it has not
        // committed its first entry yet): not a stall, a fresh start.
        let new = vote(4, 1);
        let at = start + limit + ms(2);
        assert!(progress.judge(&report(new, 8, 7), LEASE, at).is_ok());
        assert!(progress
            .judge(&report(new, 10, 7), LEASE, at + limit)
            .is_ok());
        assert!(progress
            .judge(&report(new, 10, 7), LEASE, at + limit + ms(1))
            .is_err());
    }

    #[test]
    fn a_follower_behind_the_commit_index_is_not_waiting() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(2, 1);
        // Catching up on committed entries for a long time, the commit index not moving.
        for i in 0..40u64 {
            let at = start + ms(i * 50);
            assert!(progress
                .judge(&report(leader, i.min(50), 50), LEASE, at)
                .is_ok());
        }
    }

    #[test]
    fn an_empty_log_is_not_waiting() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(1, 1);
        let empty = Report {
            vote: leader,
            sent: None,
            committed: None,
        };
        assert!(progress.judge(&empty, LEASE, start).is_ok());
        assert!(progress.judge(&empty, LEASE, start + LEASE * 10).is_ok());
    }
}
