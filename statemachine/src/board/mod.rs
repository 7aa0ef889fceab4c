//! The task board: claims on seeded tasks, with dependencies, store-minted tokens and fences.
//!
//! The host seeds the topology (ids and dependencies). A claim is one atomic read-judge-write:
//! unknown, done, blocked by an unfinished dependency, held by a live lease, or granted with a
//! fresh random token and `fence = highest fence ever issued for this task + 1`. Release, complete
//! and renew act only with the current, unexpired token, so a late holder can never touch the
//! lease of whoever claimed after it. Renewal extends the lease without changing token or fence:
//! renewal is not a takeover.

mod check;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use check::{check, BoardProblem, BoardProblemCode};

use crate::change::{board_task_bytes, Change, ChangeKind, ChangeValue, Journal, Primitive};
use crate::command::Stamp;
use crate::error::Refusal;
use crate::limits::{MAX_AGENT_BYTES, MAX_DEPENDENCIES, MAX_KEY_BYTES};
use crate::sweep::Weight;
use crate::time::{deadline_after, is_overdue};
use crate::validate;

/// A task's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Free to claim (once its dependencies are done).
    Open,
    /// Held by a lease.
    Claimed,
    /// Completed; terminal.
    Done,
    /// A state name outside the vocabulary, for judging snapshots from any store.
    Unrecognized(String),
}

impl TaskState {
    /// The wire name.
    pub fn as_str(&self) -> &str {
        match self {
            TaskState::Open => "open",
            TaskState::Claimed => "claimed",
            TaskState::Done => "done",
            TaskState::Unrecognized(name) => name,
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Self {
        match name {
            "open" => TaskState::Open,
            "claimed" => TaskState::Claimed,
            "done" => TaskState::Done,
            other => TaskState::Unrecognized(other.to_string()),
        }
    }
}

/// A claim on a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Who holds it.
    pub agent: String,
    /// The store-minted credential (128 random bits, hex). Empty in listings: only the claimer
    /// ever sees it.
    pub token: String,
    /// Strictly increasing per task across all claims, never reset.
    pub fence: u64,
    /// The lease ends at this store time (Unix ms).
    pub until_ms: u64,
}

/// A task as the board holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// The host's id.
    pub id: String,
    /// Ids that must be done before this task can be claimed.
    pub deps: Vec<String>,
    /// Lifecycle state.
    pub state: TaskState,
    /// The current lease while claimed.
    pub lease: Option<Lease>,
    /// The highest fence ever issued for this task (0 before the first claim).
    pub max_fence: u64,
}

/// A task as the host seeds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The task's id.
    pub id: String,
    /// Its dependencies.
    pub deps: Vec<String>,
}

/// A board command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Seed (or re-seed) tasks: same id overwrites the dependencies and clears the lease; a done
    /// task stays done.
    Seed(Vec<TaskSpec>),
    /// Claim a task.
    Claim {
        /// Task id.
        id: String,
        /// Claiming agent.
        agent: String,
        /// Lease length in ms (> 0).
        ttl_ms: i64,
    },
    /// Give a claim back.
    Release {
        /// Task id.
        id: String,
        /// The claim's token.
        token: String,
    },
    /// Mark the claimed task done.
    Complete {
        /// Task id.
        id: String,
        /// The claim's token.
        token: String,
    },
    /// Extend a live claim.
    Renew {
        /// Task id.
        id: String,
        /// The claim's token.
        token: String,
        /// New lease length from now, in ms (> 0).
        ttl_ms: i64,
    },
}

impl Command {
    /// The command's name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Seed(_) => "board.seed",
            Command::Claim { .. } => "board.claim",
            Command::Release { .. } => "board.release",
            Command::Complete { .. } => "board.complete",
            Command::Renew { .. } => "board.renew",
        }
    }
}

/// Most tasks one seed command may carry.
pub const MAX_SEED_TASKS: usize = 10_000;

/// Every task, and an index of live lease deadlines for the sweep.
///
/// Tasks are shared (`Arc`) with the change records that report them without a lease (seeded,
/// released, completed, lost): such a record takes no copy, and the task is copied only if it
/// changes again while a record still holds it. A mass expiry thus allocates no task copies.
///
/// Task ids are shared too, between the task map and the deadline index (`Arc<str>`, written
/// into snapshots as plain strings): a copy of the board, which a snapshot build takes under the
/// state lock, then copies pointers rather than every id twice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Board {
    tasks: BTreeMap<Arc<str>, Arc<Task>>,
    lease_deadlines: BTreeSet<(u64, Arc<str>)>,
    /// Changes of the command being applied (transient).
    #[serde(skip)]
    journal: Journal,
}

impl Board {
    /// Raises every task's highest fence by `by` ([`crate::State::raise_fences`]).
    pub(crate) fn raise_fences(&mut self, by: u64) {
        for task in self.tasks.values_mut() {
            let task = Arc::make_mut(task);
            task.max_fence = task.max_fence.saturating_add(by);
        }
    }

    /// Seeds tasks; returns how many were written.
    pub fn seed(&mut self, fence_floor: u64, specs: Vec<TaskSpec>) -> Result<u64, Refusal> {
        if specs.is_empty() {
            return Err(Refusal::invalid("tasks", "must not be empty"));
        }
        if specs.len() > MAX_SEED_TASKS {
            return Err(Refusal::invalid(
                "tasks",
                format!("must hold at most {MAX_SEED_TASKS} tasks"),
            ));
        }
        for spec in &specs {
            validate::required("task.id", &spec.id, MAX_KEY_BYTES)?;
            if spec.deps.len() > MAX_DEPENDENCIES {
                return Err(Refusal::invalid(
                    "task.deps",
                    format!("must hold at most {MAX_DEPENDENCIES} ids"),
                ));
            }
            for dep in &spec.deps {
                validate::required("task.deps", dep, MAX_KEY_BYTES)?;
                if dep == &spec.id {
                    return Err(Refusal::invalid(
                        "task.deps",
                        "a task cannot depend on itself",
                    ));
                }
            }
        }
        let written = specs.len() as u64;
        for spec in specs {
            let (id, previous) = match self.tasks.remove_entry(spec.id.as_str()) {
                Some((id, task)) => (id, Some(task)),
                None => (Arc::from(spec.id.as_str()), None),
            };
            // A task new to the store starts at the floor (crate::State::fence_floor).
            let max_fence = previous.as_ref().map_or(fence_floor, |task| task.max_fence);
            // A done task stays done: hosts commonly re-seed their whole topology at start-up,
            // and that must never make finished work claimable (and so executable) again.
            let done = previous
                .as_ref()
                .is_some_and(|task| task.state == TaskState::Done);
            let task = Arc::new(Task {
                id: spec.id.clone(),
                deps: spec.deps,
                state: if done {
                    TaskState::Done
                } else {
                    TaskState::Open
                },
                lease: None,
                max_fence,
            });
            // Re-seeding a claimed task clears the claim: its holder lost it.
            if let Some(lease) = previous.and_then(|task| task.lease.clone()) {
                self.lease_deadlines.remove(&(lease.until_ms, id.clone()));
                self.journal
                    .push(change(ChangeKind::Lost, &lease.agent, lease.fence, &task));
            }
            self.journal.push(change(ChangeKind::Seeded, "", 0, &task));
            self.tasks.insert(id, task);
        }
        Ok(written)
    }

    /// Claims a task: unknown > done > blocked > taken > granted.
    pub fn claim(
        &mut self,
        stamp: &Stamp,
        clock_ms: u64,
        id: &str,
        agent: &str,
        ttl_ms: i64,
    ) -> Result<Task, Refusal> {
        validate_claim(id, agent, ttl_ms)?;
        self.expire_if_overdue(id, clock_ms);
        let (key, task) = self.tasks.get_key_value(id).ok_or(Refusal::UnknownTask)?;
        if let Some(refusal) = self.claim_refusal(task) {
            return Err(refusal);
        }
        let key = Arc::clone(key);
        let task = self
            .tasks
            .get_mut(id)
            .map(Arc::make_mut)
            .ok_or(Refusal::UnknownTask)?;
        let lease = Lease {
            agent: agent.to_string(),
            token: stamp.token(),
            fence: task.max_fence + 1,
            until_ms: deadline_after(clock_ms, ttl_ms),
        };
        task.max_fence = lease.fence;
        task.state = TaskState::Claimed;
        self.lease_deadlines.insert((lease.until_ms, key));
        task.lease = Some(lease);
        let task = task.clone();
        self.journal.push(leased(ChangeKind::Claimed, &task));
        Ok(task)
    }

    /// Gives a live claim back; the task is open again.
    pub fn release(&mut self, clock_ms: u64, id: &str, token: &str) -> Result<(), Refusal> {
        let lease = self.current_lease(clock_ms, id, token)?.clone();
        self.forget_deadline(lease.until_ms, id);
        if let Some(task) = self.tasks.get_mut(id) {
            let open = Arc::make_mut(task);
            open.state = TaskState::Open;
            open.lease = None;
            let released = change(ChangeKind::Released, &lease.agent, lease.fence, task);
            self.journal.push(released);
        }
        Ok(())
    }

    /// Completes a claimed task with its live claim; the task is done for good.
    pub fn complete(&mut self, clock_ms: u64, id: &str, token: &str) -> Result<(), Refusal> {
        let lease = self.current_lease(clock_ms, id, token)?.clone();
        self.forget_deadline(lease.until_ms, id);
        if let Some(task) = self.tasks.get_mut(id) {
            let done = Arc::make_mut(task);
            done.state = TaskState::Done;
            done.lease = None;
            let completed = change(ChangeKind::Completed, &lease.agent, lease.fence, task);
            self.journal.push(completed);
        }
        Ok(())
    }

    /// Extends a live claim to `clock + ttl`; token and fence stay the same.
    pub fn renew(
        &mut self,
        clock_ms: u64,
        id: &str,
        token: &str,
        ttl_ms: i64,
    ) -> Result<Task, Refusal> {
        validate::ttl(ttl_ms)?;
        let old_until = self.current_lease(clock_ms, id, token)?.until_ms;
        let until = deadline_after(clock_ms, ttl_ms);
        let key = self.key(id).ok_or(Refusal::UnknownTask)?;
        self.lease_deadlines.remove(&(old_until, key.clone()));
        self.lease_deadlines.insert((until, key));
        let task = self.task_mut(id).ok_or(Refusal::UnknownTask)?;
        if let Some(lease) = task.lease.as_mut() {
            lease.until_ms = until;
        }
        let task = task.clone();
        self.journal.push(leased(ChangeKind::Renewed, &task));
        Ok(task)
    }

    /// Frees every lease whose time is up; returns how many.
    pub fn sweep(&mut self, clock_ms: u64) -> u64 {
        self.sweep_first(clock_ms, usize::MAX)
    }

    /// Frees the `max` leases that fell due first (fewer when fewer are due), in deadline order
    /// (then task id); returns how many.
    pub(crate) fn sweep_first(&mut self, clock_ms: u64, max: usize) -> u64 {
        let mut expired = 0;
        for _ in 0..max {
            if !self.has_overdue(clock_ms) {
                break;
            }
            let Some((_, id)) = self.lease_deadlines.pop_first() else {
                break;
            };
            if let Some(task) = self.tasks.get_mut(&*id) {
                if let Some(lost) = expire(task, &id) {
                    self.journal.push(lost);
                }
                expired += 1;
            }
        }
        expired
    }

    /// The deadlines of the leases due at `clock_ms`, earliest first (what [`Board::sweep_first`]
    /// takes in turn).
    pub(crate) fn due(&self, clock_ms: u64) -> impl Iterator<Item = (u64, &str)> + '_ {
        self.lease_deadlines
            .iter()
            .map(|(until, id)| (*until, &**id))
            .take_while(move |(until, _)| is_overdue(*until, clock_ms))
    }

    /// What expiring the lease on task `id` adds to a sweep's changes: one change carrying the
    /// task.
    pub(crate) fn expiry_weight(&self, id: &str) -> Weight {
        self.tasks.get(id).map_or(Weight::NONE, |task| {
            let agent = task.lease.as_ref().map_or(0, |lease| lease.agent.len());
            Weight::change(id.len() + agent + board_task_bytes(task))
        })
    }

    /// Whether some lease is due for the sweep.
    pub fn has_overdue(&self, clock_ms: u64) -> bool {
        self.lease_deadlines
            .first()
            .is_some_and(|(until, _)| is_overdue(*until, clock_ms))
    }

    /// One task.
    pub fn get(&self, id: &str) -> Option<&Task> {
        self.tasks.get(id).map(|task| &**task)
    }

    /// Every task, ordered by id.
    pub fn tasks(&self) -> impl Iterator<Item = &Task> {
        self.tasks.values().map(|task| &**task)
    }

    /// [`Board::tasks`] as shared pointers: cheap to take while holding the state, to read after
    /// letting it go.
    pub fn shared_tasks(&self) -> impl Iterator<Item = &Arc<Task>> {
        self.tasks.values()
    }

    /// One task, to change: copied first if a change record still shares it.
    fn task_mut(&mut self, id: &str) -> Option<&mut Task> {
        self.tasks.get_mut(id).map(Arc::make_mut)
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the board is empty.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Number of live leases.
    pub fn leases(&self) -> usize {
        self.lease_deadlines.len()
    }

    /// The lease `token` names, if it is the task's current and unexpired one.
    fn current_lease(&mut self, clock_ms: u64, id: &str, token: &str) -> Result<&Lease, Refusal> {
        validate::required("id", id, MAX_KEY_BYTES)?;
        validate::required("token", token, MAX_KEY_BYTES)?;
        self.expire_if_overdue(id, clock_ms);
        let task = self.tasks.get(id).ok_or(Refusal::UnknownTask)?;
        match &task.lease {
            Some(lease) if lease.token == token => Ok(lease),
            _ => Err(Refusal::LeaseLost),
        }
    }

    /// The refusal [`Board::claim`] would answer at `clock_ms` without changing anything, judged
    /// on the board as it stands; `None` when the claim would be granted, or when judging it would
    /// first expire an overdue lease (a change). The leader answers such refusals without a log
    /// entry.
    pub fn claim_refused(
        &self,
        clock_ms: u64,
        id: &str,
        agent: &str,
        ttl_ms: i64,
    ) -> Option<Refusal> {
        if let Err(refusal) = validate_claim(id, agent, ttl_ms) {
            return Some(refusal);
        }
        let Some(task) = self.tasks.get(id) else {
            return Some(Refusal::UnknownTask);
        };
        if task
            .lease
            .as_ref()
            .is_some_and(|lease| is_overdue(lease.until_ms, clock_ms))
        {
            return None;
        }
        self.claim_refusal(task)
    }

    /// Why `task` cannot be claimed as it stands: done > blocked > taken.
    fn claim_refusal(&self, task: &Task) -> Option<Refusal> {
        match task.state {
            TaskState::Done => Some(Refusal::AlreadyDone),
            _ if self.blocked(task) => Some(Refusal::Blocked),
            TaskState::Claimed => Some(Refusal::Taken),
            _ => None,
        }
    }

    fn blocked(&self, task: &Task) -> bool {
        task.deps.iter().any(|dep| {
            self.tasks
                .get(dep.as_str())
                .is_none_or(|dep| dep.state != TaskState::Done)
        })
    }

    /// Lazy expiry: a lease judged past its time is dropped right here.
    fn expire_if_overdue(&mut self, id: &str, clock_ms: u64) {
        let Some((key, task)) = self.tasks.get_key_value(id) else {
            return;
        };
        let Some(until) = task.lease.as_ref().map(|lease| lease.until_ms) else {
            return;
        };
        if !is_overdue(until, clock_ms) {
            return;
        }
        self.lease_deadlines.remove(&(until, Arc::clone(key)));
        if let Some(task) = self.tasks.get_mut(id) {
            if let Some(lost) = expire(task, id) {
                self.journal.push(lost);
            }
        }
    }

    /// The task map's own copy of `id` (the deadline index shares it).
    fn key(&self, id: &str) -> Option<Arc<str>> {
        self.tasks.get_key_value(id).map(|(key, _)| Arc::clone(key))
    }

    /// Takes the lease of `id` ending at `until_ms` off the deadline index.
    fn forget_deadline(&mut self, until_ms: u64, id: &str) {
        if let Some(key) = self.key(id) {
            self.lease_deadlines.remove(&(until_ms, key));
        }
    }

    /// The changes recorded since the last call (drained after every command).
    pub(crate) fn take_changes(&mut self) -> Vec<Change> {
        self.journal.take()
    }
}

fn validate_claim(id: &str, agent: &str, ttl_ms: i64) -> Result<(), Refusal> {
    validate::required("id", id, MAX_KEY_BYTES)?;
    validate::required("agent", agent, MAX_AGENT_BYTES)?;
    validate::ttl(ttl_ms)
}

/// Ends a claim whose time is up: the task is open again and the claimer lost its lease. `id`
/// is the task's id (the change's key; the lease's agent becomes its holder).
fn expire(task: &mut Arc<Task>, id: &str) -> Option<Change> {
    let open = Arc::make_mut(task);
    let lease = open.lease.take()?;
    open.state = TaskState::Open;
    Some(Change {
        primitive: Primitive::Board,
        key: id.to_string(),
        kind: ChangeKind::Lost,
        holder: lease.agent,
        fence: lease.fence,
        value: ChangeValue::shared_board_task(task),
    })
}

/// A change naming the task's current claim as holder and fence (the task is copied into it,
/// its token withheld).
fn leased(kind: ChangeKind, task: &Task) -> Change {
    let (agent, fence) = task
        .lease
        .as_ref()
        .map_or(("", 0), |lease| (lease.agent.as_str(), lease.fence));
    record(kind, agent, fence, &task.id, ChangeValue::board_task(task))
}

/// A change reporting `task` as it now stands (shared with it when it holds no lease).
fn change(kind: ChangeKind, holder: &str, fence: u64, task: &Arc<Task>) -> Change {
    record(
        kind,
        holder,
        fence,
        &task.id,
        ChangeValue::shared_board_task(task),
    )
}

fn record(kind: ChangeKind, holder: &str, fence: u64, key: &str, value: ChangeValue) -> Change {
    Change {
        primitive: Primitive::Board,
        key: key.to_string(),
        kind,
        holder: holder.to_string(),
        fence,
        value,
    }
}
