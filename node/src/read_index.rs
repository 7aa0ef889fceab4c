//! Read-index batching: concurrent linearizable reads share one leadership confirmation.
//!
//! openraft's `ensure_linearizable` sends a heartbeat round to a quorum per call. Under load
//! that is one round of RPCs per read. Here reads queue for the next round instead: one task
//! runs rounds back to back, and every read waiting when a round starts is answered by it.
//! That is still linearizable: a round that starts after a read arrived confirms a read index at
//! least as new as any write acknowledged before the read began, and waits until that index is
//! applied.
//!
//! A round that finds no quorum also appends an empty entry (one at a time): a leader whose links
//! are too slow for any answer to come back in time, serving reads only, has nothing to commit,
//! and its followers judge a leader stalled only by entries it fails to commit
//! ([`crate::stalled_leader`]). The empty entry gives them one; it changes no state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use baton_rpc::error::{infra, infra_status};
use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use crate::node::not_leader;
use crate::types::{Batch, Raft};

/// The queue of reads waiting for the next confirmation round; clones share it.
#[derive(Clone)]
pub struct ReadIndex {
    queue: mpsc::UnboundedSender<oneshot::Sender<Result<(), Status>>>,
}

impl ReadIndex {
    /// Starts the task that runs confirmation rounds for `raft`.
    pub fn start(raft: Raft) -> Self {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(round_loop(raft, waiting));
        Self { queue }
    }

    /// Resolves once this node has confirmed with a quorum, in a round that began after this
    /// call, that it leads, and has applied everything committed when the round began.
    pub async fn confirm(&self) -> Result<(), Status> {
        let (done, confirmed) = oneshot::channel();
        if self.queue.send(done).is_err() {
            return Err(stopped());
        }
        confirmed.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn stopped() -> Status {
    infra_status(
        Code::Unavailable,
        infra::SHUTTING_DOWN,
        "this node is shutting down",
    )
}

async fn round_loop(
    raft: Raft,
    mut waiting: mpsc::UnboundedReceiver<oneshot::Sender<Result<(), Status>>>,
) {
    let nudging = Arc::new(AtomicBool::new(false));
    while let Some(first) = waiting.recv().await {
        let mut round = vec![first];
        while let Ok(next) = waiting.try_recv() {
            round.push(next);
        }
        let result = raft
            .ensure_linearizable()
            .await
            .map(|_| ())
            .map_err(|e| match e {
                RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward)) => {
                    not_leader(forward)
                }
                RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e)) => {
                    nudge(&raft, &nudging);
                    infra_status(Code::Unavailable, infra::NO_LEADER, e.to_string())
                }
                RaftError::Fatal(fatal) => {
                    infra_status(Code::Unavailable, infra::INTERNAL, fatal.to_string())
                }
            });
        for done in round {
            let _ = done.send(result.clone());
        }
    }
}

/// Appends an empty entry unless one is still waiting (`nudging`): it resolves once committed,
/// or once this node no longer leads.
fn nudge(raft: &Raft, nudging: &Arc<AtomicBool>) {
    if nudging.swap(true, Ordering::AcqRel) {
        return;
    }
    let (raft, nudging) = (raft.clone(), nudging.clone());
    tokio::spawn(async move {
        tracing::debug!("no quorum answered a read-index round; appending an empty entry");
        let _ = raft.client_write(Batch(Vec::new())).await;
        nudging.store(false, Ordering::Release);
    });
}
