//! The task-queue worker runtime (seed 004 §4).
//!
//! A [`Worker`] turns a handler — an async function from a [`TaskContext`] to a result — into a
//! well-behaved queue consumer:
//!
//! - it registers its identity with its fixed capability (`concurrency_keys`);
//! - it leases with the server's long poll, for at most its free slots, so an idle worker sends
//!   one request per poll window and writes nothing to the log while it waits;
//! - it confirms every attempt with `Start` **before** the handler runs, so business code never
//!   runs on an attempt the store has not confirmed;
//! - it renews each attempt's lease in the background about every third of the lease TTL; a
//!   renewal refused (`LEASE_LOST`, ...) or a lease that runs out locally stops that handler's
//!   work (its future is dropped, and [`TaskContext::lease_lost`] turns true);
//! - it reports the handler's answer: `Ok(result)` completes the attempt, a [`TaskError`] says
//!   whether to fail it retryably, fail it for good, or report its effect unknown (as does a
//!   panic, also one before the handler's future exists); a report lost to an outage is sent
//!   again while the lease may still be held, and the store records a repeat once;
//! - it refuses protocol errors itself and never hands them to the handler (see
//!   [`check_assignment`]): a keyed assignment without a token, an unkeyed one with a token, a
//!   keyed one to a worker registered without concurrency keys, or one that changes the key or
//!   token of an attempt already running. Such an attempt is failed non-retryably with a
//!   `protocol error: ...` message and logged;
//! - a handler whose lease is lost is stopped at its next await, and keeps its slot until then:
//!   never more than `slots` handlers run;
//! - on shutdown it drains: it stops leasing, hands back unstarted what a lease cut short by the
//!   stop had leased, lets in-flight handlers finish (bounded by the drain timeout) and returns
//!   a [`WorkerSummary`].
//!
//! ```no_run
//! # async fn demo(client: baton_rpc::Client) -> Result<(), baton_rpc::Error> {
//! use baton_rpc::worker::{TaskError, Worker};
//!
//! let worker = Worker::builder(client.clone(), "worker-1")
//!     .queue("images")
//!     .slots(4)
//!     .build()?;
//! let summary = worker
//!     .run(
//!         move |ctx| {
//!             let client = client.clone();
//!             async move {
//!                 // Keyed tasks carry a permit token: the resource side fences with it.
//!                 let (Some(key), Some(token)) = (ctx.concurrency_key.clone(), ctx.token) else {
//!                     return Err(TaskError::non_retryable("expected a keyed task"));
//!                 };
//!                 // Tokens count per namespace and key: so does the resource.
//!                 let key = format!("{}/{key}", ctx.namespace);
//!                 // A refusal (a newer token wrote) fails the task; no answer may mean the
//!                 // write was applied, so its effect is unknown: a retry would write again.
//!                 client
//!                     .write_fenced(&key, token, &ctx.payload)
//!                     .await
//!                     .map_err(|e| match e.is_infrastructure() {
//!                         true => TaskError::unknown_effect(e),
//!                         false => TaskError::non_retryable(e),
//!                     })?;
//!                 Ok(b"written".to_vec())
//!             }
//!         },
//!         async { let _ = tokio::signal::ctrl_c().await; },
//!     )
//!     .await?;
//! println!("completed={} drained={}", summary.completed, summary.drained);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use baton_statemachine::limits::{MAX_PAYLOAD_BYTES, MAX_TEXT_BYTES};
use baton_statemachine::queue::{Assignment, Task as QueueTask};
use baton_statemachine::Refusal;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::client::LeasePoll;
use crate::{Client, Error};

/// What a handler returns when the attempt did not succeed. The variant decides what the worker
/// reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskError {
    /// Nothing happened that a retry could duplicate: fail the attempt retryably (the task backs
    /// off and retries while attempts and time remain; the permit is released meanwhile).
    Retryable(String),
    /// Retrying cannot help: fail the task for good.
    NonRetryable(String),
    /// The effect may or may not have happened: report it unknown (the task needs review).
    UnknownEffect(String),
}

impl TaskError {
    /// A [`TaskError::Retryable`].
    pub fn retryable(message: impl fmt::Display) -> Self {
        TaskError::Retryable(message.to_string())
    }

    /// A [`TaskError::NonRetryable`].
    pub fn non_retryable(message: impl fmt::Display) -> Self {
        TaskError::NonRetryable(message.to_string())
    }

    /// A [`TaskError::UnknownEffect`].
    pub fn unknown_effect(message: impl fmt::Display) -> Self {
        TaskError::UnknownEffect(message.to_string())
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Retryable(m) => write!(f, "retryable: {m}"),
            TaskError::NonRetryable(m) => write!(f, "non-retryable: {m}"),
            TaskError::UnknownEffect(m) => write!(f, "unknown effect: {m}"),
        }
    }
}

impl std::error::Error for TaskError {}

/// What a handler gets for one confirmed (started) attempt.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The task id.
    pub task_id: u64,
    /// The attempt number (1-based).
    pub attempt: u32,
    /// The queue it came from.
    pub queue: String,
    /// The queue's namespace.
    pub namespace: String,
    /// Which handler should run it.
    pub handler: String,
    /// The handler version it was submitted for.
    pub handler_version: String,
    /// The payload's schema version.
    pub payload_version: String,
    /// The payload, as submitted.
    pub payload: Vec<u8>,
    /// The concurrency key (resource key), when the task has one.
    pub concurrency_key: Option<String>,
    /// The permit token: present exactly when the key is. Present it to the resource side, which
    /// must refuse `token < highest seen` atomically (Baton's fenced sink does).
    pub token: Option<u64>,
    /// This worker's identity.
    pub worker: String,
    lost: watch::Receiver<bool>,
    /// The latest moment, by this machine's clock, at which the store may still hold the lease,
    /// as the last confirmed start or renewal showed it.
    valid_until: Arc<Mutex<Instant>>,
}

impl TaskContext {
    /// Whether this attempt's lease was lost (a renewal was refused or the lease ran out). The
    /// runtime also drops the handler's future when that happens; a handler that hands work to
    /// other threads should check this before any external write.
    ///
    /// Judged on this machine's clock too, not only on what the runtime's renewal task has found:
    /// a handler that blocked its thread (or a process that stalled) past the lease's end sees it
    /// lost before that task has had a chance to run.
    pub fn lease_lost(&self) -> bool {
        *self.lost.borrow() || Instant::now() >= *lock(&self.valid_until)
    }

    /// Resolves when this attempt's lease is lost (never, if it is not).
    pub async fn wait_lease_lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|lost| *lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A protocol error in an assignment: the runtime refuses it instead of running the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// A keyed task arrived without a permit token.
    MissingToken {
        /// The task's concurrency key.
        key: String,
    },
    /// A keyed task arrived with the token 0 (tokens are non-zero).
    ZeroToken {
        /// The task's concurrency key.
        key: String,
    },
    /// An unkeyed task arrived with a permit token.
    UnexpectedToken {
        /// The token it carried.
        token: u64,
    },
    /// A keyed task arrived at a worker registered without concurrency keys.
    NotCapable {
        /// The task's concurrency key.
        key: String,
    },
    /// The assignment repeats an attempt already running here with another key or token.
    ChangedAttempt {
        /// The running attempt's key (empty = none).
        running_key: String,
        /// The running attempt's token.
        running_token: Option<u64>,
        /// The new assignment's key (empty = none).
        key: String,
        /// The new assignment's token.
        token: Option<u64>,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |t: &Option<u64>| t.map_or_else(|| "none".to_string(), |t| t.to_string());
        match self {
            ProtocolError::MissingToken { key } => {
                write!(f, "keyed assignment (concurrency key {key:?}) without a permit token")
            }
            ProtocolError::ZeroToken { key } => write!(
                f,
                "keyed assignment (concurrency key {key:?}) with permit token 0 (tokens are non-zero)"
            ),
            ProtocolError::UnexpectedToken { token } => {
                write!(f, "unkeyed assignment with a permit token ({token})")
            }
            ProtocolError::NotCapable { key } => write!(
                f,
                "keyed assignment (concurrency key {key:?}) to a worker registered without \
                 concurrency keys"
            ),
            ProtocolError::ChangedAttempt {
                running_key,
                running_token,
                key,
                token,
            } => write!(
                f,
                "assignment changes a running attempt's concurrency key {running_key:?} / token {} \
                 to {key:?} / {}",
                show(running_token),
                show(token)
            ),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// The key and token of an attempt already running on this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningAttempt<'a> {
    /// Its concurrency key (empty = none).
    pub concurrency_key: &'a str,
    /// Its permit token.
    pub token: Option<u64>,
}

/// The protocol checks of seed 004 §4, as a pure function: whether a worker registered with
/// `concurrency_keys` may run `assignment`, given the attempt with the same task id and attempt
/// number already running here (if any). A repeat of a running attempt with the same key and
/// token passes (the caller ignores it as a duplicate); anything that would silently replace the
/// key or token does not.
pub fn check_assignment(
    assignment: &Assignment,
    concurrency_keys: bool,
    running: Option<RunningAttempt<'_>>,
) -> Result<(), ProtocolError> {
    let key = &assignment.concurrency_key;
    if key.is_empty() {
        if let Some(token) = assignment.token {
            return Err(ProtocolError::UnexpectedToken { token });
        }
    } else {
        if !concurrency_keys {
            return Err(ProtocolError::NotCapable { key: key.clone() });
        }
        match assignment.token {
            None => return Err(ProtocolError::MissingToken { key: key.clone() }),
            Some(0) => return Err(ProtocolError::ZeroToken { key: key.clone() }),
            Some(_) => {}
        }
    }
    if let Some(running) = running {
        if running.concurrency_key != key || running.token != assignment.token {
            return Err(ProtocolError::ChangedAttempt {
                running_key: running.concurrency_key.to_string(),
                running_token: running.token,
                key: key.clone(),
                token: assignment.token,
            });
        }
    }
    Ok(())
}

/// How one attempt ended, as far as this worker knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The handler succeeded and the completion was recorded.
    Completed,
    /// The handler failed and the failure was recorded; or the attempt's start was not
    /// confirmed, the handler did not run, and that was recorded as a retryable failure
    /// ([`Finished::detail`] says "start not confirmed").
    Failed {
        /// Whether it was reported retryable.
        retryable: bool,
    },
    /// The handler reported an unknown effect (or panicked) and that was recorded.
    Unknown,
    /// The attempt was no longer this worker's: its start, a renewal or its report was refused,
    /// or its lease ran out. The handler did not run, was stopped, or its answer was not
    /// recorded.
    LeaseLost,
    /// The cluster could not be reached to record the handler's answer (it was sent again until
    /// the lease's end; a sending that went unanswered may have been recorded even when a later
    /// one was refused), or to confirm the attempt's start (then the handler did not run:
    /// [`Finished::detail`] says which). The lease will expire and the store recovers the
    /// attempt.
    Unreported,
    /// The assignment broke the protocol; the handler never ran and the attempt was failed for
    /// good.
    ProtocolError,
}

impl AttemptEnd {
    /// A short name for logs: `completed`, `failed`, `retry`, `unknown`, `lease_lost`,
    /// `unreported`, `protocol_error`.
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptEnd::Completed => "completed",
            AttemptEnd::Failed { retryable: true } => "retry",
            AttemptEnd::Failed { retryable: false } => "failed",
            AttemptEnd::Unknown => "unknown",
            AttemptEnd::LeaseLost => "lease_lost",
            AttemptEnd::Unreported => "unreported",
            AttemptEnd::ProtocolError => "protocol_error",
        }
    }
}

/// One finished attempt, as the `on_finish` hook sees it.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The task id.
    pub task_id: u64,
    /// The attempt number.
    pub attempt: u32,
    /// The queue.
    pub queue: String,
    /// The handler name.
    pub handler: String,
    /// The concurrency key, if any.
    pub concurrency_key: Option<String>,
    /// The permit token, if any.
    pub token: Option<u64>,
    /// How it ended.
    pub end: AttemptEnd,
    /// The handler's error text, the refusal, or the protocol error.
    pub detail: String,
}

/// What a worker did, returned by [`Worker::run`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Attempts completed.
    pub completed: u64,
    /// Attempts failed (retryable or not) by their handler.
    pub failed: u64,
    /// Attempts reported with an unknown effect.
    pub unknown: u64,
    /// Attempts lost (lease lost, or the answer could not be recorded).
    pub lost: u64,
    /// Assignments refused as protocol errors.
    pub protocol_errors: u64,
    /// Attempts leased by a request whose answer shutdown cut short, handed back unstarted.
    pub handed_back: u64,
    /// Whether every in-flight handler finished within the drain timeout.
    pub drained: bool,
}

impl WorkerSummary {
    fn count(&mut self, end: AttemptEnd) {
        match end {
            AttemptEnd::Completed => self.completed += 1,
            AttemptEnd::Failed { .. } => self.failed += 1,
            AttemptEnd::Unknown => self.unknown += 1,
            AttemptEnd::LeaseLost | AttemptEnd::Unreported => self.lost += 1,
            AttemptEnd::ProtocolError => self.protocol_errors += 1,
        }
    }
}

type FinishHook = Arc<dyn Fn(&Finished) + Send + Sync>;

/// The detail of an attempt the drain stopped before it ended on its own: its handler did not
/// yield, or its answer was not confirmed, within the drain's grace.
const STOPPED_AT_DRAIN_END: &str = "stopped at the end of a timed-out drain before its answer was \
     confirmed (a report sent may still be recorded); its lease will run out";

/// The lease an attempt handed back unstarted at shutdown is renewed to (milliseconds): it ends
/// at once, and the store's expiry puts the task back to waiting.
const HAND_BACK_TTL_MS: i64 = 1;

/// How long, after the drain timed out, an attempt whose handler has finished may still take to
/// report its answer before it is abandoned too.
pub const REPORT_GRACE: Duration = Duration::from_secs(5);
/// The pause before a result whose answer was lost is sent again; it doubles up to
/// [`MAX_REPORT_PAUSE`] while the lease lasts.
const FIRST_REPORT_PAUSE: Duration = Duration::from_millis(100);
const MAX_REPORT_PAUSE: Duration = Duration::from_secs(2);
/// The longest lease a worker asks for: renewals keep a long handler's lease, and a lease of
/// years would hold its task (and its concurrency key) for good after a crash.
pub const MAX_LEASE_TTL: Duration =
    Duration::from_millis(baton_statemachine::queue::MAX_LEASE_TTL_MS as u64);
/// The shortest long-poll wait a worker accepts.
pub const MIN_POLL_WAIT: Duration = Duration::from_millis(100);

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    client: Client,
    id: String,
    queues: Vec<String>,
    concurrency_keys: bool,
    slots: usize,
    lease_ttl: Duration,
    poll_wait: Duration,
    drain_timeout: Duration,
    on_finish: Option<FinishHook>,
}

impl WorkerBuilder {
    /// Adds a queue to lease from (none = every queue).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queues.push(queue.into());
        self
    }

    /// Adds queues to lease from.
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.queues.extend(queues.into_iter().map(Into::into));
        self
    }

    /// Whether this worker supports concurrency keys (default true, as seed 004 has its
    /// high-level worker declare): only then is it handed keyed tasks, each with its key and
    /// permit token in the [`TaskContext`], which the handler presents to a resource side that
    /// checks it. Turn it off for handlers that cannot: keyed tasks then wait for other workers.
    /// It is a fixed property of the worker identity: registering the same id with another
    /// answer is refused `STATE_CONFLICT` (use a new id for a new process version).
    pub fn concurrency_keys(mut self, enabled: bool) -> Self {
        self.concurrency_keys = enabled;
        self
    }

    /// How many handlers may run at once (default 1).
    pub fn slots(mut self, slots: usize) -> Self {
        self.slots = slots;
        self
    }

    /// The lease length of each attempt (default 30 s, 30 ms to 24 h); it is renewed about every
    /// third of it.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long one lease long-poll waits on the server when nothing is leasable (default 10 s,
    /// at least [`MIN_POLL_WAIT`], at most [`crate::MAX_LEASE_WAIT`]).
    pub fn poll_wait(mut self, wait: Duration) -> Self {
        self.poll_wait = wait;
        self
    }

    /// How long shutdown waits for in-flight handlers (default 30 s). Handlers still running
    /// then are stopped; their leases run out and the store recovers their attempts. An
    /// attempt whose handler has finished is not stopped while it reports its answer (for up to
    /// [`REPORT_GRACE`] more), so finished work is recorded rather than done again.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Called (on the worker's own task) once for every finished attempt, also one a timed-out
    /// drain had to abort (as [`AttemptEnd::LeaseLost`]; an assignment refused as a protocol
    /// error stays [`AttemptEnd::ProtocolError`]). A panic in it is logged and the worker
    /// goes on.
    pub fn on_finish(mut self, hook: impl Fn(&Finished) + Send + Sync + 'static) -> Self {
        self.on_finish = Some(Arc::new(hook));
        self
    }

    /// The worker; [`Error::Config`] for an empty id, zero slots, a lease TTL outside 30 ms–24 h
    /// or more queues than one lease may name.
    pub fn build(self) -> Result<Worker, Error> {
        if self.id.trim().is_empty() {
            return Err(Error::Config("the worker id must not be empty".into()));
        }
        let most_queues = baton_statemachine::queue::MAX_LEASE_QUEUES;
        if self.queues.len() > most_queues {
            return Err(Error::Config(format!(
                "at most {most_queues} queues (none: every queue)"
            )));
        }
        if self.slots == 0 || self.slots > baton_statemachine::queue::MAX_LEASE_BATCH as usize {
            return Err(Error::Config(format!(
                "slots must be 1-{}",
                baton_statemachine::queue::MAX_LEASE_BATCH
            )));
        }
        if self.lease_ttl < Duration::from_millis(30) || self.lease_ttl > MAX_LEASE_TTL {
            return Err(Error::Config(
                "the lease TTL must be between 30ms and 24h (it is renewed while the handler runs)"
                    .into(),
            ));
        }
        if self.poll_wait < MIN_POLL_WAIT {
            // Each poll that finds nothing ends in a lease entry in the log: a near-zero wait
            // turns an idle worker into a stream of writes.
            return Err(Error::Config(format!(
                "the poll wait must be at least {MIN_POLL_WAIT:?}"
            )));
        }
        Ok(Worker {
            settings: Arc::new(Settings {
                client: self.client,
                id: self.id,
                queues: self.queues,
                concurrency_keys: self.concurrency_keys,
                slots: self.slots,
                // The store is sent whole milliseconds: the local estimate of a lease's end must
                // not count the fraction the store never granted.
                lease_ttl: Duration::from_millis(
                    u64::try_from(self.lease_ttl.as_millis()).unwrap_or(u64::MAX),
                ),
                poll_wait: self.poll_wait.min(crate::MAX_LEASE_WAIT),
                drain_timeout: self.drain_timeout,
            }),
            on_finish: self.on_finish,
        })
    }
}

struct Settings {
    client: Client,
    id: String,
    queues: Vec<String>,
    concurrency_keys: bool,
    slots: usize,
    lease_ttl: Duration,
    poll_wait: Duration,
    drain_timeout: Duration,
}

impl Settings {
    fn lease_ttl_ms(&self) -> i64 {
        i64::try_from(self.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A queue worker: see the [module documentation](self).
pub struct Worker {
    settings: Arc<Settings>,
    on_finish: Option<FinishHook>,
}

/// An attempt running on this worker.
struct Running {
    attempt: u32,
    concurrency_key: String,
    token: Option<u64>,
    lost: Arc<watch::Sender<bool>>,
}

type RunningMap = Arc<Mutex<HashMap<u64, Running>>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Aborts the task when dropped, so stopping an attempt also stops its handler and renewals.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The attempts in flight on this worker. Each is known by what it would report had it been
/// stopped before ending on its own, so an attempt the drain has to abort (a handler that never
/// yields) still reaches the summary and the `on_finish` hook.
#[derive(Default)]
struct InFlight {
    set: JoinSet<Finished>,
    if_stopped: HashMap<tokio::task::Id, Finished>,
}

impl InFlight {
    fn spawn(
        &mut self,
        if_stopped: Finished,
        attempt: impl Future<Output = Finished> + Send + 'static,
    ) {
        let id = self.set.spawn(attempt).id();
        self.if_stopped.insert(id, if_stopped);
    }

    fn len(&self) -> usize {
        self.set.len()
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The next attempt to end; `None` when none is in flight.
    async fn next(&mut self) -> Option<Finished> {
        loop {
            let joined = self.set.join_next_with_id().await?;
            if let Some(finished) = self.ended(joined) {
                return Some(finished);
            }
        }
    }

    /// An attempt that has already ended, if any.
    fn try_next(&mut self) -> Option<Finished> {
        loop {
            let joined = self.set.try_join_next_with_id()?;
            if let Some(finished) = self.ended(joined) {
                return Some(finished);
            }
        }
    }

    /// Stops every attempt at its next await (see [`Worker::run`]'s drain).
    fn abort_all(&mut self) {
        self.set.abort_all();
    }

    fn ended(
        &mut self,
        joined: Result<(tokio::task::Id, Finished), tokio::task::JoinError>,
    ) -> Option<Finished> {
        match joined {
            Ok((id, finished)) => {
                self.if_stopped.remove(&id);
                Some(finished)
            }
            Err(error) => {
                // Only the drain aborts; an attempt's own task never panics (the handler runs in
                // a task of its own), but if it did, the attempt would end the same way.
                let mut stopped = self.if_stopped.remove(&error.id());
                if !error.is_cancelled() {
                    tracing::error!(%error, "attempt task failed");
                    if let Some(stopped) = &mut stopped {
                        stopped.detail = format!("the attempt's task failed: {error}");
                    }
                }
                stopped
            }
        }
    }
}

impl Worker {
    /// Starts building a worker with identity `id` that talks through `client`.
    pub fn builder(client: Client, id: impl Into<String>) -> WorkerBuilder {
        WorkerBuilder {
            client,
            id: id.into(),
            queues: Vec::new(),
            concurrency_keys: true,
            slots: 1,
            lease_ttl: Duration::from_secs(30),
            poll_wait: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            on_finish: None,
        }
    }

    /// This worker's identity.
    pub fn id(&self) -> &str {
        &self.settings.id
    }

    /// Registers the worker, then leases and runs tasks with `handler` until `shutdown`
    /// resolves; then drains and returns what it did.
    ///
    /// Fails when the registration is refused (e.g. `STATE_CONFLICT`: this id was registered
    /// with another capability) or the cluster cannot be reached for it, and when a lease is
    /// refused (e.g. `UNKNOWN_QUEUE`) or fails in a way that sending it again cannot change (a
    /// server error such as a token no longer accepted, a protocol error) — after draining what
    /// is in flight. An unreachable cluster while leasing is retried with back-off.
    pub async fn run<H, Fut, S>(self, handler: H, shutdown: S) -> Result<WorkerSummary, Error>
    where
        H: Fn(TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<u8>, TaskError>> + Send + 'static,
        S: Future<Output = ()>,
    {
        let settings = self.settings.clone();
        tokio::pin!(shutdown);
        // A stop while registering (a cluster that does not answer holds it for the client's
        // whole deadline) ends the run at once: nothing was leased, and registering again is
        // harmless.
        tokio::select! {
            registered = settings
                .client
                .register_worker(&settings.id, settings.concurrency_keys) => {
                registered?;
            }
            () = &mut shutdown => {
                return Ok(WorkerSummary {
                    drained: true,
                    ..WorkerSummary::default()
                });
            }
        }
        let handler = Arc::new(handler);
        let running: RunningMap = Arc::default();
        let mut in_flight = InFlight::default();
        let mut summary = WorkerSummary::default();
        let mut fatal = None;
        let mut pause = Duration::from_millis(100);
        // A lease request the stop cut short: what it leased is handed back.
        let mut unsettled = None;
        // A lease request whose settling ask no node answered: asked again before any other
        // lease is numbered.
        let mut pending = None;

        loop {
            while let Some(finished) = in_flight.try_next() {
                self.tally(&mut summary, finished);
            }
            let free = settings.slots.saturating_sub(in_flight.len());
            if free == 0 {
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    Some(finished) = in_flight.next() => self.tally(&mut summary, finished),
                }
                continue;
            }
            let polled_at = Instant::now();
            // A lease whose answer never came is settled before another is numbered: applied
            // late (a leader that regained its quorum), it leased tasks to this worker, which
            // would stay leased, unrun, until their leases ran out; and once a later request of
            // this session is applied, the store forgets its answer for good.
            let poll = match pending.take() {
                Some(poll) => Ok((poll, false)),
                None => tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    poll = settings.client.lease_poll(
                        &settings.id,
                        &settings.queues,
                        free as u32,
                        settings.lease_ttl_ms(),
                        settings.poll_wait,
                    ) => poll.map(|poll| (poll, true)),
                },
            };
            let polled = match poll {
                Ok((poll, fresh)) => {
                    let sent = if fresh {
                        tokio::select! {
                            biased;
                            _ = &mut shutdown => {
                                unsettled = Some(poll);
                                break;
                            }
                            sent = poll.send() => Some(sent),
                        }
                    } else {
                        None
                    };
                    let answered = match sent {
                        // No answer is not no lease: it may have been applied with its answer
                        // lost. What it got is learnt under its own seq.
                        Some(Err(error)) if worth_sending_again(&error) => None,
                        sent => sent,
                    };
                    match answered {
                        Some(answer) => answer,
                        None => {
                            let settled = tokio::select! {
                                biased;
                                _ = &mut shutdown => {
                                    unsettled = Some(poll);
                                    break;
                                }
                                settled = poll.settle() => settled,
                            };
                            // No node answered: settled again, after the back-off, before any
                            // other lease is numbered.
                            if matches!(&settled, Err(error) if unanswered(error)) {
                                pending = Some(poll);
                            }
                            settled
                        }
                    }
                }
                Err(error) => Err(error),
            };
            match polled {
                Ok(leased) => {
                    pause = Duration::from_millis(100);
                    // A long poll answers empty only after its wait (or when another worker won
                    // the race); guard against a server that answers at once anyway.
                    if leased.assignments.is_empty()
                        && polled_at.elapsed() < Duration::from_millis(50)
                    {
                        tokio::select! {
                            biased;
                            _ = &mut shutdown => break,
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        }
                    }
                    // The lease was granted at the end of the long poll, not at its start, and
                    // a replayed answer long before it arrived: what the store says is left of
                    // each lease counts from the answer's arrival.
                    for assignment in leased.assignments.iter().cloned() {
                        let lease_end = leased.local_end(&assignment, settings.lease_ttl);
                        self.dispatch(assignment, lease_end, &handler, &running, &mut in_flight);
                    }
                }
                Err(error) if !worth_sending_again(&error) => {
                    tracing::error!(worker = %settings.id, %error, "lease failed for good; stopping");
                    fatal = Some(error);
                    break;
                }
                Err(error) => {
                    tracing::warn!(worker = %settings.id, %error, ?pause, "lease failed; retrying");
                    tokio::select! {
                        biased;
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }

        // Drain: no more leases; in-flight handlers finish within the drain timeout.
        tracing::info!(worker = %settings.id, in_flight = in_flight.len(), "draining");
        let drain_until = crate::client::instant_after(settings.drain_timeout);
        if let Some(poll) = unsettled.or(pending) {
            match tokio::time::timeout_at(drain_until, self.hand_back(&poll)).await {
                Ok(handed_back) => summary.handed_back = handed_back,
                Err(_) => tracing::warn!(
                    worker = %settings.id,
                    "the drain timed out while handing back what the lease cut short by the \
                     stop leased: its tasks stay leased until their leases run out"
                ),
            }
        }
        let mut drained = true;
        while !in_flight.is_empty() {
            match tokio::time::timeout_at(drain_until, in_flight.next()).await {
                Ok(Some(finished)) => self.tally(&mut summary, finished),
                Ok(None) => break,
                Err(_) => {
                    drained = false;
                    break;
                }
            }
        }
        if !drained {
            tracing::warn!(
                worker = %settings.id,
                stopped = in_flight.len(),
                "drain timed out; stopping the remaining handlers (their leases will run out)"
            );
            // A stopped handler's attempt ends once the handler reaches its next await; one whose
            // handler already finished goes on reporting its answer, for a while: aborted,
            // finished work would be done again.
            for entry in lock(&running).values() {
                entry.lost.send_replace(true);
            }
            let grace_until = Instant::now() + REPORT_GRACE;
            while let Ok(Some(finished)) =
                tokio::time::timeout_at(grace_until, in_flight.next()).await
            {
                self.tally(&mut summary, finished);
            }
            // What is left is a report not recorded in time, or a handler that never reached an
            // await: lost either way.
            in_flight.abort_all();
            while let Some(finished) = in_flight.next().await {
                self.tally(&mut summary, finished);
            }
        }
        summary.drained = drained;
        match fatal {
            Some(error) => Err(error),
            None => Ok(summary),
        }
    }

    /// Learns what a lease request whose answer the stop cut short leased (see
    /// [`LeasePoll::settle`]), and hands each attempt back unstarted instead of leaving it, and
    /// its concurrency key, to a worker that is gone until its lease runs out: its lease is
    /// renewed to end a millisecond later, and the store's own expiry puts the task back to
    /// waiting moments later, when the leader's sweep (or the next lease) materialises it (no
    /// back-off, nothing counted against its attempts). Returns how many.
    async fn hand_back(&self, poll: &LeasePoll<'_>) -> u64 {
        let settings = &self.settings;
        let leased = match poll.settle().await {
            Ok(leased) => leased.assignments,
            Err(error) => {
                tracing::warn!(
                    worker = %settings.id,
                    %error,
                    "cannot learn what the lease cut short by the stop leased: its tasks stay \
                     leased until their leases run out"
                );
                return 0;
            }
        };
        let ended = futures::future::join_all(leased.iter().map(|assignment| {
            settings.client.renew_attempt(
                assignment.task_id,
                assignment.attempt,
                &settings.id,
                HAND_BACK_TTL_MS,
            )
        }))
        .await;
        let mut handed_back = 0;
        for (assignment, ended) in leased.iter().zip(ended) {
            match ended {
                Ok(_) => handed_back += 1,
                Err(error) => tracing::warn!(
                    worker = %settings.id,
                    task = assignment.task_id,
                    %error,
                    "cannot hand back an attempt leased as the worker stopped"
                ),
            }
        }
        if handed_back > 0 {
            tracing::info!(
                worker = %settings.id,
                handed_back,
                "handed back attempts leased as the worker stopped"
            );
        }
        handed_back
    }

    fn tally(&self, summary: &mut WorkerSummary, finished: Finished) {
        summary.count(finished.end);
        tracing::debug!(
            task = finished.task_id,
            attempt = finished.attempt,
            end = finished.end.as_str(),
            detail = %finished.detail,
            "attempt finished"
        );
        if let Some(hook) = &self.on_finish {
            // A panicking hook must not unwind `run`: that would abort every attempt
            // still running here, unreported.
            let hooked = std::panic::catch_unwind(AssertUnwindSafe(|| hook(&finished)));
            if hooked.is_err() {
                tracing::error!(task = finished.task_id, "the on_finish hook panicked");
            }
        }
    }

    /// Checks an assignment and starts its attempt (or refuses it).
    fn dispatch<H, Fut>(
        &self,
        assignment: Assignment,
        lease_end: Instant,
        handler: &Arc<H>,
        running: &RunningMap,
        in_flight: &mut InFlight,
    ) where
        H: Fn(TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<u8>, TaskError>> + Send + 'static,
    {
        let settings = self.settings.clone();
        let mut map = lock(running);
        let same = map
            .get(&assignment.task_id)
            .filter(|r| r.attempt == assignment.attempt);
        let checked = check_assignment(
            &assignment,
            settings.concurrency_keys,
            same.map(|r| RunningAttempt {
                concurrency_key: &r.concurrency_key,
                token: r.token,
            }),
        );
        match checked {
            Ok(()) if same.is_some() => {
                tracing::debug!(
                    task = assignment.task_id,
                    attempt = assignment.attempt,
                    "duplicate assignment of a running attempt ignored"
                );
            }
            Ok(()) => {
                let lost = Arc::new(watch::Sender::new(false));
                let entry = Running {
                    attempt: assignment.attempt,
                    concurrency_key: assignment.concurrency_key.clone(),
                    token: assignment.token,
                    lost: lost.clone(),
                };
                // A newer attempt of a task still running here means the old one lost its lease.
                if let Some(old) = map.insert(assignment.task_id, entry) {
                    old.lost.send_replace(true);
                }
                drop(map);
                let running = running.clone();
                let handler = handler.clone();
                let if_stopped = finished(
                    &assignment,
                    AttemptEnd::LeaseLost,
                    STOPPED_AT_DRAIN_END.into(),
                );
                in_flight.spawn(if_stopped, async move {
                    let task_id = assignment.task_id;
                    let attempt = assignment.attempt;
                    let finished =
                        run_attempt(&settings, assignment, lease_end, handler, lost).await;
                    let mut map = lock(&running);
                    if map.get(&task_id).is_some_and(|r| r.attempt == attempt) {
                        map.remove(&task_id);
                    }
                    finished
                });
            }
            Err(protocol) => {
                // The attempt being failed may be the one running here: stop its handler too.
                if let Some(same) = same {
                    same.lost.send_replace(true);
                }
                drop(map);
                let detail = format!("protocol error: {protocol}");
                tracing::error!(
                    worker = %settings.id,
                    task = assignment.task_id,
                    attempt = assignment.attempt,
                    "{detail}; failing the attempt without running the handler"
                );
                let if_stopped = finished(&assignment, AttemptEnd::ProtocolError, detail.clone());
                in_flight.spawn(if_stopped, async move {
                    let reported = settings
                        .client
                        .fail_attempt(
                            assignment.task_id,
                            assignment.attempt,
                            &settings.id,
                            &detail,
                            false,
                        )
                        .await;
                    if let Err(error) = reported {
                        tracing::warn!(task = assignment.task_id, %error, "could not fail the attempt");
                    }
                    finished(&assignment, AttemptEnd::ProtocolError, detail)
                });
            }
        }
    }
}

fn finished(assignment: &Assignment, end: AttemptEnd, detail: String) -> Finished {
    Finished {
        task_id: assignment.task_id,
        attempt: assignment.attempt,
        queue: assignment.queue.clone(),
        handler: assignment.handler.clone(),
        concurrency_key: (!assignment.concurrency_key.is_empty())
            .then(|| assignment.concurrency_key.clone()),
        token: assignment.token,
        end,
        detail,
    }
}

/// Start, run with renewals, report.
async fn run_attempt<H, Fut>(
    settings: &Arc<Settings>,
    assignment: Assignment,
    lease_end: Instant,
    handler: Arc<H>,
    lost: Arc<watch::Sender<bool>>,
) -> Finished
where
    H: Fn(TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<u8>, TaskError>> + Send + 'static,
{
    let client = &settings.client;
    let (task_id, attempt, worker) = (assignment.task_id, assignment.attempt, &settings.id);

    // Business code runs only once the store confirmed this attempt.
    let start_sent = Instant::now();
    let started = match client.start_attempt(task_id, attempt, worker).await {
        Ok(task) => task,
        Err(error) => {
            let end = if error.is_infrastructure() {
                // The start may have been applied all the same, and the store then counts the
                // attempt as started: say it failed harmlessly (as below), so the task retries
                // when it can rather than when the lease runs out, and its last attempt ends
                // failed rather than needing review for an effect that never happened. Refused
                // when the start was not applied or the lease has ended, which changes nothing.
                let detail = "start not confirmed (the handler did not run)";
                // Sent again through an outage while the lease lasts: given up, the attempt
                // would stay RUNNING to the lease's end and, on its last attempt, need review.
                match fail_unrun(client, task_id, attempt, worker, detail, lease_end).await {
                    true => AttemptEnd::Failed { retryable: true },
                    false => AttemptEnd::Unreported,
                }
            } else {
                AttemptEnd::LeaseLost
            };
            tracing::warn!(task = task_id, attempt, %error, "start not confirmed; handler not run");
            return finished(
                &assignment,
                end,
                format!("start not confirmed (the handler did not run): {error}"),
            );
        }
    };
    let lease_end = lease_end_after_start(&started, attempt, start_sent)
        .map_or(lease_end, |bound| bound.min(lease_end));
    // Also when the attempt was stopped while its start was on its way (a drain that timed out,
    // a newer attempt of the task, a protocol error).
    if Instant::now() >= lease_end || *lost.borrow() {
        let detail = "the lease ran out or the attempt was stopped before its start was confirmed \
                      (the handler did not run)";
        tracing::warn!(task = task_id, attempt, "{detail}");
        // The store counts the attempt as started: say it failed harmlessly, so the task retries
        // now rather than when the lease runs out (and, on its last attempt, ends failed rather
        // than needing review for an effect that never happened). Refused when the store's lease
        // has ended already, which changes nothing.
        let _ = client
            .fail_attempt(task_id, attempt, worker, detail, true)
            .await;
        return finished(&assignment, AttemptEnd::LeaseLost, detail.into());
    }

    let valid_until = Arc::new(Mutex::new(lease_end));
    let _renewer = AbortOnDrop(tokio::spawn(renew_loop(
        settings.clone(),
        task_id,
        attempt,
        valid_until.clone(),
        lost.clone(),
    )));
    let context = TaskContext {
        task_id,
        attempt,
        queue: assignment.queue.clone(),
        namespace: assignment.namespace.clone(),
        handler: assignment.handler.clone(),
        handler_version: assignment.handler_version.clone(),
        payload_version: assignment.payload_version.clone(),
        payload: assignment.payload.clone(),
        concurrency_key: (!assignment.concurrency_key.is_empty())
            .then(|| assignment.concurrency_key.clone()),
        token: assignment.token,
        worker: worker.clone(),
        lost: lost.subscribe(),
        valid_until: valid_until.clone(),
    };
    // The handler is called inside the task, so a panic before its future exists (in the
    // closure's synchronous part) is caught and reported like one inside the future.
    let mut work = AbortOnDrop(tokio::spawn(async move { handler(context).await }));
    let mut lost_rx = lost.subscribe();
    let outcome = tokio::select! {
        // A handler that has finished is reported, even if its attempt was stopped meanwhile.
        biased;
        joined = &mut work.0 => joined,
        _ = async {
            if lost_rx.wait_for(|lost| *lost).await.is_err() {
                std::future::pending::<()>().await;
            }
        } => {
            // Stopped, and waited for: the slot is free only once the handler is gone (one that
            // blocks its thread stops at its next await, not at once), so no more than `slots`
            // handlers ever run. One that finished (or panicked) meanwhile is reported as such.
            tracing::warn!(task = task_id, attempt, "lease lost; stopping the handler");
            work.0.abort();
            match (&mut work.0).await {
                Err(stopped) if stopped.is_cancelled() => {
                    return finished(&assignment, AttemptEnd::LeaseLost, "the lease was lost while the handler ran".into());
                }
                ended => ended,
            }
        }
    };
    drop(_renewer);

    // A report whose answer is lost to an outage is sent again while the lease may still be held
    // (the store answers a repeat of a recorded result as recorded): given up, the finished work
    // would be done again once the lease ran out.
    let report = Report::of(outcome);
    let mut pause = FIRST_REPORT_PAUSE;
    let mut unanswered_before = false;
    let (reported, end, detail) = loop {
        let sent = report.send(client, task_id, attempt, worker).await;
        // Until the end of the lease as its last renewal left it.
        let unknown = sent.0.as_ref().is_err_and(worth_sending_again);
        if unknown {
            unanswered_before = true;
        }
        if !unknown || Instant::now() + pause >= *lock(&valid_until) {
            break sent;
        }
        tracing::debug!(
            task = task_id,
            attempt,
            "result not confirmed; sending it again"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_REPORT_PAUSE);
    };
    match reported {
        Ok(_) => finished(&assignment, end, detail),
        Err(error) => {
            tracing::warn!(task = task_id, attempt, %error, outcome = end.as_str(), "answer not recorded");
            let end = unrecorded_end(&error, unanswered_before);
            let detail = if unanswered_before && !error.is_infrastructure() {
                format!(
                    "{} not confirmed: a report that went unanswered may have been recorded \
                     before this one was refused: {error}",
                    end_name(detail)
                )
            } else {
                format!("{} not recorded: {error}", end_name(detail))
            };
            finished(&assignment, end, detail)
        }
    }
}

/// The latest moment, by this machine's clock, at which the store can still hold `attempt`'s
/// lease, judged from the answer to its start (`started`), whose first sending was at `sent`.
///
/// The store applied the start at its time `started_at_ms`, necessarily after `sent`, with
/// `lease_until_ms - started_at_ms` of the lease left then; so the lease ends no earlier than
/// `sent` plus that. The estimate made from the lease's own answer counts from that answer's
/// arrival instead, and is too late by however long the answer took to be seen here (a slow
/// path back, a worker process that stalled); this one is not, and the handler starts on the
/// earlier of the two. `None` when the answer does not show the attempt started.
fn lease_end_after_start(started: &QueueTask, attempt: u32, sent: Instant) -> Option<Instant> {
    let record = started
        .attempts
        .iter()
        .rev()
        .find(|a| a.number == attempt)?;
    let left = record.lease_until_ms.saturating_sub(record.started_at_ms?);
    Some(sent + Duration::from_millis(left))
}

/// Tells the store that `attempt`, which it may count as started, failed harmlessly (its handler
/// did not run), so the task retries now, or on its last attempt ends failed rather than needing
/// review for an effect that never happened. Sent again, with growing pauses, while its outcome
/// is unknown, and never past `until` (the lease's end: then the store recovers the attempt
/// itself, and a drain is not held longer). Whether it was recorded; a refusal (the start was
/// not applied, or the lease has ended) changes nothing.
async fn fail_unrun(
    client: &Client,
    task_id: u64,
    attempt: u32,
    worker: &str,
    detail: &str,
    until: Instant,
) -> bool {
    let mut pause = FIRST_REPORT_PAUSE;
    loop {
        let sent = client.fail_attempt(task_id, attempt, worker, detail, true);
        let Ok(answer) = tokio::time::timeout_at(until, sent).await else {
            tracing::warn!(
                task = task_id,
                attempt,
                "could not say the handler did not run; the attempt ends with its lease"
            );
            return false;
        };
        match answer {
            Ok(_) => return true,
            Err(error) if worth_sending_again(&error) && Instant::now() + pause < until => {
                tracing::debug!(task = task_id, attempt, %error, "sending the harmless failure again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_REPORT_PAUSE);
            }
            Err(error) if worth_sending_again(&error) => {
                tracing::warn!(
                    task = task_id,
                    attempt,
                    %error,
                    "could not say the handler did not run; the attempt ends with its lease"
                );
                return false;
            }
            Err(error) => {
                tracing::debug!(task = task_id, attempt, %error, "harmless failure refused");
                return false;
            }
        }
    }
}

/// Whether a failed call (a lease, a report) may succeed if simply sent again: its outcome is
/// unknown ([`Error::outcome_unknown`]: the cluster was unreachable or forgot the request). A
/// refusal, a server error (a token no longer accepted, a request too large), a protocol or
/// configuration error answers the same way every time, so the worker stops (or gives the report
/// up) and says why instead of retrying for good.
fn worth_sending_again(error: &Error) -> bool {
    error.outcome_unknown()
}

/// Whether a settling ask that failed with `error` is to be asked again: only while no node
/// answered it. An answer that will not change (a token no longer accepted, a session the store
/// forgot, so that the lease's own answer is gone) ends the settling: the lease is left to its
/// TTL, and the worker goes on as after any failed lease (a new one meets that answer as a
/// plain refusal, and stops the worker where it must).
fn unanswered(error: &Error) -> bool {
    matches!(error, Error::Unavailable { .. })
}

/// How an attempt whose report ended in `error` ended. A refusal means the lease was no longer
/// this worker's — unless an earlier sending went unanswered: that one may have been recorded
/// (a retryable failure, then the task leased again, refuses the next sending `LEASE_LOST`), so
/// the report's fate is unknown, not lost.
fn unrecorded_end(error: &Error, unanswered_before: bool) -> AttemptEnd {
    if error.is_infrastructure() || unanswered_before {
        AttemptEnd::Unreported
    } else {
        AttemptEnd::LeaseLost
    }
}

/// What an attempt whose handler finished tells the store.
enum Report {
    Complete(Vec<u8>),
    Fail { message: String, retryable: bool },
    Unknown(String),
}

impl Report {
    fn of(outcome: Result<Result<Vec<u8>, TaskError>, tokio::task::JoinError>) -> Self {
        match outcome {
            // Refused by the store, or before it by the node's request limit, whatever the
            // attempt: the handler's effects are not run again for a result that cannot be kept.
            Ok(Ok(result)) if result.len() > MAX_PAYLOAD_BYTES => Self::Fail {
                message: format!(
                    "the result was refused: {} bytes, the store keeps at most {MAX_PAYLOAD_BYTES}",
                    result.len()
                ),
                retryable: false,
            },
            Ok(Ok(result)) => Self::Complete(result),
            Ok(Err(TaskError::Retryable(message))) => Self::Fail {
                message: bounded(message),
                retryable: true,
            },
            Ok(Err(TaskError::NonRetryable(message))) => Self::Fail {
                message: bounded(message),
                retryable: false,
            },
            Ok(Err(TaskError::UnknownEffect(message))) => Self::Unknown(bounded(message)),
            // A panic part-way through: what the handler did is unknown.
            Err(join_error) => {
                Self::Unknown(bounded(format!("the handler panicked: {join_error}")))
            }
        }
    }

    /// Sends the report once, with the attempt's end and detail as this worker counts them.
    async fn send(
        &self,
        client: &Client,
        task_id: u64,
        attempt: u32,
        worker: &str,
    ) -> (Result<QueueTask, Error>, AttemptEnd, String) {
        match self {
            Self::Complete(result) => {
                match client
                    .complete_attempt(task_id, attempt, worker, result)
                    .await
                {
                    // The store refused the result itself (e.g. too large): retrying cannot help.
                    Err(Error::Refused(refusal @ Refusal::Invalid { .. })) => {
                        let message = bounded(format!("the result was refused: {refusal}"));
                        (
                            client
                                .fail_attempt(task_id, attempt, worker, &message, false)
                                .await,
                            AttemptEnd::Failed { retryable: false },
                            message,
                        )
                    }
                    completed => (completed, AttemptEnd::Completed, String::new()),
                }
            }
            Self::Fail { message, retryable } => (
                client
                    .fail_attempt(task_id, attempt, worker, message, *retryable)
                    .await,
                AttemptEnd::Failed {
                    retryable: *retryable,
                },
                message.clone(),
            ),
            Self::Unknown(message) => (
                client
                    .report_unknown(task_id, attempt, worker, message)
                    .await,
                AttemptEnd::Unknown,
                message.clone(),
            ),
        }
    }
}

/// `text` cut (at a character boundary) to what the store accepts as an error or note.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_TEXT_BYTES {
        let mut cut = MAX_TEXT_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

fn end_name(detail: String) -> String {
    if detail.is_empty() {
        "the result was".into()
    } else {
        format!("the answer ({detail}) was")
    }
}

/// Renews the attempt about every third of the lease TTL until dropped. A refused renewal, or a
/// lease that (by this worker's clock: from `lease_end`, then from the sending of each successful
/// renewal) has run out, marks the attempt lost.
///
/// The first renewal is due a third of the TTL into the lease, and goes out at once when that
/// moment has passed (the start took long, or the lease answer came late); the lease's end is
/// watched even while no renewal is due: a handler must not run on a lease that ran out between
/// two renewals.
async fn renew_loop(
    settings: Arc<Settings>,
    task_id: u64,
    attempt: u32,
    shared_until: Arc<Mutex<Instant>>,
    lost: Arc<watch::Sender<bool>>,
) {
    let ttl = settings.lease_ttl;
    let every = ttl / 3;
    let mut valid_until = *lock(&shared_until);
    // The first renewal is due a third of the TTL into the lease; at once if that has passed.
    let mut next = valid_until
        .checked_sub(ttl - every)
        .unwrap_or_else(Instant::now);
    loop {
        tokio::time::sleep_until(next.min(valid_until)).await;
        if Instant::now() >= valid_until {
            tracing::warn!(
                task = task_id,
                attempt,
                "the lease ran out before a renewal got through; stopping the handler"
            );
            lost.send_replace(true);
            return;
        }
        let sent = Instant::now();
        next = sent + every;
        let renewal =
            settings
                .client
                .renew_attempt(task_id, attempt, &settings.id, settings.lease_ttl_ms());
        match tokio::time::timeout_at(valid_until, renewal).await {
            Ok(Ok(_)) => {
                valid_until = sent + ttl;
                *lock(&shared_until) = valid_until;
            }
            Ok(Err(error @ Error::Refused(_))) => {
                tracing::warn!(task = task_id, attempt, %error, "renewal refused; stopping the handler");
                lost.send_replace(true);
                return;
            }
            Ok(Err(error)) => {
                tracing::warn!(task = task_id, attempt, %error, "renewal failed; will retry")
            }
            // The lease ran out while the renewal was on its way: the check above stops the
            // handler.
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::client::Leased;

    /// A worker whose client talks to a node that accepts connections and never answers.
    fn worker_facing_silence(ttl: Duration) -> (Worker, std::net::TcpListener) {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = crate::ClientConfig {
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        };
        let client =
            crate::Client::new(&[silent.local_addr().unwrap().to_string()], config).unwrap();
        let worker = Worker::builder(client, "w")
            .queue("q")
            .lease_ttl(ttl)
            .build()
            .unwrap();
        (worker, silent)
    }

    /// A lease with little left when its handler starts (a late answer, a slow start) is watched
    /// to its end: the handler is stopped when it runs out, not at the next renewal a third of
    /// the TTL later.
    #[tokio::test]
    async fn a_lease_that_runs_out_before_the_first_renewal_is_due_stops_the_handler() {
        // A long TTL puts the next renewal (a third of it) 10 s away, far from the lease's end.
        let (worker, _silent) = worker_facing_silence(Duration::from_secs(30));
        let lost = Arc::new(watch::Sender::new(false));
        let mut seen = lost.subscribe();
        let started = Instant::now();
        let lease_end = started + Duration::from_millis(200);
        let until = Arc::new(Mutex::new(lease_end));
        let renewer = tokio::spawn(renew_loop(worker.settings.clone(), 7, 1, until, lost));
        tokio::time::timeout(Duration::from_secs(30), seen.wait_for(|lost| *lost))
            .await
            .unwrap()
            .unwrap();
        let took = started.elapsed();
        // Halfway between the lease's end (200 ms) and the renewal after the first (10 s).
        assert!(
            took < Duration::from_secs(5),
            "the lease ended at 200 ms, the handler was stopped at {took:?}"
        );
        println!("the lease ended at 200 ms, the handler was stopped at {took:?}");
        renewer.abort();
    }

    /// Seed 004 §4: the high-level worker declares keyed-task support by itself; only an
    /// integrator that turns it off (or talks to the store directly) goes without.
    #[tokio::test]
    async fn a_worker_takes_keyed_tasks_unless_told_not_to() {
        let client = crate::Client::new(&["127.0.0.1:1"], crate::ClientConfig::default()).unwrap();
        let by_default = Worker::builder(client.clone(), "w");
        assert!(by_default.concurrency_keys);
        assert!(
            !Worker::builder(client, "w")
                .concurrency_keys(false)
                .concurrency_keys
        );
    }

    /// A handler that blocked its thread past the lease's end sees the lease lost at once, before
    /// the runtime's renewal task (which could not run meanwhile) has said so.
    #[test]
    fn a_lease_past_its_end_is_lost_to_a_handler_that_blocked_its_thread() {
        let lost = watch::Sender::new(false);
        let context = TaskContext {
            task_id: 7,
            attempt: 1,
            queue: "q".into(),
            namespace: "ns".into(),
            handler: "h".into(),
            handler_version: "v1".into(),
            payload_version: "v1".into(),
            payload: Vec::new(),
            concurrency_key: None,
            token: None,
            worker: "w".into(),
            lost: lost.subscribe(),
            valid_until: Arc::new(Mutex::new(Instant::now() + Duration::from_secs(1))),
        };
        assert!(!context.lease_lost(), "the lease has a second left");
        std::thread::sleep(Duration::from_millis(1200));
        assert!(context.lease_lost(), "the lease ended 200 ms ago");
    }

    /// What is left of a lease counts from the answer's arrival: all of it for a fresh grant,
    /// less for an answer replayed after the grant, the whole TTL from a node that does not say.
    #[test]
    fn a_lease_ends_locally_when_the_store_says_it_does() {
        let arrived = Instant::now();
        let ttl = Duration::from_secs(30);
        let leased = |store_now_ms| Leased {
            assignments: Vec::new(),
            arrived,
            store_now_ms,
        };
        let mut granted = assignment("", None);
        granted.lease_until_ms = 1_000_000 + 30_000;
        let fresh = leased(1_000_000).local_end(&granted, ttl);
        assert_eq!(fresh, arrived + ttl);
        let replayed = leased(1_000_000 + 12_000).local_end(&granted, ttl);
        assert_eq!(replayed, arrived + Duration::from_secs(18));
        let gone = leased(1_000_000 + 40_000).local_end(&granted, ttl);
        assert_eq!(gone, arrived);
        assert_eq!(leased(0).local_end(&granted, ttl), arrived + ttl);
        // Never more than the TTL asked for, whatever the clocks say.
        granted.lease_until_ms = 1_000_000 + 90_000;
        assert_eq!(leased(1_000_000).local_end(&granted, ttl), arrived + ttl);
    }

    /// The start's answer bounds the lease from the start's sending: what the store says was
    /// left when it applied the start, whenever the answer arrives.
    #[test]
    fn a_started_attempt_s_lease_ends_what_was_left_after_the_start_was_sent() {
        let sent = Instant::now();
        let record = |number, started_at_ms| baton_statemachine::queue::Attempt {
            number,
            worker: "w".into(),
            token: None,
            leased_at_ms: 1_000_000,
            lease_until_ms: 1_002_000,
            started_at_ms,
            ended_at_ms: None,
            outcome: baton_statemachine::queue::AttemptOutcome::Active,
            note: String::new(),
        };
        let task = |attempts| QueueTask {
            id: 7,
            namespace: "ns".into(),
            spec: baton_statemachine::queue::TaskSpec {
                queue: "q".into(),
                idempotency_key: "k".into(),
                handler: "h".into(),
                handler_version: "v1".into(),
                payload_version: "v1".into(),
                payload: Vec::new(),
                concurrency_key: String::new(),
                business_key: String::new(),
                max_attempts: 3,
                ttl_ms: 60_000,
            },
            state: baton_statemachine::queue::TaskState::Running,
            attempts,
            submitted_at_ms: 999_000,
            deadline_ms: 1_059_000,
            retry_at_ms: None,
            result: Vec::new(),
            last_error: String::new(),
        };
        // Started 1.5 s into a 2 s lease: half a second from the sending.
        let started = task(vec![record(1, Some(1_001_500))]);
        assert_eq!(
            lease_end_after_start(&started, 1, sent),
            Some(sent + Duration::from_millis(500))
        );
        // Another attempt's record says nothing about this one; nor does an unstarted one.
        assert_eq!(lease_end_after_start(&started, 2, sent), None);
        let unstarted = task(vec![record(1, None)]);
        assert_eq!(lease_end_after_start(&unstarted, 1, sent), None);
        // Applied after the lease's end (cannot be, but must not wrap): nothing left.
        let late = task(vec![record(1, Some(1_003_000))]);
        assert_eq!(lease_end_after_start(&late, 1, sent), Some(sent));
        // A broken answer's deadline of u64::MAX ms does not overflow the clock (the caller
        // takes the earlier of this and the lease's own estimate).
        let mut broken = record(1, Some(0));
        broken.lease_until_ms = u64::MAX;
        assert!(lease_end_after_start(&task(vec![broken]), 1, sent).is_some());
    }

    /// The store is sent whole milliseconds; the local lease clock must not count the fraction
    /// it never granted (it would end the lease up to a millisecond late).
    #[test]
    fn a_lease_ttl_is_whole_milliseconds() {
        let client = crate::Client::new(&["127.0.0.1:1"], crate::ClientConfig::default()).unwrap();
        let worker = Worker::builder(client, "w")
            .queue("q")
            .lease_ttl(Duration::from_micros(30_900))
            .build()
            .unwrap();
        assert_eq!(worker.settings.lease_ttl, Duration::from_millis(30));
    }

    /// A stop while the worker registers ends the run at once (before: it waited out the
    /// client's deadline against a cluster that never answers, 30 s here).
    #[tokio::test]
    async fn a_stop_while_registering_ends_the_run_at_once() {
        let (worker, _silent) = worker_facing_silence(Duration::from_secs(3));
        let stopped = tokio::time::timeout(
            Duration::from_secs(5),
            worker.run(
                |_task: TaskContext| async { Ok(Vec::new()) },
                tokio::time::sleep(Duration::from_millis(200)),
            ),
        )
        .await
        .expect("the run ended soon after the stop")
        .unwrap();
        assert!(stopped.drained);
        assert_eq!(
            stopped,
            WorkerSummary {
                drained: true,
                ..WorkerSummary::default()
            }
        );
    }

    fn assignment(key: &str, token: Option<u64>) -> Assignment {
        Assignment {
            task_id: 7,
            attempt: 1,
            queue: "q".into(),
            namespace: "ns".into(),
            handler: "h".into(),
            handler_version: "v1".into(),
            payload_version: "v1".into(),
            payload: Vec::new(),
            concurrency_key: key.into(),
            token,
            lease_until_ms: 0,
        }
    }

    #[test]
    fn well_formed_assignments_pass() {
        assert_eq!(check_assignment(&assignment("", None), false, None), Ok(()));
        assert_eq!(check_assignment(&assignment("", None), true, None), Ok(()));
        assert_eq!(
            check_assignment(&assignment("object/42", Some(3)), true, None),
            Ok(())
        );
    }

    #[test]
    fn a_keyed_assignment_without_a_token_is_refused() {
        let error = check_assignment(&assignment("object/42", None), true, None).unwrap_err();
        assert_eq!(
            error,
            ProtocolError::MissingToken {
                key: "object/42".into()
            }
        );
        assert!(
            error.to_string().contains("without a permit token"),
            "{error}"
        );
    }

    #[test]
    fn a_zero_token_is_refused() {
        assert_eq!(
            check_assignment(&assignment("k", Some(0)), true, None),
            Err(ProtocolError::ZeroToken { key: "k".into() })
        );
    }

    #[test]
    fn an_unkeyed_assignment_with_a_token_is_refused() {
        for capable in [false, true] {
            assert_eq!(
                check_assignment(&assignment("", Some(5)), capable, None),
                Err(ProtocolError::UnexpectedToken { token: 5 })
            );
        }
    }

    #[test]
    fn a_keyed_assignment_to_an_incapable_worker_is_refused_even_with_a_token() {
        for token in [None, Some(1)] {
            let error = check_assignment(&assignment("k", token), false, None).unwrap_err();
            assert_eq!(error, ProtocolError::NotCapable { key: "k".into() });
            assert!(
                error.to_string().contains("without concurrency keys"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_repeat_of_a_running_attempt_must_not_change_its_key_or_token() {
        let running = |key: &'static str, token| {
            Some(RunningAttempt {
                concurrency_key: key,
                token,
            })
        };
        // The same key and token: a harmless duplicate.
        assert_eq!(
            check_assignment(&assignment("k", Some(4)), true, running("k", Some(4))),
            Ok(())
        );
        assert_eq!(
            check_assignment(&assignment("", None), true, running("", None)),
            Ok(())
        );
        // Another token, another key, a key added or removed: refused.
        for (key, token, was_key, was_token) in [
            ("k", Some(5), "k", Some(4)),
            ("other", Some(4), "k", Some(4)),
            ("k", Some(4), "", None),
            ("", None, "k", Some(4)),
        ] {
            let error =
                check_assignment(&assignment(key, token), true, running(was_key, was_token))
                    .unwrap_err();
            assert!(
                matches!(error, ProtocolError::ChangedAttempt { .. }),
                "{key:?}/{token:?} over {was_key:?}/{was_token:?}: {error:?}"
            );
            assert!(error.to_string().contains("changes a running attempt"));
        }
    }

    /// Only an outage is worth leasing again; an answer that will be the same next time stops
    /// the worker (e.g. its token was revoked: it used to retry that for good, warning only).
    #[test]
    fn only_an_outage_is_worth_sending_again() {
        let unavailable = Error::Unavailable {
            endpoints: vec!["a:1".into()],
            waited: Duration::from_secs(1),
            last: "connection refused".into(),
        };
        assert!(worth_sending_again(&unavailable));
        assert!(worth_sending_again(&Error::OutcomeUnknown(
            "session expired".into()
        )));
        for error in [
            Error::Server {
                code: "UNAUTHENTICATED".into(),
                message: "token not accepted".into(),
            },
            Error::Protocol("undecodable".into()),
            Error::Config("bad".into()),
            Error::Refused(Refusal::UnknownWorker),
        ] {
            assert!(!worth_sending_again(&error), "{error}");
        }
    }

    /// A lease whose answer is still unknown is settled again only while no node answers: a
    /// settling ask is a retry, so a server's answer to it (a revoked token) comes back as
    /// "outcome unknown", and asking again for good would keep a worker from ever meeting it
    /// as the refusal that stops it.
    #[test]
    fn a_lease_is_settled_again_only_while_no_node_answers() {
        assert!(unanswered(&Error::Unavailable {
            endpoints: vec!["a:1".into()],
            waited: Duration::from_secs(1),
            last: "no answer".into(),
        }));
        for error in [
            Error::OutcomeUnknown("UNAUTHENTICATED: token not accepted".into()),
            Error::OutcomeUnknown("session expired".into()),
            Error::Protocol("undecodable".into()),
        ] {
            assert!(!unanswered(&error), "{error}");
        }
    }

    #[test]
    fn a_refused_report_after_an_unanswered_one_is_unreported_not_lost() {
        let refused = Error::Refused(Refusal::LeaseLost);
        assert_eq!(unrecorded_end(&refused, false), AttemptEnd::LeaseLost);
        assert_eq!(unrecorded_end(&refused, true), AttemptEnd::Unreported);
        let outage = Error::OutcomeUnknown("forgotten".into());
        assert_eq!(unrecorded_end(&outage, false), AttemptEnd::Unreported);
    }

    #[test]
    fn the_summary_counts_each_end_once() {
        let mut summary = WorkerSummary::default();
        for end in [
            AttemptEnd::Completed,
            AttemptEnd::Completed,
            AttemptEnd::Failed { retryable: true },
            AttemptEnd::Failed { retryable: false },
            AttemptEnd::Unknown,
            AttemptEnd::LeaseLost,
            AttemptEnd::Unreported,
            AttemptEnd::ProtocolError,
        ] {
            summary.count(end);
        }
        assert_eq!(
            summary,
            WorkerSummary {
                completed: 2,
                failed: 2,
                unknown: 1,
                lost: 2,
                protocol_errors: 1,
                handed_back: 0,
                drained: false,
            }
        );
    }
}
