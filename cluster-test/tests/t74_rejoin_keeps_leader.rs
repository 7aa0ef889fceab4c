//! Claim: a follower cut off from the others and then reconnected does not depose a leader that
//! a majority kept hearing all along. While it is cut off it asks before it campaigns (pre-vote)
//! and nobody answers, so it never raises its term; once back, it simply follows again, and the
//! leader keeps its role and its term. Without the pre-vote it would campaign every election
//! timeout, each time with a higher term, and its first answer after the heal would make the
//! leader step down and the cluster go through an election it did not need.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_cluster_test::{offer_a_to_b, Cluster, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t74_a_reconnected_follower_does_not_depose_the_leader() {
    let options = Options {
        proxied: true,
        ..Options::default()
    };
    let cluster = Cluster::start(3, options).await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let term = cluster.node_info(leader).await.unwrap().term;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let client = cluster.client().await.unwrap();

    cluster.network().unwrap().isolate(follower);
    // Many election timeouts (200-400 ms by default) pass; the majority keeps committing.
    for i in 0..6 {
        client
            .offer(offer_a_to_b(format!("t74-cut-{i}")))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let cut_off = cluster.node_info(follower).await.unwrap();
    assert_eq!(
        cut_off.term, term,
        "the cut-off follower raised its term to {} from {term} without a quorum's pre-vote",
        cut_off.term
    );

    cluster.network().unwrap().heal_all();
    client.offer(offer_a_to_b("t74-healed")).await.unwrap();
    let index = cluster.wait_all_caught_up().await.unwrap();
    // Give a deposing answer time to arrive: heartbeats go out every 50 ms.
    tokio::time::sleep(Duration::from_secs(1)).await;

    for id in cluster.ids() {
        let info = cluster.node_info(id).await.unwrap();
        assert_eq!(
            (info.leader_id, info.term),
            (Some(leader), term),
            "node {id} after the heal: leader {:?} in term {}, expected node {leader} in term {term}",
            info.leader_id,
            info.term
        );
    }
    let rejoined = cluster.node_info(follower).await.unwrap();
    assert_eq!(rejoined.role, "follower");
    assert!(rejoined.applied_index >= index, "{rejoined:?}");
    println!(
        "t74: follower {follower} was cut off for ~3 s and rejoined; node {leader} still leads in \
         term {term}"
    );
}
