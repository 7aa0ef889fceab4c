//! Seed 004 §5: keyed concurrency with monotonic permit tokens, end to end.
//!
//! Two fresh queues each get one task with the SAME fresh concurrency key. Two worker runtimes
//! (concurrency keys on, 4 slots each) serve both queues; their handler writes to Baton's own
//! fenced sink with the resource = namespace/key and the fence = the permit token. The store lets only
//! one attempt per key be active, so the two writes happen one after the other with strictly
//! increasing tokens; afterwards an "old request" presenting the older token is refused
//! `FENCE_STALE`. Finally both workers are shut down and must drain.
//!
//! Run it against a cluster (default: the `baton dev` one on 127.0.0.1:7001-7003):
//!
//! ```sh
//! cargo run --release -p baton-rpc --example keyed-concurrency
//! BATON_ENDPOINTS=127.0.0.1:7401,127.0.0.1:7402,127.0.0.1:7403 \
//!     cargo run -p baton-rpc --example keyed-concurrency
//! ```
//!
//! It prints
//!
//! ```text
//! queues=2 completed=2 tokens_increasing=true
//! resource_writes=2 stale_write_rejected=true worker_drained=true
//! ```
//!
//! and exits 0; otherwise it exits non-zero with the reason on stderr. The whole run is bounded
//! by 20 s. Every run creates its own queues, tasks and key and leaves their history behind.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::worker::{TaskContext, TaskError, Worker, WorkerSummary};
use baton_rpc::{Client, Error};
use baton_statemachine::queue::{TaskSpec, TaskState};
use baton_statemachine::Refusal;
use tokio::sync::watch;

/// The whole run's time limit.
const LIMIT: Duration = Duration::from_secs(20);
const DEFAULT_ENDPOINTS: &str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003";
const NAMESPACE: &str = "default";

/// What the run found.
struct Report {
    queues: usize,
    completed: u64,
    tokens_increasing: bool,
    resource_writes: u64,
    stale_write_rejected: bool,
    worker_drained: bool,
    /// Set when two handlers for the key ever ran at the same time.
    overlapped: bool,
}

impl Report {
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.completed != 2 {
            problems.push(format!("{} tasks completed, want 2", self.completed));
        }
        if !self.tokens_increasing {
            problems.push("the permit tokens were not strictly increasing".into());
        }
        if self.resource_writes != 2 {
            problems.push(format!(
                "the resource accepted {} writes, want 2",
                self.resource_writes
            ));
        }
        if !self.stale_write_rejected {
            problems.push("a write with the older token was not refused FENCE_STALE".into());
        }
        if !self.worker_drained {
            problems.push("a worker did not drain".into());
        }
        if self.overlapped {
            problems.push("two handlers held the same key at once".into());
        }
        problems
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let endpoints: Vec<String> = std::env::var("BATON_ENDPOINTS")
        .unwrap_or_else(|_| DEFAULT_ENDPOINTS.to_string())
        .split(',')
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect();
    match tokio::time::timeout(LIMIT, run(&endpoints)).await {
        Ok(Ok(report)) => {
            println!(
                "queues={} completed={} tokens_increasing={}",
                report.queues, report.completed, report.tokens_increasing
            );
            println!(
                "resource_writes={} stale_write_rejected={} worker_drained={}",
                report.resource_writes, report.stale_write_rejected, report.worker_drained
            );
            let problems = report.problems();
            if problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                eprintln!("keyed-concurrency: FAILED: {}", problems.join("; "));
                ExitCode::FAILURE
            }
        }
        Ok(Err(why)) => {
            eprintln!("keyed-concurrency: FAILED: {why}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!(
                "keyed-concurrency: FAILED: the run did not finish within {LIMIT:?} (cluster at {})",
                endpoints.join(",")
            );
            ExitCode::FAILURE
        }
    }
}

async fn run(endpoints: &[String]) -> Result<Report, String> {
    let client = Client::connect(endpoints)
        .await
        .map_err(|e| format!("cannot reach the cluster at {}: {e}", endpoints.join(",")))?;
    let run_id = format!("{:016x}", rand::random::<u64>());
    let key = format!("object/{run_id}");

    // Two dedicated queues, one task in each, both with the same resource key.
    let queues = [format!("keyed-a-{run_id}"), format!("keyed-b-{run_id}")];
    for queue in &queues {
        client
            .create_queue(queue, NAMESPACE)
            .await
            .map_err(|e| format!("create queue {queue}: {e}"))?;
    }
    let mut task_ids = Vec::new();
    for (i, queue) in queues.iter().enumerate() {
        let spec = TaskSpec {
            queue: queue.clone(),
            idempotency_key: format!("update-{run_id}-operation-{i}"),
            handler: "object.update".into(),
            handler_version: "v1".into(),
            payload_version: "v1".into(),
            payload: format!(r#"{{"operation_ref":"update-{i}","object_ref":"{key}"}}"#)
                .into_bytes(),
            concurrency_key: key.clone(),
            business_key: String::new(),
            max_attempts: 3,
            ttl_ms: LIMIT.as_millis() as i64,
        };
        let receipt = client
            .submit(&spec)
            .await
            .map_err(|e| format!("submit to {queue}: {e}"))?;
        task_ids.push(receipt.task.id);
    }

    // Two workers with 4 slots each, both serving both queues.
    let active = Arc::new(AtomicUsize::new(0));
    let overlapped = Arc::new(AtomicBool::new(false));
    let handler = {
        let client = client.clone();
        let active = active.clone();
        let overlapped = overlapped.clone();
        move |ctx: TaskContext| {
            let client = client.clone();
            let active = active.clone();
            let overlapped = overlapped.clone();
            async move { update_object(&client, &active, &overlapped, ctx).await }
        }
    };
    let (stop, stopped) = watch::channel(false);
    let mut workers = Vec::new();
    for i in 1..=2 {
        let worker = Worker::builder(client.clone(), format!("keyed-worker-{i}-{run_id}"))
            .queues(queues.iter().cloned())
            .concurrency_keys(true)
            .slots(4)
            .lease_ttl(Duration::from_secs(5))
            .poll_wait(Duration::from_secs(5))
            .drain_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("worker {i}: {e}"))?;
        let mut stopped = stopped.clone();
        let shutdown = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        workers.push(tokio::spawn(worker.run(handler.clone(), shutdown)));
    }

    // Both tasks must succeed.
    for &id in &task_ids {
        loop {
            let task = client
                .queue_task(id)
                .await
                .map_err(|e| format!("read task {id}: {e}"))?;
            match task.state {
                TaskState::Succeeded => break,
                state if state.is_terminal() => {
                    return Err(format!(
                        "task {id} ended {} ({})",
                        state.as_str(),
                        task.last_error
                    ))
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    // Every attempt on the key, in lease order: the tokens must strictly increase, and no
    // attempt may be leased before the previous one ended.
    let mut attempts = Vec::new();
    for &id in &task_ids {
        let history = client
            .attempts(id)
            .await
            .map_err(|e| format!("attempts of task {id}: {e}"))?;
        attempts.extend(history.attempts);
    }
    attempts.sort_by_key(|a| (a.leased_at_ms, a.ended_at_ms));
    let tokens: Vec<Option<u64>> = attempts.iter().map(|a| a.token).collect();
    let tokens_increasing = tokens.len() >= 2
        && tokens.iter().all(|t| t.is_some_and(|t| t > 0))
        && tokens.windows(2).all(|w| w[0] < w[1])
        && attempts
            .windows(2)
            .all(|w| w[0].ended_at_ms.is_some_and(|end| end <= w[1].leased_at_ms));
    let older = tokens.iter().flatten().copied().min().unwrap_or(0);

    // The resource side: two accepted writes, and an old request with the older token refused.
    let resource = resource_of(NAMESPACE, &key);
    let written = client
        .read_sink(&resource)
        .await
        .map_err(|e| format!("read the resource {resource}: {e}"))?;
    let stale_write_rejected = matches!(
        client
            .write_fenced(&resource, older, b"an old request")
            .await,
        Err(Error::Refused(Refusal::FenceStale))
    );

    // Shut both workers down; they must drain.
    let _ = stop.send(true);
    let mut completed = 0;
    let mut worker_drained = true;
    for (i, worker) in workers.into_iter().enumerate() {
        let summary: WorkerSummary = worker
            .await
            .map_err(|e| format!("worker {} panicked: {e}", i + 1))?
            .map_err(|e| format!("worker {}: {e}", i + 1))?;
        completed += summary.completed;
        worker_drained &= summary.drained;
    }

    Ok(Report {
        queues: queues.len(),
        completed,
        tokens_increasing,
        resource_writes: written.writes,
        stale_write_rejected,
        worker_drained,
        overlapped: overlapped.load(Ordering::SeqCst),
    })
}

/// The fenced resource of a concurrency key: tokens count per namespace and key, so the same key
/// in another namespace is another resource, whose tokens must never be compared with these.
fn resource_of(namespace: &str, key: &str) -> String {
    format!("{namespace}/{key}")
}

/// The handler: a fenced write of the object, presenting the permit token.
async fn update_object(
    client: &Client,
    active: &AtomicUsize,
    overlapped: &AtomicBool,
    ctx: TaskContext,
) -> Result<Vec<u8>, TaskError> {
    let (Some(key), Some(token)) = (ctx.concurrency_key.clone(), ctx.token) else {
        return Err(TaskError::non_retryable("expected a keyed task"));
    };
    if active.fetch_add(1, Ordering::SeqCst) > 0 {
        overlapped.store(true, Ordering::SeqCst);
    }
    // Hold the key for a moment, so a second attempt on it would overlap if the store allowed it.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let value = format!(
        "task={} attempt={} token={token} payload={}",
        ctx.task_id,
        ctx.attempt,
        String::from_utf8_lossy(&ctx.payload)
    );
    let resource = resource_of(&ctx.namespace, &key);
    let written = client
        .write_fenced(&resource, token, value.as_bytes())
        .await;
    active.fetch_sub(1, Ordering::SeqCst);
    match written {
        Ok(_) => Ok(value.into_bytes()),
        // A newer holder already wrote: this attempt's write must not happen, and retrying the
        // same attempt cannot help.
        Err(Error::Refused(Refusal::FenceStale)) => Err(TaskError::non_retryable(
            "FENCE_STALE: a newer permit already wrote the resource",
        )),
        // The write may or may not have been applied.
        Err(error) if error.is_infrastructure() => Err(TaskError::unknown_effect(error)),
        Err(error) => Err(TaskError::non_retryable(error)),
    }
}
