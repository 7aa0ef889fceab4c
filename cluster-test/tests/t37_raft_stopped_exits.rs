//! Claim: a node whose Raft stops on an error it cannot go on from (a storage error: here the
//! leader's snapshot file, damaged on disk, read to bring a new learner up to date) exits with a
//! failure instead of lingering — answering `NodeInfo` and every health probe that only asks
//! whether it answers, while it can serve nothing — so that its supervisor restarts it; the other
//! two go on without it.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use baton_cluster_test::{wait, Cluster, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t37_a_node_whose_raft_stops_on_a_storage_error_exits() {
    // Snapshots every 50 entries and a short log behind them: a new learner needs a snapshot.
    let options = Options {
        snapshot_every: 50,
        keep_logs: 10,
        ..Options::default()
    };
    let mut cluster = Cluster::start(3, options).await.unwrap();
    let client = cluster.client().await.unwrap();
    let mut n = 0;
    let mut tries = 0;
    let leader = loop {
        tries += 1;
        assert!(tries <= 10, "leadership kept moving: no leader to damage");
        let leader = cluster.leader().await.unwrap();
        let image = cluster
            .data_dir(leader)
            .unwrap()
            .join("db")
            .join("raft-snapshot");
        while !image.exists() {
            n += 1;
            client.write_fenced("t37", n, b"v").await.unwrap();
            assert!(n < 2_000, "the leader built no snapshot");
        }
        // Let the snapshot being written land (and the log behind it be purged, so the learner
        // needs the snapshot), then damage it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(&image, b"not an image").unwrap();
        // Leadership that moved meanwhile (a loaded machine) would send the learner another
        // node's snapshot: damage the new leader's too.
        if cluster.leader().await.unwrap() == leader {
            break leader;
        }
    };

    let learner = cluster.add_node().await.unwrap();
    let addr = cluster.addr(learner).to_string();
    let admin = cluster.client().await.unwrap();
    // It may never be answered: the leader that would bring the learner up to date is the one
    // that fails.
    let adding = tokio::spawn(async move { admin.add_learner(learner, &addr).await });

    let started = Instant::now();
    let status = loop {
        if let Some(status) = cluster.exit_status(leader).unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node {leader} still runs with a damaged snapshot; its log:\n{}",
            cluster.log_tail(leader, 20)
        );
        tokio::time::sleep(wait::POLL).await;
    };
    adding.abort();
    let log = cluster.log_tail(leader, 40);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("Raft has stopped"), "{log}");
    assert!(log.contains("damaged"), "{log}");

    // The other two elect a leader and go on.
    let writes = cluster.client().await.unwrap();
    writes
        .write_fenced("t37", 1_000_000, b"after")
        .await
        .unwrap();
    let now = cluster.leader().await.unwrap();
    assert_ne!(now, leader);
    println!(
        "t37: node {leader} exited ({status}) {:?} after the learner was added",
        started.elapsed()
    );
}
