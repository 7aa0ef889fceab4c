//! `baton queue ...`, `baton task ...` and `baton worker run`: the keyed-concurrency task queue.

use std::time::Duration;

use baton_rpc::worker::{Finished, TaskContext, Worker, WorkerSummary};
use baton_rpc::Client;
use baton_statemachine::queue::{Attempt, Task, TaskFilter, TaskSpec, TaskState};
use clap::Subcommand;
use serde_json::{json, Value};

use super::{exit, rfc3339, shutdown_signal, task_command, ttl_ms};

/// `baton queue ...`
#[derive(Subcommand, Debug)]
pub enum QueueCommand {
    /// Create a queue (the same name and namespace again is a no-op).
    Create {
        #[arg(long)]
        name: String,
        /// Queues in one namespace share concurrency keys.
        #[arg(long, default_value = "default")]
        namespace: String,
    },
    /// List every queue (linearizable).
    List {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `baton task ...`
#[derive(Subcommand, Debug)]
pub enum TaskCommand {
    /// Submit a task; prints its id, state and whether this was a replay.
    Submit {
        /// The queue (created with `baton queue create`).
        #[arg(long)]
        queue: String,
        /// The submission's identity: the same key and content again returns the original task.
        #[arg(long)]
        idempotency_key: String,
        /// The handler name a worker dispatches on (`BATON_HANDLER` for `baton worker run`).
        #[arg(long)]
        handler: String,
        /// The payload, a JSON document (anything else is refused before the cluster is reached).
        #[arg(long, value_parser = json_document)]
        payload: String,
        /// The resource key: one active attempt per (namespace, key) across all queues.
        #[arg(long, default_value = "")]
        concurrency_key: String,
        /// Business correlation (no effect on concurrency or deduplication).
        #[arg(long, default_value = "")]
        business_key: String,
        /// Attempts the task may start before it fails (or, after an unknown outcome, needs
        /// review).
        #[arg(long, default_value_t = 3)]
        max_attempts: u32,
        /// Total time the task may take from submission.
        #[arg(long, default_value = "1h", value_parser = super::ttl)]
        ttl: Duration,
        /// The handler's version, carried to the worker unchanged.
        #[arg(long, default_value = "v1")]
        handler_version: String,
        /// The payload's schema version, carried to the worker unchanged.
        #[arg(long, default_value = "v1")]
        payload_version: String,
    },
    /// Show one task (linearizable).
    Get {
        #[arg(long)]
        id: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List tasks (linearizable), optionally filtered.
    List {
        #[arg(long)]
        queue: Option<String>,
        /// WAITING, LEASED, RUNNING, RETRY_WAIT, SUCCEEDED, FAILED, CANCELLED or NEEDS_REVIEW.
        #[arg(long, value_parser = parse_state)]
        state: Option<TaskState>,
        /// Matched byte-exactly.
        #[arg(long)]
        concurrency_key: Option<String>,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a task that has not started.
    Cancel {
        #[arg(long)]
        id: u64,
    },
    /// Show a task's attempts: number, worker, permit token, outcome.
    Attempts {
        #[arg(long)]
        id: u64,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `baton worker ...`
#[derive(Subcommand, Debug)]
pub enum WorkerCommand {
    /// Run a worker: CMD runs once per task, in a process group of its own, with the payload
    /// on its standard input (and in BATON_PAYLOAD when it is text up to 32 KiB), and
    /// BATON_TASK_ID, BATON_ATTEMPT, BATON_QUEUE, BATON_NAMESPACE, BATON_HANDLER, BATON_PAYLOAD_BYTES,
    /// BATON_CONCURRENCY_KEY and BATON_FENCE (the permit token of a keyed task) set, besides
    /// BATON_ENDPOINTS and the TLS and token settings (BATON_TLS_*, BATON_TOKEN) of the worker
    /// itself, so `baton` commands in CMD reach the same cluster.
    /// Exit 0 completes the task with stdout (at most 1 MiB) as its result; another exit code
    /// fails it retryably with the tail of stderr; death by a signal reports its effect unknown.
    /// When an attempt ends (or its lease is lost) its whole process group is killed. Runs until
    /// Ctrl-C / SIGTERM, then drains.
    Run {
        /// The worker identity (its concurrency-key support is fixed for the identity's life).
        #[arg(long)]
        id: String,
        /// A queue to lease from (repeatable; none = every queue).
        #[arg(long = "queue")]
        queues: Vec<String>,
        /// Accept keyed tasks (CMD must fence its writes with BATON_FENCE).
        #[arg(long)]
        concurrency_keys: bool,
        /// How many tasks may run at once.
        #[arg(long, default_value_t = 4)]
        slots: usize,
        /// Lease length of each attempt (renewed about every third of it).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        lease_ttl: Duration,
        /// How long shutdown waits for running tasks.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        drain_timeout: Duration,
        /// The command to run per task, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
}

fn parse_state(name: &str) -> Result<TaskState, String> {
    TaskState::parse(name).ok_or_else(|| {
        "must be one of WAITING, LEASED, RUNNING, RETRY_WAIT, SUCCEEDED, FAILED, CANCELLED, \
         NEEDS_REVIEW"
            .to_string()
    })
}

pub async fn run_queue(command: QueueCommand, client: &Client) -> u8 {
    let result = match command {
        QueueCommand::Create { name, namespace } => client
            .create_queue(&name, &namespace)
            .await
            .map(|q| out!("queue={} namespace={}", q.name, q.namespace)),
        QueueCommand::List { json } => client.queues().await.map(|queues| {
            if json {
                let list: Vec<_> = queues
                    .iter()
                    .map(|q| json!({"name": q.name, "namespace": q.namespace}))
                    .collect();
                out!("{}", Value::Array(list));
            } else {
                out!("{:<32} NAMESPACE", "NAME");
                for q in &queues {
                    out!("{:<32} {}", q.name, q.namespace);
                }
            }
        }),
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}

pub async fn run_task(command: TaskCommand, client: &Client) -> u8 {
    let result = match command {
        TaskCommand::Submit {
            queue,
            idempotency_key,
            handler,
            payload,
            concurrency_key,
            business_key,
            max_attempts,
            ttl,
            handler_version,
            payload_version,
        } => {
            let spec = TaskSpec {
                queue,
                idempotency_key,
                handler,
                handler_version,
                payload_version,
                payload: payload.into_bytes(),
                concurrency_key,
                business_key,
                max_attempts,
                ttl_ms: ttl_ms(ttl),
            };
            client.submit(&spec).await.map(|receipt| {
                out!(
                    "task={} state={} replayed={}",
                    receipt.task.id,
                    receipt.task.state.as_str(),
                    receipt.replayed
                )
            })
        }
        TaskCommand::Get { id, json } => client.queue_task(id).await.map(|task| {
            if json {
                out!("{}", task_json(&task, true));
            } else {
                print_task(&task);
            }
        }),
        TaskCommand::List {
            queue,
            state,
            concurrency_key,
            json,
        } => {
            let filter = TaskFilter {
                queue,
                state,
                concurrency_key,
            };
            client.queue_tasks(&filter).await.map(|tasks| {
                if json {
                    let list = tasks.iter().map(|t| task_json(t, false)).collect();
                    out!("{}", Value::Array(list));
                } else {
                    print_tasks(&tasks);
                }
            })
        }
        TaskCommand::Cancel { id } => client
            .cancel_task(id)
            .await
            .map(|task| out!("task={} state={}", task.id, task.state.as_str())),
        TaskCommand::Attempts { id, json } => client.attempts(id).await.map(|history| {
            if json {
                let list = history.attempts.iter().map(attempt_json).collect();
                out!("{}", Value::Array(list));
            } else {
                print_attempts(&history.attempts);
            }
        }),
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}

fn attempt_json(a: &Attempt) -> Value {
    json!({
        "number": a.number,
        "worker": a.worker,
        "token": a.token,
        "outcome": a.outcome.as_str(),
        "leased_at_ms": a.leased_at_ms,
        "lease_until_ms": a.lease_until_ms,
        "started_at_ms": a.started_at_ms,
        "ended_at_ms": a.ended_at_ms,
        "note": a.note,
    })
}

fn task_json(t: &Task, full: bool) -> Value {
    let mut value = json!({
        "id": t.id,
        "queue": t.spec.queue,
        "namespace": t.namespace,
        "state": t.state.as_str(),
        "idempotency_key": t.spec.idempotency_key,
        "handler": t.spec.handler,
        "handler_version": t.spec.handler_version,
        "payload_version": t.spec.payload_version,
        "concurrency_key": (!t.spec.concurrency_key.is_empty()).then_some(&t.spec.concurrency_key),
        "business_key": (!t.spec.business_key.is_empty()).then_some(&t.spec.business_key),
        "max_attempts": t.spec.max_attempts,
        "attempts": t.attempts.len(),
        "started_attempts": t.started_attempts(),
        "submitted_at_ms": t.submitted_at_ms,
        "deadline_ms": t.deadline_ms,
        "retry_at_ms": t.retry_at_ms,
        "last_error": t.last_error,
    });
    if full {
        // As they were submitted and reported: text, not parsed (a result `42\n` is not the
        // number 42, and a parse reorders keys and rounds large numbers).
        super::put_bytes(&mut value, "payload", &t.spec.payload);
        if t.state == TaskState::Succeeded {
            super::put_bytes(&mut value, "result", &t.result);
        } else {
            value["result"] = Value::Null;
        }
        value["attempts"] = Value::Array(t.attempts.iter().map(attempt_json).collect());
    }
    value
}

fn or_dash(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}

fn print_task(t: &Task) {
    out!("task={}", t.id);
    out!("state={}", t.state.as_str());
    out!("queue={} namespace={}", t.spec.queue, t.namespace);
    out!(
        "handler={} handler_version={} payload_version={}",
        t.spec.handler,
        or_dash(&t.spec.handler_version),
        or_dash(&t.spec.payload_version)
    );
    out!("idempotency_key={}", t.spec.idempotency_key);
    out!("concurrency_key={}", or_dash(&t.spec.concurrency_key));
    out!("business_key={}", or_dash(&t.spec.business_key));
    out!(
        "attempts={} started={} max_attempts={}",
        t.attempts.len(),
        t.started_attempts(),
        t.spec.max_attempts
    );
    out!(
        "submitted={} deadline={}",
        rfc3339(t.submitted_at_ms),
        rfc3339(t.deadline_ms)
    );
    if let Some(at) = t.retry_at_ms {
        out!("retry_at={}", rfc3339(at));
    }
    out!("{}", super::bytes_field("payload", &t.spec.payload));
    if t.state == TaskState::Succeeded {
        out!("{}", super::bytes_field("result", &t.result));
    }
    if !t.last_error.is_empty() {
        out!("last_error={}", t.last_error);
    }
}

fn print_tasks(tasks: &[Task]) {
    out!(
        "{:>6} {:<12} {:<20} {:<24} {:>8} HANDLER",
        "ID",
        "STATE",
        "QUEUE",
        "CONCURRENCY_KEY",
        "ATTEMPTS"
    );
    for t in tasks {
        out!(
            "{:>6} {:<12} {:<20} {:<24} {:>8} {}",
            t.id,
            t.state.as_str(),
            t.spec.queue,
            or_dash(&t.spec.concurrency_key),
            format!("{}/{}", t.started_attempts(), t.spec.max_attempts),
            t.spec.handler
        );
    }
}

fn print_attempts(attempts: &[Attempt]) {
    out!(
        "{:>3} {:<24} {:>20} {:<10} {:<26} NOTE",
        "#",
        "WORKER",
        "TOKEN",
        "OUTCOME",
        "LEASED"
    );
    for a in attempts {
        out!(
            "{:>3} {:<24} {:>20} {:<10} {:<26} {}",
            a.number,
            a.worker,
            a.token.map_or_else(|| "-".to_string(), |t| t.to_string()),
            a.outcome.as_str(),
            rfc3339(a.leased_at_ms),
            or_dash(&a.note)
        );
    }
}

// ---------------------------------------------------------------- worker run

/// A `--payload` argument: kept as given once it parses as JSON, refused (exit 2) otherwise.
fn json_document(text: &str) -> Result<String, String> {
    serde_json::from_str::<Value>(text)
        .map(|_| text.to_string())
        .map_err(|error| format!("must be a JSON document: {error}"))
}

/// A worker ready to run `command`'s program, checked before anything is leased or the cluster
/// is even reached: its settings (the builder's limits) and its program (see [`check_program`]).
pub fn prepare_worker(command: &WorkerCommand, client: &Client) -> Result<Worker, u8> {
    let WorkerCommand::Run {
        id,
        queues,
        concurrency_keys,
        slots,
        lease_ttl,
        drain_timeout,
        command,
    } = command;
    check_program(command)?;
    Worker::builder(client.clone(), id.clone())
        .queues(queues.clone())
        .concurrency_keys(*concurrency_keys)
        .slots(*slots)
        .lease_ttl(*lease_ttl)
        .drain_timeout(*drain_timeout)
        .on_finish(print_finished)
        .build()
        .map_err(|error| {
            eprintln!("baton worker: {error}");
            exit::USAGE
        })
}

/// Runs a prepared worker whose command gets `env` (how to reach the cluster) besides the task's
/// own variables.
pub async fn run_worker(
    worker: Worker,
    command: WorkerCommand,
    env: Vec<(&'static str, std::ffi::OsString)>,
) -> u8 {
    let WorkerCommand::Run {
        queues,
        concurrency_keys,
        slots,
        command,
        ..
    } = command;
    eprintln!(
        "baton worker: {} on {} (concurrency keys {}, {slots} slots); Ctrl-C to stop",
        worker.id(),
        if queues.is_empty() {
            "every queue".to_string()
        } else {
            queues.join(",")
        },
        if concurrency_keys { "on" } else { "off" },
    );
    let program = std::sync::Arc::new(command);
    let env = std::sync::Arc::new(env);
    let handler = move |ctx: TaskContext| {
        let (program, env) = (program.clone(), env.clone());
        async move { task_command::run(&program, &env, ctx).await }
    };
    match worker.run(handler, shutdown_signal()).await {
        Ok(summary) => {
            print_summary(&summary);
            if summary.drained {
                exit::OK
            } else {
                exit::FAILURE
            }
        }
        Err(error) => exit::report(&error),
    }
}

/// Refuses a worker whose program cannot be run: every task it leased would fail for good
/// ("cannot run"), so a typo in the command would fail a whole queue.
fn check_program(command: &[String]) -> Result<(), u8> {
    let Some(program) = command.first() else {
        eprintln!("baton worker: no command to run (put it after `--`)");
        return Err(exit::USAGE);
    };
    which::which(program).map(|_| ()).map_err(|error| {
        eprintln!(
            "baton worker: cannot run {program:?}: {error} (not found on PATH, or not an \
             executable file); nothing was leased"
        );
        exit::USAGE
    })
}

fn print_finished(f: &Finished) {
    let mut line = format!(
        "task={} attempt={} queue={} outcome={}",
        f.task_id,
        f.attempt,
        f.queue,
        f.end.as_str()
    );
    if let Some(key) = &f.concurrency_key {
        line.push_str(&format!(" concurrency_key={key}"));
    }
    if let Some(token) = f.token {
        line.push_str(&format!(" token={token}"));
    }
    if !f.detail.is_empty() {
        line.push_str(&format!(" detail={:?}", f.detail));
    }
    print_on(&line);
}

fn print_summary(s: &WorkerSummary) {
    print_on(&format!(
        "completed={} failed={} unknown={} lost={} protocol_errors={} handed_back={} drained={}",
        s.completed, s.failed, s.unknown, s.lost, s.protocol_errors, s.handed_back, s.drained
    ));
}

/// Prints a line of `worker run`'s output, whose reader may go away without stopping the worker:
/// it drains, hands back and reports whatever happens to its output (ending the process there
/// would orphan its running commands, their leases unrenewed). The first failure is said on
/// stderr; later lines are dropped.
fn print_on(line: &str) {
    use std::io::Write;
    static FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if FAILED.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if let Err(error) = writeln!(std::io::stdout().lock(), "{line}") {
        FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
        eprintln!("baton worker: cannot print ({error}); working on without printing");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn task(payload: &[u8], result: &[u8], state: TaskState) -> Task {
        Task {
            id: 1,
            namespace: "ns".into(),
            spec: TaskSpec {
                queue: "q".into(),
                idempotency_key: "i".into(),
                handler: "h".into(),
                handler_version: "v1".into(),
                payload_version: "v1".into(),
                payload: payload.to_vec(),
                concurrency_key: String::new(),
                business_key: String::new(),
                max_attempts: 3,
                ttl_ms: 1_000,
            },
            state,
            attempts: Vec::new(),
            submitted_at_ms: 0,
            deadline_ms: 1_000,
            retry_at_ms: None,
            result: result.to_vec(),
            last_error: String::new(),
        }
    }

    /// Payloads and results are shown as they were submitted and reported, never parsed
    /// (reordered keys, a newline dropped, a number for a string) nor altered (lossy text).
    #[test]
    fn json_carries_payload_and_result_exactly() {
        let done = task(br#"{"b":1,"a":2}"#, b"42\n", TaskState::Succeeded);
        let shown = task_json(&done, true);
        assert_eq!(shown["payload"], r#"{"b":1,"a":2}"#);
        assert_eq!(shown["result"], "42\n");
        assert!(shown.get("result_base64").is_none(), "{shown}");

        let binary = task(b"{}", &[0xff, 0x00], TaskState::Succeeded);
        let shown = task_json(&binary, true);
        assert!(shown["result"].is_null(), "{shown}");
        assert_eq!(shown["result_base64"], "/wA=");

        let waiting = task(&[0xfe], b"", TaskState::Waiting);
        let shown = task_json(&waiting, true);
        assert!(shown["payload"].is_null(), "{shown}");
        assert_eq!(shown["payload_base64"], "/g==");
        assert!(shown["result"].is_null(), "{shown}");
    }
}
