//! Claim: SIGKILL of the leader under a stream of offers, takes and replies loses no
//! acknowledged operation, and the cluster serves again through a new leader
//! (contract §0 "retries are safe", architecture "quorum durable before commit").
//!
//! Four client tasks run offer -> take -> reply chains on their own keys and record every
//! acknowledgement. Three times, mid-stream, the leader is killed; once the new leader has
//! acknowledged a batch of operations the killed node is restarted, so the next kill leaves it as
//! half of the quorum. Infrastructure errors during a failover are allowed — they are ambiguous,
//! not acknowledgements — but a contract refusal is not: the tasks own their keys, so a `TAKEN`
//! here would be a retried take turned against its own winner.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_cluster_test::history::{lock, verify_live, SharedHistory};
use baton_cluster_test::workload::{self, Workload};
use baton_cluster_test::{wait, Cluster, Options};

const TASKS: usize = 4;
const KILLS: usize = 3;
/// Acknowledgements to collect before each kill, and from the new leader after it.
const BATCH: usize = 50;

async fn acks_since(history: &SharedHistory, since: Instant, want: usize, what: &str) {
    wait::until(what, Duration::from_secs(20), || async {
        let acks = lock(history).acks_since(since);
        if acks >= want {
            Ok(())
        } else {
            Err(format!("{acks} acks"))
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_leader_sigkill_under_load_loses_no_acknowledged_operation() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let history = SharedHistory::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = cluster.client().await.unwrap();
        let workload = Workload {
            prefix: "t20".into(),
            max_time: Duration::from_secs(90),
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

    let mut failovers = Vec::new();
    for kill in 0..KILLS {
        acks_since(
            &history,
            Instant::now(),
            BATCH,
            "acknowledgements before the kill",
        )
        .await;
        let old_leader = cluster.leader().await.unwrap();
        let killed_at = Instant::now();
        cluster.kill(old_leader).unwrap();
        let new_leader = cluster.leader().await.unwrap();
        let elected = killed_at.elapsed();
        assert_ne!(new_leader, old_leader);
        acks_since(
            &history,
            killed_at,
            BATCH,
            "acknowledgements after the kill",
        )
        .await;
        let gap =
            lock(&history).longest_gap(killed_at - Duration::from_millis(500), Instant::now());
        println!(
            "t20: kill {}: leader {old_leader} killed, node {new_leader} leads after {elected:?}, \
             longest stretch without an acknowledged write {gap:?}",
            kill + 1
        );
        failovers.push(gap);
        cluster.restart(old_leader).await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .unwrap()
            .unwrap();
    }

    let client = cluster.client().await.unwrap();
    let verified = verify_live(&client, &history).await.unwrap();
    let converged_at = cluster.wait_all_caught_up().await.unwrap();
    let history = lock(&history);
    let (offers, takes, replies) = history.counts();
    println!(
        "t20: {KILLS} leader kills, longest write gaps {failovers:?}; acked {offers} offers {takes} takes \
         {replies} replies, {} ambiguous, every acked op present in the final snapshot of {} tickets; \
         all 3 nodes applied index {converged_at}",
        verified.ambiguous, verified.tickets
    );
}

/// A new leader commits one entry of its own term before it serves reads; the reads that arrive
/// together right after the election share that entry instead of proposing one each (a leader
/// without a quorum would otherwise pile one up in its log per read).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t20_the_first_reads_of_a_new_leader_share_one_barrier_entry() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let old = cluster.leader().await.unwrap();
    let term = cluster.node_info(old).await.unwrap().term;
    cluster.kill(old).unwrap();
    let others: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old).collect();
    let leader = cluster
        .new_leader(&others, term, Duration::from_secs(20))
        .await
        .unwrap();
    let client = baton_rpc::Client::new(
        &[cluster.addr(leader).to_string()],
        baton_cluster_test::client_config(),
    )
    .unwrap();
    let before = cluster.node_info(leader).await.unwrap().last_log_index;
    let reads: Vec<_> = (0..50)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.tasks().await })
        })
        .collect();
    for read in reads {
        read.await.unwrap().unwrap();
    }
    let after = cluster.node_info(leader).await.unwrap().last_log_index;
    // One barrier entry, and room for a sweep the leader may propose meanwhile.
    assert!(
        after - before <= 3,
        "50 reads appended {} entries",
        after - before
    );
}
