//! Proposal batching: many client commands share one Raft entry.
//!
//! openraft 0.9 appends, replicates and applies every `client_write` as an entry of its own, and
//! runs its storage and replication commands once per call. Under concurrent load that per-entry
//! work, not the disk, bounds throughput on a small machine. So client commands go through one
//! queue: at most [`MAX_IN_FLIGHT`] entries are being written at a time, and whatever arrived while
//! they were in flight becomes the next entry. An idle node proposes a lone command at once (no
//! timer, no added latency); a busy one packs up to [`MAX_BATCH_COMMANDS`] commands (or about
//! [`MAX_BATCH_BYTES`]) into one entry, so one fsync per replica and one replication round commit
//! all of them.
//!
//! Each command keeps its own stamp and origin and is applied on its own, in queue order, so
//! batching changes no outcome: it is as if the entries had been appended one after another.

use std::sync::Arc;

use baton_rpc::error::{infra, infra_status};
use baton_statemachine::{Command, Envelope, Origin, Response};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tonic::{Code, Status};

use crate::codec;
use crate::deposed::unless_deposed;
use crate::stamp;
use crate::types::{Batch, Raft};

/// Entries being written at once. More than one lets the next batch's append overlap the
/// previous batch's replication; each extra one also splits the queue into smaller batches.
pub const MAX_IN_FLIGHT: usize = 2;
/// Most commands in one entry.
pub const MAX_BATCH_COMMANDS: usize = 512;
/// A batch is closed once its commands' encoded size reaches this (a single larger command still
/// travels, alone).
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// Commands waiting for a batch; a proposer that finds the queue full waits (back-pressure).
const QUEUE_DEPTH: usize = 16 * 1024;

/// A command's answer and the index of the log entry that carried it.
pub type Proposed = Result<(Response, u64), Status>;

/// The sending side of the proposal queue; clones share the queue.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::Sender<Pending>,
}

/// A command waiting to be batched, and where its answer goes.
struct Pending {
    origin: Option<Origin>,
    command: Command,
    bytes: usize,
    answer: oneshot::Sender<Proposed>,
}

impl Proposer {
    /// Starts the batching task for `raft`.
    pub fn start(raft: Raft) -> Self {
        let (queue, pending) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(batch_loop(raft, pending));
        Self { queue }
    }

    /// Queues `command`, and resolves once the entry that carries it is committed and applied
    /// (or refused by Raft as a whole, e.g. because this node is not the leader).
    pub async fn propose(&self, origin: Option<Origin>, command: Command) -> Proposed {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            bytes: codec::encoded_len(&command),
            origin,
            command,
            answer,
        };
        if self.queue.send(pending).await.is_err() {
            return Err(shutting_down());
        }
        answered.await.unwrap_or_else(|_| Err(shutting_down()))
    }
}

fn shutting_down() -> Status {
    infra_status(
        Code::Unavailable,
        infra::SHUTTING_DOWN,
        "this node is shutting down",
    )
}

/// Takes a write slot, then everything queued by then (up to the batch limits), and writes it as
/// one entry in a task of its own.
async fn batch_loop(raft: Raft, mut queue: mpsc::Receiver<Pending>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_COMMANDS && bytes < MAX_BATCH_BYTES {
            let Ok(next) = queue.try_recv() else { break };
            bytes = bytes.saturating_add(next.bytes);
            batch.push(next);
        }
        tokio::spawn(write_batch(raft.clone(), batch, slot));
    }
}

/// Stamps and writes one batch, then answers each of its commands.
async fn write_batch(raft: Raft, batch: Vec<Pending>, _slot: OwnedSemaphorePermit) {
    let mut envelopes = Vec::with_capacity(batch.len());
    let mut answers = Vec::with_capacity(batch.len());
    for pending in batch {
        envelopes.push(Envelope {
            stamp: stamp::stamp(),
            origin: pending.origin,
            command: pending.command,
        });
        answers.push(pending.answer);
    }
    let count = envelopes.len();
    let written = unless_deposed(&raft, raft.client_write(Batch(envelopes))).await;
    let responses = match written {
        Ok(written) if written.data.0.len() == count => {
            let index = written.log_id.index;
            written.data.0.into_iter().map(|r| Ok((r, index))).collect()
        }
        Ok(written) => {
            let status = infra_status(
                Code::Internal,
                infra::INTERNAL,
                format!(
                    "entry {} answered {} of {count} commands",
                    written.log_id,
                    written.data.0.len()
                ),
            );
            vec![Err(status); count]
        }
        Err(status) => vec![Err(status); count],
    };
    for (answer, response) in answers.into_iter().zip(responses) {
        // A proposer that gave up waiting is not an error: its command's fate is in the log.
        let _ = answer.send(response);
    }
}
