//! A single-node cluster in this process, for API tests over real gRPC.
#![allow(clippy::unwrap_used, dead_code)]

use std::time::Duration;

use baton_node::config::{NodeConfig, RaftTuning, WatchTuning};
use baton_rpc::{Client, ClientConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listen = listener.local_addr().unwrap();
        let addr = listen.to_string();
        let mut config = NodeConfig::new(1, listen, dir.path().join("node-1"));
        config.raft = RaftTuning {
            heartbeat: Duration::from_millis(50),
            election_timeout: (Duration::from_millis(150), Duration::from_millis(300)),
            ..RaftTuning::default()
        };
        config.sweep_interval = Duration::from_millis(200);
        config.watch = watch;
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(baton_node::server::serve(config, listener, async move {
            let _ = stopped.await;
        }));
        let config = ClientConfig {
            deadline: Duration::from_secs(10),
            ..ClientConfig::default()
        };
        Client::new(&[addr.as_str()], config.clone())
            .unwrap()
            .initialize(&addr, &[(1, addr.clone())])
            .await
            .unwrap();
        let client = Client::connect_with(&[addr.as_str()], config)
            .await
            .unwrap();
        Cluster {
            client,
            addr,
            stop: Some(stop),
            server: Some(server),
            _dir: dir,
        }
    }

    /// Stops the node cleanly and checks it shut down without error.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.server.take().unwrap().await.unwrap().unwrap();
    }
}
