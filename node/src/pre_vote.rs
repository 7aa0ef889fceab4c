//! Elections that ask first (pre-vote, Raft thesis §9.6): a node stands only when a quorum would
//! vote for it.
//!
//! Why: openraft 0.9 has no pre-vote. A follower cut off from the others stood for election each
//! time its timer ran out, each time in a higher term it stored. Once the link came back, its
//! first answer to the leader carried that term, and the leader stepped down: a cluster whose
//! majority had kept working went through an election it did not need (and a flapping link could
//! do that again and again).
//!
//! So openraft's own election timer is off (`enable_elect: false`, see
//! [`crate::config::RaftTuning::to_openraft`]) and [`run`] does its job: when this voter has not
//! heard from a leader for the leader lease plus a random election timeout, it asks the other
//! voters whether they would vote for it, without changing anybody's term. A voter says yes when
//! it has not heard from a leader itself for a leader lease either, does not lead, and the
//! asker's log is at least as new as its own (the test a real vote makes). Only with a quorum of
//! yeses (its own included, a majority of every configuration while membership changes) does the
//! node start an ordinary openraft election. A node that cannot reach a quorum never raises its
//! term, and rejoins as a follower.
//!
//! Safety is unchanged: the election that follows is openraft's own, and a pre-vote changes no
//! state anywhere. Liveness is as before: when a leader is really gone, its followers stop
//! hearing from it, their leases run out and they say yes to each other. Elections started on
//! purpose (a leadership handover's `TimeoutNow`, [`crate::newer_log_stands`]) do not ask first:
//! they run only when the leader is known to be stepping aside, or when a candidate is already
//! asking for votes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use openraft::ServerState;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::network::Network;
use crate::node::{is_voter, member_addr};
use crate::types::{LogId, NodeId, Raft};

/// The pre-vote question: "would you vote for `from`, whose log ends at `last_log`?"
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVote {
    /// The node that would stand.
    pub from: NodeId,
    /// Its last log entry.
    pub last_log: Option<LogId>,
}

/// When this node last heard from a leader; shared by the Raft connections that see it happen
/// and by [`run`] and [`judge`], which act on it.
#[derive(Clone)]
pub struct Contact {
    /// The last leader message this node accepted (or its start).
    leader: Arc<Mutex<Instant>>,
    /// Wakes [`run`] to stand without waiting for its timer.
    stand: Arc<Notify>,
}

impl Default for Contact {
    /// A node that just started counts as having heard from a leader now: it waits one lease
    /// before it says yes to anyone, as it would had it been running all along.
    fn default() -> Self {
        Self {
            leader: Arc::new(Mutex::new(Instant::now())),
            stand: Arc::default(),
        }
    }
}

impl Contact {
    fn leader(&self) -> MutexGuard<'_, Instant> {
        self.leader.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This node accepted a message from the leader of its term (entries, a heartbeat, a
    /// snapshot).
    pub fn heard_from_leader(&self) {
        *self.leader() = Instant::now();
    }

    /// When this node last heard from a leader (or started).
    pub fn leader_at(&self) -> Instant {
        *self.leader()
    }
}

/// The election timings, from the Raft settings.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long after a leader's last message a follower still counts it as alive (openraft's
    /// leader lease: the largest election timeout).
    pub lease: Duration,
    /// The range a node draws its election timeout from, anew for every wait.
    pub timeout: (Duration, Duration),
}

impl Timing {
    fn draw(&self) -> Duration {
        let (low, high) = self.timeout;
        if high <= low {
            return low;
        }
        rand::rng().random_range(low..=high)
    }
}

/// Why a pre-vote gets a no.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// This node leads.
    #[error("this node leads")]
    Leads,
    /// This node heard from its leader (or started) within the lease.
    #[error("this node heard from its leader (or started) {} ms ago", .0.as_millis())]
    LeaderAlive(Duration),
    /// This node's log is newer than the asker's, so it would refuse the vote too.
    #[error("this node's log is newer ({mine:?} against {theirs:?})")]
    NewerLog {
        /// This node's last log entry.
        mine: Option<LogId>,
        /// The asker's.
        theirs: Option<LogId>,
    },
}

/// How this node answers a pre-vote, given its role, how long ago it heard from a leader, and
/// both logs: `Ok` is a yes.
pub fn judge(
    role: ServerState,
    heard_ago: Duration,
    lease: Duration,
    mine: Option<LogId>,
    theirs: Option<LogId>,
) -> Result<(), Refusal> {
    if role == ServerState::Leader {
        return Err(Refusal::Leads);
    }
    if heard_ago <= lease {
        return Err(Refusal::LeaderAlive(heard_ago));
    }
    if theirs < mine {
        return Err(Refusal::NewerLog { mine, theirs });
    }
    Ok(())
}

/// Answers a pre-vote from another node: `Ok` is a yes. Changes nothing on this node, except
/// that a no for the asker's older log makes this node stand at once (after a pre-vote of its
/// own): its log is the one a leader needs, the asker's leaderless quorum is waiting, and its
/// own timer may be far off (the reason of [`crate::newer_log_stands`], for pre-votes).
pub fn on_pre_vote(
    raft: &Raft,
    contact: &Contact,
    lease: Duration,
    ask: &PreVote,
) -> Result<(), String> {
    let role = raft.metrics().borrow().state;
    let mine = raft.data_metrics().borrow().last_log;
    let verdict = judge(
        role,
        contact.leader_at().elapsed(),
        lease,
        mine,
        ask.last_log,
    );
    match &verdict {
        Ok(()) => {}
        Err(why @ Refusal::NewerLog { .. }) => {
            tracing::info!(from = ask.from, %why, "pre-vote refused; standing at once");
            contact.stand.notify_one();
        }
        Err(why) => tracing::debug!(from = ask.from, %why, "pre-vote refused"),
    }
    verdict.map_err(|why| why.to_string())
}

/// Whether `yes` holds a majority of every configuration in `joint` (one configuration, or two
/// while membership changes).
pub fn is_quorum(joint: &[BTreeSet<NodeId>], yes: &BTreeSet<NodeId>) -> bool {
    joint.iter().all(|voters| {
        let granted = voters.iter().filter(|id| yes.contains(id)).count();
        granted * 2 > voters.len()
    })
}

/// Runs this node's election timer until `stop` turns true. A follower waits a lease plus a
/// random election timeout after the last of: a leader's message, a change of its vote (a vote
/// it granted, an election), role or membership, its last try. A candidate (whose election came to nothing) and
/// the only voter wait the random timeout alone; a leader waits for a change of role. Then, or
/// at once when [`on_pre_vote`] refused an older log while no leader is heard from, the node holds
/// a pre-vote and, with a quorum's yes, starts an election.
pub async fn run(
    raft: Raft,
    network: Network,
    contact: Contact,
    timing: Timing,
    mut stop: watch::Receiver<bool>,
) {
    let mut server = raft.server_metrics();
    let mut changed_at = Instant::now();
    let mut last_try = changed_at;
    let mut wait = timing.draw();
    loop {
        let due = {
            let m = server.borrow_and_update();
            let alone = m.membership_config.membership().voter_ids().count() == 1;
            let lease = match m.state {
                ServerState::Leader => None,
                ServerState::Candidate => Some(Duration::ZERO),
                _ if alone => Some(Duration::ZERO),
                _ => Some(timing.lease),
            };
            lease.map(|lease| contact.leader_at().max(last_try).max(changed_at) + lease + wait)
        };
        if due.is_none_or(|due| Instant::now() < due) {
            let timer = async {
                match due {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => return,
                changed = server.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    changed_at = Instant::now();
                    continue;
                }
                () = contact.stand.notified() => {
                    // Asked while a round or an election ran, perhaps before a leader emerged.
                    if contact.leader_at().elapsed() <= timing.lease {
                        continue;
                    }
                }
                // Due by the moments read above; a leader may have been heard from since.
                () = timer => continue,
            }
        } else if *stop.borrow() {
            return;
        }
        last_try = Instant::now();
        wait = timing.draw();
        let Some(ask) = standing(&raft) else { continue };
        tracing::info!(last_log = ?ask.last_log, "no word from a leader; holding a pre-vote");
        let quorum = holds_quorum(&raft, &network, &ask, timing.timeout.0).await;
        // Requests to stand that came in meanwhile are answered by this round; a permit left
        // stored would start a second round (and election) right after this one.
        let _ = contact.stand.notified().now_or_never();
        if !quorum {
            continue;
        }
        // A leader, a vote or a candidacy may have come along while the answers came in.
        if server.has_changed().unwrap_or(true) {
            changed_at = Instant::now();
            continue;
        }
        if contact.leader_at() >= last_try {
            continue;
        }
        tracing::info!("a quorum would vote for this node; standing for election");
        if let Err(error) = raft.trigger().elect().await {
            tracing::warn!(%error, "could not stand for election");
        }
    }
}

/// The pre-vote this node would send, when it may stand: a voter that does not lead.
fn standing(raft: &Raft) -> Option<PreVote> {
    let metrics = raft.metrics().borrow().clone();
    if metrics.state == ServerState::Leader || metrics.running_state.is_err() {
        return None;
    }
    if !is_voter(&metrics) {
        return None;
    }
    Some(PreVote {
        from: metrics.id,
        last_log: raft.data_metrics().borrow().last_log,
    })
}

/// Asks the other voters, all at once and within `limit`, whether they would vote for `ask`'s
/// node; true as soon as a quorum (this node included) said yes.
async fn holds_quorum(raft: &Raft, network: &Network, ask: &PreVote, limit: Duration) -> bool {
    let joint: Vec<BTreeSet<NodeId>> = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .get_joint_config()
        .clone();
    let mut yes = BTreeSet::from([ask.from]);
    if is_quorum(&joint, &yes) {
        return true;
    }
    let others: BTreeSet<NodeId> = joint
        .iter()
        .flatten()
        .copied()
        .filter(|id| *id != ask.from)
        .collect();
    let mut answers: FuturesUnordered<_> = others
        .into_iter()
        .filter_map(|id| Some((id, member_addr(raft, id)?)))
        .map(|(id, addr)| async move { (id, network.pre_vote(id, &addr, ask, limit).await) })
        .collect();
    while let Some((id, answer)) = answers.next().await {
        match answer {
            Ok(()) => {
                yes.insert(id);
                if is_quorum(&joint, &yes) {
                    return true;
                }
            }
            Err(why) => tracing::debug!(node = id, %why, "no pre-vote"),
        }
    }
    tracing::info!(yes = ?yes, "no quorum would vote for this node; not standing");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(400);

    fn log(term: u64, index: u64) -> Option<LogId> {
        Some(LogId::new(openraft::CommittedLeaderId::new(term, 1), index))
    }

    fn ago(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_follower_whose_leader_went_quiet_says_yes_to_an_equal_or_newer_log() {
        let follower = ServerState::Follower;
        assert!(judge(follower, ago(401), LEASE, log(3, 12), log(3, 12)).is_ok());
        assert!(judge(follower, ago(900), LEASE, log(3, 12), log(3, 13)).is_ok());
        assert!(judge(follower, ago(900), LEASE, log(3, 12), log(4, 1)).is_ok());
        assert!(judge(ServerState::Candidate, ago(900), LEASE, None, None).is_ok());
    }

    #[test]
    fn a_node_that_still_hears_from_its_leader_says_no() {
        assert_eq!(
            judge(
                ServerState::Follower,
                ago(400),
                LEASE,
                log(3, 12),
                log(3, 20),
            ),
            Err(Refusal::LeaderAlive(ago(400)))
        );
        assert!(judge(ServerState::Follower, ago(0), LEASE, None, log(3, 20)).is_err());
    }

    #[test]
    fn a_leader_says_no() {
        assert_eq!(
            judge(
                ServerState::Leader,
                ago(5_000),
                LEASE,
                log(3, 12),
                log(3, 20),
            ),
            Err(Refusal::Leads)
        );
    }

    #[test]
    fn an_older_log_gets_no() {
        let follower = ServerState::Follower;
        assert_eq!(
            judge(follower, ago(900), LEASE, log(3, 12), log(3, 11)),
            Err(Refusal::NewerLog {
                mine: log(3, 12),
                theirs: log(3, 11)
            })
        );
        // A higher index in an older term is an older log.
        assert!(judge(follower, ago(900), LEASE, log(3, 12), log(2, 50)).is_err());
        assert!(judge(follower, ago(900), LEASE, log(1, 1), None).is_err());
    }

    fn ids(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_quorum_is_a_majority_of_every_configuration() {
        let three = vec![ids(&[1, 2, 3])];
        assert!(!is_quorum(&three, &ids(&[1])));
        assert!(is_quorum(&three, &ids(&[1, 2])));
        assert!(is_quorum(&three, &ids(&[1, 2, 3])));
        // Yeses from outside the configuration do not count.
        assert!(!is_quorum(&three, &ids(&[1, 4, 5])));
        let four = vec![ids(&[1, 2, 3, 4])];
        assert!(!is_quorum(&four, &ids(&[1, 2])));
        assert!(is_quorum(&four, &ids(&[1, 2, 3])));
        // Joint: old {1,2,3}, new {3,4,5}; a majority of one is not enough.
        let joint = vec![ids(&[1, 2, 3]), ids(&[3, 4, 5])];
        assert!(!is_quorum(&joint, &ids(&[1, 2])));
        assert!(!is_quorum(&joint, &ids(&[1, 2, 4])));
        assert!(is_quorum(&joint, &ids(&[1, 3, 4])));
        assert!(is_quorum(&[ids(&[1])], &ids(&[1])));
    }

    #[test]
    fn contact_keeps_the_last_word_from_a_leader() {
        let contact = Contact::default();
        let start = contact.leader_at();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            contact.leader_at(),
            start,
            "a start counts as a word from a leader"
        );
        contact.heard_from_leader();
        assert!(contact.leader_at() >= start + Duration::from_millis(20));
    }
}
