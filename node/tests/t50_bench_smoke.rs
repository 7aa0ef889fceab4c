//! A 2-second smoke run of `baton bench` on its own local cluster: the harness starts three node
//! processes, runs the workload and prints one JSON object with the agreed keys. Figures are
//! printed, never asserted: tests do not fail on timing.
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn bench(workload: &str, extra: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["bench", "--workload", workload, "--clients", "4"])
        .args(["--duration", "2s", "--warmup", "0s", "--json"])
        .args(extra)
        .env_remove("BATON_ENDPOINTS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

#[test]
fn bench_prints_one_json_object_per_run_with_the_agreed_keys() {
    for (workload, extra) in [
        ("handoff", &[][..]),
        ("queue-claim", &["--queue-tasks", "200"][..]),
    ] {
        let run = bench(workload, extra);
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
        assert_eq!(run["node_peak_rss_mib"].as_array().unwrap().len(), 3);
    }
}
