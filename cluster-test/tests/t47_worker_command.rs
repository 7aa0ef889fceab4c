//! Claim: `baton worker run` runs its command so that the store records what the command did,
//! and the command lives exactly as long as its attempt (seed 004 §4; docs/task-queue.md):
//!
//! - the payload reaches the command whole (on stdin; in `BATON_PAYLOAD` only when it fits an
//!   environment variable), a 200 KB payload included;
//! - a result larger than the store accepts fails the task instead of completing it cut short;
//! - a command killed by a signal part-way reports its effect unknown (it needs review), not a
//!   retryable failure;
//! - Ctrl-C at the worker's terminal (SIGINT to its whole process group) drains: the command in
//!   flight finishes and completes;
//! - when the drain times out, everything the command started dies with it, background
//!   processes included: nothing runs on after the store may have handed the task on.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use baton_cluster_test::queue_worker::{WorkerProcess, WorkerSpec};
use baton_cluster_test::{wait, Cluster, Options};
use baton_rpc::Client;
use baton_statemachine::queue::{Task, TaskSpec, TaskState};

/// One script for every test: what it does depends on the task's handler.
fn script(pid_dir: &Path) -> Vec<String> {
    let body = format!(
        r#"case "$BATON_HANDLER" in
  count) printf 'env=%s stdin=%s ns=%s' "${{#BATON_PAYLOAD}}" "$(wc -c | tr -d ' ')" "$BATON_NAMESPACE" ;;
  flood) head -c 2000000 /dev/zero ;;
  crash) kill -9 $$ ;;
  slow) touch "{dir}/$BATON_TASK_ID.started"; sleep 3; touch "{dir}/$BATON_TASK_ID.finished"; echo ok ;;
  linger) sleep 30 & echo $! > "{dir}/$BATON_TASK_ID.pid"; wait ;;
  escape) setsid sh -c 'echo $$ > "$0"; exec sleep 60' "{dir}/escapee.pid" &
          while [ ! -s "{dir}/escapee.pid" ]; do sleep 0.1; done; echo out ;;
esac"#,
        dir = pid_dir.display()
    );
    vec!["sh".into(), "-c".into(), body]
}

fn worker(id: &str, queue: &str, drain_timeout: Duration, pid_dir: &Path) -> WorkerSpec {
    WorkerSpec {
        id: id.into(),
        queues: vec![queue.into()],
        concurrency_keys: false,
        slots: 4,
        lease_ttl: Duration::from_secs(10),
        drain_timeout,
        command: script(pid_dir),
    }
}

async fn submit(client: &Client, queue: &str, handler: &str, payload: Vec<u8>) -> u64 {
    let spec = TaskSpec {
        queue: queue.into(),
        idempotency_key: format!("{queue}-{handler}-{}", payload.len()),
        handler: handler.into(),
        handler_version: "v1".into(),
        payload_version: "v1".into(),
        payload,
        concurrency_key: String::new(),
        business_key: String::new(),
        max_attempts: 1,
        ttl_ms: 600_000,
    };
    client.submit(&spec).await.unwrap().task.id
}

async fn until_state(client: &Client, id: u64, states: &[TaskState]) -> Task {
    wait::until(
        &format!("task {id} in {states:?}"),
        Duration::from_secs(30),
        || async {
            let task = client.queue_task(id).await.map_err(|e| e.to_string())?;
            if states.contains(&task.state) {
                Ok(task)
            } else {
                Err(format!("{:?} ({})", task.state, task.last_error))
            }
        },
    )
    .await
    .unwrap()
}

const SETTLED: &[TaskState] = &[
    TaskState::Succeeded,
    TaskState::Failed,
    TaskState::NeedsReview,
    TaskState::RetryWait,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t47_what_the_command_did_is_what_the_store_records() {
    let cluster = Cluster::start(1, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    client.create_queue("io", "ns").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let spec = worker("t47-io", "io", Duration::from_secs(10), dir.path());
    let mut process = WorkerProcess::spawn(
        cluster.bin(),
        &cluster.endpoints(),
        &spec,
        &dir.path().join("worker.log"),
    )
    .unwrap();

    let small = submit(&client, "io", "count", b"hello".to_vec()).await;
    let large = submit(&client, "io", "count", vec![b'a'; 200_000]).await;
    let flood = submit(&client, "io", "flood", Vec::new()).await;
    let crash = submit(&client, "io", "crash", Vec::new()).await;
    let escape = submit(&client, "io", "escape", Vec::new()).await;

    let task = until_state(&client, small, SETTLED).await;
    assert_eq!(
        (task.state, String::from_utf8_lossy(&task.result).as_ref()),
        (TaskState::Succeeded, "env=5 stdin=5 ns=ns"),
        "a small payload travels on stdin and in BATON_PAYLOAD, the namespace in \
         BATON_NAMESPACE: {task:?}"
    );
    let task = until_state(&client, large, SETTLED).await;
    assert_eq!(
        (task.state, String::from_utf8_lossy(&task.result).as_ref()),
        (TaskState::Succeeded, "env=0 stdin=200000 ns=ns"),
        "a 200 KB payload travels on stdin only ({})",
        task.last_error
    );
    let task = until_state(&client, flood, SETTLED).await;
    assert_eq!(
        task.state,
        TaskState::Failed,
        "2 MB of output completed the task: {} bytes of result",
        task.result.len()
    );
    assert!(task.last_error.contains("more than"), "{}", task.last_error);
    let task = until_state(&client, crash, SETTLED).await;
    assert_eq!(
        task.state,
        TaskState::NeedsReview,
        "a command killed part-way: {}",
        task.last_error
    );
    assert!(task.last_error.contains("signal 9"), "{}", task.last_error);
    // A process that left the command's group (once it has: the command waits for its pid)
    // keeps stdout and stderr open for a minute: the attempt ends with the command anyway.
    let task = until_state(&client, escape, SETTLED).await;
    let escapee = std::fs::read_to_string(dir.path().join("escapee.pid")).unwrap_or_default();
    let _ = std::process::Command::new("kill")
        .args(["-9", escapee.trim()])
        .status();
    assert_eq!(
        (task.state, task.result.as_slice()),
        (TaskState::Succeeded, &b"out\n"[..]),
        "{}",
        task.last_error
    );

    let status = process.terminate(Duration::from_secs(20)).await.unwrap();
    assert!(status.success(), "{status}: {}", process.log_tail(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t47_ctrl_c_drains_and_a_timed_out_drain_kills_the_command_s_whole_group() {
    let cluster = Cluster::start(1, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    client.create_queue("drain", "ns").await.unwrap();
    client.create_queue("linger", "ns").await.unwrap();
    let dir = tempfile::tempdir().unwrap();

    // Ctrl-C while a command runs: the worker drains, the command finishes and completes.
    let spec = worker("t47-drain", "drain", Duration::from_secs(10), dir.path());
    let mut drainer = WorkerProcess::spawn(
        cluster.bin(),
        &cluster.endpoints(),
        &spec,
        &dir.path().join("drain.log"),
    )
    .unwrap();
    let slow = submit(&client, "drain", "slow", Vec::new()).await;
    let started = dir.path().join(format!("{slow}.started"));
    wait::until("the slow command to start", Duration::from_secs(30), || {
        let started = started.clone();
        async move {
            if started.exists() {
                Ok(())
            } else {
                Err("no marker yet".to_string())
            }
        }
    })
    .await
    .unwrap();
    // Interrupted before its 3 s are up: the result below can only come from a command that
    // outlived the Ctrl-C.
    assert!(
        !dir.path().join(format!("{slow}.finished")).exists(),
        "the command finished before the interrupt: this run shows nothing"
    );
    let status = drainer
        .interrupt_group(Duration::from_secs(20))
        .await
        .unwrap();
    let task = client.queue_task(slow).await.unwrap();
    assert_eq!(
        (task.state, task.result.as_slice()),
        (TaskState::Succeeded, &b"ok\n"[..]),
        "Ctrl-C killed the command instead of draining: {} ({})",
        task.last_error,
        drainer.log_tail(10)
    );
    assert!(status.success(), "{status}: {}", drainer.log_tail(10));
    let summary = drainer.summary().unwrap();
    assert_eq!(
        (summary.completed, summary.drained),
        (1, true),
        "{summary:?}"
    );

    // A drain that times out: the command and what it started in the background die.
    let spec = worker(
        "t47-linger",
        "linger",
        Duration::from_millis(300),
        dir.path(),
    );
    let mut lingerer = WorkerProcess::spawn(
        cluster.bin(),
        &cluster.endpoints(),
        &spec,
        &dir.path().join("linger.log"),
    )
    .unwrap();
    let linger = submit(&client, "linger", "linger", Vec::new()).await;
    let pid_file = dir.path().join(format!("{linger}.pid"));
    let pid: u32 = wait::until(
        "the background sleep's pid",
        Duration::from_secs(30),
        || {
            let pid_file = pid_file.clone();
            async move {
                let text = std::fs::read_to_string(&pid_file).map_err(|e| e.to_string())?;
                text.trim().parse().map_err(|e| format!("{text:?}: {e}"))
            }
        },
    )
    .await
    .unwrap();
    let status = lingerer.terminate(Duration::from_secs(20)).await.unwrap();
    let summary = lingerer.summary().unwrap();
    assert!(!summary.drained, "{status}: {summary:?}");
    let gone = wait::until(
        "the background sleep to die with its attempt",
        Duration::from_secs(5),
        || async move {
            if alive(pid) {
                Err(format!("pid {pid} still runs"))
            } else {
                Ok(())
            }
        },
    )
    .await;
    if gone.is_err() {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    gone.unwrap();
}

/// Whether `pid` is a live process (a zombie waiting for its parent counts as dead).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// A command that cannot be run (a typo, a directory, a file without the execute bit) is refused
/// at start, before anything is leased: every task leased would fail for good ("cannot run"),
/// so a typo would fail a whole queue. The cluster named here does not exist: the check comes
/// first (exit 2, not 4 after the 15 s the connection would take).
#[test]
fn t47_a_command_that_cannot_run_is_refused_before_anything_is_leased() {
    let bin = baton_cluster_test::binary::baton_bin().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let not_executable = dir.path().join("handler.sh");
    std::fs::write(&not_executable, "#!/bin/sh\necho ok\n").unwrap();
    let not_executable = not_executable.display().to_string();
    for program in [
        "./no-such-handler.sh",
        "no-such-program-t47",
        "/",
        not_executable.as_str(),
    ] {
        let output = std::process::Command::new(&bin)
            .args(["--endpoints", "127.0.0.1:9", "worker", "run", "--id", "w"])
            .args(["--", program])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{program}: {stderr}");
        assert!(
            stderr.contains("cannot run") && stderr.contains("nothing was leased"),
            "{program}: {stderr}"
        );
    }
}

/// The worker's own settings are checked before the cluster is reached too: a lease TTL or a
/// slot count the worker refuses is said at once (exit 2), not after the 15 s the connection to
/// a cluster that does not answer would take (exit 4).
#[test]
fn t47_settings_the_worker_refuses_are_said_before_connecting() {
    let bin = baton_cluster_test::binary::baton_bin().unwrap();
    for (flags, said) in [
        (["--id", "w", "--lease-ttl", "10ms"], "lease TTL"),
        (["--id", "w", "--slots", "0"], "slots"),
        (["--id", " ", "--slots", "1"], "worker id"),
    ] {
        let started = std::time::Instant::now();
        let output = std::process::Command::new(&bin)
            .args(["--endpoints", "127.0.0.1:9", "worker", "run"])
            .args(flags)
            .args(["--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
        assert!(
            !stderr.contains("retrying"),
            "{flags:?}: it tried the cluster first: {stderr}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}
