//! Claim: a leader that commits nothing is replaced even though its followers still hear from
//! it. With its links slower than its AppendEntries deadline (the 50 ms heartbeat), every request
//! it sends arrives and every answer comes too late; its followers see it hold entries it never
//! commits, stop taking its messages, and elect one of themselves while the links are still slow,
//! after which writes succeed again. And the same watch leaves a working leader alone: with one
//! follower's links as slow, or every link a little slow, the leader keeps committing and keeps
//! its term.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_cluster_test::{wait, Cluster, Options};
use baton_statemachine::handoff::OfferArgs;
use tokio::time::Instant;

/// Each way, well over the 50 ms AppendEntries deadline.
const SLOW: Duration = Duration::from_millis(200);

/// A leader whose followers see it stall is replaced in their first round of refusals, within
/// this: at the tests' timings (600 ms leases, 300–600 ms election timeouts) the stall is judged
/// after 1.2 s and an election follows within a lease and a timeout (2–4.3 s in all). Had the
/// first round failed, the second would start after the 2.4 s refusal and a new 1.2 s limit, and
/// elect no sooner than about 5 s.
const ONE_ROUND: Duration = Duration::from_secs(5);

/// What a node logs when it starts refusing a stalled leader's messages.
const STALLED: &str = "leader stalled";

fn offer(key: String) -> OfferArgs {
    OfferArgs {
        key,
        from: "src".into(),
        to: "dst".into(),
        payload: Vec::new(),
        reply_to: "src".into(),
        ttl_ms: 60_000,
    }
}

/// A client that gives up on an attempt after a second and on a request after three.
fn impatient(cluster: &Cluster) -> baton_rpc::Client {
    let config = baton_rpc::ClientConfig {
        deadline: Duration::from_secs(3),
        attempt_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_millis(500),
    };
    baton_rpc::Client::new(&cluster.endpoints(), config).unwrap()
}

/// Offers fresh tickets one after another until `stop`, for at most `limit`; counts the ones
/// acknowledged in `acked`. The load gives a leader something to commit.
fn write_in_background(
    client: baton_rpc::Client,
    prefix: &'static str,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    limit: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) && started.elapsed() < limit {
            n += 1;
            if client.offer(offer(format!("{prefix}-{n}"))).await.is_ok() {
                acked.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Slows every link to and from `id`, both ways.
fn slow_links_of(cluster: &Cluster, id: u64, delay: Duration) {
    let network = cluster.network().unwrap();
    for other in cluster.ids().into_iter().filter(|other| *other != id) {
        network.slow(id, other, delay);
        network.slow(other, id, delay);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t73_a_leader_with_slow_links_is_replaced_while_they_stay_slow() {
    let cluster = Cluster::start(3, Options::proxied()).await.unwrap();
    let old = cluster.leader().await.unwrap();
    let old_term = cluster.node_info(old).await.unwrap().term;
    let client = impatient(&cluster);
    client.offer(offer("before".into())).await.unwrap();

    slow_links_of(&cluster, old, SLOW);
    let slowed_at = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let writer = write_in_background(
        impatient(&cluster),
        "during",
        stop.clone(),
        acked.clone(),
        Duration::from_secs(40),
    );

    // The followers elect one of themselves at a higher term, the old leader's links still slow.
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old).collect();
    let new = cluster
        .new_leader(&followers, old_term, Duration::from_secs(30))
        .await;
    let took = slowed_at.elapsed();
    let new = match new.and_then(|new| {
        anyhow::ensure!(
            took < ONE_ROUND,
            "node {new} took over after {took:?}, not within one refusal"
        );
        Ok(new)
    }) {
        Ok(new) => new,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            let views = [old, followers[0], followers[1]]
                .map(|id| format!("node {id}:\n{}", cluster.log_tail(id, 15)));
            panic!("{e:#}\n{}", views.join("\n"));
        }
    };

    // It was the watch that deposed it.
    assert!(
        followers
            .iter()
            .any(|id| cluster.log_of_last_run(*id).contains(STALLED)),
        "no follower judged leader {old} stalled"
    );

    // Writes succeed again with the slow links still in place.
    wait::until("a write acknowledged", Duration::from_secs(15), || {
        let client = &client;
        async move {
            client
                .offer(offer("after".into()))
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await
    .unwrap();
    wait::until(
        "the background writer acknowledged",
        Duration::from_secs(15),
        || {
            let acked = acked.load(Ordering::Relaxed);
            async move {
                if acked > 0 {
                    Ok(())
                } else {
                    Err("no offer acknowledged yet".to_string())
                }
            }
        },
    )
    .await
    .unwrap();
    let acked_while_slow = acked.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();

    // Once the links are fast the old leader follows the new one and catches up.
    cluster.network().unwrap().heal_all();
    cluster.wait_all_caught_up().await.unwrap();
    let old_view = cluster.node_info(old).await.unwrap();
    assert_eq!(old_view.role, "follower", "{old_view:?}");
    client.ticket("before").await.unwrap();
    client.ticket("after").await.unwrap();
    println!(
        "t73: leader {old} (term {old_term}) with links {SLOW:?} slower each way; node {new} \
         took over after {took:?}; {acked_while_slow} background offers acknowledged while slow"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t73_a_leader_with_slow_links_serving_only_reads_is_replaced_too() {
    let cluster = Cluster::start(3, Options::proxied()).await.unwrap();
    let old = cluster.leader().await.unwrap();
    let old_term = cluster.node_info(old).await.unwrap().term;
    let client = impatient(&cluster);
    client.offer(offer("read-me".into())).await.unwrap();
    // The first read of a term commits an entry of the term first (node.rs,
    // `commit_in_current_term`): done here, so that later reads are read-index rounds only.
    client.ticket("read-me").await.unwrap();

    // Only reads from here on: the leader has nothing of its own to commit (the offer's deadline
    // and the sweeper's session sweep are a minute away), so its failed read-index rounds must
    // give the followers an entry to see it stall on.
    slow_links_of(&cluster, old, SLOW);
    let slowed_at = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (client, stop) = (impatient(&cluster), stop.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(40) {
                let _ = client.ticket("read-me").await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old).collect();
    let new = cluster
        .new_leader(&followers, old_term, Duration::from_secs(30))
        .await;
    stop.store(true, Ordering::Relaxed);
    reader.await.unwrap();
    let new = new.unwrap();
    let took = slowed_at.elapsed();
    assert!(
        took < ONE_ROUND,
        "node {new} took over after {took:?}, not within one refusal"
    );
    let read_again = wait::until("a read answered", Duration::from_secs(15), || {
        let client = &client;
        async move { client.ticket("read-me").await.map_err(|e| e.to_string()) }
    })
    .await;
    assert!(read_again.is_ok(), "{read_again:?}");
    let read_again = slowed_at.elapsed();
    cluster.network().unwrap().heal_all();
    println!(
        "t73: leader {old} (term {old_term}) with links {SLOW:?} slower, serving only reads; \
         node {new} took over after {took:?}; reads succeeded again after {read_again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t73_a_working_leader_keeps_its_term_when_a_follower_or_every_link_is_slow() {
    let cluster = Cluster::start(3, Options::proxied()).await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let term = cluster.node_info(leader).await.unwrap().term;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let writer = write_in_background(
        impatient(&cluster),
        "load",
        stop.clone(),
        acked.clone(),
        Duration::from_secs(30),
    );

    // One follower's links as slow as the stalled leader's above, for five stall limits: its
    // copies of the entries come late, but the leader commits them with the other follower.
    slow_links_of(&cluster, follower, SLOW);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let one_slow = acked.swap(0, Ordering::Relaxed);
    cluster.network().unwrap().heal_all();

    // Every link a little slow: round trips stay within the deadline.
    for id in cluster.ids() {
        slow_links_of(&cluster, id, Duration::from_millis(10));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let all_slow = acked.load(Ordering::Relaxed);
    cluster.network().unwrap().heal_all();
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();

    for id in cluster.ids() {
        let info = cluster.node_info(id).await.unwrap();
        assert_eq!(info.term, term, "node {id} moved to another term: {info:?}");
        // Not even the slow follower judged the leader stalled (and refused its entries).
        let log = cluster.log_of_last_run(id);
        assert!(
            !log.contains(STALLED),
            "node {id} judged the leader stalled:\n{log}"
        );
    }
    assert_eq!(cluster.leader().await.unwrap(), leader);
    assert!(
        one_slow > 0 && all_slow > 0,
        "{one_slow} / {all_slow} offers acknowledged"
    );
    println!(
        "t73: leader {leader} kept term {term}: {one_slow} offers acknowledged in 6 s with \
         follower {follower}'s links {SLOW:?} slower, {all_slow} in 4 s with every link 10 ms \
         slower"
    );
}
