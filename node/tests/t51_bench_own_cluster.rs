//! `baton bench --workload failover` SIGKILLs a leader and `--workload scale` adds and removes a
//! member: they must never do that to a cluster named by `--endpoints` (someone's real cluster).
//! They refuse it as a usage error before contacting anything. The workloads themselves are
//! benchmarks and never run in the test command. A cluster nobody answers for is reported as
//! unreachable before any run.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

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
