//! Keyed task-queue workload: a submitter keeps a few tasks on two concurrency keys waiting;
//! workers lease one at a time, start the attempt, write the key's fenced sink with the permit
//! token, and end the attempt: mostly complete, sometimes fail (retryable or not) or report its
//! outcome unknown. Now and then a worker stalls past its lease (before its start, or between
//! its start and its write), so the permit moves on with a higher token and the stale worker must
//! be refused; the submitter sends an acknowledged submission again, with the same content or
//! another concurrency key, and cancels a task: one of its latest, or the one a worker leased
//! last (waiting, retrying or leased: cancelled, a leased attempt with it; running or ended:
//! refused).
//!
//! Checked: every keyed lease carries a non-zero permit token (an unkeyed one none), one
//! acknowledged permit per key and token, no permit granted before the store-clock deadline of
//! an earlier one not ended (completed, failed, reported unknown or cancelled; each lease's
//! answer carries its deadline), tokens increasing per key in real time, no start or end
//! acknowledged for an attempt whose permit had moved on, no lease or start of a task after its
//! cancel was answered, the fenced sink's rules, a submission sent again answered with the
//! original task or `IDEMPOTENCY_CONFLICT`, and after recovery: every acknowledged submission,
//! lease, attempt end and cancel is there (the attempt's outcome, and the task's state where it
//! is final), no token appears twice on a key, and at most one attempt per key is active.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_rpc::Client;
use baton_statemachine::queue::{Assignment, SubmitReceipt, Task, TaskFilter, TaskSpec, TaskState};
use rand::rngs::StdRng;
use rand::Rng;

use super::check::{
    exclusive_holds, increasing_fences, no_stale_holder, sink, unexplained_lease_lost,
    unique_grants, Grant, Use, Violation,
};
use super::history::{AttemptEnd, AttemptRecord, Input, LeasedTask, Op, Output, Recorder};

/// The queue every task goes to.
pub const QUEUE: &str = "robust-queue";
/// Its namespace.
pub const NAMESPACE: &str = "robust";
/// The concurrency keys tasks carry.
pub const KEYS: [&str; 2] = ["key-0", "key-1"];
/// Lease (and permit) TTL.
pub const LEASE_TTL_MS: i64 = 3_000;
/// How long a stalling worker sleeps (past its lease).
const STALL: Duration = Duration::from_millis(3_600);
/// Tasks the submitter keeps waiting at most.
const BACKLOG: u64 = 6;
/// How often a stalled submitter counts the unfinished tasks itself.
const RECOUNT_EVERY: Duration = Duration::from_secs(1);
/// Prefix of the sink resources this workload writes.
pub const SINK_PREFIX: &str = "sink-queue-";

/// Counters the submitter paces itself by.
#[derive(Debug, Default)]
pub struct Pace {
    submitted: AtomicU64,
    completed: AtomicU64,
    /// The task a worker leased last, with its concurrency key: the submitter cancels it now and
    /// then, so that cancels also land between a lease and its start (a permit to free).
    leased: Mutex<Option<(u64, String)>>,
}

/// Whether `op` is an acknowledged lease of a task on concurrency key `key`.
pub fn leased_on(op: &Op, key: &str) -> bool {
    matches!(
        (&op.input, op.ok()),
        (Input::Lease { .. }, Some(Output::Leased(assignments)))
            if assignments.iter().any(|assignment| assignment.key == key)
    )
}

/// Creates the queue and registers `workers`, retrying infrastructure failures (set-up, not
/// part of the checked history).
pub async fn setup(client: &Client, workers: &[String]) -> anyhow::Result<()> {
    for attempt in 0.. {
        let result = async {
            client.create_queue(QUEUE, NAMESPACE).await?;
            for worker in workers {
                client.register_worker(worker, true).await?;
            }
            Ok::<(), baton_rpc::Error>(())
        }
        .await;
        match result {
            Ok(()) => return Ok(()),
            Err(error) if error.is_infrastructure() && attempt < 5 => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(error) => return Err(error.into()),
        }
    }
    unreachable!("the loop returns")
}

fn spec(idempotency_key: &str, concurrency_key: &str) -> TaskSpec {
    TaskSpec {
        queue: QUEUE.into(),
        idempotency_key: idempotency_key.into(),
        handler: "robustness".into(),
        handler_version: "1".into(),
        payload_version: "1".into(),
        payload: idempotency_key.as_bytes().to_vec(),
        concurrency_key: concurrency_key.into(),
        business_key: String::new(),
        max_attempts: 20,
        ttl_ms: 60 * 60 * 1000,
    }
}

/// The submitter: keeps up to `BACKLOG` tasks waiting, until `stop`.
pub async fn submit(
    client: Client,
    name: String,
    rec: Recorder,
    pace: Arc<Pace>,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    let mut n = 0;
    // Acknowledged submissions: sent again now and then, with the same content (a replay: the
    // same task) or another concurrency key (a conflict: `IDEMPOTENCY_CONFLICT`).
    let mut acked: Vec<(String, &'static str, u64)> = Vec::new();
    let mut recounted: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        if !acked.is_empty() && rng.random_bool(0.05) {
            // Cancel one of the latest submissions: most are still waiting or leased (then the
            // attempt is cancelled and its permit freed), some running or ended (refused).
            let leased = pace.leased.lock().map(|l| l.clone()).unwrap_or_default();
            let (task, key) = match leased {
                Some((task, key)) if rng.random_bool(0.5) => (task, key),
                _ => {
                    let recent = acked.len().saturating_sub(4)..acked.len();
                    let (_, key, task) = &acked[rng.random_range(recent)];
                    (*task, key.to_string())
                }
            };
            cancel(&rec, &client, &name, task, &key).await;
            continue;
        }
        let again = !acked.is_empty() && rng.random_bool(0.15);
        let (idempotency_key, key) = if again {
            let (idempotency_key, key, _) = acked[rng.random_range(0..acked.len())].clone();
            let key = if rng.random_bool(0.5) {
                key
            } else {
                KEYS.into_iter().find(|other| *other != key).unwrap_or(key)
            };
            (idempotency_key, key)
        } else {
            let backlog = pace
                .submitted
                .load(Ordering::Relaxed)
                .saturating_sub(pace.completed.load(Ordering::Relaxed));
            if backlog >= BACKLOG {
                if recounted.is_none_or(|at| at.elapsed() >= RECOUNT_EVERY) {
                    recounted = Some(Instant::now());
                    recount(&client, &pace).await;
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
                continue;
            }
            n += 1;
            (format!("{name}-{n}"), KEYS[rng.random_range(0..KEYS.len())])
        };
        let input = Input::Submit {
            idempotency_key: idempotency_key.clone(),
            concurrency_key: key.into(),
        };
        let submitted = rec
            .record(
                &name,
                input,
                client.submit(&spec(&idempotency_key, key)),
                submitted_output,
            )
            .await;
        if let (Ok(receipt), false) = (submitted, again) {
            pace.submitted.fetch_add(1, Ordering::Relaxed);
            acked.push((idempotency_key, key, receipt.task.id));
        }
    }
}

/// Cancels a task, recorded with the attempts its answer shows.
async fn cancel(rec: &Recorder, client: &Client, name: &str, task: u64, key: &str) {
    let input = Input::CancelTask {
        task,
        concurrency_key: key.into(),
    };
    let _ = rec
        .record(name, input, client.cancel_task(task), attempt_list)
        .await;
}

/// A task's state and attempts as recorded.
fn attempt_list(task: &Task) -> Output {
    Output::AttemptList {
        state: task.state.as_str().to_string(),
        attempts: task
            .attempts
            .iter()
            .map(|a| AttemptRecord {
                number: a.number,
                worker: a.worker.clone(),
                token: a.token,
                outcome: a.outcome.as_str().to_string(),
            })
            .collect(),
    }
}

/// Counts as finished every acknowledged submission no longer waiting, leased or running. The
/// workers count only the completions they hear of; a task that failed or needs review, or whose
/// completion's answer was lost, finishes unheard, and without this the submitter would stop for
/// good after [`BACKLOG`] of them (every lease then empty). Not recorded: pacing only.
async fn recount(client: &Client, pace: &Pace) {
    // One listing (pages by task id, so each task is seen once even as it changes state).
    let filter = TaskFilter {
        queue: Some(QUEUE.to_string()),
        state: None,
        concurrency_key: None,
    };
    let Ok(tasks) = client.queue_tasks(&filter).await else {
        return;
    };
    let open = tasks
        .iter()
        .filter(|task| {
            matches!(
                task.state,
                TaskState::Waiting | TaskState::RetryWait | TaskState::Leased | TaskState::Running
            )
        })
        .count() as u64;
    let submitted = pace.submitted.load(Ordering::Relaxed);
    pace.completed
        .fetch_max(submitted.saturating_sub(open), Ordering::Relaxed);
}

fn submitted_output(receipt: &SubmitReceipt) -> Output {
    Output::Submitted {
        task: receipt.task.id,
        replayed: receipt.replayed,
    }
}

/// Submissions under one idempotency key (contract §5: same key and content -> the original
/// receipt; same key, other content, a different resource key included -> `IDEMPOTENCY_CONFLICT`).
/// The first submission of each key set its content (the workload sends a key again only once
/// its first submission was acknowledged): every acknowledged one with that content names the
/// same task, at most one of them is not a replay, none is refused; one with other content is
/// never acknowledged and only refused `IDEMPOTENCY_CONFLICT`.
fn idempotent_submits(history: &[Op]) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<(&str, &Op)>> = BTreeMap::new();
    for op in history {
        if let Input::Submit {
            idempotency_key,
            concurrency_key,
        } = &op.input
        {
            by_key
                .entry(idempotency_key)
                .or_default()
                .push((concurrency_key, op));
        }
    }
    let mut violations = Vec::new();
    for (key, submits) in by_key {
        let Some(&(content, first)) = submits.first() else {
            continue;
        };
        let mut task_of_key: Option<(u64, usize)> = None;
        let mut originals = Vec::new();
        for (concurrency_key, op) in submits {
            let same = concurrency_key == content;
            match (op.ok(), op.refused()) {
                (Some(Output::Submitted { task, replayed }), _) if same => {
                    match task_of_key {
                        Some((earlier, at)) if earlier != *task => {
                            violations.push(Violation::new(
                                "idempotent-submit",
                                key,
                                format!("the same submission named task {earlier}, then task {task}"),
                                vec![at, op.index],
                            ));
                        }
                        _ => task_of_key = Some((*task, op.index)),
                    }
                    if !replayed {
                        originals.push(op.index);
                    }
                }
                (Some(_), _) => violations.push(Violation::new(
                    "idempotent-submit",
                    key,
                    format!(
                        "a submission with concurrency key {concurrency_key:?} was accepted under \
                         a key first submitted with {content:?}"
                    ),
                    vec![first.index, op.index],
                )),
                (None, Some(code)) if same || code != "IDEMPOTENCY_CONFLICT" => {
                    violations.push(Violation::new(
                        "idempotent-submit",
                        key,
                        format!("a submission with concurrency key {concurrency_key:?} was refused {code}"),
                        vec![first.index, op.index],
                    ))
                }
                _ => {}
            }
        }
        if originals.len() > 1 {
            violations.push(Violation::new(
                "idempotent-submit",
                key,
                "more than one submission of this key was answered as the original (not replayed)",
                originals,
            ));
        }
    }
    violations
}

fn leased_output(assignments: &[Assignment]) -> Output {
    Output::Leased(
        assignments
            .iter()
            .map(|a| LeasedTask {
                task: a.task_id,
                attempt: a.attempt,
                key: a.concurrency_key.clone(),
                token: a.token,
                // 0 would be no deadline at all: judged on the client clock, not vacuously.
                until_ms: (a.lease_until_ms > 0).then_some(a.lease_until_ms),
            })
            .collect(),
    )
}

/// One worker: lease, start, write the sink with the token, end the attempt (complete, fail or
/// report unknown), until `stop`.
pub async fn work(
    client: Client,
    name: String,
    rec: Recorder,
    pace: Arc<Pace>,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    let queues = vec![QUEUE.to_string()];
    while !stop.load(Ordering::Relaxed) {
        let input = Input::Lease {
            worker: name.clone(),
        };
        let leased = rec
            .record(
                &name,
                input,
                client.lease(&name, &queues, 1, LEASE_TTL_MS, Duration::from_millis(300)),
                |assignments: &Vec<Assignment>| leased_output(assignments),
            )
            .await;
        let Ok(assignments) = leased else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        for assignment in assignments {
            let Some(token) = assignment.token else {
                continue;
            };
            if let Ok(mut leased) = pace.leased.lock() {
                *leased = Some((assignment.task_id, assignment.concurrency_key.clone()));
            }
            let stall = rng.random_range(0..100);
            if stall < 4 {
                tokio::time::sleep(STALL).await;
            }
            let input = Input::StartAttempt {
                task: assignment.task_id,
                attempt: assignment.attempt,
                worker: name.clone(),
                concurrency_key: assignment.concurrency_key.clone(),
                token,
            };
            let started = rec
                .record(
                    &name,
                    input,
                    client.start_attempt(assignment.task_id, assignment.attempt, &name),
                    |task: &Task| Output::TaskState(task.state.as_str().to_string()),
                )
                .await;
            if started.is_err() {
                continue;
            }
            if (4..8).contains(&stall) {
                tokio::time::sleep(STALL).await;
            }
            let value = format!("task-{}/{}", assignment.task_id, assignment.attempt);
            let sink = format!("{SINK_PREFIX}{}", assignment.concurrency_key);
            if !super::effect::write_sink(&rec, &client, &name, &sink, token, &value).await {
                continue;
            }
            let end = match rng.random_range(0..100) {
                0..6 => AttemptEnd::Fail { retryable: true },
                6..9 => AttemptEnd::Fail { retryable: false },
                9..12 => AttemptEnd::Unknown,
                _ => AttemptEnd::Complete,
            };
            let input = Input::EndAttempt {
                task: assignment.task_id,
                attempt: assignment.attempt,
                worker: name.clone(),
                concurrency_key: assignment.concurrency_key.clone(),
                token,
                end,
            };
            let (task, attempt) = (assignment.task_id, assignment.attempt);
            let ended = rec
                .record(
                    &name,
                    input,
                    async {
                        match end {
                            AttemptEnd::Complete => {
                                client
                                    .complete_attempt(task, attempt, &name, value.as_bytes())
                                    .await
                            }
                            AttemptEnd::Fail { retryable } => {
                                client
                                    .fail_attempt(task, attempt, &name, "robustness", retryable)
                                    .await
                            }
                            AttemptEnd::Unknown => {
                                client
                                    .report_unknown(task, attempt, &name, "robustness")
                                    .await
                            }
                        }
                    },
                    |task: &Task| Output::TaskState(task.state.as_str().to_string()),
                )
                .await;
            if ended.is_ok() && end == AttemptEnd::Complete {
                pace.completed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Reads a queue task with its attempts, recorded.
pub async fn read_task(rec: &Recorder, client: &Client, name: &str, task: u64) {
    let _ = rec
        .record(
            name,
            Input::Attempts { task },
            client.queue_task(task),
            attempt_list,
        )
        .await;
}

/// The ids of every task whose submission was acknowledged or that a lease named.
pub fn task_ids(history: &[Op]) -> Vec<u64> {
    let mut ids = std::collections::BTreeSet::new();
    for op in history {
        match op.ok() {
            Some(Output::Submitted { task, .. }) => {
                ids.insert(*task);
            }
            Some(Output::Leased(assignments)) => ids.extend(assignments.iter().map(|a| a.task)),
            _ => {}
        }
    }
    ids.into_iter().collect()
}

/// Every queue checker. `final_from`: when the reads after recovery began (µs).
pub fn check(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut grants = Vec::new();
    let mut uses = Vec::new();
    let mut ends = Vec::new();
    let mut violations = idempotent_submits(history);
    violations.extend(cancelled_stays_cancelled(history));
    let permits = permits_by_task(history);
    for op in history {
        // Every call that may have ended a permit (a refusal ended nothing).
        match (&op.input, op.refused(), op.ok()) {
            (_, Some(_), _) => {}
            (
                Input::EndAttempt {
                    concurrency_key,
                    token,
                    ..
                },
                None,
                _,
            ) => ends.push(Use {
                key: concurrency_key.clone(),
                fence: *token,
                op: op.index,
            }),
            // An answered cancel shows the attempt it cancelled (a leased one).
            (
                Input::CancelTask {
                    concurrency_key, ..
                },
                None,
                Some(Output::AttemptList { attempts, .. }),
            ) => ends.extend(
                attempts
                    .iter()
                    .filter(|a| a.outcome == "CANCELLED")
                    .filter_map(|a| a.token)
                    .map(|fence| Use {
                        key: concurrency_key.clone(),
                        fence,
                        op: op.index,
                    }),
            ),
            // An unanswered one may have cancelled any attempt of the task.
            (Input::CancelTask { task, .. }, None, _) => ends.extend(
                permits
                    .get(task)
                    .into_iter()
                    .flatten()
                    .map(|(key, fence)| Use {
                        key: key.clone(),
                        fence: *fence,
                        op: op.index,
                    }),
            ),
            _ => {}
        }
        match (&op.input, op.ok()) {
            (Input::Lease { .. }, Some(Output::Leased(assignments))) => {
                for LeasedTask {
                    task,
                    key,
                    token,
                    until_ms,
                    ..
                } in assignments
                {
                    // A keyed task comes with its permit, a non-zero token; an unkeyed one with
                    // none (seed 004 §2).
                    if key.is_empty() != token.is_none() || *token == Some(0) {
                        violations.push(Violation::new(
                            "permit-token",
                            key,
                            format!("task {task} (key {key:?}) was leased with token {token:?}"),
                            vec![op.index],
                        ));
                    }
                    if let Some(token) = token {
                        grants.push(Grant {
                            key: key.clone(),
                            fence: *token,
                            op: op.index,
                            // Not renewed by this workload: the lease's own deadline is its end.
                            until_ms: *until_ms,
                            renewed_until_ms: *until_ms,
                        });
                    }
                }
            }
            (
                Input::StartAttempt {
                    concurrency_key,
                    token,
                    ..
                },
                Some(_),
            )
            | (
                Input::EndAttempt {
                    concurrency_key,
                    token,
                    ..
                },
                Some(_),
            ) => uses.push(Use {
                key: concurrency_key.clone(),
                fence: *token,
                op: op.index,
            }),
            _ => {}
        }
    }
    violations.extend(unique_grants("permit", &grants, history));
    violations.extend(exclusive_holds(
        "permit",
        &grants,
        &ends,
        LEASE_TTL_MS,
        history,
    ));
    violations.extend(increasing_fences("permit", &grants, history));
    violations.extend(no_stale_holder("start/end", &grants, &uses, history));
    violations.extend(unexplained_lease_lost(
        "a start or end of an attempt",
        &grants,
        &[],
        &holder_refusals(history),
        LEASE_TTL_MS,
        |op| cancel_sent_before(history, op),
        history,
    ));
    violations.extend(sink(history, final_from, |resource| {
        resource.starts_with(SINK_PREFIX)
    }));
    violations.extend(durable(history, final_from));
    violations
}

/// What the reads after recovery must show.
fn durable(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut finals: BTreeMap<u64, &Op> = BTreeMap::new();
    for op in history.iter().filter(|op| op.call >= final_from) {
        if let Input::Attempts { task } = op.input {
            finals.insert(task, op);
        }
    }
    let mut violations = Vec::new();
    let attempts_of = |task: u64| match finals.get(&task).and_then(|op| op.ok()) {
        Some(Output::AttemptList { state, attempts }) => Some((state.clone(), attempts.clone())),
        _ => None,
    };
    let final_index = |task: u64| finals.get(&task).map(|op| op.index);
    for op in history {
        match (&op.input, op.ok()) {
            (
                Input::Submit {
                    idempotency_key, ..
                },
                Some(Output::Submitted { task, .. }),
            ) if attempts_of(*task).is_none() => {
                let mut ops = vec![op.index];
                ops.extend(final_index(*task));
                violations.push(Violation::new(
                    "lost-ack",
                    idempotency_key,
                    format!("task {task} was submitted; after recovery it cannot be read"),
                    ops,
                ));
            }
            (Input::Lease { .. }, Some(Output::Leased(assignments))) => {
                for LeasedTask {
                    task,
                    attempt,
                    key,
                    token,
                    ..
                } in assignments
                {
                    let found = attempts_of(*task).is_some_and(|(_, attempts)| {
                        attempts
                            .iter()
                            .any(|a| a.number == *attempt && a.token == *token)
                    });
                    if !found {
                        let mut ops = vec![op.index];
                        ops.extend(final_index(*task));
                        violations.push(Violation::new(
                            "lost-ack",
                            key,
                            format!(
                                "task {task} attempt {attempt} was leased with token {token:?}; after recovery that attempt is not recorded"
                            ),
                            ops,
                        ));
                    }
                }
            }
            (
                Input::EndAttempt {
                    task,
                    attempt,
                    concurrency_key,
                    end,
                    ..
                },
                Some(_),
            ) => {
                let kept = attempts_of(*task).is_some_and(|(state, attempts)| {
                    end.final_state()
                        .is_none_or(|final_state| state == final_state)
                        && attempts
                            .iter()
                            .any(|a| a.number == *attempt && a.outcome == end.outcome())
                });
                if !kept {
                    let mut ops = vec![op.index];
                    ops.extend(final_index(*task));
                    let state = end
                        .final_state()
                        .map_or(String::new(), |s| format!(" and task {s}"));
                    violations.push(Violation::new(
                        "lost-ack",
                        concurrency_key,
                        format!(
                            "task {task} attempt {attempt} ended {}{state}; after recovery it is not recorded so",
                            end.outcome()
                        ),
                        ops,
                    ));
                }
            }
            (
                Input::CancelTask {
                    task,
                    concurrency_key,
                },
                Some(_),
            ) if attempts_of(*task).is_none_or(|(state, _)| state != "CANCELLED") => {
                let mut ops = vec![op.index];
                ops.extend(final_index(*task));
                violations.push(Violation::new(
                    "lost-ack",
                    concurrency_key,
                    format!("task {task} was cancelled; after recovery it is not CANCELLED"),
                    ops,
                ));
            }
            _ => {}
        }
    }
    // The final state itself: no token twice on a key, at most one active attempt per key.
    let mut tokens: BTreeMap<(String, u64), Vec<usize>> = BTreeMap::new();
    let mut active: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (task, op) in &finals {
        let Some(Output::AttemptList { attempts, .. }) = op.ok() else {
            continue;
        };
        let key = key_of_task(history, *task).unwrap_or_default();
        for attempt in attempts {
            if let Some(token) = attempt.token {
                tokens
                    .entry((key.clone(), token))
                    .or_default()
                    .push(op.index);
            }
            if attempt.outcome == "ACTIVE" {
                active.entry(key.clone()).or_default().push(op.index);
            }
        }
    }
    for ((key, token), ops) in tokens {
        if ops.len() > 1 {
            violations.push(Violation::new(
                "unique-grant",
                &key,
                format!(
                    "after recovery token {token} belongs to {} attempts",
                    ops.len()
                ),
                ops,
            ));
        }
    }
    for (key, ops) in active {
        if ops.len() > 1 {
            violations.push(Violation::new(
                "one-active-attempt",
                &key,
                format!(
                    "after recovery {} attempts on this key are active",
                    ops.len()
                ),
                ops,
            ));
        }
    }
    violations
}

/// The refused starts and ends of attempts, as (concurrency key, token) uses.
fn holder_refusals(history: &[Op]) -> Vec<Use> {
    history
        .iter()
        .filter(|op| op.refused().is_some())
        .filter_map(|op| match &op.input {
            Input::StartAttempt {
                concurrency_key,
                token,
                ..
            }
            | Input::EndAttempt {
                concurrency_key,
                token,
                ..
            } => Some(Use {
                key: concurrency_key.clone(),
                fence: *token,
                op: op.index,
            }),
            _ => None,
        })
        .collect()
}

/// Whether `op` is a start and a cancel of its task, not refused, was sent before it returned:
/// it may have cancelled the leased attempt. (An end follows an acknowledged start, and a
/// running task is not cancelled: no cancel explains a refused end.)
fn cancel_sent_before(history: &[Op], op: &Op) -> bool {
    let Input::StartAttempt { task, .. } = &op.input else {
        return false;
    };
    history.iter().any(|other| {
        matches!(&other.input, Input::CancelTask { task: cancelled, .. } if cancelled == task)
            && other.refused().is_none()
            && op.ret.is_none_or(|ret| other.call < ret)
    })
}

/// Every permit a lease granted, by task: `(key, token)`.
fn permits_by_task(history: &[Op]) -> BTreeMap<u64, Vec<(String, u64)>> {
    let mut permits: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
    for op in history {
        if let Some(Output::Leased(assignments)) = op.ok() {
            for a in assignments {
                if let Some(token) = a.token {
                    permits
                        .entry(a.task)
                        .or_default()
                        .push((a.key.clone(), token));
                }
            }
        }
    }
    permits
}

/// A cancelled task is done for good (contract §5): once a cancel was answered, no lease that
/// was invoked after that answer names the task, and no start of one of its attempts invoked
/// after it is acknowledged.
fn cancelled_stays_cancelled(history: &[Op]) -> Vec<Violation> {
    let mut cancelled: BTreeMap<u64, &Op> = BTreeMap::new();
    for op in history {
        if let (Input::CancelTask { task, .. }, Some(_)) = (&op.input, op.ok()) {
            let earliest = cancelled.entry(*task).or_insert(op);
            if op.ret < earliest.ret {
                *earliest = op;
            }
        }
    }
    let mut violations = Vec::new();
    for op in history {
        let named: Vec<u64> = match (&op.input, op.ok()) {
            (Input::Lease { .. }, Some(Output::Leased(assignments))) => {
                assignments.iter().map(|a| a.task).collect()
            }
            (Input::StartAttempt { task, .. }, Some(_)) => vec![*task],
            _ => continue,
        };
        for task in named {
            let Some(cancel) = cancelled.get(&task) else {
                continue;
            };
            if cancel.precedes(op) {
                violations.push(Violation::new(
                    "cancel-final",
                    &format!("task-{task}"),
                    format!("task {task} was cancelled, and afterwards {}", op.input),
                    vec![cancel.index, op.index],
                ));
            }
        }
    }
    violations
}

/// The concurrency key of a task, from its submission or a lease.
fn key_of_task(history: &[Op], task: u64) -> Option<String> {
    history.iter().find_map(|op| match (&op.input, op.ok()) {
        (
            Input::Submit {
                concurrency_key, ..
            },
            Some(Output::Submitted { task: t, .. }),
        ) if *t == task => Some(concurrency_key.clone()),
        (_, Some(Output::Leased(assignments))) => assignments
            .iter()
            .find(|a| a.task == task)
            .map(|a| a.key.clone()),
        _ => None,
    })
}
