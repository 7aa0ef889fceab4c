//! The recorded history: every operation any client invoked, with its invocation and completion
//! time on one monotonic clock and what came back.
//!
//! An operation ends in one of four ways. An answer ([`Outcome::Ok`]) and a contract refusal
//! ([`Outcome::Refused`], applied as a refusal: nothing changed) are definite. What a fault
//! explains — a timeout, an unreachable cluster, `SESSION_EXPIRED`, no leader, or no answer
//! before the run ended — is [`Outcome::Ambiguous`]: the command may or may not have taken
//! effect, at any time after its invocation. Any other error — a server code no correct store
//! sends for a data call (`SEQ_REUSED`: the session table answered another request's result), an
//! answer the client could not decode, a reply missing what it must carry — is
//! [`Outcome::Unexpected`]: as unknown in effect as an ambiguous one, and a violation by itself
//! ([`crate::robustness::check::unexpected_errors`]). Both stay in the history (checkers model
//! them as unknown) and are never counted as acknowledgements.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use baton_rpc::Error;

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// `offer(key, from, to)` with a TTL that never runs out during a run.
    Offer {
        /// Ticket key.
        key: String,
        /// Source.
        from: String,
        /// Addressee.
        to: String,
    },
    /// `take(key, to)`.
    Take {
        /// Ticket key.
        key: String,
        /// Taker.
        to: String,
    },
    /// `reply(key, token, done)`.
    Reply {
        /// Ticket key.
        key: String,
        /// Token presented.
        token: String,
    },
    /// `cancel(key, by)`.
    Cancel {
        /// Ticket key.
        key: String,
        /// Canceller.
        by: String,
    },
    /// `ticket(key)`: a linearizable read of one ticket.
    Read {
        /// Ticket key.
        key: String,
    },
    /// Board `claim(task, agent)`.
    Claim {
        /// Task id.
        task: String,
        /// Claimer.
        agent: String,
    },
    /// Board `release(task, token)` of the claim with this fence.
    ReleaseTask {
        /// Task id.
        task: String,
        /// Claim token.
        token: String,
        /// The claim's fence (for checking; not sent).
        fence: u64,
    },
    /// Board `renew(task, token)` of the claim with this fence.
    RenewTask {
        /// Task id.
        task: String,
        /// Claim token.
        token: String,
        /// The claim's fence (for checking; not sent).
        fence: u64,
    },
    /// Board `list()`.
    ListTasks,
    /// Board `claim(step, agent)` of a chain step (a task with a dependency).
    ClaimStep {
        /// Task id.
        task: String,
        /// Claimer.
        agent: String,
    },
    /// Board `complete(step, token)` of the claim with this fence.
    CompleteStep {
        /// Task id.
        task: String,
        /// The claim's fence (for checking; the token is sent).
        fence: u64,
    },
    /// Side-effect `acquire(action)`.
    Acquire {
        /// Action key.
        key: String,
        /// Resource.
        resource: String,
    },
    /// Side-effect `complete(action, lease)`.
    CompleteEffect {
        /// Action key.
        key: String,
        /// Resource.
        resource: String,
        /// The lease's fence.
        fence: u64,
    },
    /// Side-effect `release(action, lease)`.
    ReleaseEffect {
        /// Action key.
        key: String,
        /// Resource.
        resource: String,
        /// The lease's fence.
        fence: u64,
    },
    /// Side-effect `mark_uncertain(action, lease)`: the holder does not know whether its effect
    /// happened.
    MarkUncertain {
        /// Action key.
        key: String,
        /// Resource.
        resource: String,
        /// The lease's fence.
        fence: u64,
    },
    /// Side-effect `begin_reconcile(action)`.
    BeginReconcile {
        /// Action key.
        key: String,
    },
    /// Side-effect `resolve_uncertain(action, resolution)`.
    Resolve {
        /// Action key.
        key: String,
        /// Whether the resolver found that the effect happened.
        happened: bool,
        /// The result submitted (when it happened).
        result: String,
        /// Whether a "did not happen" is forced retryable.
        forced: bool,
        /// Whether the action is declared unsafe to repeat.
        unsafe_action: bool,
    },
    /// Side-effect `show(key)`.
    ShowAction {
        /// Action key.
        key: String,
    },
    /// Fenced sink `write(resource, fence, value)`.
    SinkWrite {
        /// Sink resource.
        resource: String,
        /// Fence presented.
        fence: u64,
        /// Value written (unique per write).
        value: String,
    },
    /// Fenced sink `read(resource)`.
    SinkRead {
        /// Sink resource.
        resource: String,
    },
    /// Queue `submit` of a keyed task.
    Submit {
        /// Idempotency key.
        idempotency_key: String,
        /// Concurrency key.
        concurrency_key: String,
    },
    /// Queue `lease(worker, limit 1)`.
    Lease {
        /// Worker id.
        worker: String,
    },
    /// Queue `start(task, attempt)`.
    StartAttempt {
        /// Task id.
        task: u64,
        /// Attempt number.
        attempt: u32,
        /// Worker id.
        worker: String,
        /// Concurrency key (for checking).
        concurrency_key: String,
        /// Permit token of the attempt (for checking).
        token: u64,
    },
    /// Queue `complete`, `fail` or `report_unknown` of a started attempt.
    EndAttempt {
        /// Task id.
        task: u64,
        /// Attempt number.
        attempt: u32,
        /// Worker id.
        worker: String,
        /// Concurrency key (for checking).
        concurrency_key: String,
        /// Permit token of the attempt (for checking).
        token: u64,
        /// Which of the three.
        end: AttemptEnd,
    },
    /// Queue `cancel(task)`, by the submitter.
    CancelTask {
        /// Task id.
        task: u64,
        /// Its concurrency key (for checking).
        concurrency_key: String,
    },
    /// Queue `attempts(task)`.
    Attempts {
        /// Task id.
        task: u64,
    },
    /// Checkpoint `save_if_newer(run, seq, data)`.
    SaveCheckpoint {
        /// Run id.
        run: String,
        /// Sequence number offered.
        seq: u64,
        /// Data saved (unique per save).
        data: String,
    },
    /// Checkpoint `load(run)`.
    LoadCheckpoint {
        /// Run id.
        run: String,
    },
    /// A watch delivered a checkpoint save (observed, not invoked: call = return = delivery).
    WatchSaved {
        /// Run id.
        run: String,
        /// Its seq.
        seq: u64,
        /// Its data.
        data: String,
    },
    /// A watch delivered a change of a ticket or a lease: a ticket's, a board claim's, a
    /// side-effect attempt's, a queue attempt's (observed, not invoked: call = return =
    /// delivery).
    WatchLease {
        /// The change's kind: `offered`, `claimed`, `granted`, `lost`, ...
        kind: String,
        /// Ticket key, task id (a queue task's in decimal) or action key.
        key: String,
        /// The agent the change names (the taker of a ticket, a queue attempt's worker; none
        /// for a side effect).
        holder: String,
        /// The ticket's generation or the lease's fence (a queue attempt's permit token).
        fence: u64,
    },
    /// A watch delivered an accepted fenced-sink write (observed, not invoked: call = return =
    /// delivery).
    WatchSinkWritten {
        /// Sink resource.
        resource: String,
        /// The write's fence.
        fence: u64,
        /// The resource's seen fence after the write.
        seen_fence: u64,
        /// The resource's accepted writes, this one included.
        writes: u64,
        /// The value written.
        value: String,
    },
    /// A watch met `COMPACTED` at `requested` and went on from the oldest revision kept (the
    /// answer's position).
    WatchCompacted {
        /// The revision it needed next.
        requested: u64,
    },
    /// A watch ended with an error it could not go on from.
    WatchEnded {
        /// The error.
        error: String,
    },
}

/// How a worker ends a started attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// `complete`: the task succeeds.
    Complete,
    /// `fail`: retried (back-off, then a new attempt) while attempts remain, or failed for good.
    Fail {
        /// Whether the worker asked for a retry.
        retryable: bool,
    },
    /// `report_unknown`: the effect's outcome is unknown; the task needs review.
    Unknown,
}

impl AttemptEnd {
    /// The attempt outcome the store records for it.
    pub fn outcome(self) -> &'static str {
        match self {
            AttemptEnd::Complete => "SUCCEEDED",
            AttemptEnd::Fail { .. } => "FAILED",
            AttemptEnd::Unknown => "UNKNOWN",
        }
    }

    /// The task state it leaves for good, if it does (a retryable failure may be retried).
    pub fn final_state(self) -> Option<&'static str> {
        match self {
            AttemptEnd::Complete => Some("SUCCEEDED"),
            AttemptEnd::Fail { retryable: false } => Some("FAILED"),
            AttemptEnd::Fail { retryable: true } => None,
            AttemptEnd::Unknown => Some("NEEDS_REVIEW"),
        }
    }
}

/// One attempt as `attempts(task)` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    /// Attempt number.
    pub number: u32,
    /// Worker.
    pub worker: String,
    /// Permit token.
    pub token: Option<u64>,
    /// Outcome name.
    pub outcome: String,
}

/// One task a lease handed out, as its answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedTask {
    /// Task id.
    pub task: u64,
    /// Attempt number.
    pub attempt: u32,
    /// Concurrency key (empty: none).
    pub key: String,
    /// Permit token (present exactly when the key is).
    pub token: Option<u64>,
    /// The lease's deadline on the store clock (Unix ms), when the answer carried one.
    pub until_ms: Option<u64>,
}

/// What came back from a successful operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A ticket (offer, read).
    Ticket {
        /// Generation.
        generation: u64,
        /// State name.
        state: String,
        /// Holder.
        holder: Option<String>,
    },
    /// A take's handle.
    Handle {
        /// Fence (= generation).
        fence: u64,
        /// Token.
        token: String,
    },
    /// Success without a value (reply, cancel, release, ...).
    Done,
    /// A board claim's lease (claim, renew).
    Lease {
        /// Fence.
        fence: u64,
        /// Token.
        token: String,
        /// The lease's deadline on the store clock (Unix ms), when the answer carried one.
        until_ms: Option<u64>,
    },
    /// Every board task: `(id, state, max_fence)`.
    Tasks(Vec<(String, String, u64)>),
    /// `acquire` granted.
    Granted {
        /// Fence.
        fence: u64,
        /// Holder identity.
        holder: String,
        /// The hold's deadline on the store clock (Unix ms), when the answer carried one.
        until_ms: Option<u64>,
    },
    /// `acquire` answered another outcome (`contended`, `in_progress`, ...).
    NotGranted(String),
    /// The recorded result of a completed action key: what `complete` and a "happened"
    /// resolution answer, and what `acquire` answers for a completed key.
    Result(String),
    /// A reconciler slot, held until this store time (Unix ms).
    Reconciling {
        /// When the occupancy ends.
        until_ms: u64,
    },
    /// A "did not happen" resolution made the key retryable.
    Retryable,
    /// An action key's view: status, fence, result.
    Action {
        /// Status name.
        status: String,
        /// Fence of its latest attempt.
        fence: u64,
        /// Recorded result.
        result: Option<String>,
    },
    /// A sink resource after a write or on a read.
    Sink {
        /// Highest fence accepted.
        seen_fence: u64,
        /// Accepted writes.
        writes: u64,
        /// The value (reads only; empty for writes).
        value: String,
    },
    /// A submitted task.
    Submitted {
        /// Task id.
        task: u64,
        /// Whether it was a replay.
        replayed: bool,
    },
    /// Leased assignments.
    Leased(Vec<LeasedTask>),
    /// A queue task's state after start / complete.
    TaskState(String),
    /// A queue task's attempts and state.
    AttemptList {
        /// Task state name.
        state: String,
        /// Every attempt.
        attempts: Vec<AttemptRecord>,
    },
    /// Where a watch delivered a change (or went on from, after a compaction).
    Position {
        /// Revision (log index).
        revision: u64,
        /// Place among the entry's changes.
        index: u32,
    },
    /// A loaded checkpoint.
    Checkpoint {
        /// Its seq.
        seq: u64,
        /// Its data.
        data: String,
    },
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not finished yet (only while a run is going on; unfinished at the end means ambiguous).
    Pending,
    /// Answered.
    Ok(Output),
    /// Refused by the contract with this code; nothing changed.
    Refused(String),
    /// Unknown: it may or may not have taken effect.
    Ambiguous(String),
    /// An error no fault explains; unknown in effect, like [`Outcome::Ambiguous`].
    Unexpected(String),
}

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct Op {
    /// Position in the history.
    pub index: usize,
    /// The client (a name like `handoff-2`); each client runs one operation at a time.
    pub client: String,
    /// What was asked.
    pub input: Input,
    /// Invocation, in microseconds since the run started.
    pub call: u64,
    /// Completion, for definite outcomes.
    pub ret: Option<u64>,
    /// What came back.
    pub outcome: Outcome,
}

impl Op {
    /// The output of an answered operation.
    pub fn ok(&self) -> Option<&Output> {
        match &self.outcome {
            Outcome::Ok(output) => Some(output),
            _ => None,
        }
    }

    /// The refusal code of a refused operation.
    pub fn refused(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Refused(code) => Some(code),
            _ => None,
        }
    }

    /// Whether the outcome is unknown.
    pub fn is_ambiguous(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Ambiguous(_) | Outcome::Unexpected(_) | Outcome::Pending
        )
    }

    /// Whether `self` completed before `other` was invoked (real-time order).
    pub fn precedes(&self, other: &Op) -> bool {
        self.ret.is_some_and(|ret| ret < other.call)
    }
}

/// Seconds with millisecond precision.
fn secs(us: u64) -> String {
    format!("{}.{:03}s", us / 1_000_000, (us / 1_000) % 1_000)
}

/// The first 8 characters of a token.
fn short(token: &str) -> &str {
    token.get(..8).unwrap_or(token)
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Input::Offer { key, from, to } => write!(f, "offer {key} from={from} to={to}"),
            Input::Take { key, to } => write!(f, "take {key} to={to}"),
            Input::Reply { key, token } => write!(f, "reply {key} token={}", short(token)),
            Input::Cancel { key, by } => write!(f, "cancel {key} by={by}"),
            Input::Read { key } => write!(f, "read {key}"),
            Input::Claim { task, agent } => write!(f, "claim {task} agent={agent}"),
            Input::ReleaseTask { task, token, fence } => {
                write!(f, "release {task} token={} fence={fence}", short(token))
            }
            Input::RenewTask { task, token, fence } => {
                write!(f, "renew {task} token={} fence={fence}", short(token))
            }
            Input::ListTasks => write!(f, "list tasks"),
            Input::Acquire { key, resource } => write!(f, "acquire {key} resource={resource}"),
            Input::CompleteEffect {
                key,
                resource,
                fence,
            } => write!(f, "complete {key} resource={resource} fence={fence}"),
            Input::ReleaseEffect {
                key,
                resource,
                fence,
            } => write!(f, "release {key} resource={resource} fence={fence}"),
            Input::MarkUncertain {
                key,
                resource,
                fence,
            } => write!(f, "mark-uncertain {key} resource={resource} fence={fence}"),
            Input::BeginReconcile { key } => write!(f, "begin-reconcile {key}"),
            Input::Resolve {
                key,
                happened,
                result,
                forced,
                unsafe_action,
            } => {
                let verb = match (happened, forced) {
                    (true, _) => "resolve-happened",
                    (false, true) => "resolve-forced",
                    (false, false) => "resolve-not-happened",
                };
                let safety = if *unsafe_action { "unsafe" } else { "safe" };
                write!(f, "{verb} {key} {safety}")?;
                if *happened {
                    write!(f, " result={result}")?;
                }
                Ok(())
            }
            Input::ShowAction { key } => write!(f, "show {key}"),
            Input::SinkWrite {
                resource,
                fence,
                value,
            } => write!(f, "sink-write {resource} fence={fence} value={value}"),
            Input::SinkRead { resource } => write!(f, "sink-read {resource}"),
            Input::ClaimStep { task, agent } => write!(f, "claim-step {task} agent={agent}"),
            Input::CompleteStep { task, fence } => write!(f, "complete-step {task} fence={fence}"),
            Input::Submit {
                idempotency_key,
                concurrency_key,
            } => write!(f, "submit {idempotency_key} key={concurrency_key}"),
            Input::Lease { worker } => write!(f, "lease worker={worker}"),
            Input::StartAttempt {
                task,
                attempt,
                worker,
                concurrency_key,
                token,
            } => write!(
                f,
                "start task={task} attempt={attempt} worker={worker} key={concurrency_key} token={token}"
            ),
            Input::EndAttempt {
                task,
                attempt,
                worker,
                concurrency_key,
                token,
                end,
            } => {
                let verb = match end {
                    AttemptEnd::Complete => "complete",
                    AttemptEnd::Fail { retryable: true } => "fail-retryable",
                    AttemptEnd::Fail { retryable: false } => "fail",
                    AttemptEnd::Unknown => "report-unknown",
                };
                write!(
                    f,
                    "{verb} task={task} attempt={attempt} worker={worker} key={concurrency_key} token={token}"
                )
            }
            Input::CancelTask {
                task,
                concurrency_key,
            } => write!(f, "cancel task={task} key={concurrency_key}"),
            Input::Attempts { task } => write!(f, "attempts task={task}"),
            Input::SaveCheckpoint { run, seq, data } => {
                write!(f, "save {run} seq={seq} data={data}")
            }
            Input::LoadCheckpoint { run } => write!(f, "load {run}"),
            Input::WatchSaved { run, seq, data } => {
                write!(f, "watch-saved {run} seq={seq} data={data}")
            }
            Input::WatchLease {
                kind,
                key,
                holder,
                fence,
            } if holder.is_empty() => write!(f, "watch-{kind} {key} fence={fence}"),
            Input::WatchLease {
                kind,
                key,
                holder,
                fence,
            } => write!(f, "watch-{kind} {key} agent={holder} fence={fence}"),
            Input::WatchSinkWritten {
                resource,
                fence,
                seen_fence,
                writes,
                value,
            } => write!(
                f,
                "watch-written {resource} fence={fence} seen={seen_fence} writes={writes} \
                 value={value}"
            ),
            Input::WatchCompacted { requested } => write!(f, "watch-compacted at={requested}"),
            Input::WatchEnded { error } => write!(f, "watch-ended {error}"),
        }
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Output::Ticket {
                generation,
                state,
                holder,
            } => write!(f, "gen={generation} state={state} holder={holder:?}"),
            Output::Handle { fence, token } => write!(f, "fence={fence} token={}", short(token)),
            Output::Done => write!(f, "done"),
            Output::Lease { fence, token, .. } => {
                write!(f, "fence={fence} token={}", short(token))
            }
            Output::Tasks(tasks) => {
                let tasks: Vec<String> = tasks
                    .iter()
                    .map(|(id, state, fence)| format!("{id}:{state}@{fence}"))
                    .collect();
                write!(f, "[{}]", tasks.join(" "))
            }
            Output::Granted { fence, holder, .. } => {
                write!(f, "granted fence={fence} holder={}", short(holder))
            }
            Output::NotGranted(outcome) => write!(f, "{outcome}"),
            Output::Result(result) => write!(f, "result={result}"),
            Output::Reconciling { until_ms } => write!(f, "reconciling until={until_ms}"),
            Output::Retryable => write!(f, "retryable"),
            Output::Action {
                status,
                fence,
                result,
            } => write!(f, "status={status} fence={fence} result={result:?}"),
            Output::Sink {
                seen_fence,
                writes,
                value,
            } => write!(f, "seen={seen_fence} writes={writes} value={value}"),
            Output::Submitted { task, replayed } => write!(f, "task={task} replayed={replayed}"),
            Output::Leased(assignments) => {
                let shown: Vec<String> = assignments
                    .iter()
                    .map(|a| {
                        format!(
                            "task={}/{} key={} token={:?} until={:?}",
                            a.task, a.attempt, a.key, a.token, a.until_ms
                        )
                    })
                    .collect();
                write!(f, "[{}]", shown.join(", "))
            }
            Output::TaskState(state) => write!(f, "state={state}"),
            Output::AttemptList { state, attempts } => {
                let shown: Vec<String> = attempts
                    .iter()
                    .map(|a| format!("#{}:{}:{:?}:{}", a.number, a.worker, a.token, a.outcome))
                    .collect();
                write!(f, "state={state} [{}]", shown.join(" "))
            }
            Output::Checkpoint { seq, data } => write!(f, "seq={seq} data={data}"),
            Output::Position { revision, index } => write!(f, "at {revision}.{index}"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ret = self.ret.map_or_else(|| "?".to_string(), secs);
        write!(
            f,
            "#{} {} [{} -> {}] {} => ",
            self.index,
            self.client,
            secs(self.call),
            ret,
            self.input
        )?;
        match &self.outcome {
            Outcome::Pending => write!(f, "pending"),
            Outcome::Ok(output) => write!(f, "ok {output}"),
            Outcome::Refused(code) => write!(f, "refused {code}"),
            Outcome::Ambiguous(reason) => {
                let reason: String = reason.chars().take(120).collect();
                write!(f, "AMBIGUOUS ({reason})")
            }
            Outcome::Unexpected(reason) => {
                let reason: String = reason.chars().take(120).collect();
                write!(f, "UNEXPECTED ({reason})")
            }
        }
    }
}

/// One monotonic clock for a whole run.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Microseconds since the clock started.
    pub fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// The shared, append-only history of one run. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    clock: Clock,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Recorder {
    /// An empty history on `clock`.
    pub fn new(clock: Clock) -> Recorder {
        Recorder {
            clock,
            ops: Arc::default(),
        }
    }

    /// The run's clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Op>> {
        self.ops
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the invocation of `input` by `client` now; returns its index.
    pub fn invoke(&self, client: &str, input: Input) -> usize {
        let mut ops = self.lock();
        let index = ops.len();
        ops.push(Op {
            index,
            client: client.to_string(),
            input,
            call: self.clock.now(),
            ret: None,
            outcome: Outcome::Pending,
        });
        index
    }

    /// Records how operation `index` ended, now.
    pub fn complete(&self, index: usize, outcome: Outcome) {
        let now = self.clock.now();
        let mut ops = self.lock();
        if let Some(op) = ops.get_mut(index) {
            op.ret = match outcome {
                Outcome::Ok(_) | Outcome::Refused(_) => Some(now),
                Outcome::Ambiguous(_) | Outcome::Unexpected(_) | Outcome::Pending => None,
            };
            op.outcome = outcome;
        }
    }

    /// Runs `call` as one recorded operation: invocation before, completion after; a success is
    /// recorded as `describe(value)`, a refusal by its code, no answer (or a forgotten one) as
    /// ambiguous, any other error as unexpected.
    pub async fn record<T, Fut>(
        &self,
        client: &str,
        input: Input,
        call: Fut,
        describe: impl FnOnce(&T) -> Output,
    ) -> Result<T, Error>
    where
        Fut: Future<Output = Result<T, Error>>,
    {
        let index = self.invoke(client, input);
        let result = call.await;
        let outcome = match &result {
            Ok(value) => Outcome::Ok(describe(value)),
            Err(Error::Refused(refusal)) => Outcome::Refused(refusal.code().to_string()),
            Err(error @ (Error::Unavailable { .. } | Error::OutcomeUnknown(_))) => {
                Outcome::Ambiguous(error.to_string())
            }
            Err(error) => Outcome::Unexpected(error.to_string()),
        };
        self.complete(index, outcome);
        result
    }

    /// Records something observed rather than invoked (a watch's delivery): call and return are
    /// now.
    pub fn observe(&self, client: &str, input: Input, output: Output) {
        let index = self.invoke(client, input);
        self.complete(index, Outcome::Ok(output));
    }

    /// Runs `f` over the history so far.
    pub fn inspect<R>(&self, f: impl FnOnce(&[Op]) -> R) -> R {
        f(&self.lock())
    }

    /// Number of operations recorded so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Operations matching `which` that got a definite answer (`Ok` or refused) at or after
    /// `since` (microseconds).
    pub fn answered_since(&self, since: u64, which: impl Fn(&Op) -> bool) -> usize {
        self.lock()
            .iter()
            .filter(|op| op.ret.is_some_and(|ret| ret >= since) && which(op))
            .count()
    }

    /// The finished history: operations still pending become ambiguous ("no answer before the
    /// run ended").
    pub fn finish(&self) -> Vec<Op> {
        let mut ops = self.lock().clone();
        for op in &mut ops {
            if op.outcome == Outcome::Pending {
                op.outcome = Outcome::Ambiguous("no answer before the run ended".into());
            }
        }
        ops
    }
}
