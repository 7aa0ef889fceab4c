//! Running one node: open storage, start Raft, serve gRPC (and, when configured, the operator's
//! HTTP endpoint), sweep, and shut down cleanly.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use baton_rpc::proto::batch_server::BatchServer;
use baton_rpc::proto::board_server::BoardServer;
use baton_rpc::proto::checkpoint_server::CheckpointServer;
use baton_rpc::proto::cluster_server::ClusterServer;
use baton_rpc::proto::effect_server::EffectServer;
use baton_rpc::proto::handoff_server::HandoffServer;
use baton_rpc::proto::queue_server::QueueServer;
use baton_rpc::proto::sink_server::SinkServer;
use baton_rpc::proto::watch_server::WatchServer;
use openraft::storage::RaftLogStorage;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic_health::ServingStatus;

use crate::admission::Admission;
use crate::auth::Tokens;
use crate::client_connections::{self, ClientConnections};
use crate::cluster_id::OwnCluster;
use crate::config::NodeConfig;
use crate::durable_file;
use crate::health::{health_service, reflection_service};
use crate::limits::AdmissionLayer;
use crate::metered::{MeteredLog, MeteredStateMachine};
use crate::metrics::{metrics, StoreStats};
use crate::network::Network;
use crate::node::{Node, NodeRef};
use crate::pre_vote::{self, Contact};
use crate::read_index::Nudge;
use crate::readiness::{LeaderCaller, Readiness};
use crate::security::Security;
use crate::service::{
    BatchService, BoardService, CheckpointService, ClusterService, EffectService, HandoffService,
    QueueService, SinkService, WatchService,
};
use crate::shutdown::{CLOSE_LIMIT, RAFT_STOP_LIMIT, STOP_LIMIT};
use crate::store;
use crate::throttle::Throttle;
use crate::tls::NodeTls;
use crate::types::Raft;
use crate::{
    http, raft_server, rules_adoption, snapshot_schedule, stalled_leader, sweeper, systemd,
};

/// Runs a node until `shutdown` resolves, then leaves gracefully ([`crate::shutdown`]), stops
/// serving and shuts Raft down.
pub async fn run(
    config: NodeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_secured(config, Security::default(), shutdown).await
}

/// [`run`] with TLS and client tokens as `security` says.
pub async fn run_secured(
    config: NodeConfig,
    security: Security,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    serve_secured(config, security, listener, shutdown).await
}

/// [`run`] on an already bound listener.
pub async fn serve(
    config: NodeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_secured(config, Security::default(), listener, shutdown).await
}

/// What to say at every start when a node reachable from other machines admits anyone: the
/// shipped production example leaves TLS and tokens off until the operator adds them.
fn open_door(listen: SocketAddr, tls: bool, tokens: bool) -> Option<String> {
    (!tls && !tokens && !listen.ip().is_loopback()).then(|| {
        format!(
            "neither TLS nor client tokens are set and the node listens on {listen}, beyond \
             loopback: anyone who reaches it can read every lease token (`snapshot save`), \
             change the membership and write; turn on TLS and tokens (docs/security.md)"
        )
    })
}

/// [`run_secured`] on an already bound listener.
pub async fn serve_secured(
    config: NodeConfig,
    security: Security,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let tls = security.tls.as_ref().map(NodeTls::load).transpose()?;
    if tls.is_none() && security.tokens.is_some() {
        // Said at every start: an operator who set tokens may believe the node closed.
        tracing::warn!(
            "client tokens are set but TLS is not: tokens cross the network in clear text, and the \
             Raft side of the port (entries, votes, snapshots) is open to anyone who reaches it, \
             tokens or not; turn on TLS (docs/security.md)"
        );
    }
    if let Some(warning) = open_door(config.listen, tls.is_some(), security.tokens.is_some()) {
        tracing::warn!("{warning}");
    }
    // Everything that can fail without side effects comes before Raft starts.
    let reflection = reflection_service()?;
    let http_listener = match config.http {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for HTTP on {addr}"))?,
        ),
        None => None,
    };
    durable_file::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    crate::snapshot_file::refuse_unfinished_restore(&config.data_dir)?;
    claim_identity(&config)?;
    let restored_from = crate::snapshot_file::restored_from(&config.data_dir)?;
    if !restored_from.is_empty() {
        tracing::info!(fingerprint = %restored_from, "this data dir was seeded by a restore");
    }
    let (log_store, state_machine) =
        store::open_with(&config.data_dir.join("db"), config.watch.history)
            .with_context(|| format!("cannot open storage in {}", config.data_dir.display()))
            .map_err(|e| with_disk_hint(e, &config.data_dir))?;
    // Under the store's lock, so no other node writes here (a restore writes its last files
    // after letting go of that lock, while its unfinished-restore marker keeps nodes from
    // starting): files of small writes (`node-id`, `cluster-id`, ...) a crash interrupted.
    let removed = durable_file::remove_leftovers(&config.data_dir)?;
    if removed > 0 {
        tracing::info!(removed, "removed files of writes a crash interrupted");
    }
    let raft_config = Arc::new(config.raft.to_openraft().context("invalid raft settings")?);
    let admission = Admission::new(security.tokens.clone());
    let stats = StoreStats::shared();
    if let Some(bytes) = state_machine.opened_from_snapshot() {
        metrics().snapshot_resumed(bytes);
    }
    let metered_state_machine = MeteredStateMachine::new(state_machine.clone());
    let mut log_store = log_store;
    let stored = log_store
        .get_log_state()
        .await
        .context("cannot read the log")?
        .last_log_id;
    let stored_vote = log_store
        .read_vote()
        .await
        .context("cannot read the vote")?;
    // A node with an empty log may still join a cluster and take its id.
    let cluster = OwnCluster::open(&config.data_dir, stored.is_none())?;
    let mut network = Network::new(config.peer_addrs.clone(), cluster.clone());
    if let Some(tls) = &tls {
        network = network.with_tls(tls.peer_connector());
    }
    let raft = Raft::new(
        config.id,
        raft_config,
        network.clone(),
        MeteredLog::new(log_store, stats.clone()),
        metered_state_machine,
    )
    .await
    .context("cannot start raft")?;
    // Raft::new returns before the Raft core has published what it loaded; until it has, the
    // metrics read term 0, an empty log and no membership, and a NodeInfo answered from them
    // would call a restarted member uninitialised. Serve once they show the stored state.
    let loaded_term = stored_vote.map(|vote| vote.leader_id().term).unwrap_or(0);
    let loaded_index = stored.map(|id| id.index);
    raft.wait(Some(Duration::from_secs(30)))
        .metrics(
            |m| m.current_term >= loaded_term && m.last_log_index >= loaded_index,
            "the stored state to be loaded",
        )
        .await
        .context("raft did not load its stored state")?;
    let node: NodeRef = Arc::new(Node::new(
        config.id,
        config.advertise.clone(),
        raft.clone(),
        state_machine,
        admission.clone(),
        Nudge::new(admission.clone(), config.raft.election_timing().lease),
    ));
    tracing::info!(id = config.id, addr = %config.advertise, data_dir = %config.data_dir.display(), "node started");

    let (stop_tx, stop_rx) = watch::channel(false);
    let sweeper = tokio::spawn(sweeper::run(
        node.clone(),
        admission.clone(),
        config.sweep_interval,
        sweeper::budget(&config.watch),
        stop_rx.clone(),
    ));
    let contact = Contact::default();
    let elections = tokio::spawn(pre_vote::run(
        raft.clone(),
        network.clone(),
        contact.clone(),
        config.raft.election_timing(),
        stop_rx.clone(),
    ));
    let rules = tokio::spawn(rules_adoption::run(
        node.clone(),
        network.clone(),
        admission.clone(),
        stop_rx.clone(),
    ));
    let snapshots = tokio::spawn(snapshot_schedule::run(
        raft.clone(),
        config.id,
        config.raft.snapshot_every,
        stop_rx.clone(),
    ));
    let caller = LeaderCaller {
        tls: tls.as_ref().map(NodeTls::client),
        authorizations: security
            .tokens
            .as_ref()
            .map(Tokens::bearers)
            .unwrap_or_default(),
    };
    let http = http_listener
        .map(|listener| start_http(listener, &config, &node, &admission, stats, caller, stop_rx));
    // Watch streams never end on their own, so they are told when shutdown begins; otherwise the
    // graceful shutdown would wait for them until the close limit. gRPC health watches stay open
    // (saying NOT_SERVING) while the node drains and hands over, and end when it stops serving.
    let (closing_tx, closing) = watch::channel(false);
    let (stop_serving_tx, stop_serving) = watch::channel(false);
    let (health, health_server) = health_service(stop_serving.clone());
    health.set(ServingStatus::Serving).await;

    let max_request = config.limits.max_request_bytes;
    // Keepalives find clients that went away without closing (a dead host, a partition): their
    // connections, and what their streams hold (a snapshot save's place, a watch), are let go.
    // Pings go out on idle connections too, which the idle limit on client connections counts
    // on. (tonic's TCP keepalive setting applies only to listeners it binds itself.)
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(client_connections::KEEPALIVE))
        .http2_keepalive_timeout(Some(client_connections::KEEPALIVE))
        .max_concurrent_streams(streams_per_connection(&config));
    if let Some(tls) = &tls {
        builder = builder
            .tls_config(tls.server())
            .context("invalid TLS settings")?;
    }
    let limits = AdmissionLayer::new(config.limits);
    let router = builder
        .layer(admission.layer())
        .layer(limits.clone())
        .add_service(
            HandoffServer::new(HandoffService::new(node.clone()))
                .max_decoding_message_size(max_request),
        )
        .add_service(
            BoardServer::new(BoardService::new(node.clone()))
                .max_decoding_message_size(max_request),
        )
        .add_service(
            BatchServer::new(BatchService::new(
                node.clone(),
                admission.clone(),
                limits.batch_places(),
            ))
            .max_decoding_message_size(max_request),
        )
        .add_service(
            EffectServer::new(EffectService::new(node.clone()))
                .max_decoding_message_size(max_request),
        )
        .add_service(
            SinkServer::new(SinkService::new(node.clone())).max_decoding_message_size(max_request),
        )
        .add_service(
            CheckpointServer::new(CheckpointService::new(node.clone()))
                .max_decoding_message_size(max_request),
        )
        .add_service(
            QueueServer::new(QueueService::new(node.clone(), admission.clone()))
                .max_decoding_message_size(max_request),
        )
        .add_service(
            ClusterServer::new(ClusterService::new(
                node.clone(),
                admission.clone(),
                network.clone(),
                restored_from,
                cluster.clone(),
            ))
            .max_decoding_message_size(max_request),
        )
        .add_service(
            WatchServer::new(WatchService::new(
                node.clone(),
                contact.clone(),
                cluster.clone(),
                config.watch.clone(),
                closing,
            ))
            .max_decoding_message_size(max_request),
        )
        .add_service(health_server)
        .add_service(reflection);
    // Peers' Raft connections are served until the gRPC server closes, so that a handover during
    // the shutdown still reaches them.
    let (peers_closed_tx, peers_closed) = watch::channel(false);
    let local = raft_server::Local {
        id: config.id,
        cluster,
        warned: Throttle::default(),
        tls_warned: Throttle::default(),
        raft: raft.clone(),
        contact: contact.clone(),
        timing: config.raft.election_timing(),
        progress: stalled_leader::LeaderWatch::default(),
        answer_deadline: config.raft.heartbeat,
        snapshot_chunks: Default::default(),
    };
    let port = raft_server::split(
        listener,
        local,
        tls.as_ref().map(NodeTls::peer_acceptor),
        ClientConnections::new(config.limits.max_connections),
        peers_closed,
    );
    let mut server = tokio::spawn(router.serve_with_incoming_shutdown(port.grpc, async move {
        let mut stop_serving = stop_serving;
        let _ = stop_serving.wait_for(|stop| *stop).await;
    }));
    // The listener is bound, so connections made from here on are served.
    systemd::ready();

    // Serve until asked to stop (or until serving fails, or Raft stops by itself), then leave
    // gracefully while the server still carries Raft traffic for the handover, then close the
    // server.
    let mut raft_failure = None;
    let served = tokio::select! {
        fatal = raft_stopped(&raft) => {
            tracing::error!(
                error = %fatal,
                hint = disk_full_hint(&fatal, &config.data_dir).as_deref(),
                "Raft has stopped on an error it cannot go on from; the node exits so that its \
                 supervisor restarts it"
            );
            raft_failure = Some(fatal);
            health.set(ServingStatus::NotServing).await;
            let _ = closing_tx.send(true);
            let _ = stop_serving_tx.send(true);
            close(&mut server).await
        }
        () = shutdown => {
            tracing::info!("shutting down");
            systemd::stopping();
            health.set(ServingStatus::NotServing).await;
            let _ = closing_tx.send(true);
            crate::shutdown::leave(
                &node,
                &admission,
                &network,
                &contact,
                config.hand_over_on_shutdown,
            )
            .await;
            let _ = stop_serving_tx.send(true);
            close(&mut server).await
        }
        joined = &mut server => joined,
    };
    let _ = peers_closed_tx.send(true);
    let _ = port.acceptor.await;
    let served = served.context("the grpc server task failed")?;

    let _ = stop_tx.send(true);
    let stop_by = tokio::time::Instant::now() + STOP_LIMIT;
    stopped(sweeper, "the sweeper", stop_by).await;
    stopped(elections, "the election timer", stop_by).await;
    stopped(snapshots, "the snapshot schedule", stop_by).await;
    stopped(rules, "the apply rules adoption", stop_by).await;
    if let Some(http) = http {
        stopped(http, "the HTTP endpoint", stop_by).await;
    }
    if let Some(fatal) = raft_failure {
        // Its core has stopped already: nothing to wait for.
        tracing::info!(id = config.id, "node stopped");
        return Err(with_disk_hint(
            anyhow::anyhow!("Raft stopped: {fatal}"),
            &config.data_dir,
        ));
    }
    match tokio::time::timeout(RAFT_STOP_LIMIT, raft.shutdown()).await {
        Ok(stopped) => stopped.map_err(|e| anyhow::anyhow!("raft shutdown: {e}"))?,
        Err(_) => tracing::warn!("Raft did not stop within {RAFT_STOP_LIMIT:?}; leaving it"),
    }
    tracing::info!(id = config.id, "node stopped");
    served.context("grpc server failed")
}

/// Waits for the gRPC server, told to stop serving, to close its connections; after
/// [`CLOSE_LIMIT`] it closes them itself.
async fn close(
    server: &mut tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) -> Result<Result<(), tonic::transport::Error>, tokio::task::JoinError> {
    match tokio::time::timeout(CLOSE_LIMIT, &mut *server).await {
        Ok(joined) => joined,
        Err(_) => {
            tracing::warn!("connections still open after {CLOSE_LIMIT:?}; closing them");
            server.abort();
            Ok(Ok(()))
        }
    }
}

/// What to do about a storage failure, when its text says the disk (or the quota of the node's
/// user on it) is full. The errors come through openraft as text (its `AnyError` keeps no
/// types), so the text is what is judged.
fn disk_full_hint(error: &str, data_dir: &std::path::Path) -> Option<String> {
    let full = [
        "No space left on device",
        "os error 28",
        "Disk quota exceeded",
        "os error 122",
    ];
    full.iter().any(|said| error.contains(said)).then(|| {
        format!(
            "the file system holding {} is full: free space there (the node needs room for its \
             log and two snapshot images), then start the node again; what it stored is kept",
            data_dir.display()
        )
    })
}

/// `error`, led by [`disk_full_hint`] when it applies.
fn with_disk_hint(error: anyhow::Error, data_dir: &std::path::Path) -> anyhow::Error {
    match disk_full_hint(&format!("{error:#}"), data_dir) {
        Some(hint) => error.context(hint),
        None => error,
    }
}

/// Resolves, with the reason, once Raft has stopped by itself: openraft stops on an error it
/// treats as fatal (a storage error: a log or snapshot it cannot read or write). The node can
/// then serve nothing but refusals, yet would look alive to every probe that only asks whether
/// it answers; exiting lets its supervisor restart it (systemd `Restart=on-failure`, Docker's
/// restart policy), and a damage that persists stops that restart with its own message.
async fn raft_stopped(raft: &Raft) -> String {
    let mut metrics = raft.metrics();
    loop {
        if let Err(fatal) = &metrics.borrow_and_update().running_state {
            return fatal.to_string();
        }
        if metrics.changed().await.is_err() {
            return "its metrics channel closed".into();
        }
    }
}

/// Waits for `task`, told to stop, until `by`, then aborts it: a shutdown ends even when a task
/// is stuck (on a write no quorum will ever commit, say).
async fn stopped(task: tokio::task::JoinHandle<()>, name: &str, by: tokio::time::Instant) {
    let abort = task.abort_handle();
    if tokio::time::timeout_at(by, task).await.is_err() {
        tracing::warn!("{name} did not stop in time; stopping it");
        abort.abort();
    }
}

/// Serves the operator's HTTP endpoint on `listener` until `stop` turns true.
fn start_http(
    listener: TcpListener,
    config: &NodeConfig,
    node: &NodeRef,
    admission: &Admission,
    stats: Arc<StoreStats>,
    caller: LeaderCaller,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let endpoint = Arc::new(http::Endpoint {
        node: node.clone(),
        stats: stats.clone(),
        readiness: Readiness::new(
            node.clone(),
            admission.clone(),
            stats,
            config.ready_max_lag,
            config.raft.election_timeout.1,
            config.peer_addrs.clone(),
            caller,
        ),
    });
    let addr = listener.local_addr().ok();
    tracing::info!(addr = ?addr, "serving /metrics, /livez and /readyz");
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        };
        if let Err(e) = http::serve(listener, endpoint, stopped).await {
            tracing::error!(addr = ?addr, "HTTP endpoint failed: {e}");
        }
    })
}

/// Writes `id` into `data_dir`'s `node-id` file, atomically and durably: a power loss right
/// after a node's first start must not leave an empty file that would stop it from starting.
pub fn record_identity(data_dir: &Path, id: u64) -> anyhow::Result<()> {
    let path = data_dir.join("node-id");
    durable_file::write(&path, format!("{id}\n").as_bytes())
        .with_context(|| format!("cannot write the node id to {}", path.display()))
}

/// Records the node id in the data dir on first start and refuses to start a data dir that
/// belongs to another id (which would silently corrupt the cluster's view of its members).
fn claim_identity(config: &NodeConfig) -> anyhow::Result<()> {
    let path = config.data_dir.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(existing) => {
            let existing = existing.trim();
            anyhow::ensure!(
                !existing.is_empty(),
                "{} is empty (an earlier version wrote it without syncing, and the machine lost \
                 power right after the node's first start); if this data dir is node {}'s, \
                 write `{}` into that file and start the node again",
                path.display(),
                config.id,
                config.id
            );
            anyhow::ensure!(
                existing == config.id.to_string(),
                "data dir {} belongs to node {existing}, not node {}",
                config.data_dir.display(),
                config.id
            );
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            record_identity(&config.data_dir, config.id)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The HTTP/2 streams one client connection may have open at once: room for every call the
/// in-flight limit lets it make and every watch the node serves, no more. Streams the limits do
/// not limit — health watches, reflection, cluster administration, refusals on their way —
/// would otherwise be unbounded on one connection (tonic leaves the count open); past this a
/// peer's HTTP/2 stack waits for one of its streams to end before it opens another.
fn streams_per_connection(config: &NodeConfig) -> u32 {
    let streams = config
        .limits
        .max_in_flight_per_connection
        .saturating_add(config.watch.max_streams);
    u32::try_from(streams).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_node_open_to_other_machines_without_tls_or_tokens_is_warned_about() {
        let wide: SocketAddr = "0.0.0.0:7001".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let said = open_door(wide, false, false).unwrap();
        assert!(said.contains("0.0.0.0:7001"), "{said}");
        assert_eq!(open_door(local, false, false), None);
        assert_eq!(open_door("[::1]:7001".parse().unwrap(), false, false), None);
        assert_eq!(open_door(wide, true, false), None);
        assert_eq!(open_door(wide, false, true), None);
    }

    /// A full disk is named as such, with the data dir to free space in; other failures are
    /// left as they are.
    #[test]
    fn a_full_disk_is_said_with_the_data_dir() {
        let dir = std::path::Path::new("/var/lib/baton");
        // As openraft words a failed append on a full disk.
        let fatal = anyhow::anyhow!(
            "Raft stopped: when Write Log(LogId {{ index: 170 }}): std::io::error::Error: IO \
             error: No space left on device (os error 28)"
        );
        let said = format!("{:#}", with_disk_hint(fatal, dir));
        assert!(
            said.starts_with("the file system holding /var/lib/baton is full"),
            "{said}"
        );
        assert!(said.contains("index: 170"), "the cause is kept: {said}");
        let other = anyhow::anyhow!("Raft stopped: the Raft log lost entry 7");
        assert_eq!(
            format!("{:#}", with_disk_hint(other, dir)),
            "Raft stopped: the Raft log lost entry 7"
        );
    }
}
