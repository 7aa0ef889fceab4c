//! Claims: a SIGKILLed node restarts from its data dir and catches up — from the log when the
//! leader still has the entries it missed, by installing a snapshot when the leader has purged
//! them — and afterwards it is a full member: with the original leader killed, the restarted node
//! is half of the only possible quorum, and every acknowledged operation is still readable, and
//! it applies commands by the rules the cluster adopted (`baton_statemachine::rules`), which come
//! back with the log it replays or the snapshot it installs.
//! And a SIGKILL of every node at once (a power cut) loses no acknowledged operation: what was
//! acknowledged was durable on a quorum's disks. And the members build their snapshots at
//! staggered points of the log, never all at once.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_cluster_test::history::{lock, verify_live, SharedHistory};
use baton_cluster_test::robustness::replicas_agree;
use baton_cluster_test::workload::{self, Workload};
use baton_cluster_test::{offer_a_to_b, wait, Cluster, Options};
use baton_statemachine::rules::RULES;

/// Runs `tasks` workload tasks of `chains` chains each to completion.
async fn write(
    cluster: &Cluster,
    prefix: &str,
    tasks: usize,
    chains: usize,
    history: &SharedHistory,
) {
    let mut running = Vec::new();
    for task in 0..tasks {
        let client = cluster.client().await.unwrap();
        let workload = Workload {
            prefix: prefix.into(),
            max_chains: chains,
            max_time: Duration::from_secs(30),
            ..Workload::default()
        };
        let stop = Arc::new(AtomicBool::new(false));
        running.push(tokio::spawn(workload::run(
            client,
            task,
            workload,
            history.clone(),
            stop,
        )));
    }
    for task in running {
        tokio::time::timeout(Duration::from_secs(40), task)
            .await
            .unwrap()
            .unwrap();
    }
}

/// Every acknowledged operation is in the snapshot, the snapshot passes `check`, and the cluster
/// still accepts a write.
async fn assert_all_readable(cluster: &Cluster, history: &SharedHistory) -> usize {
    let client = cluster.client().await.unwrap();
    let verified = verify_live(&client, history).await.unwrap();
    client.offer(offer_a_to_b("after-failover")).await.unwrap();
    verified.acks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_killed_leader_restarts_from_its_data_dir_and_catches_up_from_the_log() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    cluster.wait_rules_adopted().await.unwrap();
    let history = SharedHistory::default();
    write(&cluster, "t30-before", 2, 15, &history).await;

    let old_leader = cluster.leader().await.unwrap();
    let before = cluster.node_info(old_leader).await.unwrap();
    cluster.kill(old_leader).unwrap();
    let new_leader = cluster.leader().await.unwrap();
    write(&cluster, "t30-missed", 2, 15, &history).await;

    let target = cluster.node_info(new_leader).await.unwrap().applied_index;
    assert!(
        target > before.applied_index,
        "the restarted node has something to catch up on"
    );
    // A small write (`node-id`, `cluster-id`) the kill cut short leaves its temporary file.
    let leftover = cluster
        .data_dir(old_leader)
        .unwrap()
        .join(".baton-interrupted");
    std::fs::write(&leftover, b"half").unwrap();
    let restarted_at = Instant::now();
    cluster.restart(old_leader).await.unwrap();
    assert!(!leftover.exists(), "the restart left {leftover:?} behind");
    let reopened = cluster.node_info(old_leader).await.unwrap();
    assert!(
        reopened.initialized && reopened.term >= before.term && reopened.last_log_index >= before.last_log_index,
        "the node came back with its membership, term and log: before {before:?}, after {reopened:?}"
    );
    let caught_up = cluster.wait_caught_up(old_leader, target).await.unwrap();
    let catch_up = restarted_at.elapsed();
    assert_eq!(
        caught_up.snapshot_index, 0,
        "no snapshot was due: it caught up from the log"
    );
    assert!(!cluster
        .log_of_last_run(old_leader)
        .contains("installed snapshot"));
    // Replayed from its log, the adopting entry included: the rules are the cluster's again.
    assert_eq!(caught_up.apply_rules, RULES, "{caught_up:?}");

    // Kill the new leader: the restarted node and the third node are now the only quorum.
    cluster.kill(new_leader).unwrap();
    let third_leader = cluster.leader().await.unwrap();
    let acks = assert_all_readable(&cluster, &history).await;
    println!(
        "t30: node {old_leader} killed at applied {}, restarted and caught up to {target} from the log in {catch_up:?}; \
         after killing node {new_leader}, node {third_leader} leads and all {acks} acked ops are readable",
        before.applied_index
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t31_follower_behind_a_purged_log_catches_up_by_snapshot() {
    const KEEP_LOGS: u64 = 10;
    let options = Options {
        snapshot_every: 50,
        keep_logs: KEEP_LOGS,
        ..Options::default()
    };
    let mut cluster = Cluster::start(3, options).await.unwrap();
    // The leader adopts this build's apply rules by itself; the snapshot must carry them.
    cluster.wait_rules_adopted().await.unwrap();
    let history = SharedHistory::default();
    write(&cluster, "t31-before", 2, 10, &history).await;

    let leader = cluster.leader().await.unwrap();
    let follower = *cluster.live_ids().iter().find(|id| **id != leader).unwrap();
    let behind = cluster.node_info(follower).await.unwrap();
    cluster.kill(follower).unwrap();

    // ~300 writes (chains of 1, 2 or 3 commands) while the follower is down.
    write(&cluster, "t31-missed", 4, 50, &history).await;
    let leader_info = cluster.node_info(leader).await.unwrap();
    assert!(
        leader_info.applied_index >= behind.last_log_index + 250,
        "enough writes happened: {} -> {}",
        behind.last_log_index,
        leader_info.applied_index
    );
    // The precondition that makes this a snapshot test: the leader no longer has the entries
    // right after the follower's last one, so log replication alone cannot catch it up.
    assert!(
        leader_info.snapshot_index.saturating_sub(KEEP_LOGS) > behind.last_log_index + 1,
        "leader snapshot at {} (keeping {KEEP_LOGS}) still covers the follower's next entry {}",
        leader_info.snapshot_index,
        behind.last_log_index + 1
    );

    let restarted_at = Instant::now();
    cluster.restart(follower).await.unwrap();
    let caught_up = cluster
        .wait_caught_up(follower, leader_info.applied_index)
        .await
        .unwrap();
    let catch_up = restarted_at.elapsed();
    assert!(
        caught_up.snapshot_index > behind.last_log_index,
        "the follower holds a snapshot past where it stopped ({} <= {})",
        caught_up.snapshot_index,
        behind.last_log_index
    );
    assert!(
        cluster
            .log_of_last_run(follower)
            .contains("installed snapshot"),
        "the restarted follower logged no snapshot install:\n{}",
        cluster.log_tail(follower, 20)
    );
    // An install replaces the whole state: the rules in force came with the snapshot's image.
    assert_eq!(caught_up.apply_rules, RULES, "{caught_up:?}");
    // The follower that installed a snapshot holds the state of those that applied every
    // entry: their digests at one applied index are equal. And a digest is of the state: a
    // write changes it.
    let disagree = replicas_agree(&cluster, Duration::from_secs(30)).await;
    assert!(disagree.is_empty(), "{disagree:?}");
    let digest = cluster.state_digest(leader).await.unwrap();
    assert_eq!(digest.digest.len(), 32, "{digest:?}");
    let client = cluster.client().await.unwrap();
    client.offer(offer_a_to_b("t31-digested")).await.unwrap();
    let after = cluster.state_digest(leader).await.unwrap();
    assert!(after.applied_index > digest.applied_index, "{after:?}");
    assert_ne!(after.digest, digest.digest);

    // Kill the original leader: the restarted follower must now be part of the quorum.
    cluster.kill(leader).unwrap();
    let new_leader = cluster.leader().await.unwrap();
    let acks = assert_all_readable(&cluster, &history).await;
    println!(
        "t31: follower {follower} stopped at log {}, leader went to applied {} (snapshot {}); \
         restarted follower caught up in {catch_up:?} with snapshot {}; after killing leader {leader}, \
         node {new_leader} leads and all {acks} acked ops are readable",
        behind.last_log_index, leader_info.applied_index, leader_info.snapshot_index, caught_up.snapshot_index
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t32_sigkill_of_every_node_under_load_loses_no_acknowledged_operation() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let history = SharedHistory::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..3 {
        let client = cluster.client().await.unwrap();
        let workload = Workload {
            prefix: "t32".into(),
            max_time: Duration::from_secs(60),
            ..Workload::default()
        };
        tasks.push(tokio::spawn(workload::run(
            client,
            task,
            workload,
            history.clone(),
            stop.clone(),
        )));
    }
    let acked = |want: usize, since: Instant| {
        let history = history.clone();
        async move {
            wait::until("acknowledgements", Duration::from_secs(20), || async {
                let acks = lock(&history).acks_since(since);
                if acks >= want {
                    Ok(())
                } else {
                    Err(format!("{acks} acks"))
                }
            })
            .await
            .unwrap()
        }
    };
    acked(60, Instant::now()).await;

    // Power cut: every node dies mid-stream, then the whole cluster comes back from disk.
    let ids = cluster.live_ids();
    for id in &ids {
        cluster.kill(*id).unwrap();
    }
    let killed_at = Instant::now();
    let acked_before = lock(&history).acks.len();
    for id in &ids {
        cluster.restart(*id).await.unwrap();
    }
    let leader = cluster.leader().await.unwrap();
    let back_after = killed_at.elapsed();
    acked(60, killed_at).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .unwrap()
            .unwrap();
    }
    let acks = assert_all_readable(&cluster, &history).await;
    let ambiguous = lock(&history).ambiguous.len();
    println!(
        "t32: all 3 nodes SIGKILLed after {acked_before} acks; restarted, node {leader} leads after {back_after:?}; \
         all {acks} acked ops readable ({ambiguous} ambiguous)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t34_members_build_snapshots_at_staggered_points() {
    // Members 1, 2 and 3 build at 0, 150 and 300 past each multiple of 450
    // (node/src/snapshot_schedule.rs). Under a shared policy all three would build at about
    // the same multiple of 450 and two of them would fail the check below.
    const EVERY: u64 = 450;
    let cluster = Cluster::start(
        3,
        Options {
            snapshot_every: EVERY,
            ..Options::default()
        },
    )
    .await
    .unwrap();
    let leader = cluster.leader().await.unwrap();
    let target = 5 * EVERY;
    let mut writers = Vec::new();
    for writer in 0..2 {
        let client = cluster.client().await.unwrap();
        writers.push(tokio::spawn(async move {
            // Bounded: stopped once the target is applied, long before the last of these.
            for n in 0..10 * EVERY {
                client
                    .offer(offer_a_to_b(format!("t32-{writer}-{n}")))
                    .await
                    .unwrap();
            }
        }));
    }
    let started = Instant::now();
    loop {
        let info = cluster.node_info(leader).await.unwrap();
        if info.applied_index >= target {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the cluster applied only {} of {target} entries in 2 minutes",
            info.applied_index
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for writer in &writers {
        writer.abort();
    }
    // Let every member notice its last point (it checks every 100 ms) and finish the build.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut ids = cluster.live_ids();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3]);
    let mut report = Vec::new();
    for (rank, id) in ids.iter().enumerate() {
        let info = cluster.node_info(*id).await.unwrap();
        let phase = EVERY * rank as u64 / 3;
        let past_point = (info.snapshot_index + EVERY - phase) % EVERY;
        report.push(format!(
            "node {id}: snapshot at {} (its points are {phase} + k*{EVERY}; {past_point} past one)",
            info.snapshot_index
        ));
        assert!(
            info.snapshot_index >= EVERY,
            "node {id} built no snapshot: {report:?}"
        );
        // A build starts up to one check (100 ms) after the point: far less than the 150
        // entries between two members' points at this rate.
        assert!(
            past_point < EVERY / 3,
            "node {id} built off its own points: {report:?}"
        );
    }
    println!("t34: {}", report.join("; "));
}
