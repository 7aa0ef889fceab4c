//! A single-node cluster in this process, for API tests over real gRPC.
#![allow(clippy::unwrap_used, dead_code)]

use std::time::Duration;

use baton_node::config::{NodeConfig, RaftTuning, WatchTuning};
use baton_rpc::{Client, ClientConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A batch item that claims board task `id` for agent "raw", under client 4242's `seq`.
pub fn claim_item(id: &str, seq: u64) -> baton_rpc::proto::BatchItem {
    use prost::Message;
    let request = baton_rpc::proto::ClaimTaskRequest {
        header: Some(baton_rpc::proto::RequestHeader {
            client_id: 4242,
            seq,
            acked_below: 1,
            ..Default::default()
        }),
        id: id.into(),
        agent: "raw".into(),
        ttl_ms: 30_000,
    };
    baton_rpc::proto::BatchItem {
        method: baton_rpc::batch::BOARD_CLAIM.path.into(),
        request: request.encode_to_vec(),
    }
}

/// TLS for a node at 127.0.0.1, from certificates `baton certs generate` writes into `dir`: the
/// node's settings, and a client's that trusts the node's CA.
pub fn tls(dir: &std::path::Path) -> (baton_node::security::Security, baton_rpc::Security) {
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args([
            "certs",
            "generate",
            "--name",
            "node",
            "--hosts",
            "127.0.0.1",
        ])
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let node = baton_node::security::Security {
        tls: Some(baton_node::tls::TlsFiles {
            cert: dir.join("node.pem"),
            key: dir.join("node-key.pem"),
            ca: dir.join("ca.pem"),
        }),
        tokens: None,
    };
    let client = baton_rpc::Security {
        token: None,
        tls: Some(baton_rpc::ClientTls {
            ca_pem: std::fs::read(dir.join("ca.pem")).unwrap(),
            identity: None,
        }),
    };
    (node, client)
}

/// A free 127.0.0.1 port for a listener the node binds itself (e.g. its HTTP endpoint).
pub fn free_addr() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// `GET path` over HTTP/1.0: the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// An offer of a ticket `key` from `a` to `b`, with a one-minute TTL.
pub fn offer(key: &str) -> baton_statemachine::handoff::OfferArgs {
    baton_statemachine::handoff::OfferArgs {
        key: key.into(),
        from: "a".into(),
        to: "b".into(),
        payload: b"x".to_vec(),
        reply_to: "a@inbox".into(),
        ttl_ms: 60_000,
    }
}

/// A plain gRPC connection to `addr`, ready, for sending raw messages to any path.
pub async fn raw_grpc(addr: &str) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc
}

/// Bytes that decode as no request with a nested message in field 1 (a header, a filter): a
/// number where the message should be.
pub fn not_a_request() -> baton_rpc::proto::SinkWriteResponse {
    baton_rpc::proto::SinkWriteResponse {
        seen_fence: 5,
        ..Default::default()
    }
}

/// One running node on an ephemeral 127.0.0.1 port; its data lives in a temporary directory
/// removed on drop.
pub struct Cluster {
    /// A client connected to the node.
    pub client: Client,
    /// The node's address.
    pub addr: String,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the node, initialises a one-member cluster and connects a client.
    pub async fn start() -> Cluster {
        Self::start_with(WatchTuning::default()).await
    }

    /// [`Cluster::start`] with the given watch history and stream limits.
    pub async fn start_with(watch: WatchTuning) -> Cluster {
        Self::start_custom(|config| config.watch = watch).await
    }

    /// [`Cluster::start`] with the test settings changed by `custom`.
    pub async fn start_custom(custom: impl FnOnce(&mut NodeConfig)) -> Cluster {
        Self::start_secured(custom, Default::default(), Default::default()).await
    }

    /// [`Cluster::start_custom`] with the node protected as `security` says, and its client
    /// presenting `client`.
    pub async fn start_secured(
        custom: impl FnOnce(&mut NodeConfig),
        security: baton_node::security::Security,
        client: baton_rpc::Security,
    ) -> Cluster {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(listener, custom, security, client).await
    }

    /// [`Cluster::start`] at `addr` (e.g. where another cluster's node served before), a
    /// cluster of its own.
    #[allow(dead_code)] // not every test binary that shares this module uses it
    pub async fn start_at(addr: &str) -> Cluster {
        let listener = TcpListener::bind(addr).await.unwrap();
        Self::start_on(listener, |_| {}, Default::default(), Default::default()).await
    }

    async fn start_on(
        listener: TcpListener,
        custom: impl FnOnce(&mut NodeConfig),
        security: baton_node::security::Security,
        client: baton_rpc::Security,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let listen = listener.local_addr().unwrap();
        let addr = listen.to_string();
        let mut config = NodeConfig::new(1, listen, dir.path().join("node-1"));
        config.raft = RaftTuning {
            heartbeat: Duration::from_millis(50),
            election_timeout: (Duration::from_millis(150), Duration::from_millis(300)),
            ..RaftTuning::default()
        };
        config.sweep_interval = Duration::from_millis(200);
        custom(&mut config);
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(baton_node::server::serve_secured(
            config,
            security,
            listener,
            async move {
                let _ = stopped.await;
            },
        ));
        let config = ClientConfig {
            deadline: Duration::from_secs(10),
            ..ClientConfig::default()
        };
        Client::new_with_security(&[addr.as_str()], config.clone(), client.clone())
            .unwrap()
            .initialize(&addr, &[(1, addr.clone())])
            .await
            .unwrap();
        let client = Client::connect_with_security(&[addr.as_str()], config, client)
            .await
            .unwrap();
        // The node has the cluster adopt its apply rules with an entry of its own as soon as it
        // leads: tests that count entries start after it.
        let adopted = async {
            while client.node_info(&addr).await.unwrap().apply_rules
                != baton_statemachine::rules::RULES
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), adopted)
            .await
            .expect("the node adopted its apply rules");
        Cluster {
            client,
            addr,
            stop: Some(stop),
            server: Some(server),
            _dir: dir,
        }
    }

    /// Asks the node to stop, runs `meanwhile` while it shuts down, then waits for it to finish
    /// and checks it shut down without error.
    #[allow(dead_code)] // not every test binary that shares this module uses it
    pub async fn stop_while<T>(mut self, meanwhile: impl std::future::Future<Output = T>) -> T {
        let _ = self.stop.take().unwrap().send(());
        let out = meanwhile.await;
        self.server.take().unwrap().await.unwrap().unwrap();
        out
    }

    /// Stops the node cleanly and checks it shut down without error.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.server.take().unwrap().await.unwrap().unwrap();
    }
}
