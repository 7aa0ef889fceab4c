//! The bench's own cluster: `baton node` processes of this very binary in a temporary directory.
//!
//! The standard workloads only start it and read the nodes' peak RSS; the failover workload also
//! kills its leader, and the scale workload adds a fourth node as a learner and reads what the
//! nodes logged about their snapshots and sweeps.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use baton_rpc::{Client, ClientConfig};

/// The log filter of the nodes of the standard workloads.
pub const QUIET_LOGS: &str = "warn";

/// One `baton node` process.
struct Member {
    id: u64,
    addr: String,
    child: Child,
}

/// `baton node` processes of this binary in a temporary directory, killed when dropped.
pub struct OwnCluster {
    /// The three founding members' addresses, in id order.
    pub endpoints: Vec<String>,
    members: Vec<Member>,
    node_args: Vec<String>,
    log_filter: String,
    dir: tempfile::TempDir,
}

impl OwnCluster {
    /// Starts three nodes (each with `node_args` appended to its command line and `log_filter`
    /// as its `RUST_LOG`) and forms a cluster of them.
    pub async fn start(node_args: &[String], log_filter: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut cluster = OwnCluster {
            endpoints: Vec::new(),
            members: Vec::new(),
            node_args: node_args.to_vec(),
            log_filter: log_filter.to_string(),
            dir,
        };
        for id in 1..=3u64 {
            let addr = cluster.spawn(id)?;
            cluster.endpoints.push(addr);
        }
        cluster.initialize().await?;
        Ok(cluster)
    }

    /// Starts node `id` with an empty data directory (not yet a member); returns its address.
    pub fn spawn(&mut self, id: u64) -> Result<String, String> {
        let bin = std::env::current_exe().map_err(|e| e.to_string())?;
        let port = free_port().map_err(|e| e.to_string())?;
        let addr = format!("127.0.0.1:{port}");
        let data = self.dir.path().join(format!("node-{id}"));
        let log = std::fs::File::create(self.log_path(id)).map_err(|e| e.to_string())?;
        let child = spawn_node(
            &bin,
            id,
            &addr,
            &data,
            log,
            &self.node_args,
            &self.log_filter,
        )
        .map_err(|e| e.to_string())?;
        self.members.push(Member {
            id,
            addr: addr.clone(),
            child,
        });
        Ok(addr)
    }

    /// Waits until the node at `addr` answers (bounded: 10 s).
    pub async fn wait_until_up(client: &Client, addr: &str) -> Result<(), String> {
        for _ in 0..100 {
            if client.node_info(addr).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("node at {addr} did not start"))
    }

    async fn initialize(&mut self) -> Result<(), String> {
        let client =
            Client::new(&self.endpoints, ClientConfig::default()).map_err(|e| e.to_string())?;
        let mut members = Vec::new();
        for endpoint in &self.endpoints {
            if let Err(why) = Self::wait_until_up(&client, endpoint).await {
                // Its log goes with the temporary directory: say what it said.
                let said = self
                    .members
                    .iter()
                    .find(|member| &member.addr == endpoint)
                    .and_then(|member| std::fs::read_to_string(self.log_path(member.id)).ok())
                    .map(|log| last_lines(&log, 5))
                    .unwrap_or_default();
                return Err(format!("{why}; its log ends:\n{said}"));
            }
            let info = client
                .node_info(endpoint)
                .await
                .map_err(|e| e.to_string())?;
            members.push((info.id, info.addr));
        }
        client
            .initialize(&self.endpoints[0], &members)
            .await
            .map_err(|e| e.to_string())?;
        client.discover_leader().await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The id of the node listening at `addr`.
    pub fn id_at(&self, addr: &str) -> Option<u64> {
        self.members
            .iter()
            .find(|member| member.addr == addr)
            .map(|member| member.id)
    }

    /// The address of node `id`.
    pub fn addr_of(&self, id: u64) -> Option<&str> {
        self.members
            .iter()
            .find(|member| member.id == id)
            .map(|member| member.addr.as_str())
    }

    /// The ids of the nodes still running, in start order.
    pub fn running_ids(&self) -> Vec<u64> {
        self.members.iter().map(|member| member.id).collect()
    }

    /// SIGKILLs node `id` (no shutdown, no flush: a crash) and reaps it.
    pub fn kill(&mut self, id: u64) -> Result<(), String> {
        let index = self
            .members
            .iter()
            .position(|member| member.id == id)
            .ok_or_else(|| format!("no running node {id}"))?;
        let mut member = self.members.remove(index);
        member.child.kill().map_err(|e| e.to_string())?;
        let _ = member.child.wait();
        Ok(())
    }

    /// Where node `id` writes its log.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    /// Each running node's peak resident set (VmHWM) in KiB, read from /proc.
    pub fn peak_rss_kib(&self) -> Vec<u64> {
        self.proc_status("VmHWM:")
    }

    /// Each running node's current resident set (VmRSS) in KiB, read from /proc.
    pub fn rss_kib(&self) -> Vec<u64> {
        self.proc_status("VmRSS:")
    }

    /// Each running node's CPU time so far (user + system), in ms, read from /proc.
    pub fn cpu_ms(&self) -> Vec<u64> {
        self.members
            .iter()
            .map(|member| proc_cpu_ms(member.child.id()).unwrap_or(0))
            .collect()
    }

    fn proc_status(&self, field: &str) -> Vec<u64> {
        self.members
            .iter()
            .map(|member| proc_status_kib(member.child.id(), field).unwrap_or(0))
            .collect()
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            let _ = member.child.kill();
            let _ = member.child.wait();
        }
    }
}

/// A `kB` field of `/proc/<pid>/status`.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|line| line.starts_with(field))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
}

/// A process's user + system CPU time in ms, from `/proc/<pid>/stat` (fields 14 and 15, in clock
/// ticks of 10 ms: Linux's `USER_HZ` is 100 on every mainstream architecture).
pub fn proc_cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it are plain numbers.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) * 10)
}

fn spawn_node(
    bin: &Path,
    id: u64,
    addr: &str,
    data: &Path,
    log: std::fs::File,
    node_args: &[String],
    log_filter: &str,
) -> std::io::Result<Child> {
    let err = log.try_clone()?;
    let mut command = Command::new(bin);
    // `baton node` reads every `BATON_*` variable as configuration: the caller's (a client's
    // `BATON_TLS_CA`, a production `BATON_RAFT_*`) would make the bench's own plaintext, default
    // cluster fail to start, or measure another configuration than the one it reports.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("BATON_") {
            command.env_remove(name);
        }
    }
    command
        .args([
            "node",
            "--id",
            &id.to_string(),
            "--listen",
            addr,
            "--data-dir",
        ])
        .arg(data)
        .args(node_args)
        .env("RUST_LOG", log_filter)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
}

/// The last `count` lines of `text`.
fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    Ok(listener.local_addr()?.port())
}
