//! Claim: Baton's guarantees survive the faults containers suffer (issue 5, "real containers";
//! contract §0–§5). The compose cluster of `deploy/` runs the robustness suite's recorded
//! workloads — handoff races, board claims, side-effect acquires with fenced sink writes, keyed
//! queue permits — while the nemesis, in turn, aims at the leader:
//!
//! - `docker kill` (SIGKILL) of its container, then `docker start`;
//! - `docker pause` (cgroup freezer) for 2–4 s, past the election timeout, then `docker unpause`;
//! - `docker network disconnect` from the Raft network for 2–4 s, then `docker network connect`;
//!
//! probing a paused or isolated old leader with raw reads and writes after the other side
//! elected a new one. The robustness checkers then judge the whole history (linearizable
//! tickets, one grant per fence, increasing fences and permit tokens, no lost acknowledgement,
//! service after recovery), exactly as for node processes (`t70_robustness`).
//!
//! Prints `scenario=docker-leader-faults seed=<n> ops=<n> ambiguous=<n> faults=<n>
//! verdict=ok|VIOLATION` and the fault log. Skipped where no Docker engine answers
//! (`BATON_REQUIRE_DOCKER=1` makes that a failure).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use baton_cluster_test::docker::{self, DockerCluster};
use baton_cluster_test::robustness::faults::LeaderFault;
use baton_cluster_test::robustness::{self, Settings};

const SEED: u64 = 9101;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_container_kill_pause_and_partition_of_the_leader() {
    let Some(engine) = docker::engine_or_skip("t91").await.unwrap() else {
        return;
    };
    let started = Instant::now();
    let mut cluster = DockerCluster::start(engine).await.unwrap();
    println!(
        "t91: compose project {} up in {:.1}s",
        cluster.project(),
        started.elapsed().as_secs_f64()
    );
    let settings = Settings {
        fault_time: Duration::from_secs(20),
        ..Settings::default()
    };
    let faults = [LeaderFault::Kill, LeaderFault::Pause, LeaderFault::Isolate];
    let outcome = robustness::run_leader_faults(
        &mut cluster,
        &faults,
        "docker-leader-faults",
        SEED,
        "cargo nextest run -p baton-cluster-test t91 --no-capture",
        &settings,
    )
    .await;
    let report = match outcome {
        Ok(report) => report,
        Err(error) => {
            println!("scenario=docker-leader-faults seed={SEED} ops=0 ambiguous=0 faults=0 verdict=ERROR");
            eprintln!("{}", cluster.logs(40).await);
            panic!("{error:#}");
        }
    };
    println!("{}", report.summary());
    println!("{}", report.details());
    println!("faults:\n    {}", report.fault_log.join("\n    "));
    if !report.violations.is_empty() {
        println!("{}", report.explain());
        eprintln!("{}", cluster.logs(40).await);
    }
    drop(cluster);
    println!(
        "t91: done in {:.1}s (including image build and teardown)",
        started.elapsed().as_secs_f64()
    );
    assert!(report.violations.is_empty(), "{}", report.summary());
    for fault in ["docker kill", "docker pause", "docker network disconnect"] {
        let ran = report
            .fault_log
            .iter()
            .any(|line| line.contains(&format!("{fault} leader")));
        assert!(ran, "the nemesis never ran `{fault}` on the leader");
    }
}
