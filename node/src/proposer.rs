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
//!
//! While the admission gate is closed (a handover or a shutdown), queued commands are answered
//! with the gate's refusal instead of being written: their callers may have given up (the
//! handover's drain counts only callers still waiting), and an entry appended after the drain
//! would leave the handover's target behind the log it was promised.
//!
//! The proposer also knows which client requests it holds ([`Proposer::is_proposing`]): a repeat
//! of one of them must go to the log, where the session table gives it the first attempt's
//! answer, and not be judged on state that does not include the first attempt yet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use baton_rpc::error::{infra, infra_status};
use baton_statemachine::{Command, Envelope, Origin, Response};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tonic::{Code, Status};

use crate::admission::Admission;
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
/// Most tasks the leases of one entry may ask for together. A lease's command is small and its
/// changes many (each task it hands out is announced to watches): 512 leases of 1,000 tasks in
/// one entry would make more changes than a watch's history holds, ending every watch
/// `COMPACTED`. A batch closes before a lease that would pass this (a lone lease still travels).
pub const MAX_BATCH_LEASED: usize = 1024;
/// Commands waiting for a batch; a proposer that finds the queue full waits (back-pressure).
const QUEUE_DEPTH: usize = 16 * 1024;

/// A command's answer and the index of the log entry that carried it.
pub type Proposed = Result<(Response, u64), Status>;

/// The sending side of the proposal queue; clones share the queue.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::Sender<Pending>,
    proposing: Proposing,
}

/// A command waiting to be batched, and where its answer goes.
struct Pending {
    origin: Option<Origin>,
    command: Command,
    bytes: usize,
    /// The tasks it may lease ([`MAX_BATCH_LEASED`]).
    leased: usize,
    answer: oneshot::Sender<Proposed>,
    /// Keeps the request counted as proposing until its entry is applied or the command is
    /// dropped unwritten.
    held: Option<Held>,
}

/// The client requests this proposer holds — queued, or in an entry not yet applied — counted
/// by `(client_id, seq)` (a client that repeats a request before the first attempt is answered
/// has two of it here).
#[derive(Clone, Default)]
struct Proposing(Arc<Mutex<HashMap<(u64, u64), usize>>>);

/// One request counted in [`Proposing`]; dropping it uncounts it.
struct Held {
    proposing: Proposing,
    request: (u64, u64),
}

impl Proposing {
    fn hold(&self, origin: &Origin) -> Held {
        let request = (origin.client_id, origin.seq);
        *self.lock().entry(request).or_default() += 1;
        Held {
            proposing: self.clone(),
            request,
        }
    }

    fn contains(&self, origin: &Origin) -> bool {
        self.lock().contains_key(&(origin.client_id, origin.seq))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), usize>> {
        // The map is consistent between statements; a panic elsewhere cannot leave it half-made.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut proposing = self.proposing.lock();
        if let Some(count) = proposing.get_mut(&self.request) {
            *count -= 1;
            if *count == 0 {
                proposing.remove(&self.request);
            }
        }
    }
}

impl Proposer {
    /// Starts the batching task for `raft`, which writes nothing while `gate` is closed.
    pub fn start(raft: Raft, gate: Admission) -> Self {
        let (queue, pending) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(batch_loop(raft, gate, pending));
        Self {
            queue,
            proposing: Proposing::default(),
        }
    }

    /// Whether the request `origin` names is queued here or in an entry not yet applied. Checked
    /// while the applied state is held (its lock excludes the apply), a `false` means the
    /// request was either applied before that state (so the session table holds its answer), or
    /// not yet handed to this proposer, or its entry's write ended without an answer (this node
    /// was deposed: it judges nothing until, leading again, it has applied what it inherited).
    pub fn is_proposing(&self, origin: &Origin) -> bool {
        self.proposing.contains(origin)
    }

    /// Counts `origin`'s request as proposing until the returned value is dropped, as if a first
    /// attempt of it waited in the queue.
    #[cfg(test)]
    pub(crate) fn hold(&self, origin: &Origin) -> impl Drop {
        self.proposing.hold(origin)
    }

    /// Queues `command`, and resolves once the entry that carries it is committed and applied
    /// (or refused by Raft as a whole, e.g. because this node is not the leader).
    pub async fn propose(&self, origin: Option<Origin>, command: Command) -> Proposed {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            bytes: codec::encoded_len(&command),
            leased: leased_by(&command),
            held: origin.as_ref().map(|origin| self.proposing.hold(origin)),
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
async fn batch_loop(raft: Raft, gate: Admission, mut queue: mpsc::Receiver<Pending>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // A command that would have taken its batch past a limit opens the next one.
    let mut held_back: Option<Pending> = None;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match held_back.take() {
            Some(first) => first,
            None => match queue.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let batch;
        (batch, held_back) = fill_batch(first, &mut queue);
        if let Some(refusal) = gate.refusal_now() {
            // Nothing of it reaches the log: the refusal is the truth, and a retry may go
            // anywhere.
            for pending in batch {
                let _ = pending.answer.send(Err(refusal.clone()));
            }
            continue;
        }
        tokio::spawn(write_batch(raft.clone(), batch, slot));
    }
}

/// `first` and whatever is queued behind it, up to the batch limits; and the command that would
/// have passed one of them, if any (it opens the next batch).
fn fill_batch(
    first: Pending,
    queue: &mut mpsc::Receiver<Pending>,
) -> (Vec<Pending>, Option<Pending>) {
    let mut bytes = first.bytes;
    let mut leased = first.leased;
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH_COMMANDS && bytes < MAX_BATCH_BYTES {
        let Ok(next) = queue.try_recv() else { break };
        if next.leased > 0 && leased + next.leased > MAX_BATCH_LEASED {
            return (batch, Some(next));
        }
        bytes = bytes.saturating_add(next.bytes);
        leased += next.leased;
        batch.push(next);
    }
    (batch, None)
}

/// How many tasks `command` may lease ([`MAX_BATCH_LEASED`]).
fn leased_by(command: &Command) -> usize {
    match command {
        Command::Queue(baton_statemachine::queue::Command::Lease { limit, .. }) => *limit as usize,
        _ => 0,
    }
}

/// Stamps and writes one batch, then answers each of its commands.
async fn write_batch(raft: Raft, batch: Vec<Pending>, _slot: OwnedSemaphorePermit) {
    let mut envelopes = Vec::with_capacity(batch.len());
    let mut answers = Vec::with_capacity(batch.len());
    let mut held = Vec::with_capacity(batch.len());
    for pending in batch {
        envelopes.push(Envelope {
            stamp: stamp::stamp(),
            origin: pending.origin,
            command: pending.command,
        });
        answers.push(pending.answer);
        held.push(pending.held);
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
    // Applied (the session table answers a repeat now), or this node was deposed.
    drop(held);
    for (answer, response) in answers.into_iter().zip(responses) {
        // A proposer that gave up waiting is not an error: its command's fate is in the log.
        let _ = answer.send(response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(command: Command) -> Pending {
        Pending {
            origin: None,
            bytes: codec::encoded_len(&command),
            leased: leased_by(&command),
            command,
            answer: oneshot::channel().0,
            held: None,
        }
    }

    fn lease(limit: u32) -> Command {
        Command::Queue(baton_statemachine::queue::Command::Lease {
            worker: "w".into(),
            queues: Vec::new(),
            limit,
            lease_ttl_ms: 1_000,
        })
    }

    /// An entry of leases stays within the room the leader's sweeps leave a watch's history for
    /// client commands (with the default watch limits): each lease may sweep a few expiries
    /// (at most 7 changes for MAX_LEASE_SWEEP of 1) and each task it hands out makes at most 3
    /// (granted, its permit, and the task leaving the leasable ones).
    #[test]
    fn an_entry_of_leases_fits_the_room_the_sweeps_leave() {
        use baton_statemachine::queue::MAX_LEASE_SWEEP;
        let sweep = crate::sweeper::budget(&crate::config::WatchTuning::default()).changes;
        let room = sweep / 4;
        let leases = MAX_BATCH_COMMANDS * 7 * MAX_LEASE_SWEEP + 3 * MAX_BATCH_LEASED;
        assert!(leases <= room, "{leases} changes, {room} of room");
    }

    /// The leases of one entry ask for at most MAX_BATCH_LEASED tasks together: the one that
    /// would pass it opens the next entry (a lone lease still travels), other commands pack as
    /// before.
    #[tokio::test]
    async fn one_entry_leases_a_bounded_number_of_tasks() {
        let (queue, mut receiver) = mpsc::channel(16);
        for command in [
            lease(1_000),
            Command::Sweep,
            lease(1_000),
            lease(100),
            lease(1),
        ] {
            assert!(queue.try_send(pending(command)).is_ok());
        }
        let first = receiver.try_recv().expect("queued");
        let (batch, next) = fill_batch(first, &mut receiver);
        assert_eq!(batch.len(), 2, "1,000 + a sweep");
        let next = next.expect("the second lease of 1,000 waits for the next entry");
        assert_eq!(next.leased, 1_000);
        let (batch, next) = fill_batch(next, &mut receiver);
        assert_eq!(batch.len(), 1);
        let (batch, next) = fill_batch(next.expect("the lease of 100"), &mut receiver);
        assert_eq!(batch.len(), 2, "100 + 1");
        assert!(next.is_none());
        assert!(queue.try_send(pending(Command::Sweep)).is_ok());
        assert!(queue.try_send(pending(lease(1))).is_ok());
        let (batch, next) = fill_batch(pending(lease(5_000)), &mut receiver);
        assert_eq!(
            batch.len(),
            2,
            "a lone lease travels, with commands that lease nothing"
        );
        assert!(next.is_some_and(|next| next.leased == 1));
    }

    fn origin(client_id: u64, seq: u64) -> Origin {
        Origin {
            client_id,
            seq,
            acked_below: 0,
        }
    }

    #[test]
    fn a_request_is_proposing_until_its_last_attempt_lets_go() {
        let proposing = Proposing::default();
        let first = proposing.hold(&origin(7, 1));
        let repeat = proposing.hold(&origin(7, 1));
        let other = proposing.hold(&origin(8, 1));
        assert!(proposing.contains(&origin(7, 1)));
        assert!(
            !proposing.contains(&origin(7, 2)),
            "another seq of the client"
        );
        drop(first);
        assert!(
            proposing.contains(&origin(7, 1)),
            "the repeat is still being proposed"
        );
        drop(repeat);
        assert!(!proposing.contains(&origin(7, 1)));
        assert!(proposing.contains(&origin(8, 1)));
        drop(other);
        assert!(proposing.lock().is_empty(), "nothing is left behind");
    }
}
