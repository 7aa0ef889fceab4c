//! Claim: the deployment in `deploy/` works as shipped (issue 7). The image built FROM scratch
//! by `deploy/image.sh` runs, `deploy/docker-compose.yml` forms a three-node cluster through its
//! `init` service, a client on the host reaches it through the published ports — including by
//! following a follower's `NOT_LEADER` redirect to the leader's advertised address — and a node
//! whose container is stopped (SIGTERM) and started again comes back with its data from its
//! volume while the others keep serving writes.
//!
//! Skipped (with a message) where no Docker engine answers; `BATON_REQUIRE_DOCKER=1` makes that
//! a failure. The cluster runs under a compose project of its own on free ports and is removed
//! (`down -v`) however the test ends.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use baton_cluster_test::docker::{self, DockerCluster};
use baton_cluster_test::robustness::target::Target;
use baton_cluster_test::{cli, client_config};
use baton_rpc::Client;
use baton_statemachine::handoff::{OfferArgs, Ticket};

fn offer(key: &str) -> OfferArgs {
    OfferArgs {
        key: key.to_string(),
        from: "ci".into(),
        to: "deployer".into(),
        payload: key.as_bytes().to_vec(),
        reply_to: "ci".into(),
        ttl_ms: 10 * 60 * 1000,
    }
}

/// Offers `keys` through `client`, one at a time.
async fn offer_all(client: &Client, keys: &[String]) -> anyhow::Result<()> {
    for key in keys {
        client.offer(offer(key)).await?;
    }
    Ok(())
}

/// Requires every key in `keys` to be an offered ticket, read through `client`.
async fn require_all(client: &Client, keys: &[String]) -> anyhow::Result<()> {
    let tickets: Vec<Ticket> = client.tickets().await?.tickets;
    for key in keys {
        let found = tickets.iter().any(|t| &t.key == key && t.generation == 1);
        anyhow::ensure!(found, "ticket {key} is missing after the restart");
    }
    Ok(())
}

async fn scenario(cluster: &mut DockerCluster) -> anyhow::Result<()> {
    let endpoints = cluster.endpoints();
    let client = Client::connect_with(&endpoints, client_config()).await?;
    let before: Vec<String> = (0..20).map(|i| format!("before-{i}")).collect();
    offer_all(&client, &before).await?;

    // A client that knows only a follower: its write is redirected to the leader's advertised
    // address, which must be one the host can dial.
    let leader = cluster.leader().await?;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let via_follower = Client::connect_with(&[cluster.addr(follower)], client_config()).await?;
    via_follower.offer(offer("via-follower")).await?;

    // The command line on the host sees the whole cluster and a leader (each member at the
    // address it advertises).
    let bin = baton_cluster_test::binary::baton_bin()?;
    let status = cli::run(
        &bin,
        &[
            "status",
            "--endpoints",
            &endpoints.join(","),
            "--timeout",
            "5s",
        ],
        std::time::Duration::from_secs(20),
    )
    .await?;
    let rows = status
        .stdout
        .lines()
        .filter(|l| l.contains("127.0.0.1:"))
        .count();
    anyhow::ensure!(
        status.code == Some(0)
            && rows == 3
            && !status.stdout.contains("unreachable")
            && status.stdout.contains("leader: node "),
        "baton status from the host must reach three members and name a leader: {status}"
    );

    // Stop the leader's container gracefully; the other two elect a leader and take writes.
    let stopped_at = cluster.node_info(leader).await?.last_log_index;
    cluster.stop(leader).await?;
    let during: Vec<String> = (0..10).map(|i| format!("during-{i}")).collect();
    offer_all(&client, &during).await?;

    // Started again, it still has everything it had logged: its volume kept its data.
    cluster.restart(leader).await?;
    let info = cluster.node_info(leader).await?;
    anyhow::ensure!(
        info.initialized && info.last_log_index >= stopped_at,
        "node {leader} came back without its data: initialized={} last_log_index={} (had {stopped_at})",
        info.initialized,
        info.last_log_index
    );
    cluster.wait_all_caught_up().await?;

    let after: Vec<String> = (0..10).map(|i| format!("after-{i}")).collect();
    offer_all(&client, &after).await?;
    let mut all = before;
    all.extend(during);
    all.extend(after);
    all.push("via-follower".into());
    require_all(&client, &all).await?;
    println!(
        "t90: stopped and restarted node {leader} (the leader; it had logged index {stopped_at}, \
         came back at {}); {} tickets present; writes served throughout",
        info.last_log_index,
        all.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t90_compose_cluster_keeps_data_across_a_container_restart() {
    let Some(engine) = docker::engine_or_skip("t90").await.unwrap() else {
        return;
    };
    let started = Instant::now();
    let mut cluster = DockerCluster::start(engine).await.unwrap();
    println!(
        "t90: compose project {} ({} on engine {}) up in {:.1}s",
        cluster.project(),
        cluster.engine().compose_command(),
        cluster.engine().server_version,
        started.elapsed().as_secs_f64()
    );
    if let Err(error) = scenario(&mut cluster).await {
        eprintln!("{}", cluster.logs(40).await);
        panic!("{error:#}");
    }
    drop(cluster);
    println!(
        "t90: done in {:.1}s (including image build and teardown)",
        started.elapsed().as_secs_f64()
    );
}
