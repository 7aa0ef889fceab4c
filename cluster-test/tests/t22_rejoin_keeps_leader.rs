//! Claim: a follower cut off from the others and then reconnected does not depose a leader that
//! a majority kept hearing all along. While it is cut off it asks before it campaigns (pre-vote)
//! and nobody answers, so it never raises its term; once back, it simply follows again, and the
//! leader keeps its role and its term. Without the pre-vote it would campaign every election
//! timeout, each time with a higher term, and its first answer after the heal would make the
//! leader step down and the cluster go through an election it did not need.
//!
//! And a follower cut off from the leader alone, still reaching the other follower, gets no yes
//! from it: that follower still hears from the leader. (Nothing is written meanwhile, so both
//! followers' logs are equal and only the leader's lease stands in the way.)
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use baton_cluster_test::{offer_a_to_b, wait, Cluster, Options};

/// What a node logs each time it holds a pre-vote (`node/src/pre_vote.rs`).
const PRE_VOTE_LOG: &str = "holding a pre-vote";

/// What it logs when a pre-vote found no quorum, so that it does not stand.
const NOT_STANDING_LOG: &str = "no quorum would vote for this node; not standing";

/// A three-node cluster whose peer links run through proxies, its leader and term, and how much
/// each node had logged once it settled (what it logs later is what the checks read).
struct Setup {
    cluster: Cluster,
    leader: u64,
    term: u64,
    logged: BTreeMap<u64, usize>,
}

async fn proxied_cluster() -> Setup {
    let cluster = Cluster::start(3, Options::proxied()).await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let term = cluster.node_info(leader).await.unwrap().term;
    cluster.wait_all_caught_up().await.unwrap();
    let logged = cluster
        .ids()
        .into_iter()
        .map(|id| (id, cluster.log_of_last_run(id).len()))
        .collect();
    Setup {
        cluster,
        leader,
        term,
        logged,
    }
}

impl Setup {
    /// Waits (30 s at most) until node `id` has held a pre-vote since the setup and been
    /// refused it: the cut was long enough for it to try to stand, so its unchanged term says
    /// the pre-vote held it back.
    async fn wait_refused_pre_vote(&self, id: u64) {
        let what = format!("node {id} to hold a pre-vote and be refused");
        wait::until(&what, Duration::from_secs(30), || {
            let log = self.cluster.log_of_last_run(id);
            let since = log.get(self.logged[&id]..).unwrap_or_default();
            let refused = since.contains(PRE_VOTE_LOG) && since.contains(NOT_STANDING_LOG);
            async move {
                refused
                    .then_some(())
                    .ok_or_else(|| "no refused pre-vote logged yet".to_string())
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.cluster.log_tail(id, 20)));
    }

    /// Heals every link, has a write go through, and asserts that every node follows the leader
    /// in its term a second later (time for a deposing answer to arrive) and that none of
    /// `steady`, which heard from the leader all along, held a pre-vote since the setup.
    /// Returns the index all reached.
    async fn assert_leader_kept(&self, steady: &[u64]) -> u64 {
        let (cluster, leader, term) = (&self.cluster, self.leader, self.term);
        cluster.network().unwrap().heal_all();
        let client = cluster.client().await.unwrap();
        client.offer(offer_a_to_b("t22-healed")).await.unwrap();
        let index = cluster.wait_all_caught_up().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        for id in cluster.ids() {
            let info = cluster.node_info(id).await.unwrap();
            assert_eq!(
                (info.leader_id, info.term),
                (Some(leader), term),
                "node {id} after the heal: leader {:?} in term {}, expected node {leader} in term \
                 {term}",
                info.leader_id,
                info.term
            );
        }
        for id in steady {
            let log = cluster.log_of_last_run(*id);
            let since = log
                .get(self.logged[id]..)
                .expect("the node's log only grew since the setup");
            assert!(
                !since.contains(PRE_VOTE_LOG),
                "node {id} held a pre-vote though it heard from the leader all along"
            );
        }
        index
    }
}

/// A follower cut off from both others tries to stand, finds no quorum, keeps its term, and
/// once reconnected follows the leader, which keeps its role and term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t22_a_reconnected_follower_does_not_depose_the_leader() {
    let setup = proxied_cluster().await;
    let (cluster, leader, term) = (&setup.cluster, setup.leader, setup.term);
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let client = cluster.client().await.unwrap();

    cluster.network().unwrap().isolate(follower);
    // Many election timeouts (300-600 ms in these tests) pass; the majority keeps committing.
    for i in 0..6 {
        client
            .offer(offer_a_to_b(format!("t22-cut-{i}")))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    setup.wait_refused_pre_vote(follower).await;
    let cut_off = cluster.node_info(follower).await.unwrap();
    assert_eq!(
        cut_off.term, term,
        "the cut-off follower raised its term to {} from {term} without a quorum's pre-vote",
        cut_off.term
    );

    let steady: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != follower)
        .collect();
    let index = setup.assert_leader_kept(&steady).await;
    let rejoined = cluster.node_info(follower).await.unwrap();
    assert_eq!(rejoined.role, "follower");
    assert!(rejoined.applied_index >= index, "{rejoined:?}");
    println!(
        "t22: follower {follower} was cut off for ~3 s and rejoined; node {leader} still leads in \
         term {term}"
    );
}

/// A follower cut off from the leader alone tries to stand and gets no yes from the other
/// follower, which still hears the leader: no term moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t22_a_follower_cut_off_from_the_leader_alone_gets_no_yes_from_the_other() {
    let setup = proxied_cluster().await;
    let (cluster, leader, term) = (&setup.cluster, setup.leader, setup.term);
    let followers: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    let (cut, other) = (followers[0], followers[1]);

    let network = cluster.network().unwrap();
    network.cut(leader, cut);
    network.cut(cut, leader);
    tokio::time::sleep(Duration::from_secs(3)).await;
    setup.wait_refused_pre_vote(cut).await;
    let cut_off = cluster.node_info(cut).await.unwrap();
    assert_eq!(
        cut_off.term, term,
        "node {cut}, cut off from the leader only, stood for election (term {} from {term}): \
         node {other} said yes while it still heard from the leader",
        cut_off.term
    );

    setup.assert_leader_kept(&[leader, other]).await;
    println!(
        "t22: node {cut} lost its link to leader {leader} for 3 s; node {other} refused it, and \
         node {leader} still leads in term {term}"
    );
}
