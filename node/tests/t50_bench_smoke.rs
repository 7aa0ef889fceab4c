//! A 2-second smoke run of `baton bench` on its own local cluster: the harness starts three node
//! processes, runs the workload and prints one JSON object with the agreed keys. Figures are
//! printed, never asserted: tests do not fail on timing.
#![allow(clippy::unwrap_used)]

use std::process::Command;

/// Runs a smoke bench with `BATON_ENDPOINTS` naming a cluster nobody answers for, as a shell
/// that exported a production cluster's address would: the bench must start and measure its own
/// cluster (never seed and load the exported one) and say that it ignored the variable. The
/// shell also exports node settings its own cluster must not take (before: an election timeout
/// under three heartbeats stopped every node, and the bench failed). Answers whether it
/// succeeded, its JSON object and its stderr.
fn run_bench(workload: &str, extra: &[&str]) -> (bool, serde_json::Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["bench", "--workload", workload, "--clients", "4"])
        .args(["--duration", "2s", "--warmup", "0s", "--json"])
        .args(extra)
        .env("BATON_ENDPOINTS", "127.0.0.1:9")
        .env("BATON_RAFT_ELECTION_TIMEOUT", "1ms")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(stderr.contains("BATON_ENDPOINTS is ignored"), "{stderr}");
    println!("{stdout}");
    let run = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("no JSON object ({e}): {stderr}\n{stdout}"));
    (output.status.success(), run, stderr)
}

#[test]
fn bench_prints_one_json_object_per_run_with_the_agreed_keys() {
    for (workload, extra) in [
        ("handoff", &[][..]),
        ("queue-claim", &["--queue-tasks", "5000"][..]),
    ] {
        let (succeeded, run, stderr) = run_bench(workload, extra);
        assert!(succeeded, "bench failed: {stderr}\n{run}");
        assert_eq!(run["workload"], workload);
        assert_eq!(run["clients"], 4);
        for key in ["ops_per_s", "requests_per_s", "p50_ms", "p99_ms", "p999_ms"] {
            assert!(run[key].is_number(), "{key} missing in {run}");
        }
        assert!(
            run["ops"].as_u64().unwrap() > 0,
            "no operation completed: {run}"
        );
        assert_eq!(run["errors"], 0, "{run}");
        assert_eq!(run["failed_ops"], 0, "{run}");
        assert_eq!(run["empty_leases"], 0, "{run}");
        assert_eq!(run["node_peak_rss_mib"].as_array().unwrap().len(), 3);
    }
}

/// A queue that runs dry during the run makes its figures the queue's size, not a claim rate
/// (each empty lease is a cheap round trip): the bench still prints them, counts the empty
/// leases, and fails.
#[test]
fn a_queue_claim_run_whose_queue_runs_dry_fails() {
    let (succeeded, run, stderr) = run_bench("queue-claim", &["--queue-tasks", "20"]);
    assert!(!succeeded, "{run}");
    assert!(stderr.contains("the queue ran dry"), "{stderr}");
    assert!(run["empty_leases"].as_u64().unwrap() > 0, "{run}");
    assert!(run["ops"].as_u64().unwrap() <= 20, "{run}");
}
