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
//! So each voter judges its leader by what the leader sends it. An AppendEntries shows the
//! leader's commit index, and an index the leader holds for this follower (the last entry it
//! carries, or for a heartbeat the entry before). A leader is stalled when both hold:
//!
//! - for [`STALL_LEASES`] leases it has held entries beyond its commit index without committing
//!   anything (a working leader commits them within a round trip);
//! - meanwhile it sent again entries this voter had acknowledged within half the leader's
//!   deadline for an answer ([`PROMPT`]): the answer was prompt, so the link (or the leader)
//!   made it too late. A voter slow to write its entries is slow itself: its resent entries say
//!   nothing of the leader, and do not count.
//!
//! A stalled leader's AppendEntries and snapshots are refused for [`REFUSAL_LEASES`] leases. This
//! voter's lease and openraft's run out, its election timer fires, and it holds a pre-vote: the
//! other followers, which saw the same leader stall, say yes once their own refusals ran out their
//! leases, and one of them becomes the next leader.
//!
//! The followers' refusals must overlap for that. Each judges on its own copy of the leader's
//! messages, so their judgements can be a lease or more apart (a busy machine); a refusal that
//! ran out is followed by [`STALL_LEASES`] of judging afresh, so two followers could go on
//! refusing in turn, each pre-vote meeting a peer that still hears the leader (seen: ~28 s of
//! it). So a pre-vote from a peer, which no longer hears a leader, counts as a second witness: a
//! voter that has watched its leader stall for [`CORROBORATED_STALL_LEASES`] starts refusing it
//! then (and says no to that pre-vote, having heard the leader just now; it says yes to the
//! next).
//!
//! Refusing messages is losing them, which Raft tolerates at any time: safety is unchanged. A
//! leader that commits again with the other voters (its links were slow for a moment) is taken
//! again at its next message. With the other follower down, this voter is the only one the
//! leader can commit with, so nothing lifts the refusal early: writes wait for it to run out (up
//! to [`REFUSAL_LEASES`] leases) even once the links recover. A leader with nothing to commit is not judged, so a slow leader serving only reads
//! (each failing: read-index needs a quorum's answers in time) appends an empty entry when a
//! read-index round finds no quorum ([`crate::read_index`]).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::types::NodeId;

/// A leader that holds entries beyond its commit index this many leases without committing is
/// stalled (if its followers' answers do not reach it). Two, not one: a wrongly deposed leader
/// costs an election.
pub const STALL_LEASES: u32 = 2;

/// A leader that holds entries beyond its commit index this many leases without committing is
/// stalled when a peer's pre-vote says that peer no longer hears a leader either.
pub const CORROBORATED_STALL_LEASES: u32 = 1;

/// How many leases a stalled leader's messages are refused for: one for this voter's lease to run
/// out, one for its election timer (at most a lease), and two for the other followers' refusals,
/// which start when their own view of the stall does (their copies of the entries may arrive
/// later), to overlap with this one.
pub const REFUSAL_LEASES: u32 = 4;

/// An acknowledgement counts when this voter answered within this part of the leader's deadline
/// for an answer: the rest is left for the round trip.
pub const PROMPT: f64 = 0.5;

/// The leader a voter follows, as an AppendEntries names it.
pub type Vote = openraft::Vote<NodeId>;

/// What one AppendEntries tells of its leader's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// The leader that sent it.
    pub vote: Vote,
    /// The index of the first entry it carries (none for a heartbeat).
    pub first: Option<u64>,
    /// The index of the last entry it carries, or for a heartbeat of the entry before: the
    /// leader holds the log up to there.
    pub sent: Option<u64>,
    /// The leader's commit index.
    pub committed: Option<u64>,
}

/// Why a leader's message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "leader {leader} (term {term}) has committed nothing for {} ms while holding entries, and \
     sends again what this node acknowledged; its messages are refused for {} ms more so that \
     its followers can elect another",
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
    /// The highest index this voter acknowledged to it promptly.
    acknowledged: Option<u64>,
    /// Since when it has held entries beyond `committed` (without committing since).
    waiting_since: Option<Instant>,
    /// Whether, since `waiting_since`, it sent again entries this voter had acknowledged
    /// promptly.
    resent: bool,
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
            self.resent = false;
            self.refusing_until = None;
        }
        if let Some(until) = self.refusing_until {
            if now < until {
                return Err(self.stalled(now, until));
            }
            // The refusal ran out and the leader is still there: judged afresh from now.
            self.refusing_until = None;
            self.waiting_since = None;
            self.resent = false;
        }
        if report.sent > self.committed && self.waiting_since.is_none() {
            self.waiting_since = Some(now);
        }
        if self.waiting_since.is_some()
            && report.first.is_some()
            && report.first <= self.acknowledged
        {
            self.resent = true;
        }
        match self.waiting_since {
            Some(since) if self.resent && now.duration_since(since) > lease * STALL_LEASES => {
                let until = now + lease * REFUSAL_LEASES;
                self.refusing_until = Some(until);
                Err(self.stalled(now, until))
            }
            _ => Ok(()),
        }
    }

    /// A peer holds a pre-vote at `now` (it no longer hears a leader): the leader is judged
    /// stalled, and refused from now on, if it has held entries without committing for
    /// [`CORROBORATED_STALL_LEASES`] and sent again entries this voter had acknowledged promptly.
    /// `None` when it is not, or is refused already.
    pub fn corroborate(&mut self, lease: Duration, now: Instant) -> Option<Stalled> {
        if let Some(until) = self.refusing_until {
            if now < until {
                return None;
            }
            // A refusal ran out and no message of the leader has come since: what was watched
            // before it says nothing of the leader now, which is judged afresh.
            self.refusing_until = None;
            self.waiting_since = None;
            self.resent = false;
            return None;
        }
        let since = self.waiting_since?;
        if !self.resent || now.duration_since(since) <= lease * CORROBORATED_STALL_LEASES {
            return None;
        }
        let until = now + lease * REFUSAL_LEASES;
        self.refusing_until = Some(until);
        Some(self.stalled(now, until))
    }

    /// Records that this voter acknowledged `vote`'s log up to `index` (it appended the entries
    /// of an AppendEntries, or matched its heartbeat) in `took`, where the leader waits
    /// `deadline` for the answer; only a prompt answer ([`PROMPT`]) counts.
    pub fn acknowledge(
        &mut self,
        vote: &Vote,
        index: Option<u64>,
        took: Duration,
        deadline: Duration,
    ) {
        let prompt = took <= deadline.mul_f64(PROMPT);
        if prompt && self.leader.as_ref() == Some(vote) && index > self.acknowledged {
            self.acknowledged = index;
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
pub struct LeaderWatch(Arc<Mutex<Progress>>);

impl LeaderWatch {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Progress::judge`] now; the start of a refusal, and its end by a commit, are logged.
    pub fn judge(&self, report: &Report, lease: Duration) -> Result<(), Stalled> {
        let now = Instant::now();
        let mut progress = self.progress();
        let was_refusing = progress.refuses(&report.vote, now);
        let verdict = progress.judge(report, lease, now);
        match &verdict {
            Err(stalled) if !was_refusing => tracing::warn!(%stalled, "leader stalled"),
            Ok(()) if was_refusing => {
                tracing::info!("the stalled leader commits again; its messages are taken");
            }
            _ => {}
        }
        verdict
    }

    /// [`Progress::corroborate`] now, for a pre-vote of `peer`; the start of a refusal is logged.
    pub fn corroborate(&self, peer: NodeId, lease: Duration) {
        if let Some(stalled) = self.progress().corroborate(lease, Instant::now()) {
            tracing::warn!(%stalled, peer, "leader stalled (a peer's pre-vote bears it out)");
        }
    }

    /// [`Progress::acknowledge`].
    pub fn acknowledge(&self, vote: &Vote, index: Option<u64>, took: Duration, deadline: Duration) {
        self.progress().acknowledge(vote, index, took, deadline);
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
    const LIMIT: Duration = Duration::from_millis(100 * STALL_LEASES as u64);
    /// The leader's deadline for an answer.
    const DEADLINE: Duration = Duration::from_millis(50);
    /// A prompt answer.
    const QUICK: Duration = Duration::from_millis(5);

    fn vote(term: u64, leader: NodeId) -> Vote {
        Vote::new_committed(term, leader)
    }

    /// Entries `first..=last` with the commit index at `committed`.
    fn entries(vote: Vote, first: u64, last: u64, committed: u64) -> Report {
        Report {
            vote,
            first: Some(first),
            sent: Some(last),
            committed: Some(committed),
        }
    }

    /// A heartbeat after entry `matched`.
    fn heartbeat(vote: Vote, matched: u64, committed: u64) -> Report {
        Report {
            vote,
            first: None,
            sent: Some(matched),
            committed: Some(committed),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Entries 10..=12 arrive at `start` and are acknowledged, and the leader commits nothing.
    fn waiting(leader: Vote, start: Instant) -> Progress {
        let mut progress = Progress::default();
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, start)
            .is_ok());
        progress.acknowledge(&leader, Some(12), QUICK, DEADLINE);
        progress
    }

    #[test]
    fn a_leader_that_commits_what_it_sends_is_never_refused() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(2, 1);
        // Every entry is committed by the next message, for far longer than the stall limit.
        for i in 1..100u64 {
            let at = start + ms(i * 20);
            assert!(progress
                .judge(&entries(leader, i, i, i - 1), LEASE, at)
                .is_ok());
            progress.acknowledge(&leader, Some(i), QUICK, DEADLINE);
        }
    }

    #[test]
    fn a_leader_that_commits_slowly_but_commits_is_never_refused() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(2, 1);
        // Always entries beyond the commit index, sent again and again, but the commit index
        // moves every 1.5 leases.
        for i in 0..40u64 {
            let at = start + ms(i * 50);
            let committed = (i / 3) * 10;
            let report = entries(leader, committed + 1, committed + 10, committed);
            assert!(progress.judge(&report, LEASE, at).is_ok());
            progress.acknowledge(&leader, Some(committed + 10), QUICK, DEADLINE);
        }
    }

    #[test]
    fn a_leader_that_gets_the_answers_but_commits_nothing_is_waited_for() {
        // Its own disk is slow, say: it sends each entry once, and heartbeats.
        let start = Instant::now();
        let leader = vote(3, 2);
        let mut progress = waiting(leader, start);
        assert!(progress
            .judge(&entries(leader, 13, 14, 9), LEASE, start + ms(50))
            .is_ok());
        progress.acknowledge(&leader, Some(14), QUICK, DEADLINE);
        for i in 2..40u64 {
            let at = start + ms(i * 50);
            assert!(progress.judge(&heartbeat(leader, 14, 9), LEASE, at).is_ok());
        }
    }

    #[test]
    fn a_peers_pre_vote_bears_out_a_stall_watched_for_one_lease() {
        let start = Instant::now();
        let leader = vote(3, 2);
        let mut progress = waiting(leader, start);
        // Not yet resent: a leader whose own disk is slow is not judged on a peer's word.
        assert!(progress.corroborate(LEASE, start + LEASE * 3).is_none());
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, start + ms(50))
            .is_ok());
        // Resent, but watched for less than a lease.
        assert!(progress.corroborate(LEASE, start + LEASE).is_none());
        assert!(!progress.refuses(&leader, start + LEASE));
        // Past a lease (short of the limit this voter judges alone by): refused from then.
        let at = start + LEASE + ms(1);
        assert!(at < start + LIMIT);
        let stalled = progress.corroborate(LEASE, at).unwrap();
        assert_eq!(stalled.refusing_for, LEASE * REFUSAL_LEASES);
        assert!(progress.refuses(&leader, at + ms(1)));
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, at + ms(2))
            .is_err());
        assert!(
            progress.corroborate(LEASE, at + ms(3)).is_none(),
            "refused already"
        );
        // Once the refusal ran out, a pre-vote before the leader's next message finds nothing
        // watched since: the leader is judged afresh.
        let after = at + LEASE * REFUSAL_LEASES;
        assert!(progress.corroborate(LEASE, after).is_none());
        assert!(progress.corroborate(LEASE, after + LEASE * 3).is_none());
        assert!(!progress.refuses(&leader, after + LEASE * 3));
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, after + LEASE * 3)
            .is_ok());
        // Watched afresh from that message on: resent, and a lease later borne out again.
        let again = after + LEASE * 3;
        progress.acknowledge(&leader, Some(12), QUICK, DEADLINE);
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, again + ms(1))
            .is_ok());
        assert!(
            progress.corroborate(LEASE, again + ms(2)).is_none(),
            "watched for less than a lease"
        );
        assert!(progress.corroborate(LEASE, again + LEASE + ms(2)).is_some());
        // A commit lifts the refusal, as it lifts any.
        assert!(progress
            .judge(&entries(leader, 13, 13, 12), LEASE, again + LEASE + ms(3))
            .is_ok());
        assert!(!progress.refuses(&leader, again + LEASE + ms(4)));
    }

    #[test]
    fn a_leader_resending_entries_uncommitted_past_the_limit_is_refused_for_the_refusal_time() {
        let start = Instant::now();
        let leader = vote(3, 2);
        let mut progress = waiting(leader, start);
        // The answers did not reach it: it sends the same entries again. Heartbeats from its
        // older view of this follower do not reset the clock either: only a commit does.
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, start + ms(100))
            .is_ok());
        assert!(progress
            .judge(&heartbeat(leader, 9, 9), LEASE, start + LIMIT)
            .is_ok());
        let stalled = progress
            .judge(&heartbeat(leader, 9, 9), LEASE, start + LIMIT + ms(1))
            .unwrap_err();
        assert_eq!((stalled.leader, stalled.term), (2, 3));
        assert_eq!(stalled.stalled_for, LIMIT + ms(1));
        assert_eq!(stalled.refusing_for, LEASE * REFUSAL_LEASES);
        let refusing_from = start + LIMIT + ms(1);
        assert!(progress.refuses(&leader, refusing_from + ms(1)));
        assert!(!progress.refuses(&vote(4, 3), refusing_from + ms(1)));
        // Its messages are refused through the refusal...
        let last = refusing_from + LEASE * REFUSAL_LEASES - ms(1);
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, last)
            .is_err());
        // ...and after it the leader is judged afresh: taken, until it stalls a limit again.
        let after = refusing_from + LEASE * REFUSAL_LEASES;
        assert!(!progress.refuses(&leader, after));
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, after)
            .is_ok());
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, after + LIMIT)
            .is_ok());
        assert!(progress
            .judge(&heartbeat(leader, 9, 9), LEASE, after + LIMIT + ms(1))
            .is_err());
    }

    #[test]
    fn a_resend_counts_only_while_entries_wait() {
        let start = Instant::now();
        let leader = vote(3, 2);
        let mut progress = Progress::default();
        // A resend of committed entries (an answer lost once), then new entries.
        assert!(progress
            .judge(&entries(leader, 1, 5, 5), LEASE, start)
            .is_ok());
        progress.acknowledge(&leader, Some(5), QUICK, DEADLINE);
        assert!(progress
            .judge(&entries(leader, 1, 5, 5), LEASE, start)
            .is_ok());
        assert!(progress
            .judge(&entries(leader, 6, 8, 5), LEASE, start)
            .is_ok());
        progress.acknowledge(&leader, Some(8), QUICK, DEADLINE);
        // Entries wait past the limit, but nothing was sent again meanwhile.
        assert!(progress
            .judge(&heartbeat(leader, 8, 5), LEASE, start + LIMIT + ms(1))
            .is_ok());
    }

    #[test]
    fn a_commit_lifts_a_refusal_at_once() {
        let start = Instant::now();
        let leader = vote(3, 2);
        let mut progress = waiting(leader, start);
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, start + LIMIT + ms(1))
            .is_err());
        // The leader committed (with the other follower, say): taken again.
        assert!(progress
            .judge(&heartbeat(leader, 9, 10), LEASE, start + LIMIT + ms(2))
            .is_ok());
        assert!(!progress.refuses(&leader, start + LIMIT + ms(3)));
    }

    #[test]
    fn a_new_leader_starts_with_a_clean_slate() {
        let start = Instant::now();
        let old = vote(3, 2);
        let mut progress = waiting(old, start);
        assert!(progress
            .judge(&entries(old, 10, 12, 9), LEASE, start + LIMIT + ms(1))
            .is_err());
        // Its successor reports a lower commit index than the old leader's highest (it has not
        // committed its first entry yet), and acknowledgements to the old leader do not count.
        let new = vote(4, 1);
        let at = start + LIMIT + ms(2);
        assert!(progress.judge(&entries(new, 8, 8, 7), LEASE, at).is_ok());
        assert!(progress.judge(&entries(new, 8, 8, 7), LEASE, at).is_ok());
        assert!(progress
            .judge(&entries(new, 8, 8, 7), LEASE, at + LIMIT + ms(1))
            .is_ok());
        progress.acknowledge(&new, Some(8), QUICK, DEADLINE);
        assert!(progress
            .judge(&entries(new, 8, 8, 7), LEASE, at + LIMIT + ms(2))
            .is_err());
    }

    #[test]
    fn a_follower_behind_the_commit_index_is_not_waiting() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(2, 1);
        // Catching up on committed entries for a long time, some sent twice, the commit index
        // not moving.
        for i in 1..40u64 {
            let at = start + ms(i * 50);
            let first = i.saturating_sub(1).max(1);
            assert!(progress
                .judge(&entries(leader, first, i, 50), LEASE, at)
                .is_ok());
            progress.acknowledge(&leader, Some(i), QUICK, DEADLINE);
        }
    }

    #[test]
    fn an_empty_log_is_not_waiting() {
        let mut progress = Progress::default();
        let start = Instant::now();
        let leader = vote(1, 1);
        let empty = Report {
            vote: leader,
            first: None,
            sent: None,
            committed: None,
        };
        assert!(progress.judge(&empty, LEASE, start).is_ok());
        assert!(progress.judge(&empty, LEASE, start + LEASE * 10).is_ok());
    }

    #[test]
    fn only_prompt_acknowledgements_to_the_leader_watched_count() {
        let start = Instant::now();
        let leader = vote(3, 2);
        let mut progress = Progress::default();
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, start)
            .is_ok());
        // This voter was slow to write them (over half the deadline): the resend is its own
        // doing. An acknowledgement to another leader does not count either.
        progress.acknowledge(&leader, Some(12), DEADLINE / 2 + ms(1), DEADLINE);
        progress.acknowledge(&vote(2, 1), Some(12), QUICK, DEADLINE);
        assert!(progress
            .judge(&entries(leader, 10, 12, 9), LEASE, start + ms(100))
            .is_ok());
        assert!(progress
            .judge(&heartbeat(leader, 9, 9), LEASE, start + LIMIT + ms(1))
            .is_ok());
        // A prompt one does; a lower one later does not replace it.
        progress.acknowledge(&leader, Some(12), DEADLINE / 2, DEADLINE);
        progress.acknowledge(&leader, Some(11), QUICK, DEADLINE);
        assert!(progress
            .judge(&entries(leader, 12, 12, 9), LEASE, start + LIMIT + ms(2))
            .is_err());
    }
}
