//! A small process harness for the administration tests: nodes started with any extra flags
//! (TLS, tokens), from data dirs the test prepared (restored snapshots), and stopped with
//! SIGTERM so their exit status can be checked. The shared [`baton_cluster_test::Cluster`]
//! covers crash tests; these tests need what it does not expose.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton_cluster_test::binary::baton_bin;
use baton_cluster_test::wait;
use baton_rpc::proto::NodeInfoResponse;
use baton_rpc::{Client, ClientConfig, Security};
use rand::Rng;
use tempfile::TempDir;

/// Bound on every wait.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// One node process.
struct Proc {
    addr: String,
    data_dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

/// Nodes of one test, each in its own data dir under one temporary directory.
pub struct Procs {
    dir: TempDir,
    bin: PathBuf,
    nodes: BTreeMap<u64, Proc>,
    ports: BTreeSet<u16>,
    /// What the harness itself presents when it asks a node about itself.
    security: Security,
}

/// Client timeouts for tests.
pub fn config() -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_secs(10),
        attempt_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_millis(500),
    }
}

impl Procs {
    /// An empty set of nodes; the harness uses `security` for its own calls.
    pub fn new(security: Security) -> anyhow::Result<Self> {
        Ok(Self {
            dir: tempfile::Builder::new().prefix("baton-admin-").tempdir()?,
            bin: baton_bin()?,
            nodes: BTreeMap::new(),
            ports: BTreeSet::new(),
            security,
        })
    }

    /// The temporary directory (for certificates, token files, snapshots).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `baton` binary.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Declares node `id` on a fresh port with `args` added to `baton node`; returns its
    /// address. It is started by [`Procs::start`].
    pub fn declare(&mut self, id: u64, args: &[String]) -> anyhow::Result<String> {
        let port = free_port(&self.ports)?;
        self.ports.insert(port);
        let addr = format!("127.0.0.1:{port}");
        self.nodes.insert(
            id,
            Proc {
                addr: addr.clone(),
                data_dir: self.dir.path().join(format!("node-{id}")),
                log: self.dir.path().join(format!("node-{id}.log")),
                args: args.to_vec(),
                child: None,
            },
        );
        Ok(addr)
    }

    /// Node `id`'s address.
    pub fn addr(&self, id: u64) -> String {
        self.nodes[&id].addr.clone()
    }

    /// Node `id`'s data dir.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.nodes[&id].data_dir.clone()
    }

    /// Every node's address, in id order.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.values().map(|n| n.addr.clone()).collect()
    }

    /// `(id, addr)` of every node.
    pub fn members(&self) -> Vec<(u64, String)> {
        self.nodes
            .iter()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    }

    /// Starts node `id` and waits until it answers.
    pub async fn start(&mut self, id: u64) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(&id).context("no such node")?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)?;
        let child = Command::new(&self.bin)
            .arg("node")
            .args(["--id", &id.to_string(), "--listen", &node.addr])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(["--heartbeat", "50ms", "--election-timeout", "300ms"])
            .args(&node.args)
            .env("NO_COLOR", "1")
            .env_remove("BATON_TOKEN")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start baton node")?;
        node.child = Some(child);
        let admin = self.admin()?;
        let addr = self.addr(id);
        wait::until(&format!("node {id} to answer"), TIMEOUT, || {
            let admin = admin.clone();
            let addr = addr.clone();
            async move {
                admin
                    .node_info(&addr)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .await
        .with_context(|| self.log_tail(id))
    }

    /// Declares nodes 1..=`count` with `args`, starts them, forms the cluster through node 1 and
    /// waits for its leader, which it returns.
    pub async fn form_cluster(&mut self, count: u64, args: &[String]) -> anyhow::Result<u64> {
        for id in 1..=count {
            self.declare(id, args)?;
        }
        for id in 1..=count {
            self.start(id).await?;
        }
        self.initialize(1).await?;
        self.leader().await
    }

    /// Forms a cluster of every declared node through node `through`.
    pub async fn initialize(&self, through: u64) -> anyhow::Result<()> {
        self.admin()?
            .initialize(&self.addr(through), &self.members())
            .await?;
        Ok(())
    }

    /// A client for per-node calls, presenting the harness's security.
    pub fn admin(&self) -> anyhow::Result<Client> {
        Ok(Client::new_with_security(
            &self.endpoints(),
            config(),
            self.security.clone(),
        )?)
    }

    /// A connected client presenting `security`.
    pub async fn client(&self, security: Security) -> anyhow::Result<Client> {
        Ok(Client::connect_with_security(&self.endpoints(), config(), security).await?)
    }

    /// Node `id`'s view of itself.
    pub async fn info(&self, id: u64) -> Result<NodeInfoResponse, baton_rpc::Error> {
        self.admin()
            .map_err(|e| baton_rpc::Error::Config(e.to_string()))?
            .node_info(&self.addr(id))
            .await
    }

    /// Waits until the running nodes agree on a leader; returns its id.
    pub async fn leader(&self) -> anyhow::Result<u64> {
        let live: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.child.is_some())
            .map(|(id, _)| *id)
            .collect();
        wait::until("an agreed leader", TIMEOUT, || {
            let live = live.clone();
            async move {
                let mut leaders = BTreeSet::new();
                for id in &live {
                    let info = self.info(*id).await.map_err(|e| e.to_string())?;
                    leaders.insert(info.leader_id);
                }
                match leaders.into_iter().collect::<Vec<_>>().as_slice() {
                    [Some(leader)] => Ok(*leader),
                    other => Err(format!("leaders seen: {other:?}")),
                }
            }
        })
        .await
    }

    /// Sends SIGTERM to node `id` and waits (at most `limit`) for it to exit; returns its status.
    pub fn terminate(&mut self, id: u64, limit: Duration) -> anyhow::Result<ExitStatus> {
        let node = self.nodes.get_mut(&id).context("no such node")?;
        let mut child = node.child.take().context("node is not running")?;
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -TERM failed");
        }
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if started.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                bail!("node {id} did not exit within {limit:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills every running node (SIGKILL).
    pub fn kill_all(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Runs the `baton` command line (with a time limit) and returns its output. The output is
    /// read while the command runs: one that fills a pipe (64 KiB) would otherwise wait for a
    /// reader for ever, and the time limit would call it hung.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<Output> {
        let child = Command::new(&self.bin)
            .args(args)
            .env_remove("BATON_TOKEN")
            .env_remove("BATON_ENDPOINTS")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let pid = child.id();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(child.wait_with_output());
        });
        match finished.recv_timeout(Duration::from_secs(60)) {
            Ok(output) => Ok(output?),
            Err(_) => {
                // Not reaped yet (its waiter still waits), so the pid is still the command's.
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                bail!("baton {args:?} did not finish within 60s");
            }
        }
    }

    /// Node `id`'s whole log.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(&self.nodes[&id].log).unwrap_or_default()
    }

    /// The end of node `id`'s log.
    pub fn log_tail(&self, id: u64) -> String {
        let text = std::fs::read_to_string(&self.nodes[&id].log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- node {id} log ---\n{}",
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.kill_all();
        if std::thread::panicking() {
            for id in self.nodes.keys() {
                eprintln!("{}", self.log_tail(*id));
            }
        }
    }
}

/// A free port in 20000..32000 (below the ephemeral range) not already chosen.
fn free_port(taken: &BTreeSet<u16>) -> anyhow::Result<u16> {
    let mut rng = rand::rng();
    for _ in 0..200 {
        let port = rng.random_range(20_000..32_000u16);
        if !taken.contains(&port)
            && TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok()
        {
            return Ok(port);
        }
    }
    bail!("no free port")
}

/// stdout and stderr of a command, for assertion messages.
pub fn show(output: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
