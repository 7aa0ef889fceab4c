//! Claim: Baton's guarantees survive crashes, pauses, partitions, one-way and partial link cuts,
//! slow links, full-cluster power loss and membership changes (issue 5; contract §0–§5). Each
//! test runs a group of fault scenarios ([`Scenario`]) with fixed seeds on a fresh three-node
//! cluster whose peer links go through TCP proxies, under concurrent recorded workloads —
//! handoff offer/take/reply/cancel/read races, board claims, side-effect acquires with fenced
//! sink writes, keyed queue permits — and judges the whole history afterwards:
//!
//! - handoff ticket histories are linearizable per key (Wing–Gong/Lowe search against the
//!   ticket model; ambiguous operations modelled as such), including the answers a paused or
//!   isolated old leader gave;
//! - at most one acknowledged take / claim / grant / permit per key and fence, and fences and
//!   permit tokens strictly increasing per key in real time across every failover;
//! - no holder acts on a superseded grant; a stale-fence sink write is never applied and the
//!   sink's final value is the highest acknowledged write's (or a higher ambiguous one's);
//! - every acknowledged write is present after recovery, and every workload is served again.
//!
//! One line per scenario: `scenario=<name> seed=<n> ops=<n> ambiguous=<n> faults=<n>
//! verdict=ok|VIOLATION`. A violation prints the slice of history that breaks the rule and how
//! to replay the seed. `docs/robustness.md` has the fault matrix.
#![allow(clippy::unwrap_used)]

use baton_cluster_test::robustness::{self, Scenario, Settings};

/// Runs `scenarios` one after the other with their fixed seeds; fails listing every scenario
/// that found a violation or could not run.
async fn run_group(scenarios: &[(Scenario, u64)]) {
    let settings = Settings::default();
    let mut failures = Vec::new();
    for (scenario, seed) in scenarios {
        match robustness::run(*scenario, *seed, &settings).await {
            Ok(report) => {
                println!("{}", report.summary());
                println!("{}", report.details());
                if !report.violations.is_empty() {
                    println!("{}", report.explain());
                    failures.push(report.summary());
                }
            }
            Err(error) => {
                println!(
                    "scenario={scenario} seed={seed} ops=0 ambiguous=0 faults=0 verdict=ERROR"
                );
                println!("{error:#}");
                failures.push(format!("{scenario} seed {seed}: {error:#}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_crashes_leader_kill_follower_kill_restart_all() {
    run_group(&[
        (Scenario::LeaderKill, 7001),
        (Scenario::FollowerKill, 7002),
        (Scenario::RestartAll, 7003),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_pause_of_the_leader_past_the_election_timeout() {
    run_group(&[(Scenario::LeaderPause, 7004)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_partitions_isolate_leader_isolate_follower_split() {
    run_group(&[
        (Scenario::IsolateLeader, 7005),
        (Scenario::IsolateFollower, 7006),
        (Scenario::Split, 7007),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_one_way_partial_and_slow_links() {
    run_group(&[(Scenario::OneWay, 7010), (Scenario::SlowLinks, 7011)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_membership_change_under_load() {
    run_group(&[(Scenario::Membership, 7008)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t70_mixed_faults_one_after_another() {
    run_group(&[(Scenario::Mixed, 7009)]).await;
}
