//! A running node: its Raft instance, its state machine, and the two things every client-facing
//! handler needs — propose a command, or read linearizably.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use baton_rpc::error::{infra, infra_status, not_leader_status, refusal_status};
use baton_statemachine::{Command, Envelope, Origin, Reply, Response};
use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use openraft::BasicNode;
use tonic::{Code, Status};

use crate::stamp;
use crate::store::{Applied, StateMachineStore};
use crate::types::{NodeId, Raft};

/// Shared handle to this node's consensus and state.
pub struct Node {
    /// This node's id.
    pub id: NodeId,
    /// The address peers and clients reach this node at.
    pub addr: String,
    /// The Raft instance.
    pub raft: Raft,
    /// The applied state.
    pub state_machine: StateMachineStore,
    /// The highest term in which this node, as leader, has committed an entry of its own.
    read_barrier_term: AtomicU64,
}

/// A shareable [`Node`].
pub type NodeRef = Arc<Node>;

impl Node {
    /// A node over a started Raft instance and its state machine.
    pub fn new(id: NodeId, addr: String, raft: Raft, state_machine: StateMachineStore) -> Self {
        Self {
            id,
            addr,
            raft,
            state_machine,
            read_barrier_term: AtomicU64::new(0),
        }
    }

    /// Stamps `command`, proposes it, waits for it to be committed and applied, and returns the
    /// state machine's reply — or the refusal / infrastructure failure as a gRPC status.
    pub async fn propose(&self, origin: Option<Origin>, command: Command) -> Result<Reply, Status> {
        let name = command.name();
        let envelope = Envelope {
            stamp: stamp::stamp(),
            origin,
            command,
        };
        let written = tokio::select! {
            written = self.raft.client_write(envelope) => written.map_err(write_error)?,
            leader = self.deposed() => return Err(not_leader_status(leader)),
        };
        let index = written.log_id.index;
        match written.data {
            Response::Answer(Ok(reply)) => {
                tracing::debug!(command = name, index, "applied");
                Ok(reply)
            }
            Response::Answer(Err(refusal)) => {
                tracing::debug!(command = name, index, code = refusal.code(), "refused");
                Err(refusal_status(&refusal))
            }
            Response::SessionExpired => Err(infra_status(
                Code::Aborted,
                infra::SESSION_EXPIRED,
                "this request is older than the store's session window; its outcome is unknown",
            )),
        }
    }

    /// Confirms leadership with a quorum (read index), waits until that index is applied, then
    /// runs `read` on the applied state. The result is linearizable.
    pub async fn read<T>(&self, read: impl FnOnce(&Applied) -> T) -> Result<T, Status> {
        self.commit_in_current_term().await?;
        self.raft.ensure_linearizable().await.map_err(|e| match e {
            RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward)) => {
                not_leader(forward)
            }
            RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e)) => {
                infra_status(Code::Unavailable, infra::NO_LEADER, e.to_string())
            }
            RaftError::Fatal(fatal) => {
                infra_status(Code::Unavailable, infra::INTERNAL, fatal.to_string())
            }
        })?;
        let applied = self.state_machine.read();
        Ok(read(&applied))
    }

    /// Resolves once another node is known to lead, with its id and address.
    ///
    /// A write pending on a leader that gets deposed is not always answered by openraft 0.9: when
    /// the old leader catches up by snapshot, its uncommitted entries are purged without their
    /// waiters being told (regression test `t79_issue_old_leader_write_hangs`). Answering
    /// `NOT_LEADER` as soon as a new leader is known is safe: the client retries at the leader with
    /// the same `(client_id, seq)`, so if the entry did survive and commit, the session table
    /// answers with its original response.
    async fn deposed(&self) -> Option<(NodeId, String)> {
        let mut metrics = self.raft.metrics();
        loop {
            let leader = metrics.borrow_and_update().current_leader;
            if let Some(leader) = leader.filter(|leader| *leader != self.id) {
                return Some((leader, self.member_addr(leader).unwrap_or_default()));
            }
            if metrics.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Makes sure this leader has committed an entry of its current term before it serves reads.
    ///
    /// After a restart a leader can resume its term with the commit index it last saved, which
    /// may lag behind entries that were committed (and acknowledged to clients) before the
    /// crash; openraft 0.9 appends no new entry in that case, so its read index would be that
    /// stale commit index and a read could miss an acknowledged write. Committing one entry of
    /// its own (a sweep, harmless at any time) advances the commit index past everything before
    /// it, as the Raft paper requires of a leader before it answers read-only queries (§8).
    async fn commit_in_current_term(&self) -> Result<(), Status> {
        let term = self.raft.metrics().borrow().current_term;
        if self.read_barrier_term.load(Ordering::Acquire) >= term {
            return Ok(());
        }
        let envelope = Envelope {
            stamp: stamp::stamp(),
            origin: None,
            command: Command::Sweep,
        };
        let written = self
            .raft
            .client_write(envelope)
            .await
            .map_err(write_error)?;
        self.read_barrier_term
            .fetch_max(written.log_id.leader_id.term, Ordering::AcqRel);
        Ok(())
    }

    /// The address of a member, from the current membership.
    pub fn member_addr(&self, id: NodeId) -> Option<String> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics
            .membership_config
            .membership()
            .get_node(&id)
            .map(|node| node.addr.clone())
    }
}

fn not_leader(forward: ForwardToLeader<NodeId, BasicNode>) -> Status {
    match (forward.leader_id, forward.leader_node) {
        (Some(id), Some(node)) => not_leader_status(Some((id, node.addr))),
        _ => infra_status(
            Code::Unavailable,
            infra::NO_LEADER,
            "no leader is known right now",
        ),
    }
}

/// A failed Raft write (a client command or a membership change) as a gRPC status.
pub(crate) fn write_error(error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> Status {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => not_leader(forward),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            infra_status(Code::FailedPrecondition, infra::MEMBERSHIP, e.to_string())
        }
        RaftError::Fatal(fatal) => {
            infra_status(Code::Unavailable, infra::INTERNAL, fatal.to_string())
        }
    }
}
