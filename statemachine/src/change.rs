//! What a command changed, as plain data: the feed that watches deliver.
//!
//! Every executed command reports each state change it made as one [`Change`], in the order it
//! made them: the primitive, the key, what happened ([`ChangeKind`]), the holder and fence the
//! change concerns, and the key's new value. Expiries are changes too, whether a sweep or a
//! lazy check at apply time materialised them. When a holder's lease ends without the holder
//! asking — a taken ticket, a board claim, a side-effect intent or a queue attempt runs out, or a
//! re-seed clears a claim — the change is of kind [`ChangeKind::Lost`] and names that holder and
//! its fence (a side-effect holder by its fence alone: its identity is its credential), so the
//! holder can stop acting on a right it no longer has.
//!
//! Changes are derived from the same deterministic apply on every replica, so every node reports
//! the same changes, in the same order, for the same log entry. A command refused without
//! changing anything, and a retry answered from the session table, report none.

use std::sync::Arc;

use crate::board;
use crate::checkpoint::Checkpoint;
use crate::effect::ActionView;
use crate::error::Refusal;
use crate::handoff::Ticket;
use crate::limits::{MAX_AGENT_BYTES, MAX_KEY_BYTES, MAX_RESOURCE_BYTES};
use crate::queue;
use crate::sink::SinkValue;
use crate::validate;

/// The primitive a change belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Primitive {
    /// Handoff tickets; keyed by ticket key.
    Handoff,
    /// Task-board tasks; keyed by task id.
    Board,
    /// Side-effect gate actions; keyed by action key.
    Effect,
    /// Fenced-sink resources; keyed by resource.
    Sink,
    /// Checkpoints; keyed by run.
    Checkpoint,
    /// The task queue; tasks keyed by their id in decimal, queues by name, workers by id, freed
    /// concurrency keys by the key.
    Queue,
}

impl Primitive {
    /// Every primitive.
    pub const ALL: [Primitive; 6] = [
        Primitive::Handoff,
        Primitive::Board,
        Primitive::Effect,
        Primitive::Sink,
        Primitive::Checkpoint,
        Primitive::Queue,
    ];

    /// The wire name (`handoff`, `board`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Primitive::Handoff => "handoff",
            Primitive::Board => "board",
            Primitive::Effect => "effect",
            Primitive::Sink => "sink",
            Primitive::Checkpoint => "checkpoint",
            Primitive::Queue => "queue",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    /// Handoff: a new generation of a ticket was offered.
    Offered,
    /// Handoff: the addressee took the ticket (holder = addressee, fence = generation).
    Taken,
    /// Handoff: the holder settled the ticket with a receipt.
    Closed,
    /// Handoff: the source withdrew the offered ticket.
    Withdrawn,
    /// Handoff: an offered ticket's deadline passed before anyone took it.
    Expired,
    /// Board: a task was seeded or re-seeded.
    Seeded,
    /// Board: a task was claimed (holder = agent, fence = the claim's fence).
    Claimed,
    /// Board, effect: the holder gave its claim or resource hold back.
    Released,
    /// Board, effect: the holder completed the task or recorded the action's result.
    Completed,
    /// Board, effect, queue: the holder extended its lease.
    Renewed,
    /// Effect: an attempt was granted (fence = resource fence; the holder id is withheld).
    Granted,
    /// Effect: the holder withdrew its attempt.
    Abandoned,
    /// Effect: the holder declared the outcome unknown.
    Uncertain,
    /// Effect: a reconciler took the slot of an uncertain key.
    Reconciling,
    /// Effect: an uncertain key was resolved (completed, or idle again).
    Resolved,
    /// Effect: a resource hold ran out (the resource is free again).
    HoldExpired,
    /// Sink: a fenced write was accepted.
    Written,
    /// Checkpoint: a newer checkpoint was saved (fence = its seq).
    Saved,
    /// Queue: a queue was created (key = queue name).
    QueueCreated,
    /// Queue: a worker identity was registered (key = worker id).
    WorkerRegistered,
    /// Queue: a task was submitted.
    Submitted,
    /// Queue: a waiting task whose concurrency key is free (or that has none): a lease on its
    /// queue could hand it out now.
    Leasable,
    /// Queue: an attempt was leased (holder = worker, fence = permit token, or the attempt
    /// number for an unkeyed task).
    Leased,
    /// Queue: the worker confirmed the start of its attempt.
    Started,
    /// Queue: a task waits again (its back-off ended).
    Requeued,
    /// Queue: a retryable failure; the task backs off.
    RetryWait,
    /// Queue: the task finished successfully.
    Succeeded,
    /// Queue: the task failed for good.
    Failed,
    /// Queue: the task was cancelled.
    Cancelled,
    /// Queue: the attempt's effect is unknown; someone must look.
    NeedsReview,
    /// Queue: a concurrency key's permit was released (key = the concurrency key): the oldest
    /// task waiting on it in any of the listed queues may now be leased.
    KeyFreed,
    /// Queue: a task's scheduling remark changed (e.g. its key's tokens are exhausted).
    Updated,
    /// Any primitive: a holder's lease ended without the holder asking — it expired, or a re-seed
    /// cleared it. Names the holder (not a side effect's: its id is its credential) and its
    /// fence; the value shows what the key became.
    Lost,
}

impl ChangeKind {
    /// Every kind.
    pub const ALL: [ChangeKind; 33] = [
        ChangeKind::Offered,
        ChangeKind::Taken,
        ChangeKind::Closed,
        ChangeKind::Withdrawn,
        ChangeKind::Expired,
        ChangeKind::Seeded,
        ChangeKind::Claimed,
        ChangeKind::Released,
        ChangeKind::Completed,
        ChangeKind::Renewed,
        ChangeKind::Granted,
        ChangeKind::Abandoned,
        ChangeKind::Uncertain,
        ChangeKind::Reconciling,
        ChangeKind::Resolved,
        ChangeKind::HoldExpired,
        ChangeKind::Written,
        ChangeKind::Saved,
        ChangeKind::QueueCreated,
        ChangeKind::WorkerRegistered,
        ChangeKind::Submitted,
        ChangeKind::Leasable,
        ChangeKind::Leased,
        ChangeKind::Started,
        ChangeKind::Requeued,
        ChangeKind::RetryWait,
        ChangeKind::Succeeded,
        ChangeKind::Failed,
        ChangeKind::Cancelled,
        ChangeKind::NeedsReview,
        ChangeKind::KeyFreed,
        ChangeKind::Updated,
        ChangeKind::Lost,
    ];

    /// The wire name (`offered`, `lost`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            ChangeKind::Offered => "offered",
            ChangeKind::Taken => "taken",
            ChangeKind::Closed => "closed",
            ChangeKind::Withdrawn => "withdrawn",
            ChangeKind::Expired => "expired",
            ChangeKind::Seeded => "seeded",
            ChangeKind::Claimed => "claimed",
            ChangeKind::Released => "released",
            ChangeKind::Completed => "completed",
            ChangeKind::Renewed => "renewed",
            ChangeKind::Granted => "granted",
            ChangeKind::Abandoned => "abandoned",
            ChangeKind::Uncertain => "uncertain",
            ChangeKind::Reconciling => "reconciling",
            ChangeKind::Resolved => "resolved",
            ChangeKind::HoldExpired => "hold_expired",
            ChangeKind::Written => "written",
            ChangeKind::Saved => "saved",
            ChangeKind::QueueCreated => "queue_created",
            ChangeKind::WorkerRegistered => "worker_registered",
            ChangeKind::Submitted => "submitted",
            ChangeKind::Leasable => "leasable",
            ChangeKind::Leased => "leased",
            ChangeKind::Started => "started",
            ChangeKind::Requeued => "requeued",
            ChangeKind::RetryWait => "retry_wait",
            ChangeKind::Succeeded => "succeeded",
            ChangeKind::Failed => "failed",
            ChangeKind::Cancelled => "cancelled",
            ChangeKind::NeedsReview => "needs_review",
            ChangeKind::KeyFreed => "key_freed",
            ChangeKind::Updated => "updated",
            ChangeKind::Lost => "lost",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// A concurrency key's permit after its release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    /// The namespace the key lives in.
    pub namespace: String,
    /// The concurrency key.
    pub key: String,
    /// The highest token ever issued for it.
    pub highest_token: u64,
    /// The queues of the namespace (those whose waiting tasks may hold this key), by name.
    pub queues: Vec<String>,
}

/// The new value of the changed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeValue {
    /// A handoff ticket (its token is never part of it).
    Ticket(Box<Ticket>),
    /// A board task; the lease token is withheld (empty), as in listings. Shared with the board
    /// while the task holds no lease.
    Task(Arc<board::Task>),
    /// A side-effect action key as `show` presents it.
    Action(Box<ActionView>),
    /// A fenced-sink resource.
    Sink(SinkValue),
    /// A run's checkpoint.
    Checkpoint(Checkpoint),
    /// A queue task as listings show it: payload and result left empty.
    QueueTask(Box<queue::Task>),
    /// A queue.
    Queue(queue::Queue),
    /// A registered worker.
    Worker(queue::Worker),
    /// A concurrency key's permit.
    Permit(Permit),
}

impl ChangeValue {
    /// A board task as changes carry it: a copy, the claim's token withheld.
    pub fn board_task(task: &board::Task) -> Self {
        let mut task = task.clone();
        if let Some(lease) = task.lease.as_mut() {
            lease.token.clear();
        }
        ChangeValue::Task(Arc::new(task))
    }

    /// [`ChangeValue::board_task`] for a task the board shares: without a lease there is no
    /// token to withhold, so the change shares the task instead of copying it.
    pub fn shared_board_task(task: &Arc<board::Task>) -> Self {
        if task.lease.is_none() {
            ChangeValue::Task(Arc::clone(task))
        } else {
            Self::board_task(task)
        }
    }

    /// A queue task as changes carry it: without payload and result (never copied: a payload
    /// may be a megabyte, and a task reports several changes in its life).
    pub fn queue_task(task: &queue::Task) -> Self {
        let spec = &task.spec;
        ChangeValue::QueueTask(Box::new(queue::Task {
            id: task.id,
            namespace: task.namespace.clone(),
            spec: queue::TaskSpec {
                queue: spec.queue.clone(),
                idempotency_key: spec.idempotency_key.clone(),
                handler: spec.handler.clone(),
                handler_version: spec.handler_version.clone(),
                payload_version: spec.payload_version.clone(),
                payload: Vec::new(),
                concurrency_key: spec.concurrency_key.clone(),
                business_key: spec.business_key.clone(),
                max_attempts: spec.max_attempts,
                ttl_ms: spec.ttl_ms,
            },
            state: task.state,
            attempts: task.attempts.clone(),
            submitted_at_ms: task.submitted_at_ms,
            deadline_ms: task.deadline_ms,
            retry_at_ms: task.retry_at_ms,
            result: Vec::new(),
            last_error: task.last_error.clone(),
        }))
    }
}

/// One state change made by one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The primitive.
    pub primitive: Primitive,
    /// The changed key (see [`Primitive`] for what keys each primitive uses).
    pub key: String,
    /// What happened.
    pub kind: ChangeKind,
    /// The holder the change concerns (ticket addressee, board agent, queue worker); empty when
    /// none, and for side effects, whose holder identity is the lease's credential.
    pub holder: String,
    /// The fence of the lease concerned (ticket generation, claim fence, resource fence, permit
    /// token or attempt number, checkpoint seq, sink fence); 0 when none.
    pub fence: u64,
    /// The key's value after the change.
    pub value: ChangeValue,
}

/// What every change costs besides its key, holder and value, in [`Change::approx_bytes`].
pub(crate) const CHANGE_OVERHEAD: usize = 160;

impl Change {
    /// A rough size in bytes, for bounding how many changes a node keeps in memory.
    pub fn approx_bytes(&self) -> usize {
        let value = match &self.value {
            ChangeValue::Ticket(t) => ticket_bytes(t),
            ChangeValue::Task(t) => board_task_bytes(t),
            ChangeValue::Action(a) => action_bytes(a),
            ChangeValue::Sink(s) => s.value.len(),
            ChangeValue::Checkpoint(c) => c.data.len(),
            ChangeValue::QueueTask(t) => queue_task_bytes(t),
            ChangeValue::Queue(q) => q.name.len() + q.namespace.len(),
            ChangeValue::Worker(w) => w.id.len(),
            ChangeValue::Permit(p) => permit_bytes(p),
        };
        CHANGE_OVERHEAD + self.key.len() + self.holder.len() + value
    }
}

/// A ticket's share of [`Change::approx_bytes`].
pub(crate) fn ticket_bytes(t: &Ticket) -> usize {
    t.key.len()
        + t.from.len()
        + t.to.len()
        + t.payload.len()
        + t.reply_to.len()
        + t.receipt.as_ref().map_or(0, |r| {
            r.summary.len() + r.failure.len() + r.artifacts.iter().map(String::len).sum::<usize>()
        })
}

/// A board task's share of [`Change::approx_bytes`].
pub(crate) fn board_task_bytes(t: &board::Task) -> usize {
    t.id.len() + t.deps.iter().map(|d| d.len() + 24).sum::<usize>()
}

/// A side-effect view's share of [`Change::approx_bytes`].
fn action_bytes(a: &ActionView) -> usize {
    a.key.len() + a.resource.len() + a.reason.len() + a.result.as_ref().map_or(0, String::len)
}

/// A queue task's share of [`Change::approx_bytes`] (changes carry no payload).
pub(crate) fn queue_task_bytes(t: &queue::Task) -> usize {
    let s = &t.spec;
    s.queue.len()
        + s.idempotency_key.len()
        + s.handler.len()
        + s.concurrency_key.len()
        + s.business_key.len()
        + t.last_error.len()
        + t.attempts
            .iter()
            .map(|a| a.worker.len() + a.note.len() + 64)
            .sum::<usize>()
}

/// A permit's share of [`Change::approx_bytes`].
fn permit_bytes(p: &Permit) -> usize {
    p.namespace.len() + p.key.len() + p.queues.iter().map(String::len).sum::<usize>()
}

/// Which changes a watch wants. Every criterion that is set must hold (they combine with AND);
/// the default filter matches every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeFilter {
    /// Only this primitive.
    pub primitive: Option<Primitive>,
    /// Only this exact key.
    pub key: Option<String>,
    /// Only keys starting with this prefix.
    pub key_prefix: Option<String>,
    /// Only handoff tickets addressed to this agent (every change of such a ticket).
    pub ticket_to: Option<String>,
    /// Only queue tasks becoming leasable in this queue: `leasable` changes of its tasks and
    /// `key_freed` changes that list it.
    pub leasable_in: Option<String>,
    /// Only changes naming this holder (claims, takes, attempts, and their `lost`; side-effect
    /// changes name none).
    pub holder: Option<String>,
    /// Only these kinds (empty = any kind).
    pub kinds: Vec<ChangeKind>,
}

impl ChangeFilter {
    /// The filter that matches every change.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only changes of `primitive`.
    pub fn primitive(mut self, primitive: Primitive) -> Self {
        self.primitive = Some(primitive);
        self
    }

    /// Only changes of exactly `key`.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Only changes of keys starting with `prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// Only tickets addressed to `agent`.
    pub fn tickets_to(mut self, agent: impl Into<String>) -> Self {
        self.ticket_to = Some(agent.into());
        self
    }

    /// Only queue tasks becoming leasable in `queue`.
    pub fn leasable_in(mut self, queue: impl Into<String>) -> Self {
        self.leasable_in = Some(queue.into());
        self
    }

    /// Only changes naming `holder`.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }

    /// Only changes of these kinds.
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = ChangeKind>) -> Self {
        self.kinds = kinds.into_iter().collect();
        self
    }

    /// Refuses filters that can never be meant: an exact key together with a prefix, empty
    /// strings where a value is required, oversized values, or a ticket or queue criterion
    /// combined with another primitive.
    pub fn validate(&self) -> Result<(), Refusal> {
        if self.key.is_some() && self.key_prefix.is_some() {
            return Err(Refusal::invalid(
                "filter.key_prefix",
                "must not be combined with an exact key",
            ));
        }
        // As long as the longest key of any primitive: a fenced-sink resource name.
        if let Some(key) = &self.key {
            validate::required("filter.key", key, MAX_RESOURCE_BYTES)?;
        }
        if let Some(prefix) = &self.key_prefix {
            validate::required("filter.key_prefix", prefix, MAX_RESOURCE_BYTES)?;
        }
        if let Some(agent) = &self.ticket_to {
            validate::required("filter.ticket_to", agent, MAX_AGENT_BYTES)?;
            if self.primitive.is_some_and(|p| p != Primitive::Handoff) {
                return Err(Refusal::invalid(
                    "filter.ticket_to",
                    "selects handoff tickets; the primitive must be handoff or unset",
                ));
            }
        }
        if let Some(queue) = &self.leasable_in {
            validate::required("filter.leasable_in", queue, MAX_KEY_BYTES)?;
            if self.ticket_to.is_some() {
                return Err(Refusal::invalid(
                    "filter.leasable_in",
                    "selects queue tasks; it cannot be combined with ticket_to (handoff tickets)",
                ));
            }
            if self.primitive.is_some_and(|p| p != Primitive::Queue) {
                return Err(Refusal::invalid(
                    "filter.leasable_in",
                    "selects queue tasks; the primitive must be queue or unset",
                ));
            }
        }
        if let Some(holder) = &self.holder {
            validate::required("filter.holder", holder, MAX_KEY_BYTES)?;
        }
        Ok(())
    }

    /// Whether `change` passes every criterion.
    pub fn matches(&self, change: &Change) -> bool {
        self.primitive.is_none_or(|p| p == change.primitive)
            && self.key.as_ref().is_none_or(|k| *k == change.key)
            && self
                .key_prefix
                .as_ref()
                .is_none_or(|p| change.key.starts_with(p.as_str()))
            && self.ticket_to.as_ref().is_none_or(
                |agent| matches!(&change.value, ChangeValue::Ticket(t) if t.to == *agent),
            )
            && self
                .leasable_in
                .as_ref()
                .is_none_or(|queue| leasable_in(change, queue))
            && self.holder.as_ref().is_none_or(|h| *h == change.holder)
            && (self.kinds.is_empty() || self.kinds.contains(&change.kind))
    }
}

fn leasable_in(change: &Change, queue: &str) -> bool {
    match (&change.kind, &change.value) {
        (ChangeKind::Leasable, ChangeValue::QueueTask(task)) => task.spec.queue == queue,
        (ChangeKind::KeyFreed, ChangeValue::Permit(permit)) => {
            permit.queues.iter().any(|q| q == queue)
        }
        _ => false,
    }
}

/// Changes recorded while a command executes, drained by [`crate::apply_with_changes`] after
/// every command. Transient: never serialized, and ignored by equality, so two states that hold
/// the same data are equal whatever a primitive was last asked to do.
#[derive(Debug, Clone, Default)]
pub(crate) struct Journal(Vec<Change>);

impl Journal {
    pub(crate) fn push(&mut self, change: Change) {
        self.0.push(change);
    }

    pub(crate) fn take(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.0)
    }
}

impl PartialEq for Journal {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Journal {}
