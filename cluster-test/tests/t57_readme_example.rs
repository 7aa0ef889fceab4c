//! The runnable example the README advertises (seed 004 §5, keyed concurrency with monotonic
//! permit tokens: `rpc/examples/keyed-concurrency.rs`) passes against a live three-node cluster.
//! It judges itself (exit 0 and its summary line only when every check held); this test runs it
//! as a user would, so a regression in what it shows (the worker's drain, one active attempt per
//! key, the fenced sink refusing the older token) fails the suite, not only the README check.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::Duration;

use baton_cluster_test::{Cluster, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t57_the_keyed_concurrency_example_passes_against_a_live_cluster() {
    let example =
        baton_cluster_test::binary::example_bin("baton-rpc", "keyed-concurrency").unwrap();
    let cluster = Cluster::start(3, Options::default()).await.unwrap();
    cluster.leader().await.unwrap();
    let run = tokio::process::Command::new(&example)
        .env("BATON_ENDPOINTS", cluster.endpoints().join(","))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    // The example bounds itself at 20 s; this only keeps a hung one from holding the suite.
    let output = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the example ran past 60 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the example failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for claim in [
        "queues=2",
        "completed=2",
        "tokens_increasing=true",
        "resource_writes=2",
        "stale_write_rejected=true",
        "worker_drained=true",
    ] {
        assert!(stdout.contains(claim), "no {claim} in:\n{stdout}\n{stderr}");
    }
    println!(
        "t57: {}",
        stdout.split_whitespace().collect::<Vec<_>>().join(" ")
    );
}
