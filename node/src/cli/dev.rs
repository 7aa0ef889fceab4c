//! `baton dev`: a local three-node cluster in one process, for trying Baton out.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_rpc::{Client, ClientConfig};
use clap::Args;
use tokio::sync::watch;

use super::{exit, shutdown_signal, TuningArgs};

/// How many nodes `baton dev` runs.
pub const NODES: u64 = 3;

/// Arguments of `baton dev`.
#[derive(Args, Debug)]
pub struct DevArgs {
    /// Where the three nodes keep their data (`node-1`, `node-2`, `node-3` inside).
    #[arg(long, default_value = "./.baton/dev")]
    data_dir: PathBuf,
    /// First of the three consecutive ports on 127.0.0.1 (1-65533).
    #[arg(long, default_value_t = 7001, value_parser = clap::value_parser!(u16).range(1..=65533))]
    base_port: u16,
    #[command(flatten)]
    tuning: TuningArgs,
}

pub async fn run(args: DevArgs) -> u8 {
    let (stop_tx, stop_rx) = watch::channel(false);
    // Settings that cannot be used are said before anything else is done.
    let mut configs = Vec::new();
    for id in 1..=NODES {
        // (The flag's range leaves room for the three.)
        let port = args.base_port + (id as u16 - 1);
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let data_dir = args.data_dir.join(format!("node-{id}"));
        match args.tuning.node_config(id, listen, data_dir) {
            Ok(config) => configs.push(config),
            Err(why) => {
                eprintln!("baton dev: {why}");
                return exit::USAGE;
            }
        }
    }
    // Every port is bound before any node starts: a port in use (another `baton dev`, the
    // Docker cluster of deploy/up.sh) is said at once, and no other cluster answering there is
    // mistaken for this one.
    let mut listeners = Vec::new();
    for config in configs {
        let listen = config.listen;
        match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => listeners.push((config, listener)),
            Err(e) => {
                eprintln!(
                    "baton dev: cannot listen on {listen}: {e} (is another `baton dev` or \
                     deploy/up.sh running? --base-port picks other ports)"
                );
                return exit::FAILURE;
            }
        }
    }
    baton_node::descriptors::raise_for(
        listeners
            .iter()
            .map(|(config, _)| config.limits.max_connections)
            .sum(),
    );
    let mut nodes = tokio::task::JoinSet::new();
    let mut endpoints = Vec::new();
    for (mut config, listener) in listeners {
        endpoints.push(config.listen.to_string());
        // All three stop together on Ctrl-C: no voter would be left to take leadership over.
        config.hand_over_on_shutdown = false;
        let mut stop = stop_rx.clone();
        let shutdown = async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        };
        nodes.spawn(baton_node::server::serve(config, listener, shutdown));
    }

    // A node that cannot start (its data locked by another `baton dev`, unreadable, another
    // node's) is said at once, not after the wait for the cluster gives up.
    let ready = tokio::select! {
        ready = form_cluster(&endpoints, &args.data_dir) => ready,
        Some(ended) = nodes.join_next() => Err(node_ended(ended)),
        _ = shutdown_signal() => Err("interrupted before the cluster was ready".to_string()),
    };
    let mut code = match ready {
        Ok(leader) => {
            say(
                std::io::stdout().lock(),
                format_args!(
                    "baton dev: ready, endpoints {} (leader {leader}, data in {})",
                    endpoints.join(","),
                    args.data_dir.display()
                ),
            );
            say(
                std::io::stdout().lock(),
                format_args!("baton dev: press Ctrl-C to stop"),
            );
            tokio::select! {
                _ = shutdown_signal() => exit::OK,
                Some(ended) = nodes.join_next() => {
                    say(
                        std::io::stderr().lock(),
                        format_args!("baton dev: {}; stopping the others", node_ended(ended)),
                    );
                    exit::FAILURE
                }
            }
        }
        Err(why) => {
            say(std::io::stderr().lock(), format_args!("baton dev: {why}"));
            exit::FAILURE
        }
    };
    let _ = stop_tx.send(true);
    while let Some(ended) = nodes.join_next().await {
        if !matches!(ended, Ok(Ok(()))) {
            say(
                std::io::stderr().lock(),
                format_args!("baton dev: {}", node_ended(ended)),
            );
            code = exit::FAILURE;
        }
    }
    say(std::io::stdout().lock(), format_args!("baton dev: stopped"));
    code
}

/// Writes a line of `baton dev`'s progress to `out` (its stdout or stderr). A reader that went
/// away (`baton dev 2>&1 | tee log`, and Ctrl-C reached `tee` too) neither stops the cluster
/// nor turns its stop into a panic: the line is dropped.
fn say(mut out: impl std::io::Write, line: std::fmt::Arguments<'_>) {
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// What a node's task ending says.
fn node_ended(ended: Result<anyhow::Result<()>, tokio::task::JoinError>) -> String {
    match ended {
        Ok(Ok(())) => "a node stopped".to_string(),
        Ok(Err(e)) => format!("node failed: {e:#}"),
        Err(e) => format!("node task failed: {e}"),
    }
}

/// Initialises the cluster on first start (later starts resume from the data dir) and waits for
/// a leader. Returns the leader's address.
async fn form_cluster(endpoints: &[String], data_dir: &Path) -> Result<String, String> {
    let config = ClientConfig {
        deadline: Duration::from_secs(30),
        ..ClientConfig::default()
    };
    let client = Client::new(endpoints, config).map_err(|e| e.to_string())?;
    let mut members = Vec::new();
    for endpoint in endpoints {
        let info = wait_for_node(&client, endpoint).await?;
        if info.initialized {
            // The members dial each other at the addresses the data remembers: data made on
            // other ports would never find a leader here. (Members added since, a learner on
            // another port, are no obstacle.)
            let known: Vec<&str> = info.members.iter().map(|m| m.addr.as_str()).collect();
            if endpoints.iter().any(|e| !known.contains(&e.as_str())) {
                return Err(format!(
                    "the data in {} belongs to a cluster at {}; start with the --base-port it \
                     was made with, or another --data-dir",
                    data_dir.display(),
                    known.join(",")
                ));
            }
            return client.discover_leader().await.map_err(|e| e.to_string());
        }
        members.push((info.id, info.addr));
    }
    client
        .initialize(&endpoints[0], &members)
        .await
        .map_err(|e| format!("cannot initialise the cluster: {e}"))?;
    client.discover_leader().await.map_err(|e| e.to_string())
}

async fn wait_for_node(
    client: &Client,
    endpoint: &str,
) -> Result<baton_rpc::proto::NodeInfoResponse, String> {
    let mut last = String::new();
    for _ in 0..100 {
        match client.node_info(endpoint).await {
            Ok(info) => return Ok(info),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("node at {endpoint} did not start: {last}"))
}
