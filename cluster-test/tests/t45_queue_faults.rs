//! Claim: the keyed task queue keeps seed 004's promises on a real three-process cluster while a
//! worker process and the Raft leader are SIGKILLed mid-run (contract §5, docs/task-queue.md).
//!
//! 1,000 tasks over 20 concurrency keys (every tenth task unkeyed) and three queues of one
//! namespace are submitted through the client library by eight concurrent submitters, each
//! retrying infrastructure failures with the same idempotency key (their client gives up after
//! 500 ms, so a failover turns into such retries, some of them replays of a submission that was
//! applied). Four `baton worker run` processes lease from all three queues with concurrency keys
//! on, four slots each and a 3 s lease; the command they run per task sleeps 0-90 ms (3 s on the
//! worker that will be killed) and prints the key and token it was handed. A quarter into the
//! submissions that worker process is SIGKILLed while it runs attempts; at 60 % the leader is
//! SIGKILLed, and restarted once the new leader has finished 50 more tasks.
//!
//! Once every task is terminal (bounded), the store's own records (`queue_tasks`, `attempts`,
//! `queue_task`) must show:
//!
//! - every submission exactly once: one task per idempotency key, with the receipt's id and the
//!   submitted content, and no other task; a repeated submission is answered as a replay of the
//!   same task, and the same key with another concurrency key is refused `IDEMPOTENCY_CONFLICT`;
//! - every task ended exactly once, in SUCCEEDED, FAILED, CANCELLED or NEEDS_REVIEW: attempts
//!   numbered 1..n, all ended, only the last with a final outcome that matches the task's state,
//!   every earlier one expired or failed; results recorded while the lease held, expiries not
//!   before the lease ran out;
//! - at most one active attempt per key across the three queues: per key, the attempts'
//!   `[leased_at, ended_at]` intervals on the store clock do not overlap (an expired attempt ends
//!   when its expiry was applied, never before its lease ran out; two intervals may touch in the
//!   same millisecond, since commands apply one after the other);
//! - permit tokens per key unique and strictly increasing in lease order; every keyed attempt
//!   carries a non-zero token, no unkeyed attempt carries one; each succeeded task's result is
//!   the key and token its command was handed, i.e. the token of the attempt that succeeded;
//! - the SIGKILLed worker's attempts all ended, at least one by lease expiry, and their tasks
//!   still finished; no worker reports a completion the store does not record as that attempt's
//!   success (with the token it was handed), every success of a surviving worker was reported by
//!   it, and the survivors drain on SIGTERM with no protocol error.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_cluster_test::queue_worker::{WorkerProcess, WorkerSpec};
use baton_cluster_test::{first, wait, Cluster, Options};
use baton_rpc::{AttemptHistory, Client, ClientConfig, Error};
use baton_statemachine::queue::{Attempt, AttemptOutcome, Task, TaskFilter, TaskSpec, TaskState};
use baton_statemachine::Refusal;
use futures::stream::{self, StreamExt};

const TASKS: usize = 1_000;
const KEYS: usize = 20;
const QUEUES: [&str; 3] = ["q1", "q2", "q3"];
const NAMESPACE: &str = "t45";
const WORKERS: usize = 4;
const SLOTS: usize = 4;
const LEASE_TTL: Duration = Duration::from_secs(3);
const MAX_ATTEMPTS: u32 = 5;
const SUBMITTERS: usize = 8;
/// From the first submission until every task is terminal.
const RUN_LIMIT: Duration = Duration::from_secs(150);
/// The worker that is SIGKILLed.
const VICTIM: &str = "w4";
/// How long the command sleeps per task: 0-90 ms by task id, so the run stays cheap.
const SLEEP: &str = "0.0$((BATON_TASK_ID % 10))";
/// The victim's command takes three seconds, so it surely dies with attempts in the middle of their
/// command rather than with their completions already on the way: with one second, two attempts
/// seen running could both finish between the listing and the kill (it happened once).
const VICTIM_SLEEP: &str = "3";

/// What a worker runs per task: a sleep, then it prints the key and the token it was handed; the
/// output becomes the task's result.
fn command(sleep: &str) -> Vec<String> {
    let script =
        format!(r#"sleep {sleep}; printf '%s/%s' "$BATON_CONCURRENCY_KEY" "$BATON_FENCE""#);
    vec!["sh".into(), "-c".into(), script]
}

/// The concurrency key of the `n`-th key (one of them not ASCII: keys match byte-exactly).
fn key(n: usize) -> String {
    if n == 13 {
        format!("clé-{n:02}")
    } else {
        format!("key-{n:02}")
    }
}

/// The `i`-th submission: queues in turn; every tenth task unkeyed, the others spread evenly
/// over the keys (so each key's tasks sit in all three queues).
fn spec(i: usize) -> TaskSpec {
    let concurrency_key = if i % 10 == 9 {
        String::new()
    } else {
        key((i - i / 10) % KEYS)
    };
    TaskSpec {
        queue: QUEUES[i % QUEUES.len()].to_string(),
        idempotency_key: format!("t45-{i}"),
        handler: "t45".into(),
        handler_version: "v1".into(),
        payload_version: "v1".into(),
        payload: format!("{{\"i\":{i}}}").into_bytes(),
        concurrency_key,
        business_key: format!("order-{i}"),
        max_attempts: MAX_ATTEMPTS,
        ttl_ms: 600_000,
    }
}

/// The submitters' client gives up quickly (before a new leader is elected), so a failover
/// surfaces as infrastructure errors — ambiguous submissions, some of them applied — that the
/// submitter retries with a new request but the same idempotency key.
fn submit_config() -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_millis(500),
        attempt_timeout: Duration::from_millis(250),
        connect_timeout: Duration::from_millis(200),
    }
}

/// What one submission ended with.
#[derive(Debug, Clone)]
struct Submission {
    task_id: u64,
    /// Infrastructure errors before the answer (each one an ambiguous submission, retried).
    infra_errors: u32,
    /// Whether the answer was a replay (only possible after an ambiguous try).
    replayed: bool,
}

#[derive(Default)]
struct Submitted {
    done: BTreeMap<usize, Submission>,
    /// Submissions refused, or given up after a minute of infrastructure errors.
    failures: Vec<String>,
}

type SharedSubmitted = Arc<Mutex<Submitted>>;

fn lock(shared: &SharedSubmitted) -> std::sync::MutexGuard<'_, Submitted> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// Submits until an answer: infrastructure failures are retried with the same spec (same
/// idempotency key) for at most `limit`; a contract refusal is an answer.
async fn submit_retrying(
    client: &Client,
    spec: &TaskSpec,
    limit: Duration,
) -> Result<Submission, String> {
    let started = Instant::now();
    let mut infra_errors = 0;
    loop {
        match client.submit(spec).await {
            Ok(receipt) => {
                return Ok(Submission {
                    task_id: receipt.task.id,
                    infra_errors,
                    replayed: receipt.replayed,
                })
            }
            Err(error) if error.is_infrastructure() && started.elapsed() < limit => {
                infra_errors += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(format!("{}: {error}", spec.idempotency_key)),
        }
    }
}

async fn submitter(client: Client, next: Arc<AtomicUsize>, submitted: SharedSubmitted) {
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= TASKS {
            return;
        }
        let result = submit_retrying(&client, &spec(i), Duration::from_secs(60)).await;
        let mut submitted = lock(&submitted);
        match result {
            Ok(submission) => {
                submitted.done.insert(i, submission);
            }
            Err(error) => submitted.failures.push(error),
        }
    }
}

/// How many tasks are submitted; panics on a failed submission (none is expected).
fn submitted_count(submitted: &SharedSubmitted) -> usize {
    let submitted = lock(submitted);
    assert!(
        submitted.failures.is_empty(),
        "submissions failed: {}",
        first(&submitted.failures, 5)
    );
    submitted.done.len()
}

async fn all_tasks(client: &Client) -> Vec<Task> {
    client.queue_tasks(&TaskFilter::default()).await.unwrap()
}

fn terminal(tasks: &[Task]) -> usize {
    tasks.iter().filter(|t| t.state.is_terminal()).count()
}

/// `(task, attempt)` of every active attempt held by `worker`, and how many of them started.
fn active_of(tasks: &[Task], worker: &str) -> (Vec<(u64, u32)>, usize) {
    let mut ids = Vec::new();
    let mut running = 0;
    for task in tasks {
        if let Some(a) = task.active_attempt().filter(|a| a.worker == worker) {
            ids.push((task.id, a.number));
            running += usize::from(a.started_at_ms.is_some());
        }
    }
    (ids, running)
}

/// Polls (every 200 ms, the listing is large) until `ready` accepts the task listing.
async fn until_tasks<T>(
    client: &Client,
    submitted: &SharedSubmitted,
    what: &str,
    limit: Duration,
    ready: impl Fn(usize, &[Task]) -> Result<T, String>,
) -> T {
    let ready = &ready;
    wait::until(what, limit, || async move {
        let count = submitted_count(submitted);
        let tasks = client
            .queue_tasks(&TaskFilter::default())
            .await
            .map_err(|e| e.to_string())?;
        match ready(count, &tasks) {
            Ok(value) => Ok(value),
            Err(reason) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Err(format!(
                    "{count} submitted, {} terminal: {reason}",
                    terminal(&tasks)
                ))
            }
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t45_keyed_queue_survives_worker_and_leader_sigkill() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    for queue in QUEUES {
        client.create_queue(queue, NAMESPACE).await.unwrap();
    }
    let logs = tempfile::tempdir().unwrap();
    let mut workers = Vec::new();
    for n in 1..=WORKERS {
        let id = format!("w{n}");
        let sleep = if id == VICTIM { VICTIM_SLEEP } else { SLEEP };
        let spec = WorkerSpec {
            command: command(sleep),
            id,
            queues: QUEUES.iter().map(|q| q.to_string()).collect(),
            concurrency_keys: true,
            slots: SLOTS,
            lease_ttl: LEASE_TTL,
            drain_timeout: Duration::from_secs(10),
        };
        let log = logs.path().join(format!("{}.log", spec.id));
        workers
            .push(WorkerProcess::spawn(cluster.bin(), &cluster.endpoints(), &spec, &log).unwrap());
    }

    let started = Instant::now();
    let submitted = SharedSubmitted::default();
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = Vec::new();
    for _ in 0..SUBMITTERS {
        let client = Client::connect_with(&cluster.endpoints(), submit_config())
            .await
            .unwrap();
        submitters.push(tokio::spawn(submitter(
            client,
            next.clone(),
            submitted.clone(),
        )));
    }

    // A quarter in, SIGKILL a worker process while it runs attempts.
    until_tasks(
        &client,
        &submitted,
        "the victim running attempts a quarter into the submissions",
        Duration::from_secs(60),
        |count, tasks| {
            let (_, running) = active_of(tasks, VICTIM);
            if count >= TASKS / 4 && running >= 2 {
                Ok(())
            } else {
                Err(format!("{VICTIM} runs {running}"))
            }
        },
    )
    .await;
    let victim = workers.iter_mut().find(|w| w.id() == VICTIM).unwrap();
    let status = victim.kill().await.unwrap();
    assert_eq!(status.signal(), Some(9), "{VICTIM} should die by SIGKILL");
    let worker_killed_after = started.elapsed();
    let (orphaned, _) = active_of(&all_tasks(&client).await, VICTIM);
    assert!(
        !orphaned.is_empty(),
        "{VICTIM} held no active attempt when it was killed"
    );

    // At 60 % of the submissions, SIGKILL the leader; restart it once the new one has
    // finished 50 more tasks.
    let old_leader = cluster.leader().await.unwrap();
    let submitted_at_kill = wait::until(
        "60% of the submissions",
        Duration::from_secs(60),
        || async {
            let count = submitted_count(&submitted);
            if count >= TASKS * 6 / 10 {
                Ok(count)
            } else {
                Err(format!("{count} submitted"))
            }
        },
    )
    .await
    .unwrap();
    cluster.kill(old_leader).unwrap();
    let leader_killed_after = started.elapsed();
    let new_leader = cluster.leader().await.unwrap();
    assert_ne!(new_leader, old_leader);
    assert!(
        submitted_at_kill < TASKS,
        "the leader was killed only after the last submission"
    );
    let terminal_before = terminal(&all_tasks(&client).await);
    assert!(
        terminal_before < TASKS,
        "every task had finished before the new leader served"
    );
    until_tasks(
        &client,
        &submitted,
        "progress under the new leader",
        Duration::from_secs(60),
        |_, tasks| {
            if terminal(tasks) >= (terminal_before + 50).min(TASKS) {
                Ok(())
            } else {
                Err("not yet".into())
            }
        },
    )
    .await;
    cluster.restart(old_leader).await.unwrap();

    for handle in submitters {
        handle.await.unwrap();
    }
    assert_eq!(submitted_count(&submitted), TASKS);
    until_tasks(
        &client,
        &submitted,
        "every task terminal",
        RUN_LIMIT.saturating_sub(started.elapsed()),
        |_, tasks| {
            let open: Vec<(u64, &str)> = tasks
                .iter()
                .filter(|t| !t.state.is_terminal())
                .map(|t| (t.id, t.state.as_str()))
                .collect();
            if open.is_empty() {
                Ok(())
            } else {
                Err(format!("open: {}", first(&open, 5)))
            }
        },
    )
    .await;
    let elapsed = started.elapsed();

    // Stop the survivors: they drain (nothing is left to run) and report.
    let mut summaries = Vec::new();
    for worker in workers.iter_mut().filter(|w| w.id() != VICTIM) {
        let status = worker.terminate(Duration::from_secs(20)).await.unwrap();
        assert!(
            status.success(),
            "worker {} exited {status}:\n{}",
            worker.id(),
            worker.log_tail(20)
        );
        let summary = worker.summary().unwrap();
        assert!(summary.drained, "worker {}: {summary:?}", worker.id());
        assert_eq!(summary.protocol_errors, 0, "worker {}", worker.id());
        summaries.push(format!(
            "{} {}/{}",
            worker.id(),
            summary.completed,
            summary.lost
        ));
    }

    // Repeated submissions are replays of the same task; changed content is a conflict.
    let submissions = lock(&submitted).done.clone();
    let mut replays_checked = 0;
    for (i, submission) in &submissions {
        if submission.infra_errors == 0 && i % 50 != 0 {
            assert!(
                !submission.replayed,
                "first try of t45-{i} answered as a replay"
            );
            continue;
        }
        let receipt = client.submit(&spec(*i)).await.unwrap();
        assert!(receipt.replayed, "t45-{i} submitted again was not a replay");
        assert_eq!(receipt.task.id, submission.task_id, "t45-{i}");
        replays_checked += 1;
    }
    let mut changed = spec(0);
    changed.concurrency_key = key(1);
    match client.submit(&changed).await {
        Err(Error::Refused(Refusal::IdempotencyConflict)) => {}
        other => {
            panic!("t45-0 with another concurrency key: want IDEMPOTENCY_CONFLICT, got {other:?}")
        }
    }

    // The store's records, through all three read paths.
    let tasks = all_tasks(&client).await;
    let histories: BTreeMap<u64, AttemptHistory> = stream::iter(tasks.iter().map(|t| t.id))
        .map(|id| {
            let client = client.clone();
            async move { (id, client.attempts(id).await.unwrap()) }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let full: BTreeMap<u64, Task> = stream::iter(tasks.iter().map(|t| t.id))
        .map(|id| {
            let client = client.clone();
            async move { (id, client.queue_task(id).await.unwrap()) }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let expected: Vec<(TaskSpec, u64)> = (0..TASKS)
        .map(|i| (spec(i), submissions[&i].task_id))
        .collect();
    let (figures, mut violations) = check_history(&expected, &tasks, &histories, &full);

    // The killed worker's attempts all ended, some by expiry; no worker's completion is unknown
    // to the store.
    let attempt_of = |task_id: u64, number: u32| {
        tasks
            .iter()
            .find(|t| t.id == task_id)
            .and_then(|t| t.attempts.iter().find(|a| a.number == number))
    };
    let orphans_expired = orphaned
        .iter()
        .filter(|(id, n)| attempt_of(*id, *n).is_some_and(|a| a.outcome == AttemptOutcome::Expired))
        .count();
    if orphans_expired == 0 {
        violations.push(format!(
            "none of {VICTIM}'s attempts active at its death ({orphaned:?}) ended by lease expiry"
        ));
    }
    let mut completed = BTreeSet::new();
    let mut reported = BTreeMap::new();
    for worker in &workers {
        for line in worker.finished() {
            reported.insert(
                (worker.id().to_string(), line.task_id, line.attempt),
                line.outcome.clone(),
            );
            if line.outcome != "completed" {
                continue;
            }
            if !completed.insert((line.task_id, line.attempt)) {
                violations.push(format!(
                    "attempt {}#{} reported completed twice",
                    line.task_id, line.attempt
                ));
            }
            match attempt_of(line.task_id, line.attempt) {
                Some(a) if a.outcome == AttemptOutcome::Succeeded && a.token == line.token => {}
                other => violations.push(format!(
                    "worker {} completed {}#{} (token {:?}), the store has {other:?}",
                    worker.id(),
                    line.task_id,
                    line.attempt,
                    line.token
                )),
            }
        }
    }
    // A success the store recorded for a surviving worker was reported by it: completed, or
    // unreported when the answer to its completion was lost.
    for task in &tasks {
        for a in task.attempts.iter().filter(|a| a.worker != VICTIM) {
            if a.outcome != AttemptOutcome::Succeeded {
                continue;
            }
            let said = reported.get(&(a.worker.clone(), task.id, a.number));
            if !matches!(said.map(String::as_str), Some("completed" | "unreported")) {
                violations.push(format!(
                    "task {} attempt {} succeeded, its worker {} reported {said:?}",
                    task.id, a.number, a.worker
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "violations: {}",
        first(&violations, 10)
    );

    let converged_at = cluster.wait_all_caught_up().await.unwrap();
    let infra_errors: u32 = submissions.values().map(|s| s.infra_errors).sum();
    let replayed = submissions.values().filter(|s| s.replayed).count();
    let tokens: Vec<String> = figures
        .max_token
        .iter()
        .map(|(k, t)| format!("{k}:{t}"))
        .collect();
    let states: Vec<String> = figures
        .states
        .iter()
        .map(|(s, n)| format!("{}={n}", s.as_str()))
        .collect();
    println!(
        "t45: {TASKS} tasks ({} keyed over {KEYS} keys, {} queues) all terminal after {elapsed:.1?} \
         [{}]; {} attempts, {} expired ({orphans_expired} of {} orphaned by SIGKILLed {VICTIM} at \
         {worker_killed_after:.1?}), {} retries; leader {old_leader} SIGKILLed at \
         {leader_killed_after:.1?} with {submitted_at_kill} submitted, node {new_leader} took \
         over; submissions: {infra_errors} infra errors, {replayed} answered as replays, \
         {replays_checked} resubmitted as replays; survivors completed/lost {}; max token per \
         key {}; all 3 nodes applied index {converged_at}",
        figures.keyed,
        QUEUES.len(),
        states.join(" "),
        figures.attempts,
        figures.expired,
        orphaned.len(),
        figures.retries,
        summaries.join(" "),
        tokens.join(" "),
    );
}

/// What the final records add up to.
#[derive(Debug, Default)]
struct Figures {
    keyed: usize,
    states: BTreeMap<TaskState, usize>,
    attempts: usize,
    expired: usize,
    /// Attempts after a task's first.
    retries: usize,
    max_token: BTreeMap<String, u64>,
}

/// One attempt of a keyed task, for the per-key checks.
struct KeyedAttempt<'a> {
    task: u64,
    attempt: &'a Attempt,
}

/// Checks the final records against the submissions (`(spec, receipt task id)`): `tasks` is the
/// listing (summaries: no payload, no result), `histories` every task's `attempts()`, `full`
/// every task as `queue_task()` answers it. Returns the figures and every violation found.
fn check_history(
    expected: &[(TaskSpec, u64)],
    tasks: &[Task],
    histories: &BTreeMap<u64, AttemptHistory>,
    full: &BTreeMap<u64, Task>,
) -> (Figures, Vec<String>) {
    let mut v = Vec::new();
    let mut figures = Figures::default();

    // Every submission exactly once, and nothing else.
    let mut by_key: BTreeMap<&str, Vec<&Task>> = BTreeMap::new();
    for task in tasks {
        by_key
            .entry(task.spec.idempotency_key.as_str())
            .or_default()
            .push(task);
    }
    for (spec, receipt_id) in expected {
        match by_key.get(spec.idempotency_key.as_str()).map(Vec::as_slice) {
            Some([task]) => {
                if task.id != *receipt_id {
                    v.push(format!(
                        "{}: receipt said task {receipt_id}, the store has {}",
                        spec.idempotency_key, task.id
                    ));
                }
                let stored = full.get(&task.id).map(|t| &t.spec);
                if stored != Some(spec) || task.namespace != NAMESPACE {
                    v.push(format!(
                        "{}: submitted {spec:?}, the store has {stored:?} in {:?}",
                        spec.idempotency_key, task.namespace
                    ));
                }
            }
            found => v.push(format!(
                "{}: {} tasks in the store",
                spec.idempotency_key,
                found.map_or(0, <[_]>::len)
            )),
        }
    }
    if tasks.len() != expected.len() {
        v.push(format!(
            "{} tasks in the store for {} submissions",
            tasks.len(),
            expected.len()
        ));
    }

    // Every task ended exactly once; attempts are a consistent history.
    let mut per_key: BTreeMap<&str, Vec<KeyedAttempt>> = BTreeMap::new();
    for task in tasks {
        let id = task.id;
        let keyed = !task.spec.concurrency_key.is_empty();
        *figures.states.entry(task.state).or_default() += 1;
        figures.keyed += usize::from(keyed);
        figures.attempts += task.attempts.len();
        figures.retries += task.attempts.len().saturating_sub(1);
        if !task.state.is_terminal() {
            v.push(format!("task {id} is {}", task.state.as_str()));
        }
        match histories.get(&id) {
            Some(h)
                if h.attempts == task.attempts
                    && h.concurrency_key == task.spec.concurrency_key => {}
            Some(_) => v.push(format!("task {id}: attempts() differs from the listing")),
            None => v.push(format!("task {id}: no attempts() answer")),
        }
        match full.get(&id) {
            Some(t) if t.attempts == task.attempts && t.state == task.state => {}
            Some(_) => v.push(format!("task {id}: queue_task() differs from the listing")),
            None => v.push(format!("task {id}: no queue_task() answer")),
        }
        if task.started_attempts() > task.spec.max_attempts {
            v.push(format!("task {id}: more started attempts than allowed"));
        }
        let last = task.attempts.len();
        for (index, a) in task.attempts.iter().enumerate() {
            let what = format!("task {id} attempt {}", a.number);
            if a.number as usize != index + 1 {
                v.push(format!("{what}: numbered out of order"));
            }
            let is_last = index + 1 == last;
            let final_outcome = match a.outcome {
                AttemptOutcome::Active => {
                    v.push(format!("{what}: still active"));
                    false
                }
                AttemptOutcome::Expired => {
                    figures.expired += 1;
                    if a.ended_at_ms.is_some_and(|end| end < a.lease_until_ms) {
                        v.push(format!("{what}: expired before its lease ran out"));
                    }
                    false
                }
                AttemptOutcome::Failed => false,
                AttemptOutcome::Succeeded | AttemptOutcome::Unknown => {
                    if a.started_at_ms.is_none() {
                        v.push(format!("{what}: {:?} without a start", a.outcome));
                    }
                    true
                }
                AttemptOutcome::Cancelled => true,
            };
            if final_outcome && !is_last {
                v.push(format!("{what}: {:?} is not the last attempt", a.outcome));
            }
            if matches!(
                a.outcome,
                AttemptOutcome::Succeeded | AttemptOutcome::Failed | AttemptOutcome::Unknown
            ) && a.ended_at_ms.is_some_and(|end| end >= a.lease_until_ms)
            {
                v.push(format!("{what}: result recorded after the lease ran out"));
            }
            match a.ended_at_ms {
                Some(end) if end >= a.leased_at_ms => {}
                other => v.push(format!(
                    "{what}: ended at {other:?}, leased at {}",
                    a.leased_at_ms
                )),
            }
            match (keyed, a.token) {
                (true, Some(0)) => v.push(format!("{what}: token 0")),
                (true, Some(_)) => per_key
                    .entry(task.spec.concurrency_key.as_str())
                    .or_default()
                    .push(KeyedAttempt {
                        task: id,
                        attempt: a,
                    }),
                (true, None) => v.push(format!("{what}: keyed attempt without a token")),
                (false, Some(t)) => v.push(format!("{what}: unkeyed attempt with token {t}")),
                (false, None) => {}
            }
        }
        let last_outcome = task.attempts.last().map(|a| a.outcome);
        let consistent = match task.state {
            TaskState::Succeeded => last_outcome == Some(AttemptOutcome::Succeeded),
            TaskState::NeedsReview => matches!(
                last_outcome,
                Some(AttemptOutcome::Unknown | AttemptOutcome::Expired)
            ),
            TaskState::Failed => matches!(
                last_outcome,
                Some(AttemptOutcome::Failed | AttemptOutcome::Expired) | None
            ),
            TaskState::Cancelled => {
                matches!(last_outcome, Some(AttemptOutcome::Cancelled) | None)
            }
            _ => true,
        };
        if !consistent {
            v.push(format!(
                "task {id}: {} but its last attempt is {last_outcome:?}",
                task.state.as_str()
            ));
        }
        if task.state == TaskState::Succeeded {
            let token = task
                .attempts
                .last()
                .and_then(|a| a.token)
                .map_or_else(String::new, |t| t.to_string());
            let want = format!("{}/{token}", task.spec.concurrency_key);
            match full.get(&id).map(|t| &t.result) {
                Some(result) if *result == want.as_bytes() => {}
                other => v.push(format!(
                    "task {id}: result {:?}, want {want:?}",
                    other.map(|r| String::from_utf8_lossy(r).into_owned())
                )),
            }
        }
    }

    // Per key, in lease order (store clock; equal times in token order): tokens are unique and
    // strictly increase, and each attempt is leased only once every earlier one has ended.
    for (key, mut attempts) in per_key {
        attempts.sort_by_key(|k| (k.attempt.leased_at_ms, k.attempt.token));
        let name = |k: &KeyedAttempt| {
            format!(
                "task {} attempt {} (token {:?}, [{}, {:?}])",
                k.task,
                k.attempt.number,
                k.attempt.token,
                k.attempt.leased_at_ms,
                k.attempt.ended_at_ms
            )
        };
        let mut seen = BTreeSet::new();
        for k in &attempts {
            if !seen.insert(k.attempt.token) {
                v.push(format!("key {key:?}: {} repeats a token", name(k)));
            }
        }
        for pair in attempts.windows(2) {
            if pair[1].attempt.token <= pair[0].attempt.token {
                v.push(format!(
                    "key {key:?}: {} leased after {}: token not increasing in lease order",
                    name(&pair[1]),
                    name(&pair[0])
                ));
            }
        }
        let mut busy: Option<(u64, &KeyedAttempt)> = None;
        for k in &attempts {
            if let Some((until, holder)) = busy {
                if k.attempt.leased_at_ms < until {
                    v.push(format!(
                        "key {key:?}: {} overlaps {}",
                        name(k),
                        name(holder)
                    ));
                }
            }
            let end = k.attempt.ended_at_ms.unwrap_or(u64::MAX);
            if busy.is_none_or(|(until, _)| end > until) {
                busy = Some((end, k));
            }
        }
        let max = attempts.iter().filter_map(|k| k.attempt.token).max();
        figures.max_token.insert(key.to_string(), max.unwrap_or(0));
    }
    (figures, v)
}

// ---------------------------------------------------------------- the checker itself

fn attempt(
    number: u32,
    token: Option<u64>,
    leased: u64,
    ended: u64,
    outcome: AttemptOutcome,
) -> Attempt {
    Attempt {
        number,
        worker: "w".into(),
        token,
        leased_at_ms: leased,
        // A result is recorded before the lease runs out; an expiry when (or after) it does.
        lease_until_ms: if outcome == AttemptOutcome::Expired {
            ended
        } else {
            ended + 100
        },
        started_at_ms: Some(leased),
        ended_at_ms: Some(ended),
        outcome,
        note: String::new(),
    }
}

fn finished_task(i: usize, id: u64, attempts: Vec<Attempt>) -> (Task, TaskSpec) {
    let spec = spec(i);
    let task = Task {
        id,
        namespace: NAMESPACE.into(),
        spec: spec.clone(),
        state: TaskState::Succeeded,
        attempts,
        submitted_at_ms: 0,
        deadline_ms: 600_000,
        retry_at_ms: None,
        result: Vec::new(),
        last_error: String::new(),
    };
    (task, spec)
}

/// Runs the checker on tasks 0 and 22 (both on `key-00`) with the given attempts.
fn check_two(a: Vec<Attempt>, b: Vec<Attempt>) -> Vec<String> {
    let (ta, sa) = finished_task(0, 1, a);
    let (tb, sb) = finished_task(22, 2, b);
    assert_eq!(ta.spec.concurrency_key, tb.spec.concurrency_key);
    let mut histories = BTreeMap::new();
    let mut full = BTreeMap::new();
    for t in [&ta, &tb] {
        histories.insert(
            t.id,
            AttemptHistory {
                task_id: t.id,
                concurrency_key: t.spec.concurrency_key.clone(),
                attempts: t.attempts.clone(),
                revision: 1,
            },
        );
        let token = t.attempts.last().and_then(|a| a.token).unwrap_or(0);
        let mut stored = t.clone();
        stored.result = format!("{}/{token}", t.spec.concurrency_key).into_bytes();
        full.insert(t.id, stored);
    }
    check_history(&[(sa, 1), (sb, 2)], &[ta, tb], &histories, &full).1
}

#[test]
fn t45_checker_accepts_a_clean_history() {
    use AttemptOutcome::*;
    let violations = check_two(
        vec![
            attempt(1, Some(1), 10, 20, Expired),
            attempt(2, Some(3), 30, 40, Succeeded),
        ],
        vec![attempt(1, Some(2), 20, 30, Succeeded)],
    );
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn t45_checker_finds_overlaps_token_order_and_duplicates() {
    use AttemptOutcome::*;
    let overlap = check_two(
        vec![attempt(1, Some(1), 10, 25, Succeeded)],
        vec![attempt(1, Some(2), 20, 30, Succeeded)],
    );
    assert!(
        overlap.iter().any(|v| v.contains("overlaps")),
        "{overlap:?}"
    );
    // One long attempt overlapping two later ones that do not overlap each other.
    let long = check_two(
        vec![attempt(1, Some(1), 10, 50, Expired)],
        vec![
            attempt(1, Some(2), 20, 25, Failed),
            attempt(2, Some(3), 30, 40, Succeeded),
        ],
    );
    let overlaps = long.iter().filter(|v| v.contains("overlaps")).count();
    assert_eq!(overlaps, 2, "{long:?}");
    let order = check_two(
        vec![attempt(1, Some(2), 10, 20, Succeeded)],
        vec![attempt(1, Some(1), 20, 30, Succeeded)],
    );
    assert!(
        order.iter().any(|v| v.contains("not increasing")),
        "{order:?}"
    );
    let same = check_two(
        vec![attempt(1, Some(1), 10, 20, Succeeded)],
        vec![attempt(1, Some(1), 20, 30, Succeeded)],
    );
    assert!(same.iter().any(|v| v.contains("repeats")), "{same:?}");
    let twice = check_two(
        vec![
            attempt(1, Some(1), 10, 20, Succeeded),
            attempt(2, Some(3), 30, 40, Succeeded),
        ],
        vec![attempt(1, Some(2), 20, 30, Succeeded)],
    );
    assert!(
        twice.iter().any(|v| v.contains("not the last")),
        "{twice:?}"
    );
    let tokenless = check_two(
        vec![attempt(1, None, 10, 20, Succeeded)],
        vec![attempt(1, Some(2), 20, 30, Succeeded)],
    );
    assert!(
        tokenless.iter().any(|v| v.contains("without a token")),
        "{tokenless:?}"
    );
}
