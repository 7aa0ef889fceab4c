//! A cluster of real `baton node` processes on 127.0.0.1, each with its own data dir in one
//! temporary directory, and the operations fault-injection tests need: kill (SIGKILL), restart
//! from the same data dir and port, find the leader, wait for a node to catch up.
//!
//! With [`Options::proxied`] every peer link runs through its own TCP proxy
//! ([`crate::proxy::Network`]), so a test can cut links to partition the cluster; and a node can
//! be frozen (SIGSTOP) and thawed (SIGCONT), added to the cluster's processes or removed.
//!
//! Every wait is bounded by [`Options::timeout`]. Dropping the cluster kills every node; when
//! the drop happens during a panic (a failing test), the tail of every node's log is printed and
//! the temporary directory is kept for inspection.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton_rpc::proto::NodeInfoResponse;
use baton_rpc::{Client, ClientConfig};
use rand::Rng;
use tempfile::TempDir;

use crate::binary::baton_bin;
use crate::power_cut::{CutReport, Mounted, Unsynced};
use crate::proxy::Network;
use crate::wait;

/// Written to a node's log before each start.
const START_MARKER: &str = "=== cluster-test: starting node";

/// How the nodes are tuned and how long the harness waits for them.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--heartbeat`.
    pub heartbeat: Duration,
    /// `--election-timeout` (the minimum; the node uses twice this as the maximum).
    pub election_timeout: Duration,
    /// `--election-timeout` of particular nodes, overriding `election_timeout` for them (to make
    /// one node slow or eager to stand).
    pub election_timeouts: BTreeMap<u64, Duration>,
    /// `--snapshot-every`.
    pub snapshot_every: u64,
    /// `--keep-logs`.
    pub keep_logs: u64,
    /// `--sweep-interval`.
    pub sweep_interval: Duration,
    /// Bound on each wait: a node answering, a leader being elected, a node catching up.
    pub timeout: Duration,
    /// Route every peer link of the first nodes through its own TCP proxy (`--peer-addr`), so
    /// [`Cluster::network`] can cut links. Nodes added later talk to their peers directly.
    pub proxied: bool,
    /// Give every node of the first ones a data dir that can lose power
    /// ([`crate::power_cut`], needs FUSE: see [`crate::power_cut::available`]), so
    /// [`Cluster::lose_power`] can throw away what the nodes wrote but did not sync. Power losses
    /// alternate between losing everything unsynced and keeping a random part of it
    /// ([`Unsynced`]), the first losing everything.
    pub power_cut: bool,
    /// Extra environment of particular nodes' processes (a skewed clock:
    /// [`crate::clock_skew::offset_env`]).
    pub env: BTreeMap<u64, Vec<(String, String)>>,
}

impl Default for Options {
    /// Fast timings that still hold on a loaded 2-core machine.
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(50),
            election_timeout: Duration::from_millis(300),
            election_timeouts: BTreeMap::new(),
            snapshot_every: 10_000,
            keep_logs: 1_000,
            sweep_interval: Duration::from_secs(1),
            timeout: Duration::from_secs(20),
            proxied: false,
            power_cut: false,
            env: BTreeMap::new(),
        }
    }
}

impl Options {
    /// The defaults, with every Raft link through a proxy ([`Cluster::network`]).
    pub fn proxied() -> Self {
        Self {
            proxied: true,
            ..Self::default()
        }
    }
}

/// How long a power loss holds the nodes' syncs before it kills them, so that the writes in
/// flight are caught between their `write` and their sync
/// ([`crate::power_cut::PowerCut::hold_syncs`]).
const SYNCS_HELD_BEFORE_THE_CUT: Duration = Duration::from_millis(50);

/// Client timeouts for tests: short enough that a dead node is abandoned quickly, long enough
/// for a debug build on a busy machine.
pub fn client_config() -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_secs(10),
        attempt_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_millis(500),
    }
}

/// Timeouts for per-node introspection (no retries: a dead node must answer "no" fast).
fn admin_config() -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_secs(2),
        attempt_timeout: Duration::from_millis(700),
        connect_timeout: Duration::from_millis(300),
    }
}

/// One node process and everything needed to restart it.
struct NodeProcess {
    id: u64,
    addr: String,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running cluster. Node ids are `1..=n`.
pub struct Cluster {
    dir: TempDir,
    bin: PathBuf,
    options: Options,
    nodes: BTreeMap<u64, NodeProcess>,
    admin: Client,
    network: Option<Network>,
    /// With [`Options::power_cut`]: each node's mounted data dir (backed by `node-<id>.disk`).
    disks: BTreeMap<u64, Mounted>,
    /// Power losses so far: picks what the next one keeps.
    power_losses: u64,
}

impl Cluster {
    /// Starts `n` nodes, forms a cluster of them through node 1 and waits for a leader.
    pub async fn start(n: u64, options: Options) -> anyhow::Result<Cluster> {
        let cluster = Self::start_uninitialized(n, options).await?;
        let members: Vec<(u64, String)> = cluster
            .nodes
            .values()
            .map(|node| (node.id, node.addr.clone()))
            .collect();
        cluster
            .admin
            .initialize(cluster.addr(1), &members)
            .await
            .context("cluster initialisation failed")?;
        cluster.leader().await?;
        Ok(cluster)
    }

    /// Starts `n` nodes that answer but belong to no cluster yet (for testing initialisation).
    pub async fn start_uninitialized(n: u64, options: Options) -> anyhow::Result<Cluster> {
        let bin = baton_bin()?;
        let dir = tempfile::Builder::new()
            .prefix("baton-cluster-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let mut taken = BTreeSet::new();
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            let port = free_port(&taken)?;
            taken.insert(port);
            nodes.insert(
                id,
                NodeProcess {
                    id,
                    addr: format!("127.0.0.1:{port}"),
                    log: dir.path().join(format!("node-{id}.log")),
                    data_dir: dir.path().join(format!("node-{id}")),
                    child: None,
                },
            );
        }
        let endpoints: Vec<String> = nodes.values().map(|node| node.addr.clone()).collect();
        let admin = Client::new(&endpoints, admin_config())?;
        let network = if options.proxied {
            let addrs = nodes
                .values()
                .map(|node| (node.id, node.addr.clone()))
                .collect();
            Some(Network::start(&addrs).await?)
        } else {
            None
        };
        let mut disks = BTreeMap::new();
        if options.power_cut {
            for node in nodes.values() {
                disks.insert(node.id, mount_disk(dir.path(), node)?);
            }
        }
        let mut cluster = Cluster {
            dir,
            bin,
            options,
            nodes,
            admin,
            network,
            disks,
            power_losses: 0,
        };
        for id in 1..=n {
            cluster.start_fresh(id, &mut taken).await?;
        }
        Ok(cluster)
    }

    /// Starts a node for the first time; if it dies before answering (its port may have been
    /// grabbed between choosing and binding it), tries again on another port.
    async fn start_fresh(&mut self, id: u64, taken: &mut BTreeSet<u16>) -> anyhow::Result<()> {
        let mut last = None;
        for _ in 0..3 {
            match self.launch(id).await {
                Ok(()) => return Ok(()),
                Err(error) => last = Some(error),
            }
            let port = free_port(taken)?;
            taken.insert(port);
            let node = self.node_mut(id)?;
            node.addr = format!("127.0.0.1:{port}");
            let _ = std::fs::remove_dir_all(&node.data_dir);
            if let Some(network) = &self.network {
                network.retarget(id, self.addr(id));
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("node {id} did not start")))
    }

    /// Node `id`'s data dir (`--data-dir`).
    pub fn data_dir(&self, id: u64) -> anyhow::Result<&Path> {
        let node = self
            .nodes
            .get(&id)
            .with_context(|| format!("no node {id}"))?;
        Ok(&node.data_dir)
    }

    /// Every node's address, in id order (killed ones included).
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.values().map(|node| node.addr.clone()).collect()
    }

    /// The address of node `id`.
    ///
    /// # Panics
    /// When there is no such node (a bug in the test).
    pub fn addr(&self, id: u64) -> &str {
        self.nodes
            .get(&id)
            .map(|n| n.addr.as_str())
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The id of the node at `addr`, if any.
    pub fn id_of(&self, addr: &str) -> Option<u64> {
        let addr = addr.trim_start_matches("http://");
        self.nodes
            .values()
            .find(|node| node.addr == addr)
            .map(|node| node.id)
    }

    /// How node `id`'s process ended, once it has (`None` while it runs); a process that ended
    /// no longer counts as running.
    pub fn exit_status(&mut self, id: u64) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let node = self.node_mut(id)?;
        let status = match node.child.as_mut() {
            Some(child) => child.try_wait()?,
            None => None,
        };
        if status.is_some() {
            node.child = None;
        }
        Ok(status)
    }

    /// Ids of the nodes whose process is running.
    pub fn live_ids(&self) -> Vec<u64> {
        self.nodes
            .values()
            .filter(|node| node.child.is_some())
            .map(|node| node.id)
            .collect()
    }

    /// The path of the `baton` binary the nodes run (for CLI tests).
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Sets node `id`'s extra environment ([`Options::env`]) for its next start.
    pub fn set_env(&mut self, id: u64, vars: Vec<(String, String)>) {
        self.options.env.insert(id, vars);
    }

    /// The options the cluster was started with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// A client library connection to the whole cluster (leader located).
    pub async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::connect_with(&self.endpoints(), client_config()).await?)
    }

    /// Node `id`'s own view of itself (one attempt, no retries).
    pub async fn node_info(&self, id: u64) -> Result<NodeInfoResponse, baton_rpc::Error> {
        self.admin.node_info(self.addr(id)).await
    }

    /// Node `id`'s applied index and the digest of its state there (one attempt).
    pub async fn state_digest(
        &self,
        id: u64,
    ) -> Result<baton_rpc::proto::StateDigestResponse, baton_rpc::Error> {
        self.admin.state_digest(self.addr(id)).await
    }

    /// Waits until the running nodes agree on one leader: it says it leads, and every other
    /// running node names it at the same term. Returns its id.
    pub async fn leader(&self) -> anyhow::Result<u64> {
        crate::robustness::target::Target::leader(self).await
    }

    /// Waits up to `limit` until one of `ids` says it leads at a term above `term`; returns its
    /// id.
    pub async fn new_leader(&self, ids: &[u64], term: u64, limit: Duration) -> anyhow::Result<u64> {
        crate::robustness::target::Target::new_leader(self, ids, term, limit).await
    }

    /// Kills node `id` with SIGKILL (no graceful shutdown) and reaps it.
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        let mut child = node
            .child
            .take()
            .with_context(|| format!("node {id} is not running"))?;
        // `Child::kill` sends SIGKILL on Unix.
        child
            .kill()
            .with_context(|| format!("cannot kill node {id}"))?;
        // Its exit waits for any sync a power loss in progress holds.
        if let Some(disk) = self.disks.get(&id) {
            disk.power().fail_held_syncs();
        }
        child
            .wait()
            .with_context(|| format!("cannot reap node {id}"))?;
        Ok(())
    }

    /// Restarts a killed node with the same id, data dir and port, and waits until it answers.
    pub async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.node_mut(id)?.child.is_some() {
            bail!("node {id} is still running");
        }
        self.launch(id).await
    }

    /// The proxies of the peer links (only with [`Options::proxied`]).
    pub fn network(&self) -> anyhow::Result<&Network> {
        self.network
            .as_ref()
            .context("the cluster was started without proxies (Options::proxied)")
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.nodes
            .get(&id)
            .and_then(|node| node.child.as_ref())
            .map(Child::id)
    }

    /// Freezes node `id` with SIGSTOP: it keeps its sockets and its memory but runs nothing (a
    /// long GC pause, a stalled VM) until [`Cluster::resume`].
    pub fn pause(&self, id: u64) -> anyhow::Result<()> {
        let pid = self
            .pid(id)
            .with_context(|| format!("node {id} is not running"))?;
        signal(pid, "STOP")
    }

    /// Lets a node frozen by [`Cluster::pause`] go on (SIGCONT).
    pub fn resume(&self, id: u64) -> anyhow::Result<()> {
        let pid = self
            .pid(id)
            .with_context(|| format!("node {id} is not running"))?;
        signal(pid, "CONT")
    }

    /// SIGKILLs every running node, one right after the other (a power loss of the whole
    /// cluster); returns the ids killed.
    pub fn kill_all(&mut self) -> anyhow::Result<Vec<u64>> {
        let live = self.live_ids();
        for id in &live {
            self.kill(*id)?;
        }
        Ok(live)
    }

    /// Whether the nodes' data dirs can lose power ([`Options::power_cut`]).
    pub fn can_lose_power(&self) -> bool {
        !self.disks.is_empty()
    }

    /// A power loss of the whole cluster: holds every sync for a moment (the writes in flight
    /// wait for theirs), SIGKILLs every running node, then throws away everything the nodes
    /// wrote to their data dirs but did not sync, or a random part of it (needs
    /// [`Options::power_cut`]). Returns the ids killed and what was thrown away.
    pub async fn lose_power(&mut self) -> anyhow::Result<(Vec<u64>, CutReport)> {
        if !self.can_lose_power() {
            bail!("the cluster was started without Options::power_cut");
        }
        for disk in self.disks.values() {
            disk.power().hold_syncs();
        }
        tokio::time::sleep(SYNCS_HELD_BEFORE_THE_CUT).await;
        let killed = self.kill_all().inspect_err(|_| self.fail_held_syncs())?;
        let loss = self.next_power_loss();
        let mut total = CutReport::default();
        let ids: Vec<u64> = self.disks.keys().copied().collect();
        for id in ids {
            total.add(self.cut_power(id, loss)?);
        }
        Ok((killed, total))
    }

    /// A power loss of node `id` alone: its syncs held for a moment, SIGKILL, then what it wrote
    /// but did not sync is thrown away, or a random part of it. `None` when its data dir cannot
    /// lose power (no [`Options::power_cut`], or a node added later): then it was only
    /// SIGKILLed.
    pub async fn lose_power_of(&mut self, id: u64) -> anyhow::Result<Option<CutReport>> {
        if !self.disks.contains_key(&id) {
            self.kill(id)?;
            return Ok(None);
        }
        if self.node_mut(id)?.child.is_none() {
            bail!("node {id} is not running");
        }
        self.disks[&id].power().hold_syncs();
        tokio::time::sleep(SYNCS_HELD_BEFORE_THE_CUT).await;
        self.kill(id).inspect_err(|_| self.fail_held_syncs())?;
        let loss = self.next_power_loss();
        self.cut_power(id, loss).map(Some)
    }

    /// Fills node `id`'s disk (`full`: every write of file data fails with `ENOSPC`) or empties
    /// it again; needs [`Options::power_cut`], whose data dirs this works through.
    pub fn fill_disk(&self, id: u64, full: bool) -> anyhow::Result<()> {
        let disk = self
            .disks
            .get(&id)
            .with_context(|| format!("node {id}'s data dir cannot be filled (no power_cut)"))?;
        disk.power().fill(full);
        Ok(())
    }

    /// Lets every sync a failed power loss left held fail, so no node waits on one for ever.
    fn fail_held_syncs(&self) {
        for disk in self.disks.values() {
            disk.power().fail_held_syncs();
        }
    }

    /// Counts a power loss; returns its number.
    fn next_power_loss(&mut self) -> u64 {
        self.power_losses += 1;
        self.power_losses - 1
    }

    /// Unmounts node `id`'s data dir (the node must be dead), undoes its unsynced writes (all of
    /// them in even-numbered power losses, a random part in odd ones) and mounts it anew, so
    /// nothing the kernel cached of the old contents survives.
    fn cut_power(&mut self, id: u64, loss: u64) -> anyhow::Result<CutReport> {
        let disk = self
            .disks
            .remove(&id)
            .with_context(|| format!("node {id}'s data dir cannot lose power"))?;
        let unsynced = if loss.is_multiple_of(2) {
            Unsynced::Lost
        } else {
            Unsynced::PartlyKept {
                seed: loss << 8 | id,
            }
        };
        let cut = disk.lose_power(unsynced).context("power cut failed");
        // Mounted again even after a failure, so the node never starts on an empty mountpoint.
        let node = self.nodes.get(&id).context("no such node")?;
        self.disks.insert(id, mount_disk(self.dir.path(), node)?);
        cut
    }

    /// Starts every node in `ids` from its data dir at once, then waits until each answers.
    pub async fn restart_all(&mut self, ids: &[u64]) -> anyhow::Result<()> {
        for id in ids {
            if self.node_mut(*id)?.child.is_some() {
                bail!("node {id} is still running");
            }
            let child = self.spawn(*id)?;
            self.node_mut(*id)?.child = Some(child);
        }
        let this = &*self;
        for id in ids {
            let what = format!("restarted node {id} to answer");
            wait::until(&what, this.options.timeout, || async move {
                match this.node_info(*id).await {
                    Ok(info) if info.id == *id => Ok(()),
                    Ok(info) => Err(format!("node {} answered at its address", info.id)),
                    Err(error) => Err(error.to_string()),
                }
            })
            .await
            .with_context(|| this.log_tail(*id, 30))?;
        }
        Ok(())
    }

    /// Starts a new node (the next free id) that belongs to no cluster yet, for a membership
    /// change to add; returns its id. It reaches its peers directly, not through proxies.
    pub async fn add_node(&mut self) -> anyhow::Result<u64> {
        let id = self.nodes.keys().max().copied().unwrap_or(0) + 1;
        let mut taken: BTreeSet<u16> = self
            .nodes
            .values()
            .filter_map(|node| node.addr.rsplit(':').next()?.parse().ok())
            .collect();
        let port = free_port(&taken)?;
        taken.insert(port);
        self.nodes.insert(
            id,
            NodeProcess {
                id,
                addr: format!("127.0.0.1:{port}"),
                log: self.dir.path().join(format!("node-{id}.log")),
                data_dir: self.dir.path().join(format!("node-{id}")),
                child: None,
            },
        );
        if let Err(error) = self.start_fresh(id, &mut taken).await {
            self.nodes.remove(&id);
            return Err(error);
        }
        Ok(id)
    }

    /// Kills node `id` if it runs and forgets it: it is no longer one of the cluster's nodes
    /// (after a membership change removed it). Its log stays in the cluster's directory.
    pub fn remove_node(&mut self, id: u64) -> anyhow::Result<()> {
        if self.node_mut(id)?.child.is_some() {
            self.kill(id)?;
        }
        self.nodes.remove(&id);
        Ok(())
    }

    /// Ids of every node the cluster has (running or killed), in order.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// Keeps the cluster's directory (data dirs and node logs) when the cluster is dropped, for
    /// a run whose failure someone will want to inspect; returns its path.
    pub fn keep(&mut self) -> PathBuf {
        self.dir.disable_cleanup(true);
        self.dir.path().to_path_buf()
    }

    /// Waits until node `id` has applied at least `index`; returns its view at that moment.
    pub async fn wait_caught_up(&self, id: u64, index: u64) -> anyhow::Result<NodeInfoResponse> {
        let what = format!("node {id} to apply index {index}");
        wait::until(&what, self.options.timeout, || async move {
            match self.node_info(id).await {
                Ok(info) if info.applied_index >= index => Ok(info),
                Ok(info) => Err(format!(
                    "applied {} (last log {})",
                    info.applied_index, info.last_log_index
                )),
                Err(error) => Err(error.to_string()),
            }
        })
        .await
    }

    /// Waits until every running node applies this build's apply rules
    /// (`baton_statemachine::rules`), which a leader has the cluster adopt by itself once every
    /// member runs a build that applies them.
    pub async fn wait_rules_adopted(&self) -> anyhow::Result<()> {
        let rules = baton_statemachine::rules::RULES;
        for id in self.live_ids() {
            let what = format!("node {id} to apply rules {rules}");
            wait::until(&what, self.options.timeout, || async move {
                match self.node_info(id).await {
                    Ok(info) if info.apply_rules == rules => Ok(()),
                    Ok(info) => Err(format!("applies rules {}", info.apply_rules)),
                    Err(error) => Err(error.to_string()),
                }
            })
            .await?;
        }
        Ok(())
    }

    /// Waits until every running node has applied what the leader has applied right now.
    pub async fn wait_all_caught_up(&self) -> anyhow::Result<u64> {
        let leader = self.leader().await?;
        let index = self.node_info(leader).await?.applied_index;
        for id in self.live_ids() {
            self.wait_caught_up(id, index).await?;
        }
        Ok(index)
    }

    /// The last `lines` lines of node `id`'s log (stdout and stderr of every run).
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let Some(node) = self.nodes.get(&id) else {
            return String::new();
        };
        let text = std::fs::read_to_string(&node.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// What node `id` logged since it was last (re)started.
    pub fn log_of_last_run(&self, id: u64) -> String {
        let text = self
            .nodes
            .get(&id)
            .and_then(|node| std::fs::read_to_string(&node.log).ok())
            .unwrap_or_default();
        match text.rfind(START_MARKER) {
            Some(at) => text[at..].to_string(),
            None => text,
        }
    }

    fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut NodeProcess> {
        self.nodes
            .get_mut(&id)
            .with_context(|| format!("no node {id}"))
    }

    /// Spawns node `id`'s process and waits until it answers `NodeInfo`; a node that exits or
    /// stays silent is reported with the tail of its log.
    async fn launch(&mut self, id: u64) -> anyhow::Result<()> {
        let child = self.spawn(id)?;
        self.node_mut(id)?.child = Some(child);
        let started = Instant::now();
        loop {
            let exited = match self.node_mut(id)?.child.as_mut() {
                Some(child) => child.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = exited {
                self.node_mut(id)?.child = None;
                bail!(
                    "node {id} exited ({status}) before answering\n--- node {id} log ---\n{}",
                    self.log_tail(id, 30)
                );
            }
            let last = match self.node_info(id).await {
                Ok(info) if info.id == id => return Ok(()),
                Ok(info) => format!("a node with id {} answered at its address", info.id),
                Err(error) => error.to_string(),
            };
            if started.elapsed() >= self.options.timeout {
                if let Some(mut child) = self.node_mut(id)?.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                bail!(
                    "node {id} did not answer within {:?}: {last}\n--- node {id} log ---\n{}",
                    self.options.timeout,
                    self.log_tail(id, 30)
                );
            }
            tokio::time::sleep(wait::POLL).await;
        }
    }

    fn spawn(&self, id: u64) -> anyhow::Result<Child> {
        let node = self
            .nodes
            .get(&id)
            .with_context(|| format!("no node {id}"))?;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("cannot open {}", node.log.display()))?;
        writeln!(log, "{START_MARKER} {id} at {} ===", node.addr)?;
        let o = &self.options;
        let election_timeout = *o.election_timeouts.get(&id).unwrap_or(&o.election_timeout);
        let routes: Vec<String> = match &self.network {
            Some(network) => network
                .routes(id)
                .into_iter()
                .flat_map(|(peer, addr)| ["--peer-addr".to_string(), format!("{peer}={addr}")])
                .collect(),
            None => Vec::new(),
        };
        let child = Command::new(&self.bin)
            .arg("node")
            .args(["--id", &id.to_string()])
            .args(["--listen", &node.addr])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(["--heartbeat", &ms(o.heartbeat)])
            .args(["--election-timeout", &ms(election_timeout)])
            .args(["--snapshot-every", &o.snapshot_every.to_string()])
            .args(["--keep-logs", &o.keep_logs.to_string()])
            .args(["--sweep-interval", &ms(o.sweep_interval)])
            .args(&routes)
            // Plain text logs: they are read by people and grepped by tests.
            .env("NO_COLOR", "1")
            .envs(o.env.get(&id).into_iter().flatten().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot run {}", self.bin.display()))?;
        Ok(child)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A node waiting in a sync a power loss holds could not exit.
        self.fail_held_syncs();
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Unmounted before the temporary directory goes, so it can be removed.
        self.disks.clear();
        if std::thread::panicking() {
            for id in self.nodes.keys() {
                eprintln!("--- node {id} log (tail) ---\n{}", self.log_tail(*id, 40));
            }
            self.dir.disable_cleanup(true);
            eprintln!("cluster data kept in {}", self.dir.path().display());
        }
    }
}

/// Mounts a power-cut file system at `node`'s data dir, backed by `<dir>/node-<id>.disk`.
fn mount_disk(dir: &Path, node: &NodeProcess) -> anyhow::Result<Mounted> {
    let backing = dir.join(format!("node-{}.disk", node.id));
    std::fs::create_dir_all(&backing)?;
    std::fs::create_dir_all(&node.data_dir)?;
    Mounted::mount(&backing, &node.data_dir)
        .with_context(|| format!("cannot mount a power-cut data dir for node {}", node.id))
}

/// Sends `SIG<name>` to `pid` with `kill(1)` (the workspace forbids `unsafe`, so no libc).
fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .context("cannot run kill")?;
    if !status.success() {
        bail!("kill -{name} {pid} failed: {status}");
    }
    Ok(())
}

/// `250ms`.
fn ms(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// A port below the kernel's ephemeral range (so an outgoing connection cannot be holding it
/// when a killed node comes back), free right now, and not already chosen.
fn free_port(taken: &BTreeSet<u16>) -> anyhow::Result<u16> {
    let mut rng = rand::rng();
    for _ in 0..200 {
        let port = rng.random_range(20_000..32_000u16);
        if taken.contains(&port) {
            continue;
        }
        if TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port found in 20000..32000")
}
