//! `baton bench --workload failover` SIGKILLs a leader and `--workload scale` adds and removes a
//! member: they must never do that to a cluster named by `--endpoints` (someone's real cluster).
//! They refuse it as a usage error before contacting anything. The workloads themselves are
//! benchmarks and never run in the test command. A cluster nobody answers for is reported as
//! unreachable before any run.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

mod support;

#[test]
fn robustness_workloads_refuse_an_external_cluster() {
    for workload in ["failover", "scale"] {
        let output = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["bench", "--workload", workload, "--duration", "1s"])
            .args(["--endpoints", "127.0.0.1:9"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{workload}: {stderr}");
        assert!(
            stderr.contains("only on its own cluster"),
            "{workload}: {stderr}"
        );
    }
}

#[test]
fn an_unreachable_cluster_is_reported_before_the_run() {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["bench", "--workload", "handoff", "--duration", "1s"])
        .args(["--endpoints", "127.0.0.1:9"])
        // The command line names the cluster; an exported variable neither wins nor is reported
        // as ignored.
        .env("BATON_ENDPOINTS", "127.0.0.1:8")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "exit code: {stderr}");
    assert!(
        stderr.contains("cluster unavailable") && stderr.contains("127.0.0.1:9"),
        "{stderr}"
    );
    assert!(!stderr.contains("BATON_ENDPOINTS is ignored"), "{stderr}");
    // Not a timing claim: the requests' own deadline is 30 s, and it must not be waited out.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?} to report it",
        started.elapsed()
    );
}

/// A bench process that is stopped as a user would stop it (SIGTERM, so it stops its nodes too)
/// if the test fails before it does; SIGKILL after 20 s.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let asked = Instant::now();
        while asked.elapsed() < Duration::from_secs(20) {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A bench stopped by a signal (Ctrl-C, or SIGTERM to it alone) stops its own cluster's nodes
/// and removes their temporary data (before: both stayed behind, three nodes serving on).
#[test]
fn an_interrupted_bench_leaves_no_nodes_or_data_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bench = Stopped(
        Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["bench", "--workload", "handoff", "--clients", "2"])
            .args(["--warmup", "0s", "--duration", "60s"])
            .env("TMPDIR", tmp.path())
            .env_remove("BATON_ENDPOINTS")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Its cluster is up once a node's data directory exists under the temporary directory.
    let started = Instant::now();
    let data_of = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    while !data_of(tmp.path())
        .iter()
        .any(|d| d.join("node-1").exists())
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the bench's cluster never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let kill = Command::new("kill")
        .args(["-TERM", &bench.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = bench.0.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut bench.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(
        data_of(tmp.path()).is_empty(),
        "left behind: {:?}",
        data_of(tmp.path())
    );
    // No process runs from the removed directory any more.
    let tmp_name = tmp.path().display().to_string();
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&tmp_name))
        .collect();
    assert!(survivors.is_empty(), "still running: {survivors:?}");
}

/// `bench --endpoints` reaches a cluster that wants TLS with the security flags given (before:
/// it dialled plaintext and reported the cluster unreachable); without `--endpoints` they do not
/// apply to its own plaintext cluster, and are refused rather than ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_flags_reach_another_cluster_and_are_refused_for_its_own() {
    let certs = tempfile::tempdir().unwrap();
    let (security, client) = support::tls(certs.path());
    let cluster = support::Cluster::start_secured(|_| {}, security, client).await;
    let ca = certs.path().join("ca.pem");
    let addr = cluster.addr.clone();
    let measured = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_baton"))
            .arg("--tls-ca")
            .arg(&ca)
            .args(["bench", "--workload", "handoff", "--clients", "1"])
            .args(["--duration", "1s", "--warmup", "0s", "--json"])
            .args(["--endpoints", &addr])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&measured.stderr);
    assert!(measured.status.success(), "{stderr}");
    cluster.stop().await;

    let refused = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["bench", "--workload", "handoff", "--duration", "1s"])
        .args(["--auth-token", "s3cret"])
        .env_remove("BATON_ENDPOINTS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--auth-token does not apply without --endpoints"),
        "{stderr}"
    );
    // Its requests keep their own deadline: --timeout is refused, not ignored.
    let refused = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["--timeout", "5s", "bench", "--workload", "handoff"])
        .args(["--endpoints", "127.0.0.1:9"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--timeout does not apply"), "{stderr}");
}
