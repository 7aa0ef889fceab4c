//! Read-index batching: concurrent linearizable reads share one leadership confirmation.
//!
//! openraft's `ensure_linearizable` sends a heartbeat round to a quorum per call. Under load
//! that is one round of RPCs per read. Here reads queue for the next round instead: one task
//! runs rounds back to back, and every read waiting when a round starts is answered by it.
//! That is still linearizable: a round that starts after a read arrived confirms a read index at
//! least as new as any write acknowledged before the read began, and waits until that index is
//! applied.
//!
//! A round that finds no quorum may also append an empty entry ([`Nudge`]): a leader whose links
//! are too slow for any answer to come back in time, serving reads only, has nothing to commit,
//! and its followers judge a leader stalled only by entries it fails to commit
//! ([`crate::stalled_leader`]). The empty entry gives them one; it changes no state (it takes a
//! revision, like every entry).

use std::time::Duration;

use baton_rpc::error::{infra, infra_status};
use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::admission::Admission;
use crate::deposed::unless_deposed;
use crate::node::not_leader;
use crate::types::{Batch, Raft};

/// What a round answers its reads: the log index they must see applied.
type Confirmed = Result<u64, Status>;

/// The queue of reads waiting for the next confirmation round; clones share it.
#[derive(Clone)]
pub struct ReadIndex {
    raft: Raft,
    queue: mpsc::UnboundedSender<oneshot::Sender<Confirmed>>,
}

impl ReadIndex {
    /// Starts the task that runs confirmation rounds for `raft`, nudging it by `nudge`.
    pub fn start(raft: Raft, nudge: Nudge) -> Self {
        let (queue, waiting) = mpsc::unbounded_channel();
        tokio::spawn(round_loop(raft.clone(), nudge, waiting));
        Self { raft, queue }
    }

    /// Resolves once this node has confirmed with a quorum, in a round that began after this
    /// call, that it leads, and has applied everything committed when the round began.
    ///
    /// Each read waits for the apply itself, not the round: a round that waited would hold the
    /// next one up (every read behind it paying for the slowest apply), and one whose index a
    /// deposed leader never applies would hold every later read of the node.
    pub async fn confirm(&self) -> Result<(), Status> {
        let (done, confirmed) = oneshot::channel();
        if self.queue.send(done).is_err() {
            return Err(stopped());
        }
        let read_index = confirmed.await.unwrap_or_else(|_| Err(stopped()))?;
        let applied = self
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map_or(0, |id| id.index);
        if read_index > applied {
            self.raft
                .wait(None)
                .applied_index_at_least(Some(read_index), "read index")
                .await
                .map_err(|_| stopped())?;
        }
        Ok(())
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
    mut nudge: Nudge,
    mut waiting: mpsc::UnboundedReceiver<oneshot::Sender<Confirmed>>,
) {
    while let Some(first) = waiting.recv().await {
        let mut round = vec![first];
        while let Ok(next) = waiting.try_recv() {
            round.push(next);
        }
        let result = raft
            .get_read_log_id()
            .await
            .map(|(read_log_id, _applied)| read_log_id.map_or(0, |id| id.index))
            .map_err(|e| match e {
                RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward)) => {
                    not_leader(forward)
                }
                RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e)) => {
                    nudge.after_no_quorum(&raft);
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

/// When a round that found no quorum appends an empty entry: not while the node hands over or
/// shuts down (its admission is closed: it must propose nothing), not while an earlier one is
/// still pending or was appended less than `spacing` ago, and not while entries wait to be
/// applied (the followers can judge the leader by those). At most one entry per `spacing`, then,
/// even when reads keep failing while writes commit (one follower down, the other slow).
pub struct Nudge {
    admission: Admission,
    spacing: Duration,
    last: Option<Instant>,
    pending: Option<JoinHandle<()>>,
}

impl Nudge {
    /// Nudges at most once per `spacing` (the leader lease), while `admission` is open.
    pub fn new(admission: Admission, spacing: Duration) -> Self {
        Self {
            admission,
            spacing,
            last: None,
            pending: None,
        }
    }

    fn after_no_quorum(&mut self, raft: &Raft) {
        let waiting = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            metrics.last_log_index > metrics.last_applied.map(|id| id.index)
        };
        if waiting
            || self.admission.is_closed()
            || self.pending.as_ref().is_some_and(|p| !p.is_finished())
            || self.last.is_some_and(|last| last.elapsed() < self.spacing)
        {
            return;
        }
        self.last = Some(Instant::now());
        let raft = raft.clone();
        // Resolves once applied, once a newer leader's log replaces the entry, once another node
        // is known to lead (its purged entry may never be answered), or once Raft stops.
        self.pending = Some(tokio::spawn(async move {
            tracing::debug!("no quorum answered a read-index round; appending an empty entry");
            let _ = unless_deposed(&raft, raft.client_write(Batch(Vec::new()))).await;
        }));
    }
}
