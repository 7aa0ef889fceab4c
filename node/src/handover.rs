//! Leadership transfer: the leader hands its role to a caught-up voter.
//!
//! openraft 0.9 has no transfer API, so this follows the Raft thesis (§3.10) with the tools 0.9
//! offers:
//!
//! 1. The leader closes its admission gate (new client requests are refused with a retryable
//!    status) and lets the admitted ones finish, so it proposes nothing new.
//! 2. It stops its heartbeats. Followers refuse votes while their leader lease (the maximum
//!    election timeout since they last heard from the leader) runs; without heartbeats it runs out.
//! 3. It waits until the target's log matches its own (replication continues for in-flight
//!    entries).
//! 4. It sends the target `TimeoutNow`, naming the moment the followers' leases will have run
//!    out. The target checks at once that it is a voter, in the leader's term, with the leader's
//!    last log entry (so an unreachable or unfit target is known without waiting), and at that
//!    moment, if its term has not moved, starts an election. It wins it with the next term before
//!    any other follower's election timer (lease plus a random timeout) fires, because every voter
//!    sees a candidate whose log is at least as new as its own.
//! 5. The old leader sees the higher term, becomes a follower, and turns heartbeats back on.
//!
//! Guarantees: safety is Raft's own (the election is an ordinary one; a target that is behind
//! simply loses), and no acknowledged write can be lost. Liveness is best effort: if the target
//! loses (another node's timer fired first, a message was lost), another attempt is made; if all
//! fail the cluster falls back to an ordinary election, which is what would have happened had
//! the leader simply stopped.

use std::time::Duration;

use baton_rpc::error::{infra, infra_status, not_leader_status, refusal_status};
use baton_statemachine::Refusal;
use openraft::ServerState;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::admission::{Admission, Closed};
use crate::network::{Declined, Network};
use crate::node::{is_voter, Node};
use crate::pre_vote::Contact;
use crate::types::{LogId, NodeId, Raft};

/// How many elections the leader asks the target for before it gives up.
const ATTEMPTS: usize = 3;

/// How long to wait for the target's log to match the leader's.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(5);

/// Margin added to the followers' lease, for timers and message delays.
const LEASE_MARGIN: Duration = Duration::from_millis(50);

/// The longest a handover runs, drain included. Below the client's wait
/// ([`baton_rpc::HANDOVER_WAIT`]), so a caller hears how it ended rather than a timeout.
const HANDOVER_LIMIT: Duration = Duration::from_secs(25);

/// Turns heartbeats back on and reopens the gate when the handover ends, however it ends: also
/// when the caller goes away mid-way (its gRPC call dropped) or a step panics. Left closed, the
/// node would refuse every client request and, leading again, send no heartbeats, so its
/// followers would unseat it over and over.
struct Restore<'a> {
    node: &'a Node,
    admission: &'a Admission,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        self.node.raft.runtime_config().heartbeat(true);
        self.admission.reopen();
    }
}

/// The `TimeoutNow` message: "start an election now", from the leader to its chosen successor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimeoutNow {
    /// The leader that asks.
    pub from: NodeId,
    /// The leader's term.
    pub term: u64,
    /// The leader's last log entry; the target must have it.
    pub last_log: Option<LogId>,
    /// Start the election this long after receiving the message: by then the other followers'
    /// leader leases have run out, so they grant their votes.
    pub after_ms: u64,
}

/// A completed handover.
#[derive(Debug, Clone)]
pub struct HandedOver {
    /// The new leader.
    pub leader: NodeId,
    /// The new leader's term.
    pub term: u64,
    /// How long the handover took from the gate closing to the new leader being known.
    pub took: Duration,
}

/// Why a handover did not happen.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// This node does not lead.
    #[error("this node is not the leader")]
    NotLeader(Option<(NodeId, String)>),
    /// The requested target is not another voter.
    #[error("node {0} is not another voter of the cluster")]
    BadTarget(NodeId),
    /// There is nobody to hand over to.
    #[error("the cluster has no other voter to hand leadership to")]
    NoOtherVoter,
    /// The handover was tried and did not complete.
    #[error("{0}")]
    Failed(String),
}

impl HandoverError {
    /// The error as the gRPC status a `TransferLeader` call answers.
    pub fn to_status(&self) -> Status {
        match self {
            HandoverError::NotLeader(leader) => not_leader_status(leader.clone()),
            HandoverError::BadTarget(_) => {
                refusal_status(&Refusal::invalid("to", "must be another voter's id"))
            }
            HandoverError::NoOtherVoter => infra_status(
                Code::FailedPrecondition,
                infra::HANDOVER_FAILED,
                self.to_string(),
            ),
            HandoverError::Failed(_) => {
                infra_status(Code::Unavailable, infra::HANDOVER_FAILED, self.to_string())
            }
        }
    }
}

/// Hands leadership from `node` to `to` (or to the most caught-up other voter), waiting for the
/// admitted client requests at most `drain`. The gate is reopened afterwards unless a shutdown
/// closed it.
pub async fn hand_over(
    node: &Node,
    admission: &Admission,
    network: &Network,
    to: Option<NodeId>,
    drain: Duration,
) -> Result<HandedOver, HandoverError> {
    let started = Instant::now();
    let Some(_slot) = admission.handover_slot() else {
        return Err(HandoverError::Failed(
            "another leadership handover is in progress".into(),
        ));
    };
    let voters = other_voters(node)?;
    if to == Some(node.id) {
        // Already where it was asked to be.
        let term = node.raft.metrics().borrow().current_term;
        return Ok(HandedOver {
            leader: node.id,
            term,
            took: started.elapsed(),
        });
    }
    if let Some(to) = to {
        if !voters.contains(&to) {
            return Err(HandoverError::BadTarget(to));
        }
    }
    let _restore = Restore { node, admission };
    admission.close(Closed::HandingOver);
    let still_running = admission.drain(drain).await;
    if still_running > 0 {
        tracing::warn!(
            still_running,
            "handing over with client requests still in flight"
        );
    }
    node.raft.runtime_config().heartbeat(false);
    let left = HANDOVER_LIMIT.saturating_sub(started.elapsed());
    let (leader, term) = tokio::time::timeout(left, attempts(node, network, to, &voters))
        .await
        .map_err(|_| {
            HandoverError::Failed(format!(
                "leadership was not handed over within {HANDOVER_LIMIT:?}"
            ))
        })??;
    let took = started.elapsed();
    tracing::info!(leader, term, ?took, "handed leadership over");
    Ok(HandedOver { leader, term, took })
}

/// The voters other than this node, or why there is nothing to hand over.
fn other_voters(node: &Node) -> Result<Vec<NodeId>, HandoverError> {
    let metrics = node.raft.metrics().borrow().clone();
    if metrics.state != ServerState::Leader {
        let leader = metrics
            .current_leader
            .filter(|leader| *leader != node.id)
            .map(|leader| (leader, node.member_addr(leader).unwrap_or_default()));
        return Err(HandoverError::NotLeader(leader));
    }
    let voters: Vec<NodeId> = metrics
        .membership_config
        .membership()
        .voter_ids()
        .filter(|id| *id != node.id)
        .collect();
    if voters.is_empty() {
        return Err(HandoverError::NoOtherVoter);
    }
    Ok(voters)
}

async fn attempts(
    node: &Node,
    network: &Network,
    to: Option<NodeId>,
    voters: &[NodeId],
) -> Result<(NodeId, u64), HandoverError> {
    let lease = Duration::from_millis(node.raft.config().election_timeout_max);
    let mut candidates = voters.to_vec();
    let mut last_error = String::new();
    for attempt in 1..=ATTEMPTS {
        let target = match to {
            Some(to) => to,
            None => match most_caught_up(node, &candidates) {
                Some(target) => target,
                None => break,
            },
        };
        match attempt_once(node, network, target, lease).await {
            Ok(done) => return Ok(done),
            Err(Step::Deposed(leader, term)) => return Ok((leader, term)),
            Err(Step::Failed(why)) => {
                tracing::warn!(attempt, target, %why, "handover attempt failed");
                last_error = format!("handing leadership to node {target} failed: {why}");
                // Without a chosen target, the next attempt tries another voter.
                candidates.retain(|id| *id != target);
            }
        }
    }
    Err(HandoverError::Failed(last_error))
}

/// How one attempt ended when it did not end with the chosen target leading.
enum Step {
    /// Another node leads now anyway (this node is deposed): that is a handover too.
    Deposed(NodeId, u64),
    /// Try again.
    Failed(String),
}

async fn attempt_once(
    node: &Node,
    network: &Network,
    target: NodeId,
    lease: Duration,
) -> Result<(NodeId, u64), Step> {
    let last_log = wait_caught_up(node, target).await?;
    let term = node.raft.metrics().borrow().current_term;
    let addr = node
        .member_addr(target)
        .ok_or_else(|| Step::Failed(format!("node {target} has no address")))?;
    // Heartbeats are off: one lease from now, every follower that has heard nothing since grants
    // votes again (one still taking entries that were in flight may refuse a while longer).
    let after = lease + LEASE_MARGIN;
    let message = TimeoutNow {
        from: node.id,
        term,
        last_log,
        after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
    };
    match network.timeout_now(target, &addr, &message).await {
        Ok(()) => {}
        Err(Declined::Refused(why)) => return Err(Step::Failed(why)),
        // The target may have got the message and will stand: see whether it wins before
        // calling the attempt failed, or the caller would hear "failed" about a handover that
        // happened.
        Err(Declined::Unanswered(why)) => {
            tracing::warn!(target, %why, "no answer to TimeoutNow; waiting for an election anyway")
        }
    }
    // The target campaigns after `after`; it wins within a few round trips, well inside a lease.
    let limit = after + lease * 2 + Duration::from_secs(1);
    match wait_new_leader(node, limit).await {
        Some((leader, term)) if leader == target => Ok((leader, term)),
        Some((leader, term)) => Err(Step::Deposed(leader, term)),
        None => Err(Step::Failed(format!(
            "node {target} did not win an election within {limit:?}"
        ))),
    }
}

/// The voter whose replicated log reaches furthest (none when `voters` is empty).
fn most_caught_up(node: &Node, voters: &[NodeId]) -> Option<NodeId> {
    let metrics = node.raft.metrics().borrow().clone();
    let matched = |id: &NodeId| {
        metrics
            .replication
            .as_ref()
            .and_then(|replication| replication.get(id).copied().flatten())
            .map(|log_id| log_id.index)
    };
    voters
        .iter()
        .copied()
        .max_by_key(|id| (matched(id), std::cmp::Reverse(*id)))
}

/// Waits until `target` has replicated the leader's last log entry; returns that entry.
async fn wait_caught_up(node: &Node, target: NodeId) -> Result<Option<LogId>, Step> {
    let deadline = Instant::now() + CATCH_UP_LIMIT;
    let mut metrics = node.raft.metrics();
    loop {
        let (state, last, matched, leader) = {
            let m = metrics.borrow_and_update();
            let matched = m
                .replication
                .as_ref()
                .and_then(|replication| replication.get(&target).copied().flatten());
            (m.state, m.last_log_index, matched, m.current_leader)
        };
        if state != ServerState::Leader {
            let term = metrics.borrow().current_term;
            return match leader.filter(|leader| *leader != node.id) {
                Some(leader) => Err(Step::Deposed(leader, term)),
                None => Err(Step::Failed("this node stopped leading".into())),
            };
        }
        if matched.map(|id| id.index) == last {
            return Ok(matched);
        }
        let changed = tokio::time::timeout_at(deadline, metrics.changed()).await;
        match changed {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Step::Failed("raft stopped".into())),
            Err(_) => {
                return Err(Step::Failed(format!(
                    "node {target} did not catch up within {CATCH_UP_LIMIT:?} \
                     (it has {:?}, the leader {last:?})",
                    matched.map(|id| id.index)
                )))
            }
        }
    }
}

/// Waits until a node other than this one is known to lead; returns it and its term.
async fn wait_new_leader(node: &Node, limit: Duration) -> Option<(NodeId, u64)> {
    let mut metrics = node.raft.metrics();
    let found = tokio::time::timeout(limit, async {
        loop {
            let (leader, term) = {
                let m = metrics.borrow_and_update();
                (m.current_leader, m.current_term)
            };
            if let Some(leader) = leader.filter(|leader| *leader != node.id) {
                return Some((leader, term));
            }
            if metrics.changed().await.is_err() {
                return None;
            }
        }
    })
    .await;
    found.ok().flatten()
}

/// Handles a `TimeoutNow` at the target: if this node is a voter that follows the asking
/// leader in its term, holds its last log entry and is not leaving, it starts an election
/// `after_ms` from now (unless its term has moved on by then, or it started leaving) and answers
/// at once; otherwise it says why not.
pub async fn on_timeout_now(
    raft: &Raft,
    contact: &Contact,
    message: TimeoutNow,
) -> Result<(), String> {
    if contact.is_leaving() {
        return Err("this node is shutting down".into());
    }
    let metrics = raft.metrics().borrow().clone();
    let me = metrics.id;
    if !is_voter(&metrics) {
        return Err(format!("node {me} is not a voter"));
    }
    if metrics.current_term != message.term {
        return Err(format!(
            "node {me} is in term {}, the leader asked in term {}",
            metrics.current_term, message.term
        ));
    }
    // Only the leader this node follows may hand over to it: a message from any other node (a
    // deposed leader's late one, a peer's bug) would disrupt a term that stands.
    if message.from == me || metrics.current_leader != Some(message.from) {
        return Err(format!(
            "node {me} does not follow node {} in term {} (its leader: {:?})",
            message.from, message.term, metrics.current_leader
        ));
    }
    let mine = raft.data_metrics().borrow().last_log;
    if mine < message.last_log {
        return Err(format!(
            "node {me} has not caught up (last log {mine:?}, the leader's {:?})",
            message.last_log
        ));
    }
    tracing::info!(
        from = message.from,
        term = message.term,
        after_ms = message.after_ms,
        "asked to take over leadership"
    );
    let (raft, contact) = (raft.clone(), contact.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(message.after_ms)).await;
        if raft.metrics().borrow().current_term != message.term {
            tracing::info!("the term moved on before the handover election; not campaigning");
            return;
        }
        if contact.is_leaving() {
            tracing::info!("this node started leaving; not campaigning");
            return;
        }
        tracing::info!("starting the handover election");
        if let Err(error) = raft.trigger().elect().await {
            tracing::warn!(%error, "could not start the handover election");
        }
    });
    Ok(())
}
