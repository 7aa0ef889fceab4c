//! The task queue's vocabulary.

use serde::{Deserialize, Serialize};

/// A queue: tasks are submitted to it and leased from it. Queues in one namespace share
/// concurrency keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queue {
    /// Unique queue name.
    pub name: String,
    /// The namespace whose concurrency keys its tasks share.
    pub namespace: String,
}

/// A task's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaskState {
    /// Submitted and waiting to be leased (possibly because its concurrency key is busy).
    Waiting,
    /// Leased to a worker, not started yet.
    Leased,
    /// Started by its worker.
    Running,
    /// A retryable failure; waiting for its back-off to pass.
    RetryWait,
    /// Finished successfully.
    Succeeded,
    /// Failed for good (non-retryable, attempts exhausted, or total deadline passed).
    Failed,
    /// Cancelled before it started.
    Cancelled,
    /// The outcome of an attempt is unknown (reported, or a running lease expired with no
    /// attempts left): someone must look.
    NeedsReview,
}

impl TaskState {
    /// The wire name (`WAITING`, `LEASED`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            TaskState::Waiting => "WAITING",
            TaskState::Leased => "LEASED",
            TaskState::Running => "RUNNING",
            TaskState::RetryWait => "RETRY_WAIT",
            TaskState::Succeeded => "SUCCEEDED",
            TaskState::Failed => "FAILED",
            TaskState::Cancelled => "CANCELLED",
            TaskState::NeedsReview => "NEEDS_REVIEW",
        }
    }

    /// Parses a wire name (case-insensitive).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "WAITING" => TaskState::Waiting,
            "LEASED" => TaskState::Leased,
            "RUNNING" => TaskState::Running,
            "RETRY_WAIT" => TaskState::RetryWait,
            "SUCCEEDED" => TaskState::Succeeded,
            "FAILED" => TaskState::Failed,
            "CANCELLED" => TaskState::Cancelled,
            "NEEDS_REVIEW" | "UNKNOWN" => TaskState::NeedsReview,
            _ => return None,
        })
    }

    /// Whether the task is finished (no attempt will ever run again).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            TaskState::Succeeded
                | TaskState::Failed
                | TaskState::Cancelled
                | TaskState::NeedsReview
        )
    }

    /// Whether an attempt is active (holding the permit).
    pub fn is_active(&self) -> bool {
        matches!(self, TaskState::Leased | TaskState::Running)
    }
}

/// What became of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptOutcome {
    /// Still leased or running.
    Active,
    /// Completed successfully.
    Succeeded,
    /// Failed (retryable or not).
    Failed,
    /// Its lease ran out.
    Expired,
    /// Cancelled before it started.
    Cancelled,
    /// Its worker reported the effect unknown.
    Unknown,
}

impl AttemptOutcome {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptOutcome::Active => "ACTIVE",
            AttemptOutcome::Succeeded => "SUCCEEDED",
            AttemptOutcome::Failed => "FAILED",
            AttemptOutcome::Expired => "EXPIRED",
            AttemptOutcome::Cancelled => "CANCELLED",
            AttemptOutcome::Unknown => "UNKNOWN",
        }
    }
}

/// One attempt, kept as history for as long as the task exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1-based attempt number.
    pub number: u32,
    /// The worker it was leased to.
    pub worker: String,
    /// The permit token for the task's concurrency key (keyed tasks only): non-zero and strictly
    /// increasing per key.
    pub token: Option<u64>,
    /// Store time of the lease.
    pub leased_at_ms: u64,
    /// The lease (and the permit) ends at this store time unless renewed.
    pub lease_until_ms: u64,
    /// Store time of the start, once started.
    pub started_at_ms: Option<u64>,
    /// Store time it ended.
    pub ended_at_ms: Option<u64>,
    /// What became of it.
    pub outcome: AttemptOutcome,
    /// The failure or unknown-effect note.
    pub note: String,
}

/// What a submitter gives; the store adds the id, the namespace and everything else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The queue to submit to.
    pub queue: String,
    /// The identity of this submission: the same key with the same content returns the original
    /// receipt; with different content it is refused.
    pub idempotency_key: String,
    /// Which handler runs it.
    pub handler: String,
    /// The handler's version.
    pub handler_version: String,
    /// The payload's schema version.
    pub payload_version: String,
    /// Opaque payload (JSON by convention).
    pub payload: Vec<u8>,
    /// The resource key: one active attempt per (namespace, key) across all queues. Empty = none.
    pub concurrency_key: String,
    /// Business correlation; no effect on concurrency or deduplication.
    pub business_key: String,
    /// Attempts that may start before the task fails (> 0).
    pub max_attempts: u32,
    /// Total time the task may take from submission, in ms (> 0).
    pub ttl_ms: i64,
}

/// A task as the queue holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Store-assigned id, increasing in submission order.
    pub id: u64,
    /// The queue's namespace, frozen at submission.
    pub namespace: String,
    /// What was submitted (the concurrency key is frozen with it).
    pub spec: TaskSpec,
    /// Lifecycle state.
    pub state: TaskState,
    /// Every attempt, oldest first.
    pub attempts: Vec<Attempt>,
    /// Store time of the submission.
    pub submitted_at_ms: u64,
    /// The total deadline: `submitted + ttl`.
    pub deadline_ms: u64,
    /// When a task in back-off becomes leasable again.
    pub retry_at_ms: Option<u64>,
    /// The result of the successful attempt.
    pub result: Vec<u8>,
    /// The latest failure, unknown-effect note or scheduling remark.
    pub last_error: String,
}

impl Task {
    /// Attempts that were started (only those count against `max_attempts`).
    pub fn started_attempts(&self) -> u32 {
        self.attempts
            .iter()
            .filter(|a| a.started_at_ms.is_some())
            .count() as u32
    }

    /// The active attempt, if any.
    pub fn active_attempt(&self) -> Option<&Attempt> {
        self.attempts
            .last()
            .filter(|a| a.outcome == AttemptOutcome::Active)
    }
}

/// The answer to a submission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitReceipt {
    /// The task (the original one when replayed).
    pub task: Task,
    /// Whether this was a replay of an earlier submission with the same key and content.
    pub replayed: bool,
}

/// What a worker receives for one leased task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The task id.
    pub task_id: u64,
    /// The attempt number this lease is for.
    pub attempt: u32,
    /// The queue it came from.
    pub queue: String,
    /// Its namespace.
    pub namespace: String,
    /// The handler.
    pub handler: String,
    /// The handler version.
    pub handler_version: String,
    /// The payload version.
    pub payload_version: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// The concurrency key (empty = none).
    pub concurrency_key: String,
    /// The permit token (present exactly when the key is).
    pub token: Option<u64>,
    /// The lease ends at this store time unless renewed.
    pub lease_until_ms: u64,
}

/// A registered worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Worker {
    /// The worker's process identity.
    pub id: String,
    /// Whether it supports concurrency keys (fixed for the identity's life).
    pub concurrency_keys: bool,
}

/// A queue command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create a queue (idempotent for the same name and namespace).
    CreateQueue(Queue),
    /// Register a worker identity and its capabilities.
    RegisterWorker(Worker),
    /// Submit a task.
    Submit(TaskSpec),
    /// Lease up to `limit` tasks from `queues` for `worker`.
    Lease {
        /// The worker.
        worker: String,
        /// Queues to lease from (empty = every queue).
        queues: Vec<String>,
        /// Most tasks to lease (> 0).
        limit: u32,
        /// Lease length in ms (> 0).
        lease_ttl_ms: i64,
    },
    /// Confirm the start of a leased attempt.
    Start {
        /// Task id.
        task_id: u64,
        /// Attempt number.
        attempt: u32,
        /// The worker holding it.
        worker: String,
    },
    /// Extend an active attempt's lease and permit.
    Renew {
        /// Task id.
        task_id: u64,
        /// Attempt number.
        attempt: u32,
        /// The worker holding it.
        worker: String,
        /// New lease length from now in ms (> 0).
        lease_ttl_ms: i64,
    },
    /// Finish a running attempt successfully.
    Complete {
        /// Task id.
        task_id: u64,
        /// Attempt number.
        attempt: u32,
        /// The worker holding it.
        worker: String,
        /// The result.
        result: Vec<u8>,
    },
    /// Fail an active attempt; retryable failures back off and retry while attempts remain.
    Fail {
        /// Task id.
        task_id: u64,
        /// Attempt number.
        attempt: u32,
        /// The worker holding it.
        worker: String,
        /// What went wrong.
        error: String,
        /// Whether a retry is safe.
        retryable: bool,
    },
    /// Report that a running attempt's effect is unknown: the task needs review.
    ReportUnknown {
        /// Task id.
        task_id: u64,
        /// Attempt number.
        attempt: u32,
        /// The worker holding it.
        worker: String,
        /// What is known.
        note: String,
    },
    /// Cancel a task that has not started.
    Cancel {
        /// Task id.
        task_id: u64,
    },
}

impl Command {
    /// The command's name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Command::CreateQueue(_) => "queue.create",
            Command::RegisterWorker(_) => "queue.register_worker",
            Command::Submit(_) => "queue.submit",
            Command::Lease { .. } => "queue.lease",
            Command::Start { .. } => "queue.start",
            Command::Renew { .. } => "queue.renew",
            Command::Complete { .. } => "queue.complete",
            Command::Fail { .. } => "queue.fail",
            Command::ReportUnknown { .. } => "queue.report_unknown",
            Command::Cancel { .. } => "queue.cancel",
        }
    }
}
