//! The queue's state and what each command does to it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::key;
use super::leasable::{permit_key, Leasable, PermitKey, Queues};
use super::types::{
    Assignment, Attempt, AttemptOutcome, Queue, SubmitReceipt, Task, TaskSpec, TaskState, Worker,
};
use crate::change::{
    queue_task_bytes, Change, ChangeKind, ChangeValue, Journal, Permit as PermitView, Primitive,
};
use crate::error::Refusal;
use crate::limits::{MAX_AGENT_BYTES, MAX_KEY_BYTES, MAX_PAYLOAD_BYTES, MAX_TEXT_BYTES};
use crate::sweep::Weight;
use crate::time::{deadline_after, is_overdue};
use crate::validate;

/// Most attempts a task may allow.
pub const MAX_ATTEMPTS: u32 = 100;
/// Most tasks one lease may hand out.
pub const MAX_LEASE_BATCH: u32 = 1000;
/// The longest lease or renewal a worker may ask for, in milliseconds (24 h). A lease outlives
/// the worker that crashed holding it, and holds its task and its concurrency key until it runs
/// out: renewals, not long leases, keep a long handler's task. Enforced where a request enters
/// the cluster, not at apply: apply rules carry no version, and a replica of another version
/// must judge an entry already in the log the same way.
pub const MAX_LEASE_TTL_MS: i64 = 24 * 3600 * 1000;
/// The most queue names one lease may list (none: every queue). A long-polling lease is judged
/// again against the state at every apply while it waits, so its list must stay small. Enforced
/// where a request enters the cluster, like [`MAX_LEASE_TTL_MS`].
pub const MAX_LEASE_QUEUES: usize = 256;

/// The most due expiries of each kind (lease expiries, ended back-offs, passed total deadlines)
/// one lease materialises before it looks for tasks, and the most candidates past their total
/// deadline it fails on its way.
///
/// A lease is a client command: through it a mass expiry must not become one huge apply, which
/// the leader's own sweeps avoid by taking [`crate::sweep::SWEEP_BATCH`] at a time. Nor may the
/// up to 512 leases batched into one log entry together make more changes than the room the
/// sweeper leaves a watch's history for client commands: at 1,000 of each kind a lease made up
/// to ~7,000 changes, and a few dozen workers polling through a mass expiry made one entry the
/// history could not hold, ending every watch `COMPACTED`. At 1, a lease makes at most 7 such
/// changes (3 for an expired keyed lease, 2 for an ended back-off, 1 for each deadline). What a
/// lease leaves due the sweeper takes, as soon as it is due; a candidate already past its total
/// deadline is failed, not leased.
pub const MAX_LEASE_SWEEP: usize = 1;

/// The most bytes of tasks one lease hands out, unless its first task alone is larger.
///
/// A lease answer must reach its worker whole: tasks leased in an answer the client cannot
/// decode (gRPC's default limit is 4 MiB) would be held by attempts nobody runs, and leased again
/// the same way after their leases lapse. Any one task fits (its payload is at most
/// [`crate::limits::MAX_PAYLOAD_BYTES`]), so a lease always gets at least one.
pub const MAX_LEASE_BYTES: usize = 2 << 20;
/// Most tasks one page of a task listing may hold.
pub const MAX_LIST_PAGE: u32 = 10_000;
/// Most tasks one page of a task listing looks at: a filter that matches few tasks returns a
/// short (even empty) page and where to go on, so no listing holds the state for long.
pub const MAX_LIST_SCAN: usize = 100_000;

/// The back-off after the `started`-th started attempt failed: 500 ms doubling, capped at 30 s.
pub fn backoff_ms(started: u32) -> u64 {
    let doublings = started.saturating_sub(1).min(6);
    (500u64 << doublings).min(30_000)
}

/// One permit per `(namespace, concurrency key)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Permit {
    /// The highest token ever issued for the key; never reset.
    highest_token: u64,
    /// The task whose active attempt holds the permit.
    holder: Option<u64>,
}

/// Which tasks a listing wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this state.
    pub state: Option<TaskState>,
    /// Only this concurrency key (byte-exact).
    pub concurrency_key: Option<String>,
}

impl TaskFilter {
    /// Whether `task` is one the listing wants.
    pub fn matches(&self, task: &Task) -> bool {
        self.queue.as_ref().is_none_or(|q| &task.spec.queue == q)
            && self.state.is_none_or(|s| task.state == s)
            && self
                .concurrency_key
                .as_ref()
                .is_none_or(|k| &task.spec.concurrency_key == k)
    }
}

/// One page of a task listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPage<'a> {
    /// The matching tasks, by id (shared: a reader can hold them after letting the state go).
    pub tasks: Vec<&'a Arc<Task>>,
    /// The id the next page starts after; `None` when no task is left.
    pub next_after: Option<u64>,
}

/// Queues, workers, tasks, permits and the indexes that keep leasing and sweeping cheap.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Stored")]
pub struct TaskQueue {
    queues: BTreeMap<String, Queue>,
    workers: BTreeMap<String, Worker>,
    /// Every task, shared (`Arc`, written into snapshots as the task itself): a copy of the state,
    /// which a snapshot build takes under the state lock, does not copy payloads and attempts; a
    /// change to a task a copy still holds copies that task first.
    tasks: BTreeMap<u64, Arc<Task>>,
    next_task_id: u64,
    /// `(namespace, idempotency key)` -> task id.
    submissions: BTreeMap<(String, String), u64>,
    /// Waiting task ids per queue, in submission order. Leasing reads [`Leasable`]; this stays
    /// because snapshots hold it, so that every version reads every other's.
    ready: BTreeMap<String, BTreeSet<u64>>,
    /// `(retry_at, task id)` of tasks in back-off.
    retries: BTreeSet<(u64, u64)>,
    /// `(lease_until, task id)` of active attempts.
    leases: BTreeSet<(u64, u64)>,
    /// `(total deadline, task id)` of tasks waiting or backing off: the ones a passed total
    /// deadline fails. Leased and running tasks leave it (an active attempt runs on until its
    /// lease ends), so a sweep, and the leader's search for the next due time after every apply,
    /// never walk past attempts that outlive their task's deadline. (Earlier versions listed
    /// active tasks too; reading their state back drops those.)
    deadlines: BTreeSet<(u64, u64)>,
    /// `(namespace, key)` -> permit.
    permits: BTreeMap<PermitKey, Permit>,
    /// The waiting tasks a lease considers (derived: rebuilt when read back, never stored).
    #[serde(skip)]
    leasable: Leasable,
    /// Namespace -> the names of its queues (derived, like `leasable`): a freed key's change
    /// names its namespace's queues, and finding them must not walk every queue of the store
    /// (their number is not bounded) for each attempt a sweep ends.
    #[serde(skip)]
    namespace_queues: BTreeMap<String, BTreeSet<String>>,
    /// Changes of the command being applied (transient).
    #[serde(skip)]
    journal: Journal,
}

/// What a [`TaskQueue`] writes into a snapshot: its fields but the derived and transient ones,
/// in the same order (bincode reads fields by position).
#[derive(Deserialize)]
struct Stored {
    queues: BTreeMap<String, Queue>,
    workers: BTreeMap<String, Worker>,
    tasks: BTreeMap<u64, Arc<Task>>,
    next_task_id: u64,
    submissions: BTreeMap<(String, String), u64>,
    ready: BTreeMap<String, BTreeSet<u64>>,
    retries: BTreeSet<(u64, u64)>,
    leases: BTreeSet<(u64, u64)>,
    deadlines: BTreeSet<(u64, u64)>,
    permits: BTreeMap<PermitKey, Permit>,
}

impl From<Stored> for TaskQueue {
    fn from(mut stored: Stored) -> Self {
        let tasks = &stored.tasks;
        stored
            .deadlines
            .retain(|(_, id)| tasks.get(id).is_some_and(|t| !t.state.is_active()));
        let mut leasable = Leasable::default();
        for task in stored.tasks.values() {
            if task.state == TaskState::Waiting {
                leasable.insert(task, key_is_free(&stored.permits, task));
            }
        }
        let mut namespace_queues = BTreeMap::new();
        for queue in stored.queues.values() {
            index_queue(&mut namespace_queues, queue);
        }
        TaskQueue {
            queues: stored.queues,
            workers: stored.workers,
            tasks: stored.tasks,
            next_task_id: stored.next_task_id,
            submissions: stored.submissions,
            ready: stored.ready,
            retries: stored.retries,
            leases: stored.leases,
            deadlines: stored.deadlines,
            permits: stored.permits,
            leasable,
            namespace_queues,
            journal: Journal::default(),
        }
    }
}

/// What `task` adds to a lease answer, near enough: its payload and the strings that travel
/// with it (the fixed-size fields are small change against [`MAX_LEASE_BYTES`]).
fn lease_bytes(task: &Task) -> usize {
    let spec = &task.spec;
    spec.payload.len()
        + spec.queue.len()
        + task.namespace.len()
        + spec.handler.len()
        + spec.handler_version.len()
        + spec.payload_version.len()
        + spec.concurrency_key.len()
}

/// Adds `queue` to the namespace -> queue names index ([`TaskQueue::namespace_queues`]).
fn index_queue(namespace_queues: &mut BTreeMap<String, BTreeSet<String>>, queue: &Queue) {
    namespace_queues
        .entry(queue.namespace.clone())
        .or_default()
        .insert(queue.name.clone());
}

/// Whether `task`'s concurrency key, if it has one, has no holder.
fn key_is_free(permits: &BTreeMap<PermitKey, Permit>, task: &Task) -> bool {
    permit_key(task).is_none_or(|key| permits.get(&key).is_none_or(|p| p.holder.is_none()))
}

impl TaskQueue {
    /// Creates a queue; the same name in the same namespace is a no-op, in another namespace a
    /// `STATE_CONFLICT`.
    pub fn create_queue(&mut self, queue: Queue) -> Result<Queue, Refusal> {
        validate::required("queue.name", &queue.name, MAX_KEY_BYTES)?;
        validate::required("queue.namespace", &queue.namespace, MAX_KEY_BYTES)?;
        if let Some(existing) = self.queues.get(&queue.name) {
            if existing.namespace != queue.namespace {
                return Err(Refusal::StateConflict);
            }
            return Ok(existing.clone());
        }
        self.queues.insert(queue.name.clone(), queue.clone());
        index_queue(&mut self.namespace_queues, &queue);
        self.journal.push(Change {
            primitive: Primitive::Queue,
            key: queue.name.clone(),
            kind: ChangeKind::QueueCreated,
            holder: String::new(),
            fence: 0,
            value: ChangeValue::Queue(queue.clone()),
        });
        Ok(queue)
    }

    /// Registers a worker identity. Its concurrency-key support is fixed for the identity's life:
    /// registering it again with a different answer is a `STATE_CONFLICT` (a new process
    /// version must use a new identity).
    pub fn register_worker(&mut self, worker: Worker) -> Result<Worker, Refusal> {
        validate::required("worker", &worker.id, MAX_AGENT_BYTES)?;
        if let Some(existing) = self.workers.get(&worker.id) {
            if existing.concurrency_keys != worker.concurrency_keys {
                return Err(Refusal::StateConflict);
            }
            return Ok(existing.clone());
        }
        self.workers.insert(worker.id.clone(), worker.clone());
        self.journal.push(Change {
            primitive: Primitive::Queue,
            key: worker.id.clone(),
            kind: ChangeKind::WorkerRegistered,
            holder: String::new(),
            fence: 0,
            value: ChangeValue::Worker(worker.clone()),
        });
        Ok(worker)
    }

    /// Submits a task. The same idempotency key (per namespace) with the same content returns the
    /// original receipt marked as a replay; with any other content it is refused.
    pub fn submit(&mut self, clock_ms: u64, spec: TaskSpec) -> Result<SubmitReceipt, Refusal> {
        validate_spec(&spec)?;
        let queue = self.queues.get(&spec.queue).ok_or(Refusal::UnknownQueue)?;
        let namespace = queue.namespace.clone();
        let submission = (namespace.clone(), spec.idempotency_key.clone());
        if let Some(id) = self.submissions.get(&submission) {
            let task = self.tasks.get(id).ok_or(Refusal::UnknownTask)?;
            if task.spec != spec {
                return Err(Refusal::IdempotencyConflict);
            }
            return Ok(SubmitReceipt {
                task: Task::clone(task),
                replayed: true,
            });
        }
        self.next_task_id += 1;
        let id = self.next_task_id;
        let deadline_ms = deadline_after(clock_ms, spec.ttl_ms);
        let task = Task {
            id,
            namespace,
            state: TaskState::Waiting,
            attempts: Vec::new(),
            submitted_at_ms: clock_ms,
            deadline_ms,
            retry_at_ms: None,
            result: Vec::new(),
            last_error: String::new(),
            spec,
        };
        self.deadlines.insert((deadline_ms, id));
        self.submissions.insert(submission, id);
        self.tasks.insert(id, Arc::new(task.clone()));
        self.enqueue(id);
        self.note(id, ChangeKind::Submitted);
        self.note_if_leasable(id);
        Ok(SubmitReceipt {
            task,
            replayed: false,
        })
    }

    /// Leases up to `limit` waiting tasks from `queues` (all queues when empty), oldest first,
    /// skipping keyed tasks the worker cannot take and tasks whose key is busy before the limit
    /// applies, and stopping before the answer would pass [`MAX_LEASE_BYTES`].
    pub fn lease(
        &mut self,
        clock_ms: u64,
        fence_floor: u64,
        worker: &str,
        queues: &[String],
        limit: u32,
        lease_ttl_ms: i64,
    ) -> Result<Vec<Assignment>, Refusal> {
        validate::required("worker", worker, MAX_AGENT_BYTES)?;
        validate::ttl(lease_ttl_ms)?;
        if limit == 0 || limit > MAX_LEASE_BATCH {
            return Err(Refusal::invalid(
                "limit",
                format!("must be 1-{MAX_LEASE_BATCH}"),
            ));
        }
        let capable = self
            .workers
            .get(worker)
            .ok_or(Refusal::UnknownWorker)?
            .concurrency_keys;
        let queues = self.resolve_queues(queues)?;
        self.sweep_first(clock_ms, MAX_LEASE_SWEEP, MAX_LEASE_SWEEP, MAX_LEASE_SWEEP);

        let mut chosen = Vec::new();
        let mut bytes = 0;
        let mut exhausted = Vec::new();
        let mut past_deadline = Vec::new();
        // Borrowed: a key's heads in other queues are passed over at no allocation.
        let mut keys_taken: BTreeSet<(&str, &str)> = BTreeSet::new();
        for id in self.leasable.candidates(&queues, capable) {
            if chosen.len() as u32 >= limit {
                break;
            }
            let Some(task) = self.tasks.get(&id) else {
                continue;
            };
            if is_overdue(task.deadline_ms, clock_ms) {
                // Bounded like the sweep: a backlog past its deadline is failed a batch at a
                // time, by leases and the sweeper, never all in one apply.
                if past_deadline.len() >= MAX_LEASE_SWEEP {
                    break;
                }
                past_deadline.push(id);
                continue;
            }
            // A keyed candidate's key has no holder (the index holds no other).
            let key = (!task.spec.concurrency_key.is_empty())
                .then(|| (task.namespace.as_str(), task.spec.concurrency_key.as_str()));
            if let Some(key) = key {
                if keys_taken.contains(&key) {
                    continue;
                }
                let owned = (key.0.to_string(), key.1.to_string());
                if self.token_exhausted(&owned) {
                    exhausted.extend(self.leasable.waiting_on(&owned, &task.spec.queue));
                    continue;
                }
            }
            // In order: a large task is not passed over for smaller ones behind it.
            bytes += lease_bytes(task);
            if bytes > MAX_LEASE_BYTES && !chosen.is_empty() {
                break;
            }
            keys_taken.extend(key);
            chosen.push(id);
        }
        for id in past_deadline {
            self.fail_if_past_deadline(clock_ms, id);
        }
        for id in exhausted {
            const EXHAUSTED: &str = "the concurrency key's permit tokens are exhausted";
            if let Some(task) = self.tasks.get_mut(&id).map(Arc::make_mut) {
                if task.last_error != EXHAUSTED {
                    task.last_error = EXHAUSTED.into();
                    self.note(id, ChangeKind::Updated);
                }
            }
        }
        let until = deadline_after(clock_ms, lease_ttl_ms);
        Ok(chosen
            .into_iter()
            .filter_map(|id| self.grant(clock_ms, fence_floor, id, worker, until))
            .collect())
    }

    /// Confirms the start of a leased attempt (idempotent for a resume of the same attempt).
    pub fn start(
        &mut self,
        clock_ms: u64,
        id: u64,
        attempt: u32,
        worker: &str,
    ) -> Result<Task, Refusal> {
        self.expire_lease_if_overdue(clock_ms, id);
        let task = self.active(id, attempt, worker)?;
        if task.state != TaskState::Leased {
            return Ok(task.clone());
        }
        // The task's total deadline counts while it is leased: past it, the attempt never starts
        // (as when its lease runs out unstarted) and the task fails.
        if is_overdue(task.deadline_ms, clock_ms) {
            self.end_attempt(
                clock_ms,
                id,
                AttemptOutcome::Expired,
                "the task's total deadline passed before the attempt started".into(),
                TaskState::Failed,
            )?;
            return Err(Refusal::LeaseLost);
        }
        task.state = TaskState::Running;
        if let Some(current) = task.attempts.last_mut() {
            current.started_at_ms = Some(clock_ms);
        }
        let task = task.clone();
        self.note_attempt(id, ChangeKind::Started);
        Ok(task)
    }

    /// Extends an active attempt's lease; the permit is held for exactly as long.
    pub fn renew(
        &mut self,
        clock_ms: u64,
        id: u64,
        attempt: u32,
        worker: &str,
        lease_ttl_ms: i64,
    ) -> Result<Task, Refusal> {
        validate::ttl(lease_ttl_ms)?;
        self.expire_lease_if_overdue(clock_ms, id);
        let until = deadline_after(clock_ms, lease_ttl_ms);
        let task = self.active(id, attempt, worker)?;
        let current = task.attempts.last_mut().ok_or(Refusal::LeaseLost)?;
        let old = current.lease_until_ms;
        current.lease_until_ms = until;
        let task = task.clone();
        self.leases.remove(&(old, id));
        self.leases.insert((until, id));
        self.note_attempt(id, ChangeKind::Renewed);
        Ok(task)
    }

    /// Finishes a running attempt successfully. Repeating the same completion returns the task
    /// and changes nothing.
    pub fn complete(
        &mut self,
        clock_ms: u64,
        id: u64,
        attempt: u32,
        worker: &str,
        result: Vec<u8>,
    ) -> Result<Task, Refusal> {
        validate::bounded_bytes("result", &result, MAX_PAYLOAD_BYTES)?;
        if let Some(task) = self.already_ended(id, attempt, worker, AttemptOutcome::Succeeded) {
            return Ok(task);
        }
        self.expire_lease_if_overdue(clock_ms, id);
        let task = self.active(id, attempt, worker)?;
        if task.state != TaskState::Running {
            return Err(Refusal::NotStarted);
        }
        task.result = result;
        self.end_attempt(
            clock_ms,
            id,
            AttemptOutcome::Succeeded,
            String::new(),
            TaskState::Succeeded,
        )
    }

    /// Fails an active attempt. A retryable failure with attempts and time left backs off
    /// (releasing the permit meanwhile); anything else fails the task for good.
    pub fn fail(
        &mut self,
        clock_ms: u64,
        id: u64,
        attempt: u32,
        worker: &str,
        error: &str,
        retryable: bool,
    ) -> Result<Task, Refusal> {
        validate::bounded("error", error, MAX_TEXT_BYTES)?;
        if let Some(task) = self.already_ended(id, attempt, worker, AttemptOutcome::Failed) {
            return Ok(task);
        }
        self.expire_lease_if_overdue(clock_ms, id);
        let task = self.active(id, attempt, worker)?;
        let retry = retryable
            && task.started_attempts() < task.spec.max_attempts
            && !is_overdue(task.deadline_ms, clock_ms);
        let next = if retry {
            TaskState::RetryWait
        } else {
            TaskState::Failed
        };
        self.end_attempt(
            clock_ms,
            id,
            AttemptOutcome::Failed,
            error.to_string(),
            next,
        )
    }

    /// Reports that a running attempt's effect is unknown: the task needs review, the permit is
    /// released and the history kept.
    pub fn report_unknown(
        &mut self,
        clock_ms: u64,
        id: u64,
        attempt: u32,
        worker: &str,
        note: &str,
    ) -> Result<Task, Refusal> {
        validate::bounded("note", note, MAX_TEXT_BYTES)?;
        if let Some(task) = self.already_ended(id, attempt, worker, AttemptOutcome::Unknown) {
            return Ok(task);
        }
        self.expire_lease_if_overdue(clock_ms, id);
        let task = self.active(id, attempt, worker)?;
        if task.state != TaskState::Running {
            return Err(Refusal::NotStarted);
        }
        self.end_attempt(
            clock_ms,
            id,
            AttemptOutcome::Unknown,
            note.to_string(),
            TaskState::NeedsReview,
        )
    }

    /// Cancels a task that has not started; a leased attempt is cancelled and its permit freed.
    /// A task whose lease or total deadline has run out is judged so first.
    pub fn cancel(&mut self, clock_ms: u64, id: u64) -> Result<Task, Refusal> {
        self.expire_lease_if_overdue(clock_ms, id);
        self.fail_if_past_deadline(clock_ms, id);
        let task = self
            .tasks
            .get_mut(&id)
            .map(Arc::make_mut)
            .ok_or(Refusal::UnknownTask)?;
        match task.state {
            TaskState::Waiting => {
                self.dequeue(id);
                let task = self.finish(id, TaskState::Cancelled, "cancelled".into());
                self.note(id, ChangeKind::Cancelled);
                task
            }
            TaskState::RetryWait => {
                if let Some(at) = task.retry_at_ms.take() {
                    self.retries.remove(&(at, id));
                }
                let task = self.finish(id, TaskState::Cancelled, "cancelled".into());
                self.note(id, ChangeKind::Cancelled);
                task
            }
            TaskState::Leased => self.end_attempt(
                clock_ms,
                id,
                AttemptOutcome::Cancelled,
                "cancelled".into(),
                TaskState::Cancelled,
            ),
            TaskState::Running => Err(Refusal::AlreadyStarted),
            _ => Err(Refusal::AlreadySettled),
        }
    }

    /// Materialises everything due at `clock_ms`: expired leases (their permits are freed),
    /// back-offs that ended, and total deadlines of tasks not running. Returns how many.
    pub fn sweep(&mut self, clock_ms: u64) -> u64 {
        self.sweep_first(clock_ms, usize::MAX, usize::MAX, usize::MAX)
    }

    /// [`TaskQueue::sweep`] bounded: at most the first `leases` expired leases, then the first
    /// `retries` ended back-offs, then the first `deadlines` passed total deadlines of tasks not
    /// running, each in time order (then task id). Returns how many it materialised.
    pub fn sweep_first(
        &mut self,
        clock_ms: u64,
        leases: usize,
        retries: usize,
        mut deadlines: usize,
    ) -> u64 {
        let mut changed = 0;
        for _ in 0..leases {
            let Some(&(until, id)) = self.leases.first() else {
                break;
            };
            if !is_overdue(until, clock_ms) {
                break;
            }
            // Taken off the index first, so an index entry that no longer matches its attempt
            // can never make this loop spin.
            self.leases.pop_first();
            self.expire_lease(clock_ms, id);
            changed += 1;
        }
        for _ in 0..retries {
            let Some(&(at, id)) = self.retries.first() else {
                break;
            };
            if at > clock_ms {
                break;
            }
            self.retries.pop_first();
            // A back-off that ends past the task's total deadline fails it: requeued, it would
            // be announced leasable, and a lease would only fail it. That takes the task's
            // deadline, due no later, off the deadlines to come: it counts against their bound,
            // so the sweep never reaches a deadline its leader did not weigh.
            if self
                .tasks
                .get(&id)
                .is_some_and(|t| is_overdue(t.deadline_ms, clock_ms))
            {
                if self.fail_past_deadline(id) {
                    changed += 1;
                }
                deadlines = deadlines.saturating_sub(1);
                continue;
            }
            if let Some(task) = self.tasks.get_mut(&id).map(Arc::make_mut) {
                task.state = TaskState::Waiting;
                task.retry_at_ms = None;
                self.enqueue(id);
                self.note(id, ChangeKind::Requeued);
                self.note_if_leasable(id);
                changed += 1;
            }
        }
        for _ in 0..deadlines {
            let Some(&(deadline, id)) = self.deadlines.first() else {
                break;
            };
            if !is_overdue(deadline, clock_ms) {
                break;
            }
            self.deadlines.pop_first();
            if self.fail_past_deadline(id) {
                changed += 1;
            }
        }
        changed
    }

    /// The times of the expired leases at `clock_ms`, earliest first.
    pub(crate) fn due_leases(&self, clock_ms: u64) -> impl Iterator<Item = (u64, &u64)> + '_ {
        self.leases
            .iter()
            .map(|(until, id)| (*until, id))
            .take_while(move |(until, _)| is_overdue(*until, clock_ms))
    }

    /// The times of the back-offs ended at `clock_ms`, earliest first.
    pub(crate) fn due_retries(&self, clock_ms: u64) -> impl Iterator<Item = (u64, &u64)> + '_ {
        self.retries
            .iter()
            .map(|(at, id)| (*at, id))
            .take_while(move |(at, _)| *at <= clock_ms)
    }

    /// The passed total deadlines, at `clock_ms`, of tasks not running, earliest first.
    pub(crate) fn due_deadlines(&self, clock_ms: u64) -> impl Iterator<Item = (u64, &u64)> + '_ {
        self.deadlines
            .iter()
            .map(|(deadline, id)| (*deadline, id))
            .take_while(move |(deadline, _)| is_overdue(*deadline, clock_ms))
    }

    /// Weighs the expiry of a task's lease: the attempt lost and the task leasable again (each
    /// carrying the task), and its key freed when it held a permit (the permit names the
    /// namespace's queues, added up once per namespace).
    pub(crate) fn lease_weigher(&self) -> impl FnMut(u64) -> Weight + '_ {
        let mut queue_names: BTreeMap<&str, usize> = BTreeMap::new();
        move |id| {
            let Some(task) = self.tasks.get(&id) else {
                return Weight::NONE;
            };
            let ended = self.task_weight(task).times(2);
            match task.active_attempt() {
                Some(attempt) if attempt.token.is_some() => {
                    let queues = *queue_names
                        .entry(task.namespace.as_str())
                        .or_insert_with(|| self.queues_of(&task.namespace).map(String::len).sum());
                    let key = task.spec.concurrency_key.len();
                    ended.plus(Weight::change(
                        2 * key + attempt.worker.len() + task.namespace.len() + queues,
                    ))
                }
                _ => ended,
            }
        }
    }

    /// What the end of task `id`'s back-off adds to a sweep's changes: requeued and leasable,
    /// each carrying the task.
    pub(crate) fn retry_weight(&self, id: u64) -> Weight {
        self.tasks
            .get(&id)
            .map_or(Weight::NONE, |task| self.task_weight(task).times(2))
    }

    /// What failing task `id` on its total deadline adds to a sweep's changes: one change
    /// carrying the task.
    pub(crate) fn deadline_weight(&self, id: u64) -> Weight {
        self.tasks
            .get(&id)
            .map_or(Weight::NONE, |task| self.task_weight(task))
    }

    /// One change carrying `task` as it will stand: its key, its latest worker, and room for the
    /// note the change's cause adds to the attempt.
    fn task_weight(&self, task: &Task) -> Weight {
        const ID_AND_NOTE: usize = 20 + 128;
        let worker = task.attempts.last().map_or(0, |a| a.worker.len());
        Weight::change(ID_AND_NOTE + worker + queue_task_bytes(task))
    }

    /// Whether a sweep at `clock_ms` has something to do.
    pub fn has_overdue(&self, clock_ms: u64) -> bool {
        let lease_due = self
            .leases
            .first()
            .is_some_and(|(u, _)| is_overdue(*u, clock_ms));
        let retry_due = self.retries.first().is_some_and(|(at, _)| *at <= clock_ms);
        let deadline_due = self
            .deadlines
            .first()
            .is_some_and(|(d, _)| is_overdue(*d, clock_ms));
        lease_due || retry_due || deadline_due
    }

    /// Whether a lease by `worker` on `queues` at `clock_ms` could hand out something (read-only,
    /// so an idle worker costs no log entry). Errs on the side of "yes" for the expiries the
    /// lease would materialise first (`TaskQueue::due_for`).
    pub fn has_leasable(&self, clock_ms: u64, worker: &str, queues: &[String]) -> bool {
        let Some(capable) = self.workers.get(worker).map(|w| w.concurrency_keys) else {
            return false;
        };
        let Ok(queues) = self.resolve_queues(queues) else {
            return false;
        };
        if self.due_for(clock_ms, &queues) {
            return true;
        }
        self.leasable.candidates(&queues, capable).any(|id| {
            self.tasks
                .get(&id)
                .is_some_and(|task| permit_key(task).is_none_or(|key| !self.token_exhausted(&key)))
        })
    }

    /// Whether an expiry that a lease at `clock_ms` materialises before it looks for tasks (the
    /// first [`MAX_LEASE_SWEEP`] due of each kind) may give it something in `queues` (sorted):
    /// a lapsed lease or an ended back-off of their task, or any keyed task's expiry (its key
    /// may be one their tasks wait on). Anything due behind those, or of other queues, the
    /// leader's sweeper takes as soon as it is due (within its 50 ms spacing); waking every long
    /// poll for any expiry due made each propose empty leases, a log entry per round trip, until
    /// the sweep landed.
    fn due_for(&self, clock_ms: u64, queues: &Queues) -> bool {
        let task = |id: &u64| self.tasks.get(id);
        let theirs = |id: &u64| task(id).is_some_and(|t| queues.contains(&t.spec.queue));
        let keyed = |id: &u64| task(id).is_some_and(|t| permit_key(t).is_some());
        self.due_leases(clock_ms)
            .take(MAX_LEASE_SWEEP)
            .any(|(_, id)| theirs(id) || keyed(id))
            || self
                .due_retries(clock_ms)
                .take(MAX_LEASE_SWEEP)
                .any(|(_, id)| theirs(id))
            || self
                .due_deadlines(clock_ms)
                .take(MAX_LEASE_SWEEP)
                .any(|(_, id)| keyed(id))
    }

    /// One task.
    pub fn get(&self, id: u64) -> Option<&Task> {
        self.tasks.get(&id).map(|task| &**task)
    }

    /// Tasks matching `filter`, by id.
    pub fn list<'a>(&'a self, filter: &'a TaskFilter) -> impl Iterator<Item = &'a Task> + 'a {
        self.tasks
            .values()
            .map(|task| &**task)
            .filter(move |task| filter.matches(task))
    }

    /// The tasks matching `filter` with ids above `after`, by id: at most `limit` of them, out of
    /// at most `scan` tasks looked at (each at least 1). Pages chained through
    /// [`TaskPage::next_after`] list every task once.
    pub fn list_page(
        &self,
        filter: &TaskFilter,
        after: u64,
        limit: usize,
        scan: usize,
    ) -> TaskPage<'_> {
        let (limit, scan) = (limit.max(1), scan.max(1));
        let mut tasks = Vec::new();
        let mut last = after;
        let rest = self.tasks.range((Bound::Excluded(after), Bound::Unbounded));
        for (scanned, (id, task)) in rest.enumerate() {
            if tasks.len() == limit || scanned == scan {
                return TaskPage {
                    tasks,
                    next_after: Some(last),
                };
            }
            last = *id;
            if filter.matches(task) {
                tasks.push(task);
            }
        }
        TaskPage {
            tasks,
            next_after: None,
        }
    }

    /// Every queue, by name.
    pub fn queues(&self) -> impl Iterator<Item = &Queue> {
        self.queues.values()
    }

    /// The names of `namespace`'s queues, in name order.
    fn queues_of(&self, namespace: &str) -> impl Iterator<Item = &String> {
        self.namespace_queues.get(namespace).into_iter().flatten()
    }

    /// Whether a queue of this name exists.
    pub fn has_queue(&self, name: &str) -> bool {
        self.queues.contains_key(name)
    }

    /// A registered worker.
    pub fn worker(&self, id: &str) -> Option<&Worker> {
        self.workers.get(id)
    }

    /// Raises every key's highest permit token by `by` ([`crate::State::raise_fences`]), and the
    /// task ids to come: a late report of the old cluster names a task id and attempt that the
    /// restored one must not have given to another task. A key whose tokens are used up stays
    /// so.
    pub(crate) fn raise_tokens(&mut self, by: u64) {
        self.next_task_id = self.next_task_id.saturating_add(by);
        for permit in self.permits.values_mut() {
            if permit.highest_token < u64::MAX {
                permit.highest_token = permit.highest_token.saturating_add(by);
            }
        }
    }

    /// The highest permit token ever issued for a key (0 if none).
    pub fn highest_token(&self, namespace: &str, key: &str) -> u64 {
        self.permits
            .get(&(namespace.to_string(), key.to_string()))
            .map_or(0, |p| p.highest_token)
    }

    /// The task holding a key's permit, if any.
    pub fn permit_holder(&self, namespace: &str, key: &str) -> Option<u64> {
        self.permits
            .get(&(namespace.to_string(), key.to_string()))
            .and_then(|p| p.holder)
    }

    /// Number of active attempts (live leases).
    pub fn active_leases(&self) -> usize {
        self.leases.len()
    }

    #[cfg(test)]
    pub(crate) fn set_highest_token(&mut self, namespace: &str, key: &str, token: u64) {
        self.permits
            .entry((namespace.to_string(), key.to_string()))
            .or_default()
            .highest_token = token;
    }

    fn resolve_queues(&self, queues: &[String]) -> Result<Queues, Refusal> {
        if queues.is_empty() {
            return Ok(Queues::All);
        }
        let mut resolved = Vec::new();
        for name in queues {
            if !self.queues.contains_key(name) {
                return Err(Refusal::UnknownQueue);
            }
            resolved.push(name.clone());
        }
        resolved.sort();
        resolved.dedup();
        Ok(Queues::Named(resolved))
    }

    /// Whether `key`'s permit has handed out its last token.
    fn token_exhausted(&self, key: &PermitKey) -> bool {
        self.permits
            .get(key)
            .is_some_and(|p| p.highest_token == u64::MAX)
    }

    /// Task `id` now waits: indexed for leasing.
    fn enqueue(&mut self, id: u64) {
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        self.ready
            .entry(task.spec.queue.clone())
            .or_default()
            .insert(id);
        self.leasable.insert(task, key_is_free(&self.permits, task));
    }

    /// Task `id` no longer waits.
    fn dequeue(&mut self, id: u64) {
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        if let Some(ready) = self.ready.get_mut(&task.spec.queue) {
            ready.remove(&id);
        }
        self.leasable.remove(task, key_is_free(&self.permits, task));
    }

    fn grant(
        &mut self,
        clock_ms: u64,
        fence_floor: u64,
        id: u64,
        worker: &str,
        until: u64,
    ) -> Option<Assignment> {
        self.dequeue(id);
        let task = self.tasks.get_mut(&id).map(Arc::make_mut)?;
        let token = match permit_key(task) {
            None => None,
            Some(key) => {
                // A key new to the store starts at the floor (crate::State::fence_floor).
                let permit = self.permits.entry(key.clone()).or_insert_with(|| Permit {
                    highest_token: fence_floor,
                    holder: None,
                });
                permit.highest_token += 1;
                permit.holder = Some(id);
                self.leasable.close(&key);
                Some(permit.highest_token)
            }
        };
        self.deadlines.remove(&(task.deadline_ms, id));
        let number = task.attempts.len() as u32 + 1;
        task.attempts.push(Attempt {
            number,
            worker: worker.to_string(),
            token,
            leased_at_ms: clock_ms,
            lease_until_ms: until,
            started_at_ms: None,
            ended_at_ms: None,
            outcome: AttemptOutcome::Active,
            note: String::new(),
        });
        task.state = TaskState::Leased;
        self.leases.insert((until, id));
        let assignment = Assignment {
            task_id: id,
            attempt: number,
            queue: task.spec.queue.clone(),
            namespace: task.namespace.clone(),
            handler: task.spec.handler.clone(),
            handler_version: task.spec.handler_version.clone(),
            payload_version: task.spec.payload_version.clone(),
            payload: task.spec.payload.clone(),
            concurrency_key: task.spec.concurrency_key.clone(),
            token,
            lease_until_ms: until,
        };
        self.note_attempt(id, ChangeKind::Leased);
        Some(assignment)
    }

    /// The task whose active attempt is `attempt`, held by `worker`; anything else is a lost lease.
    fn active(&mut self, id: u64, attempt: u32, worker: &str) -> Result<&mut Task, Refusal> {
        let task = self
            .tasks
            .get_mut(&id)
            .map(Arc::make_mut)
            .ok_or(Refusal::UnknownTask)?;
        match task.attempts.last() {
            Some(a)
                if a.number == attempt
                    && a.worker == worker
                    && a.outcome == AttemptOutcome::Active =>
            {
                Ok(task)
            }
            _ => Err(Refusal::LeaseLost),
        }
    }

    /// A repeat of a result already recorded for this attempt: answered, never applied twice.
    fn already_ended(
        &self,
        id: u64,
        attempt: u32,
        worker: &str,
        outcome: AttemptOutcome,
    ) -> Option<Task> {
        let task = self.tasks.get(&id)?;
        let last = task.attempts.last()?;
        (last.number == attempt && last.worker == worker && last.outcome == outcome)
            .then(|| Task::clone(task))
    }

    /// Ends the active attempt with `outcome`, frees its permit and lease, and moves the task to
    /// `next` (back-off is scheduled for `RetryWait`, waiting again for `Waiting`).
    fn end_attempt(
        &mut self,
        clock_ms: u64,
        id: u64,
        outcome: AttemptOutcome,
        note: String,
        next: TaskState,
    ) -> Result<Task, Refusal> {
        let task = self.move_on_from_attempt(clock_ms, id, outcome, note, next)?;
        self.note_attempt_ended(&task, outcome);
        Ok(task)
    }

    /// [`Self::end_attempt`] without recording the changes.
    fn move_on_from_attempt(
        &mut self,
        clock_ms: u64,
        id: u64,
        outcome: AttemptOutcome,
        note: String,
        next: TaskState,
    ) -> Result<Task, Refusal> {
        let task = self
            .tasks
            .get_mut(&id)
            .map(Arc::make_mut)
            .ok_or(Refusal::UnknownTask)?;
        let current = task.attempts.last_mut().ok_or(Refusal::LeaseLost)?;
        let until = current.lease_until_ms;
        current.outcome = outcome;
        current.ended_at_ms = Some(clock_ms);
        current.note = note.clone();
        self.leases.remove(&(until, id));
        self.release_permit(id);
        match next {
            TaskState::RetryWait => {
                let task = self
                    .tasks
                    .get_mut(&id)
                    .map(Arc::make_mut)
                    .ok_or(Refusal::UnknownTask)?;
                let at = clock_ms.saturating_add(backoff_ms(task.started_attempts().max(1)));
                task.state = TaskState::RetryWait;
                task.retry_at_ms = Some(at);
                task.last_error = note;
                self.retries.insert((at, id));
                self.deadlines.insert((task.deadline_ms, id));
                Ok(task.clone())
            }
            TaskState::Waiting => {
                let task = self
                    .tasks
                    .get_mut(&id)
                    .map(Arc::make_mut)
                    .ok_or(Refusal::UnknownTask)?;
                task.state = TaskState::Waiting;
                task.last_error = note;
                self.deadlines.insert((task.deadline_ms, id));
                let task = task.clone();
                self.enqueue(id);
                Ok(task)
            }
            terminal => self.finish(id, terminal, note),
        }
    }

    /// Moves a task with no active attempt to a terminal state.
    fn finish(&mut self, id: u64, state: TaskState, note: String) -> Result<Task, Refusal> {
        let task = self
            .tasks
            .get_mut(&id)
            .map(Arc::make_mut)
            .ok_or(Refusal::UnknownTask)?;
        task.state = state;
        if state != TaskState::Succeeded {
            task.last_error = note;
        }
        self.deadlines.remove(&(task.deadline_ms, id));
        Ok(task.clone())
    }

    fn release_permit(&mut self, id: u64) {
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        if task.spec.concurrency_key.is_empty() {
            return;
        }
        let key = (task.namespace.clone(), task.spec.concurrency_key.clone());
        if let Some(permit) = self.permits.get_mut(&key) {
            if permit.holder == Some(id) {
                permit.holder = None;
                self.leasable.open(&key);
            }
        }
    }

    /// Fails a waiting or backing-off task whose total deadline the caller found passed; returns
    /// whether it did (an active attempt runs on until its lease ends).
    fn fail_past_deadline(&mut self, id: u64) -> bool {
        let Some(task) = self.tasks.get_mut(&id).map(Arc::make_mut) else {
            return false;
        };
        match task.state {
            TaskState::Waiting => self.dequeue(id),
            TaskState::RetryWait => {
                if let Some(at) = task.retry_at_ms.take() {
                    self.retries.remove(&(at, id));
                }
            }
            _ => return false,
        }
        let _ = self.finish(
            id,
            TaskState::Failed,
            "the task's total deadline passed".into(),
        );
        self.note(id, ChangeKind::Failed);
        true
    }

    /// Judges one task's total deadline at apply time, so that a command's answer never depends
    /// on whether a sweep ran first.
    fn fail_if_past_deadline(&mut self, clock_ms: u64, id: u64) {
        let due = self
            .tasks
            .get(&id)
            .is_some_and(|t| is_overdue(t.deadline_ms, clock_ms));
        if due {
            self.fail_past_deadline(id);
        }
    }

    fn expire_lease_if_overdue(&mut self, clock_ms: u64, id: u64) {
        let due = self
            .tasks
            .get(&id)
            .and_then(|t| t.active_attempt())
            .is_some_and(|a| is_overdue(a.lease_until_ms, clock_ms));
        if due {
            self.expire_lease(clock_ms, id);
        }
    }

    /// Lease expiry recovery: the permit is freed; a never-started attempt goes back to waiting,
    /// a started one retries while attempts and time remain and otherwise needs review (its
    /// effect is unknown).
    fn expire_lease(&mut self, clock_ms: u64, id: u64) {
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        let Some(current) = task.active_attempt() else {
            return;
        };
        let started = current.started_at_ms.is_some();
        let out_of_time = is_overdue(task.deadline_ms, clock_ms);
        let next = match (started, out_of_time) {
            (false, false) => TaskState::Waiting,
            (false, true) => TaskState::Failed,
            (true, _) if !out_of_time && task.started_attempts() < task.spec.max_attempts => {
                TaskState::RetryWait
            }
            (true, _) => TaskState::NeedsReview,
        };
        let note = if started {
            "the lease expired while the attempt was running".to_string()
        } else {
            "the lease expired before the attempt started".to_string()
        };
        let _ = self.end_attempt(clock_ms, id, AttemptOutcome::Expired, note, next);
    }
}

/// Recording changes for watches.
impl TaskQueue {
    /// Records a change of task `id` that concerns no attempt.
    fn note(&mut self, id: u64, kind: ChangeKind) {
        self.record(id, kind, false);
    }

    /// Records a change of task `id`'s latest attempt, naming its worker and fence (the permit
    /// token, or the attempt number for an unkeyed task).
    fn note_attempt(&mut self, id: u64, kind: ChangeKind) {
        self.record(id, kind, true);
    }

    fn record(&mut self, id: u64, kind: ChangeKind, attempt: bool) {
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        let (holder, fence) = match task.attempts.last() {
            Some(a) if attempt => (a.worker.clone(), a.token.unwrap_or(u64::from(a.number))),
            _ => (String::new(), 0),
        };
        let change = Change {
            primitive: Primitive::Queue,
            key: id.to_string(),
            kind,
            holder,
            fence,
            value: ChangeValue::queue_task(task),
        };
        self.journal.push(change);
    }

    /// Records `leasable` when task `id` waits and its concurrency key is free (or it has none).
    fn note_if_leasable(&mut self, id: u64) {
        let Some(task) = self.tasks.get(&id) else {
            return;
        };
        let key = &task.spec.concurrency_key;
        let free = key.is_empty()
            || self
                .permits
                .get(&(task.namespace.clone(), key.clone()))
                .is_none_or(|p| p.holder.is_none() && p.highest_token < u64::MAX);
        if task.state == TaskState::Waiting && free {
            self.note(id, ChangeKind::Leasable);
        }
    }

    /// Records how an attempt ended: the task's new state, after `lost` when its lease ran out
    /// (a watch of `needs_review`, `retry_wait` or `failed` sees those an expiry causes too; a
    /// never-started attempt's task waiting again is told by `leasable`); then `key_freed` when
    /// it held a permit, and `leasable` when the task waits again.
    fn note_attempt_ended(&mut self, task: &Task, outcome: AttemptOutcome) {
        let kind = match task.state {
            TaskState::RetryWait => ChangeKind::RetryWait,
            TaskState::Succeeded => ChangeKind::Succeeded,
            TaskState::Cancelled => ChangeKind::Cancelled,
            TaskState::NeedsReview => ChangeKind::NeedsReview,
            TaskState::Waiting => ChangeKind::Requeued,
            _ => ChangeKind::Failed,
        };
        let expired = outcome == AttemptOutcome::Expired;
        if expired {
            self.note_attempt(task.id, ChangeKind::Lost);
        }
        if !(expired && task.state == TaskState::Waiting) {
            self.note_attempt(task.id, kind);
        }
        let Some(attempt) = task.attempts.last() else {
            return;
        };
        if let Some(token) = attempt.token {
            let queues = self.queues_of(&task.namespace).cloned().collect();
            let key = task.spec.concurrency_key.clone();
            self.journal.push(Change {
                primitive: Primitive::Queue,
                key: key.clone(),
                kind: ChangeKind::KeyFreed,
                holder: attempt.worker.clone(),
                fence: token,
                value: ChangeValue::Permit(PermitView {
                    namespace: task.namespace.clone(),
                    highest_token: self.highest_token(&task.namespace, &key),
                    key,
                    queues,
                }),
            });
        }
        self.note_if_leasable(task.id);
    }

    /// The changes recorded since the last call (drained after every command).
    pub(crate) fn take_changes(&mut self) -> Vec<Change> {
        self.journal.take()
    }
}

fn validate_spec(spec: &TaskSpec) -> Result<(), Refusal> {
    validate::required("queue", &spec.queue, MAX_KEY_BYTES)?;
    validate::required("idempotency_key", &spec.idempotency_key, MAX_KEY_BYTES)?;
    validate::required("handler", &spec.handler, MAX_KEY_BYTES)?;
    validate::bounded("handler_version", &spec.handler_version, MAX_KEY_BYTES)?;
    validate::bounded("payload_version", &spec.payload_version, MAX_KEY_BYTES)?;
    validate::bounded_bytes("payload", &spec.payload, MAX_PAYLOAD_BYTES)?;
    key::validate(&spec.concurrency_key)?;
    validate::bounded("business_key", &spec.business_key, MAX_KEY_BYTES)?;
    if spec.max_attempts == 0 || spec.max_attempts > MAX_ATTEMPTS {
        return Err(Refusal::invalid(
            "max_attempts",
            format!("must be 1-{MAX_ATTEMPTS}"),
        ));
    }
    validate::ttl(spec.ttl_ms)
}

#[cfg(test)]
mod tests {
    //! Token exhaustion needs a permit near `u64::MAX`, which only this test hook can reach.
    #![allow(clippy::unwrap_used)]

    use super::*;

    const T0: u64 = 1_000_000;

    fn spec(idempotency_key: &str, concurrency_key: &str) -> TaskSpec {
        TaskSpec {
            queue: "q".into(),
            idempotency_key: idempotency_key.into(),
            handler: "h".into(),
            handler_version: "v1".into(),
            payload_version: "v1".into(),
            payload: Vec::new(),
            concurrency_key: concurrency_key.into(),
            business_key: String::new(),
            max_attempts: 3,
            ttl_ms: 600_000,
        }
    }

    fn queue() -> TaskQueue {
        let mut q = TaskQueue::default();
        q.create_queue(Queue {
            name: "q".into(),
            namespace: "ns".into(),
        })
        .unwrap();
        q.register_worker(Worker {
            id: "w".into(),
            concurrency_keys: true,
        })
        .unwrap();
        q
    }

    fn submit(q: &mut TaskQueue, idempotency_key: &str, concurrency_key: &str) -> u64 {
        q.submit(T0, spec(idempotency_key, concurrency_key))
            .unwrap()
            .task
            .id
    }

    #[test]
    fn the_last_token_is_u64_max_and_then_leasing_the_key_is_refused_without_wrapping() {
        let mut q = queue();
        q.set_highest_token("ns", "k", u64::MAX - 1);
        let a = submit(&mut q, "a", "k");
        let got = q.lease(T0, 0, "w", &[], 10, 10_000).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].token,
            Some(u64::MAX),
            "the last token is still handed out"
        );
        q.start(T0, a, 1, "w").unwrap();
        q.complete(T0, a, 1, "w", Vec::new()).unwrap();

        let b = submit(&mut q, "b", "k");
        let c = submit(&mut q, "c", "");
        let d = submit(&mut q, "d", "other");
        let got = q.lease(T0, 0, "w", &[], 1, 10_000).unwrap();
        let ids: Vec<u64> = got.iter().map(|a| a.task_id).collect();
        assert_eq!(ids, vec![c], "the exhausted key does not use up the limit");
        let got = q.lease(T0, 0, "w", &[], 10, 10_000).unwrap();
        assert_eq!(got.iter().map(|a| a.task_id).collect::<Vec<_>>(), vec![d]);
        assert_eq!(got[0].token, Some(1));

        // Nothing else is leasable: the exhausted key is refused, never wrapped to 0 or 1.
        assert!(!q.has_leasable(T0, "w", &[]));
        assert!(q.lease(T0, 0, "w", &[], 10, 10_000).unwrap().is_empty());
        let task = q.get(b).unwrap();
        assert_eq!(task.state, TaskState::Waiting);
        assert!(task.attempts.is_empty(), "no attempt was created");
        assert!(task.last_error.contains("exhausted"), "{}", task.last_error);
        assert_eq!(q.highest_token("ns", "k"), u64::MAX);
        assert_eq!(q.permit_holder("ns", "k"), None);
    }

    fn in_deadline_index(q: &TaskQueue, id: u64) -> bool {
        let deadline = q.get(id).unwrap().deadline_ms;
        q.deadlines.contains(&(deadline, id))
    }

    #[test]
    fn only_tasks_a_passed_deadline_can_fail_are_in_the_deadline_index() {
        let mut q = queue();
        let a = submit(&mut q, "a", "k");
        assert!(in_deadline_index(&q, a), "a waiting task");

        q.lease(T0, 0, "w", &[], 1, 10_000).unwrap();
        assert!(!in_deadline_index(&q, a), "a leased task");
        let expired = T0 + 10_000;
        assert_eq!(q.sweep(expired), 1);
        assert_eq!(q.get(a).unwrap().state, TaskState::Waiting);
        assert!(
            in_deadline_index(&q, a),
            "waiting again after its lease expired"
        );

        q.lease(expired, 0, "w", &[], 1, 10_000).unwrap();
        q.start(expired, a, 2, "w").unwrap();
        assert!(!in_deadline_index(&q, a), "a running task");
        q.fail(expired, a, 2, "w", "flaky", true).unwrap();
        assert_eq!(q.get(a).unwrap().state, TaskState::RetryWait);
        assert!(in_deadline_index(&q, a), "backing off");

        let retry_at = q.get(a).unwrap().retry_at_ms.unwrap();
        q.lease(retry_at, 0, "w", &[], 1, 10_000).unwrap();
        q.start(retry_at, a, 3, "w").unwrap();
        q.complete(retry_at, a, 3, "w", Vec::new()).unwrap();
        assert!(q.deadlines.is_empty(), "a finished task");
    }

    #[test]
    fn active_tasks_an_earlier_version_listed_by_deadline_are_dropped_when_read_back() {
        let mut q = queue();
        let a = submit(&mut q, "a", "");
        let b = submit(&mut q, "b", "");
        q.lease(T0, 0, "w", &[], 1, 1_200_000).unwrap();
        q.start(T0, a, 1, "w").unwrap();
        // As an earlier version kept it: the running task still listed.
        let deadline = q.get(a).unwrap().deadline_ms;
        q.deadlines.insert((deadline, a));

        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&q, config).unwrap();
        let (read_back, _): (TaskQueue, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert!(
            !in_deadline_index(&read_back, a),
            "the running task is dropped"
        );
        assert!(in_deadline_index(&read_back, b), "the waiting task stays");
    }

    #[test]
    fn a_namespaces_queues_are_found_by_index_and_the_index_is_rebuilt_when_read_back() {
        let mut q = queue();
        for (name, namespace) in [("b", "ns"), ("x", "other"), ("a", "ns"), ("b", "ns")] {
            q.create_queue(Queue {
                name: name.into(),
                namespace: namespace.into(),
            })
            .unwrap();
        }
        // The same name in another namespace is refused and indexed nowhere.
        assert_eq!(
            q.create_queue(Queue {
                name: "x".into(),
                namespace: "ns".into(),
            }),
            Err(Refusal::StateConflict)
        );
        let names = |q: &TaskQueue, namespace: &str| -> Vec<String> {
            q.queues_of(namespace).cloned().collect()
        };
        assert_eq!(names(&q, "ns"), ["a", "b", "q"]);
        assert_eq!(names(&q, "other"), ["x"]);
        assert!(names(&q, "none").is_empty());

        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&q, config).unwrap();
        let (read_back, _): (TaskQueue, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(read_back.namespace_queues, q.namespace_queues);
        assert_eq!(names(&read_back, "ns"), ["a", "b", "q"]);
    }

    #[test]
    fn pages_of_a_listing_add_up_to_the_whole_and_stop_where_their_bounds_say() {
        let mut q = queue();
        let ids: Vec<u64> = (0..25)
            .map(|i| submit(&mut q, &format!("t{i}"), if i % 3 == 0 { "k" } else { "" }))
            .collect();
        let all = TaskFilter::default();
        let keyed = TaskFilter {
            concurrency_key: Some("k".into()),
            ..TaskFilter::default()
        };
        for filter in [&all, &keyed] {
            let whole: Vec<u64> = q.list(filter).map(|t| t.id).collect();
            for (limit, scan) in [(1, 100), (4, 100), (10, 7), (25, 25), (100, 1_000)] {
                let mut listed = Vec::new();
                let mut after = 0;
                loop {
                    let page = q.list_page(filter, after, limit, scan);
                    assert!(page.tasks.len() <= limit);
                    listed.extend(page.tasks.iter().map(|t| t.id));
                    match page.next_after {
                        Some(next) => {
                            assert!(next > after, "a page moves on");
                            after = next;
                        }
                        None => break,
                    }
                }
                assert_eq!(listed, whole, "limit {limit}, scan {scan}");
            }
        }
        // A full page that ends at the last task says so.
        let last_page = q.list_page(&all, ids[14], 10, 100);
        assert_eq!(last_page.tasks.len(), 10);
        assert_eq!(last_page.next_after, None);
        // A scan bound stops a page short, even empty, and says where to go on.
        let short = q.list_page(&keyed, ids[0], 10, 2);
        assert!(short.tasks.is_empty());
        assert_eq!(short.next_after, Some(ids[2]));
        assert!(q.list_page(&all, u64::MAX, 10, 10).tasks.is_empty());
    }

    #[test]
    fn once_the_last_token_is_released_the_key_is_never_leased_again() {
        let mut q = queue();
        q.set_highest_token("ns", "k", u64::MAX - 1);
        let a = submit(&mut q, "a", "k");
        let b = submit(&mut q, "b", "k");
        let got = q.lease(T0, 0, "w", &[], 10, 10_000).unwrap();
        assert_eq!(got.iter().map(|a| a.task_id).collect::<Vec<_>>(), vec![a]);
        // The lease runs out: the permit is released, the next lease is refused.
        let later = T0 + 10_000;
        assert!(q.lease(later, 0, "w", &[], 10, 10_000).unwrap().is_empty());
        for id in [a, b] {
            assert_eq!(q.get(id).unwrap().state, TaskState::Waiting);
        }
        assert_eq!(q.get(a).unwrap().attempts.len(), 1);
        assert!(q.get(b).unwrap().attempts.is_empty());
        assert_eq!(q.highest_token("ns", "k"), u64::MAX);
    }
}
