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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
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

/// When this node last heard from a leader, whether a refused asker wants it to stand, and
/// whether it is leaving; shared by the Raft connections that see these happen, by [`run`] and
/// [`judge`], which act on them, and by the shutdown.
#[derive(Clone, Default)]
pub struct Contact {
    moments: Arc<Mutex<Moments>>,
    /// Set when the node starts leaving: from then on it never stands.
    leaving: Arc<AtomicBool>,
    /// Wakes [`run`] to look at a stand request.
    wake: Arc<Notify>,
}

struct Moments {
    /// The last leader message this node accepted, or the moment it stopped leading itself (or
    /// its start).
    leader: Instant,
    /// Whether this node led when its role was last noted.
    leading: bool,
    /// When this node was first noted leading in its current run as leader.
    led_since: Option<Instant>,
    /// The last time a pre-vote was refused for the asker's older log (or its start).
    asked_to_stand: Instant,
}

impl Default for Moments {
    /// A node that just started counts as having heard from a leader now: it waits one lease
    /// before it says yes to anyone, as it would had it been running all along.
    fn default() -> Self {
        let now = Instant::now();
        Self {
            leader: now,
            leading: false,
            led_since: None,
            asked_to_stand: now,
        }
    }
}

impl Contact {
    fn moments(&self) -> MutexGuard<'_, Moments> {
        self.moments.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This node is taking a message from the leader of its term (entries, a heartbeat, a
    /// snapshot).
    pub fn heard_from_leader(&self) {
        self.moments().leader = Instant::now();
    }

    /// Notes this node's role. A node that stops leading counts as having heard from a leader
    /// at that moment: it was one until then, and another has just been elected (or is being),
    /// so for the next lease it refuses pre-votes like any follower of a live leader. Otherwise
    /// its last word from a leader would date from before its own election, and it would say yes
    /// to a candidate that then unseats the new leader.
    pub fn note_role(&self, leading: bool) {
        let mut moments = self.moments();
        if moments.leading && !leading {
            moments.leader = Instant::now();
        }
        if leading != moments.leading {
            moments.led_since = leading.then(Instant::now);
        }
        moments.leading = leading;
    }

    /// Since when this node leads, as last noted (`None` when it does not).
    pub fn leading_since(&self) -> Option<Instant> {
        self.moments().led_since
    }

    /// When this node last heard from a leader (or started).
    pub fn leader_at(&self) -> Instant {
        self.moments().leader
    }

    /// A pre-vote was refused for the asker's older log: this node should stand now.
    fn ask_to_stand(&self) {
        self.moments().asked_to_stand = Instant::now();
        self.wake.notify_one();
    }

    fn asked_to_stand_at(&self) -> Instant {
        self.moments().asked_to_stand
    }

    /// The node starts leaving: it stands for election no more (it still answers votes and
    /// pre-votes). Also read by the elections started on purpose ([`crate::newer_log_stands`],
    /// the handover's `TimeoutNow`).
    pub fn leave(&self) {
        self.leaving.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Whether the node is leaving.
    pub fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Relaxed)
    }
}

/// The election timings, from the Raft settings.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long after a leader's last message a follower still counts it as alive (openraft's
    /// leader lease: the largest election timeout).
    pub lease: Duration,
    /// The range a node draws its election timeout from, anew after every try.
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
    // Also here, not only in `run`: a node that just stepped down must count it before it
    // answers, whether or not `run` has looked at the role since.
    contact.note_role(role == ServerState::Leader);
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
            contact.ask_to_stand();
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

/// What decides when a node that does not lead stands next.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// When it last heard from a leader (or started).
    pub leader_at: Instant,
    /// When its vote, role or membership last changed (a vote it granted, a candidacy, a new
    /// leader, a new configuration).
    pub changed_at: Instant,
    /// Whether its vote is a leader's (committed) rather than a candidate's.
    pub vote_committed: bool,
    /// Whether it is the only voter of its configuration.
    pub alone: bool,
    /// When it last tried (held a pre-vote or found it could not).
    pub last_try: Instant,
    /// When a pre-vote was last refused for the asker's older log.
    pub asked_to_stand: Instant,
}

/// When a node that does not lead stands next, following openraft's own timer: a random
/// election timeout (`wait`) after the last change of its vote, plus the lease when that vote is
/// a leader's, and never within a lease plus `wait` of a leader's last message; not before
/// `wait` after its last try either. The only voter skips the leases.
///
/// A request to stand is due at once if it came after the last try, more than a lease after a
/// leader's last message, and after the last change of this node's vote — for a candidate's
/// vote (its own or one it granted), more than the shortest election timeout after it: that
/// election had its chance.
pub fn due(clock: &Clock, timing: &Timing, wait: Duration) -> Instant {
    let asked = clock.asked_to_stand;
    let vote_settled = if clock.vote_committed {
        clock.changed_at
    } else {
        clock.changed_at + timing.timeout.0
    };
    if asked > clock.last_try && asked > clock.leader_at + timing.lease && asked > vote_settled {
        return asked;
    }
    let lease = if clock.alone {
        Duration::ZERO
    } else {
        timing.lease
    };
    let vote_lease = if clock.vote_committed {
        lease
    } else {
        Duration::ZERO
    };
    let quiet = (clock.leader_at + lease)
        .max(clock.changed_at + vote_lease)
        .max(clock.last_try);
    quiet + wait
}

/// Runs this node's election timer until `stop` turns true: when [`due`] (or at once when
/// [`on_pre_vote`] refused an older log while no leader is heard from), a voter that does not
/// lead holds a pre-vote and, with a quorum's yes, starts an election. A leader waits for a
/// change of its vote, role or membership; a leaving node does nothing.
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
        if server.has_changed().unwrap_or(true) {
            changed_at = Instant::now();
        }
        let due = {
            let m = server.borrow_and_update();
            contact.note_role(m.state == ServerState::Leader);
            let clock = Clock {
                leader_at: contact.leader_at(),
                changed_at,
                vote_committed: m.vote.is_committed(),
                alone: m.membership_config.membership().voter_ids().count() == 1,
                last_try,
                asked_to_stand: contact.asked_to_stand_at(),
            };
            (m.state != ServerState::Leader && !contact.is_leaving())
                .then(|| due(&clock, &timing, wait))
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
                }
                () = contact.wake.notified() => {}
                () = timer => {}
            }
            // Whatever woke it, the moments are read anew.
            continue;
        }
        if *stop.borrow() {
            return;
        }
        last_try = Instant::now();
        wait = timing.draw();
        let Some(ask) = standing(&raft) else { continue };
        tracing::info!(last_log = ?ask.last_log, "no word from a leader; holding a pre-vote");
        if !holds_quorum(&raft, &network, &ask, timing.lease).await {
            // The round may have lasted its whole limit: the next waits a timeout from its end.
            last_try = Instant::now();
            continue;
        }
        // A leader, a vote or a candidacy may have come along while the answers came in (the
        // loop's top records it), or the node may have started leaving.
        if server.has_changed().unwrap_or(true) {
            continue;
        }
        if contact.leader_at() >= last_try || contact.is_leaving() || *stop.borrow() {
            continue;
        }
        tracing::info!("a quorum would vote for this node; standing for election");
        if let Err(error) = raft.trigger().elect().await {
            tracing::warn!(%error, "could not stand for election");
        }
        // openraft publishes the candidacy once its vote is flushed; until then the metrics
        // still show the old vote, and a stand request from before would look unanswered and
        // start a second election on top of this one.
        let _ = tokio::time::timeout(timing.lease, server.changed()).await;
        changed_at = Instant::now();
        last_try = changed_at;
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

    const TIMING: Timing = Timing {
        lease: Duration::from_millis(400),
        timeout: (Duration::from_millis(200), Duration::from_millis(400)),
    };
    const WAIT: Duration = Duration::from_millis(300);

    /// A follower of a leader (committed vote) that heard from it at 1,000 ms, whose vote changed
    /// at 500 ms and that never tried; `at(n)` is n ms after the clock's origin.
    fn follower() -> (Clock, impl Fn(u64) -> Instant) {
        let origin = Instant::now();
        let at = move |ms: u64| origin + Duration::from_millis(ms);
        let clock = Clock {
            leader_at: at(1_000),
            changed_at: at(500),
            vote_committed: true,
            alone: false,
            last_try: at(0),
            asked_to_stand: at(0),
        };
        (clock, at)
    }

    #[test]
    fn a_follower_stands_a_lease_and_a_timeout_after_its_leader_went_quiet() {
        let (clock, at) = follower();
        assert_eq!(due(&clock, &TIMING, WAIT), at(1_000 + 400 + 300));
        // A newer leader's vote (changed at 2,000 ms) counts from then, before its first message.
        let newer = Clock {
            changed_at: at(2_000),
            ..clock
        };
        assert_eq!(due(&newer, &TIMING, WAIT), at(2_000 + 400 + 300));
        // After a try that found no quorum, the next comes a timeout later, not a lease more.
        let tried = Clock {
            last_try: at(3_000),
            ..clock
        };
        assert_eq!(due(&tried, &TIMING, WAIT), at(3_000 + 300));
    }

    #[test]
    fn a_candidates_vote_waits_only_a_timeout() {
        let (clock, at) = follower();
        // Its own candidacy, or a vote it granted another candidate, at 5,000 ms.
        let candidate = Clock {
            changed_at: at(5_000),
            vote_committed: false,
            ..clock
        };
        assert_eq!(due(&candidate, &TIMING, WAIT), at(5_000 + 300));
        // Still never within a lease and a timeout of a leader's message.
        let recent = Clock {
            leader_at: at(4_900),
            ..candidate
        };
        assert_eq!(due(&recent, &TIMING, WAIT), at(4_900 + 400 + 300));
    }

    #[test]
    fn the_only_voter_skips_the_leases() {
        let (clock, at) = follower();
        let alone = Clock {
            alone: true,
            ..clock
        };
        assert_eq!(due(&alone, &TIMING, WAIT), at(1_000 + 300));
    }

    #[test]
    fn a_request_to_stand_is_due_at_once_only_when_nothing_speaks_against_it() {
        let (clock, at) = follower();
        let asked = Clock {
            asked_to_stand: at(1_500),
            ..clock
        };
        assert_eq!(due(&asked, &TIMING, WAIT), at(1_500));
        // A leader heard from within the lease before the request.
        let heard = Clock {
            asked_to_stand: at(1_300),
            ..clock
        };
        assert_eq!(due(&heard, &TIMING, WAIT), at(1_700));
        // Answered by a try that came after it.
        let answered = Clock {
            asked_to_stand: at(1_500),
            last_try: at(1_600),
            ..clock
        };
        assert_eq!(due(&answered, &TIMING, WAIT), at(1_900));
        // A candidacy (or a granted vote) younger than the shortest election timeout.
        let campaigning = Clock {
            asked_to_stand: at(1_500),
            changed_at: at(1_400),
            vote_committed: false,
            ..clock
        };
        assert_eq!(due(&campaigning, &TIMING, WAIT), at(1_700));
        let lost = Clock {
            changed_at: at(1_250),
            ..campaigning
        };
        assert_eq!(due(&lost, &TIMING, WAIT), at(1_500));
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

    #[test]
    fn a_node_that_stops_leading_counts_as_having_just_heard_from_a_leader() {
        let contact = Contact::default();
        contact.note_role(true);
        let elected = contact.leader_at();
        let led_since = contact.leading_since();
        assert!(led_since.is_some());
        std::thread::sleep(Duration::from_millis(20));
        contact.note_role(true);
        assert_eq!(contact.leader_at(), elected, "leading on changes nothing");
        assert_eq!(
            contact.leading_since(),
            led_since,
            "nor does it restart the lead"
        );
        contact.note_role(false);
        assert_eq!(contact.leading_since(), None);
        let stepped_down = contact.leader_at();
        assert!(stepped_down >= elected + Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(20));
        contact.note_role(false);
        assert_eq!(
            contact.leader_at(),
            stepped_down,
            "following on changes nothing"
        );
    }
}
