//! Claim: a node started on another cluster's data dir is kept out of the running cluster. Here
//! node 3 of a new cluster is restarted on node 3's dir from an earlier cluster, whose term is
//! higher and whose log is longer (the stale disk put back, the deploy mix-up). Raft alone
//! compares terms and positions only: the leader's first AppendEntries to it was answered with
//! the earlier cluster's higher term, the leader stepped down and the cluster went to an election
//! in a term past the stale one, which the stale node's newer log could win. With cluster ids
//! the two sides refuse each other's requests: the cluster keeps its leader, its term and its
//! data, the stale node keeps its own, and `baton status` says CLUSTER MISMATCH (exit 1). The
//! stale node is given routes to nodes 1 and 2, so its own requests (votes in its higher term)
//! reach them and are refused too.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_cluster_test::{cli, client_config, offer_a_to_b, Cluster, Options};
use baton_node::cluster_id::ClusterId;
use baton_node::raft_wire::{self, Kind, Outcome};
use baton_node::types::NodeId;
use futures::{SinkExt, StreamExt};
use openraft::raft::VoteRequest;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_on_another_clusters_data_dir_is_kept_out() {
    // The earlier cluster: a few handovers raise its term above what the new one will have.
    let earlier = Cluster::start(3, Options::default()).await.unwrap();
    let client = earlier.client().await.unwrap();
    for i in 0..5 {
        client
            .offer(offer_a_to_b(format!("t23-earlier-{i}")))
            .await
            .unwrap();
    }
    for _ in 0..4 {
        client.transfer_leader(None).await.unwrap();
        earlier.leader().await.unwrap();
    }
    let earlier_leader = earlier.leader().await.unwrap();
    let earlier_term = earlier.node_info(earlier_leader).await.unwrap().term;
    earlier.wait_all_caught_up().await.unwrap();
    let stash = tempfile::tempdir().unwrap();
    let stale_dir = stash.path().join("node-3");
    let mut earlier = earlier;
    earlier.kill_all().unwrap();
    copy_dir(earlier.data_dir(3).unwrap(), &stale_dir);
    drop(earlier);

    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    if cluster.leader().await.unwrap() == 3 {
        client.transfer_leader(Some(1)).await.unwrap();
    }
    for i in 0..5 {
        client
            .offer(offer_a_to_b(format!("t23-new-{i}")))
            .await
            .unwrap();
    }
    cluster.wait_all_caught_up().await.unwrap();
    let leader = cluster.leader().await.unwrap();
    let term = cluster.node_info(leader).await.unwrap().term;
    assert!(
        earlier_term > term,
        "the stale dir's term {earlier_term} must be ahead of the cluster's {term}"
    );

    cluster.kill(3).unwrap();
    let dir = cluster.data_dir(3).unwrap().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    copy_dir(&stale_dir, &dir);
    // The stale node reaches nodes 1 and 2 (its membership names the earlier cluster's
    // addresses), so both sides' refusals are tried.
    let routes = [1, 2]
        .map(|id| {
            (
                format!("BATON_PEER_ADDRS_{id}"),
                cluster.addr(id).to_string(),
            )
        })
        .to_vec();
    cluster.set_env(3, routes);
    cluster.restart(3).await.unwrap();
    // Several election timeouts and many heartbeats to node 3.
    tokio::time::sleep(Duration::from_secs(4)).await;

    for id in [1, 2] {
        let info = cluster.node_info(id).await.unwrap();
        assert_eq!(
            (info.term, info.leader_id),
            (term, Some(leader)),
            "node {id}: the cluster kept its leader and term"
        );
    }
    let stale = cluster.node_info(3).await.unwrap();
    let own = cluster.node_info(1).await.unwrap();
    assert_eq!(own.cluster_id.len(), 32, "{own:?}");
    assert_eq!(stale.cluster_id.len(), 32, "{stale:?}");
    assert_ne!(stale.cluster_id, own.cluster_id);
    assert!(
        stale.term >= earlier_term,
        "node 3 keeps the earlier cluster's term: {stale:?}"
    );
    client
        .offer(offer_a_to_b("t23-after"))
        .await
        .expect("the cluster still writes with nodes 1 and 2");
    for i in 0..5 {
        client.ticket(&format!("t23-new-{i}")).await.unwrap();
    }
    assert!(client.ticket("t23-earlier-0").await.is_err());

    let endpoints = cluster.endpoints().join(",");
    let status = cli::run(
        cluster.bin(),
        &["--endpoints", &endpoints, "--timeout", "3s", "status"],
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(status.code, Some(1), "{status}");
    assert!(
        status.stderr.contains("CLUSTER MISMATCH")
            && status
                .stderr
                .contains(&format!("{} on [1, 2]", own.cluster_id))
            && status
                .stderr
                .contains(&format!("{} on [3]", stale.cluster_id)),
        "{status}"
    );
    let log = cluster.log_of_last_run(3);
    assert!(
        log.contains("peer request refused") && log.contains(&own.cluster_id),
        "node 3 says why it refuses the leader's requests"
    );
    let refusing = [1, 2].into_iter().filter(|id| {
        let log = cluster.log_of_last_run(*id);
        log.contains("peer request refused") && log.contains(&stale.cluster_id)
    });
    assert!(
        refusing.count() >= 1,
        "nodes 1 and 2 refuse the stale node's requests, and say why"
    );
}

/// Copies directory `from` to `to` (which must not exist), as it is on disk.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// Claim: a new node refuses a vote request carrying a cluster id it has not joined (a stale
/// candidate must not win a new node's vote); initialization has every member join the new
/// cluster before the first election and fails, naming who did not answer, when one does not;
/// run again through another node once they are up, it mints another id, which the node that
/// minted the first one takes instead (its log is still empty), and every member ends up in
/// one cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialization_has_a_majority_join_first_and_new_nodes_refuse_unjoined_votes() {
    let mut cluster = Cluster::start_uninitialized(3, Options::default())
        .await
        .unwrap();
    // Not connected to a leader: there is none yet.
    let admin = baton_rpc::Client::new(&cluster.endpoints(), client_config()).unwrap();
    let members: Vec<(u64, String)> = (1..=3)
        .map(|id| (id, cluster.addr(id).to_string()))
        .collect();

    // A stale candidate of another cluster asks node 2 for its vote in term 9.
    let stale = raft_wire::Header {
        cluster: Some(ClusterId::random()),
        to: 2,
    };
    let vote: VoteRequest<NodeId> = VoteRequest::new(openraft::Vote::new(9, 3), None);
    let mut stream = TcpStream::connect(cluster.addr(2)).await.unwrap();
    stream.write_all(&raft_wire::PREAMBLE).await.unwrap();
    let mut link = raft_wire::link(Box::new(stream));
    link.send(raft_wire::request(Kind::Vote, stale, &vote).unwrap())
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), link.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let (outcome, why) = raft_wire::parse_answer(answer.freeze()).unwrap();
    let why = String::from_utf8_lossy(&why);
    assert_eq!(outcome, Outcome::Failed, "{why}");
    assert!(why.contains("has not joined"), "{why}");
    let node_2 = cluster.node_info(2).await.unwrap();
    assert_eq!(
        (node_2.term, node_2.cluster_id.as_str()),
        (0, ""),
        "{node_2:?}"
    );

    // Two of three members down: no majority can join, so nothing is initialized.
    cluster.kill(2).unwrap();
    cluster.kill(3).unwrap();
    let refused = admin.initialize(cluster.addr(1), &members).await;
    let text = format!("{refused:?}");
    assert!(
        text.contains("2 of the 3 members did not join") && text.contains("node 2"),
        "{text}"
    );
    let node_1 = cluster.node_info(1).await.unwrap();
    assert!(!node_1.initialized, "{node_1:?}");
    let minted = node_1.cluster_id.clone();
    assert_eq!(minted.len(), 32);

    // Up again, and run through node 2: another id, which node 1 takes instead of its own.
    cluster.restart(2).await.unwrap();
    cluster.restart(3).await.unwrap();
    admin.initialize(cluster.addr(2), &members).await.unwrap();
    cluster.leader().await.unwrap();
    let client = cluster.client().await.unwrap();
    client
        .offer(offer_a_to_b("t23-formed"))
        .await
        .expect("the cluster writes");
    cluster.wait_all_caught_up().await.unwrap();
    let formed = cluster.node_info(2).await.unwrap().cluster_id;
    assert_ne!(formed, minted);
    for id in 1..=3 {
        let info = cluster.node_info(id).await.unwrap();
        assert_eq!(info.cluster_id, formed, "node {id}");
    }
}
