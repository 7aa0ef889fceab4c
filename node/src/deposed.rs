//! A Raft write pending on a node that has lost its leadership is answered `NOT_LEADER`.
//!
//! openraft 0.9 does not always answer a write pending on a leader that gets deposed: when the
//! old leader catches up by snapshot, its uncommitted entries are purged without their waiters
//! being told (regression tests `t79_issue_old_leader_write_hangs` for a client write and
//! `t79_issue_old_leader_read_hangs` for the entry a fresh leader commits before its first read).
//! Every write this node proposes — client batches, the read barrier, the read-index nudge,
//! membership changes — is raced against `deposed` through `unless_deposed`.
//!
//! Answering `NOT_LEADER` as soon as a new leader is known is safe: the entry's fate is in the
//! log, not in the answer. A client retries at the leader with the same `(client_id, seq)`, so if
//! the entry did survive and commit, the session table answers with its original response; a
//! read retried at the leader is confirmed there; a membership change retried is judged against
//! the membership the new leader has.

use std::future::Future;

use baton_rpc::error::not_leader_status;
use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;
use tonic::Status;

use crate::node::{member_addr, write_error};
use crate::types::{NodeId, Raft};

/// A Raft write's outcome as an answer (its error as [`write_error`] says), unless another node is
/// known to lead first: then `NOT_LEADER` naming it.
pub(crate) async fn unless_deposed<T>(
    raft: &Raft,
    write: impl Future<Output = Result<T, WriteError>>,
) -> Result<T, Status> {
    tokio::select! {
        written = write => written.map_err(write_error),
        leader = deposed(raft) => Err(not_leader_status(leader)),
    }
}

/// What a refused Raft write (a client command, a membership change) says.
type WriteError = RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>;

/// Resolves once a node other than this one is known to lead, with its id and address.
async fn deposed(raft: &Raft) -> Option<(NodeId, String)> {
    let mut metrics = raft.metrics();
    loop {
        let (id, leader) = {
            let metrics = metrics.borrow_and_update();
            (metrics.id, metrics.current_leader)
        };
        if let Some(leader) = leader.filter(|leader| *leader != id) {
            return Some((leader, member_addr(raft, leader).unwrap_or_default()));
        }
        if metrics.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}
