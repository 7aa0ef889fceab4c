//! Baton in Docker containers: the image `deploy/image.sh` builds, the three-node cluster of
//! `deploy/docker-compose.yml` under a compose project of its own, and the faults containers
//! suffer — `docker kill` (SIGKILL), `docker stop` (SIGTERM), `docker pause` (cgroup freezer)
//! and `docker network disconnect` from the peer network.
//!
//! Addressing (deploy/README.md explains it for operators): each node advertises the port it is
//! published at on 127.0.0.1, so the client library on the host follows `NOT_LEADER` redirects to
//! addresses it can dial; the nodes reach each other over the internal `peers` network by the
//! aliases `peer1..peer3` (`--peer-addr`). Disconnecting a node from `peers` therefore cuts its
//! Raft links and nothing else: clients still reach it, so the nemesis probes an isolated old
//! leader exactly as it does with node processes.
//!
//! A machine without a Docker engine (or without compose) skips these tests
//! ([`engine_or_skip`]); with `BATON_REQUIRE_DOCKER=1` it fails them instead. Each cluster runs
//! under the compose project `baton-ct-<pid>-<n>` with free host ports on 127.0.0.1; dropping it
//! runs `down -v` and removes its image, and the next cluster removes what a test process that
//! was killed left behind (projects whose pid no longer runs). Linux only, like the rest of the
//! harness (`/proc` tells whether that pid runs).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use baton_rpc::proto::NodeInfoResponse;
use baton_rpc::{Client, ClientConfig};
use rand::Rng;

use crate::binary::baton_bin;
use crate::robustness::faults::LeaderFault;
use crate::robustness::target::Target;
use crate::wait;

/// Set to `1` to fail, instead of skip, the Docker tests on a machine where no engine answers.
pub const REQUIRE_ENV: &str = "BATON_REQUIRE_DOCKER";
/// Compose projects of test clusters are named `<PREFIX><pid>-<n>`.
const PREFIX: &str = "baton-ct-";
/// Test images are tagged `<IMAGE_REPO>:<project>`.
const IMAGE_REPO: &str = "baton-ct";
/// The label compose puts on every container, network and volume of a project.
const PROJECT_LABEL: &str = "com.docker.compose.project";
/// The label compose puts on a service's containers.
const SERVICE_LABEL: &str = "com.docker.compose.service";
/// The label compose puts on the networks it creates (the network's name in the file).
const NETWORK_LABEL: &str = "com.docker.compose.network";
/// The Raft network of `deploy/docker-compose.yml`; node N is `peer<N>` on it.
const PEERS_NETWORK: &str = "peers";
/// How long a quick docker command (kill, pause, inspect, connect) may take.
const QUICK: Duration = Duration::from_secs(30);
/// How long building the image, starting or removing the cluster may take.
const SLOW: Duration = Duration::from_secs(180);
/// How long a node may take to answer, elect, catch up or finish `cluster init`.
const WAIT: Duration = Duration::from_secs(30);
/// The nodes of `deploy/docker-compose.yml`.
const NODES: [u64; 3] = [1, 2, 3];

/// A Docker engine that answers, and the compose command that drives it.
#[derive(Debug, Clone)]
pub struct Engine {
    /// `["docker", "compose"]` (the v2 plugin) or `["docker-compose"]` (v1).
    compose: Vec<String>,
    /// The engine's version.
    pub server_version: String,
}

impl Engine {
    /// The local engine, or why there is none: `docker` is missing, `docker info` fails, or
    /// neither `docker compose` nor `docker-compose` runs.
    pub async fn detect() -> Result<Engine, String> {
        let info = exec(
            "docker",
            &["info", "--format", "{{.ServerVersion}}"],
            &[],
            QUICK,
        )
        .await
        .map_err(|e| format!("{e:#}"))?;
        if !info.success() {
            return Err(format!("`docker info` failed: {}", info.stderr.trim()));
        }
        let server_version = info.stdout.trim().to_string();
        for compose in [vec!["docker", "compose"], vec!["docker-compose"]] {
            let mut args: Vec<&str> = compose[1..].to_vec();
            args.push("version");
            if let Ok(output) = exec(compose[0], &args, &[], QUICK).await {
                if output.success() {
                    return Ok(Engine {
                        compose: compose.into_iter().map(str::to_string).collect(),
                        server_version,
                    });
                }
            }
        }
        Err(format!(
            "engine {server_version} answers, but neither `docker compose` nor `docker-compose` runs"
        ))
    }

    /// The compose command, as one would type it.
    pub fn compose_command(&self) -> String {
        self.compose.join(" ")
    }
}

/// The engine, or `None` after printing `<test>: skipped: no Docker engine (<why>)`. Fails
/// instead when [`REQUIRE_ENV`] is `1`.
pub async fn engine_or_skip(test: &str) -> anyhow::Result<Option<Engine>> {
    match Engine::detect().await {
        Ok(engine) => Ok(Some(engine)),
        Err(why) if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") => {
            bail!("{test}: no Docker engine ({why}), and {REQUIRE_ENV}=1 requires one")
        }
        Err(why) => {
            println!("{test}: skipped: no Docker engine ({why})");
            Ok(None)
        }
    }
}

/// The three-node cluster of `deploy/docker-compose.yml`, running under its own compose
/// project, with the operations the tests and the nemesis need. Dropping it removes every
/// container, network, volume and the image it created (printing the nodes' logs first when
/// the drop happens during a panic).
pub struct DockerCluster {
    engine: Engine,
    deploy: PathBuf,
    project: String,
    image: String,
    ports: BTreeMap<u64, u16>,
    containers: BTreeMap<u64, String>,
    peers: String,
    admin: Client,
    stopped: BTreeSet<u64>,
    paused: BTreeSet<u64>,
    isolated: BTreeSet<u64>,
}

impl DockerCluster {
    /// Builds the image from the harness's `baton` binary ([`baton_bin`]), starts the compose
    /// cluster on free ports, waits for its `init` service to form the cluster and for a leader.
    pub async fn start(engine: Engine) -> anyhow::Result<DockerCluster> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        let deploy = workspace_root().join("deploy");
        remove_leftovers(&engine, &deploy).await;
        let project = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let ports = free_ports(NODES.len())?;
        let ports: BTreeMap<u64, u16> = NODES.into_iter().zip(ports).collect();
        let endpoints: Vec<String> = ports.values().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut cluster = DockerCluster {
            image: format!("{IMAGE_REPO}:{project}"),
            admin: Client::new(&endpoints, admin_config())?,
            engine,
            deploy,
            project,
            ports,
            containers: BTreeMap::new(),
            peers: String::new(),
            stopped: BTreeSet::new(),
            paused: BTreeSet::new(),
            isolated: BTreeSet::new(),
        };
        // From here on, an error drops `cluster`, which removes whatever was created.
        if let Err(error) = cluster.bring_up().await {
            let logs = cluster.logs(40).await;
            return Err(error.context(format!(
                "the compose cluster {} did not come up\n{logs}",
                cluster.project
            )));
        }
        Ok(cluster)
    }

    async fn bring_up(&mut self) -> anyhow::Result<()> {
        let bin = baton_bin()?;
        let script = self.deploy.join("image.sh");
        let built = exec(
            "bash",
            &[path_str(&script)?, path_str(&bin)?, &self.image],
            &[],
            SLOW,
        )
        .await?;
        if !built.success() {
            bail!("{} failed:\n{built}", script.display());
        }
        self.compose(&["up", "-d"], SLOW).await?;
        for id in NODES {
            let container = self.container_of(&format!("node{id}")).await?;
            self.containers.insert(id, container);
        }
        self.peers = self.peers_network().await?;
        self.wait_for_init().await?;
        self.leader().await?;
        Ok(())
    }

    /// The compose project name.
    pub fn project(&self) -> &str {
        &self.project
    }

    /// The engine the cluster runs on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Stops node `id` gracefully (`docker stop`: SIGTERM, SIGKILL only after the compose file's
    /// `stop_grace_period`, which outlasts the node's longest stop, so a drain or handover is never
    /// cut short); [`Target::restart`] starts it again.
    pub async fn stop(&mut self, id: u64) -> anyhow::Result<()> {
        let container = self.container(id)?.to_string();
        docker(&["stop", "--time", "45", &container], SLOW).await?;
        self.stopped.insert(id);
        Ok(())
    }

    /// The last `lines` lines of every node's log and of the `init` service's, for a failure
    /// report.
    pub async fn logs(&self, lines: usize) -> String {
        let tail = lines.to_string();
        let mut text = String::new();
        for service in ["node1", "node2", "node3", "init"] {
            let Ok(container) = self.container_of(service).await else {
                text.push_str(&format!("--- {service}: no container ---\n"));
                continue;
            };
            let state = docker(
                &[
                    "inspect",
                    "--format",
                    "{{.State.Status}}, exit code {{.State.ExitCode}}",
                    &container,
                ],
                QUICK,
            )
            .await
            .unwrap_or_else(|e| format!("unknown state: {e:#}"));
            let log = match exec("docker", &["logs", "--tail", &tail, &container], &[], QUICK).await
            {
                // Nodes log to stderr; `docker logs` replays both streams.
                Ok(output) => format!("{}{}", output.stdout, output.stderr),
                Err(error) => format!("cannot read the log: {error:#}"),
            };
            text.push_str(&format!(
                "--- {service} ({}) log (tail) ---\n{log}",
                state.trim()
            ));
        }
        text
    }

    /// Runs `compose -p <project> -f deploy/docker-compose.yml <args>` with this cluster's
    /// image and ports; fails with its output when it fails.
    async fn compose(&self, args: &[&str], limit: Duration) -> anyhow::Result<String> {
        let output = compose(
            &self.engine,
            &self.deploy,
            &self.project,
            &self.env(),
            args,
            limit,
        )
        .await?;
        if !output.success() {
            bail!(
                "{} {} failed:\n{output}",
                self.engine.compose_command(),
                args.join(" ")
            );
        }
        Ok(output.stdout)
    }

    /// The variables `deploy/docker-compose.yml` reads.
    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("BATON_IMAGE".to_string(), self.image.clone()),
            ("BATON_BIND".to_string(), "127.0.0.1".to_string()),
            ("BATON_ADVERTISE_HOST".to_string(), "127.0.0.1".to_string()),
        ];
        for (id, port) in &self.ports {
            env.push((format!("BATON_PORT_{id}"), port.to_string()));
        }
        env
    }

    /// The id of `service`'s container (found by compose's labels, which v1 and v2 share).
    async fn container_of(&self, service: &str) -> anyhow::Result<String> {
        let project = format!("label={PROJECT_LABEL}={}", self.project);
        let service_filter = format!("label={SERVICE_LABEL}={service}");
        let ids = docker(
            &[
                "ps",
                "-aq",
                "--filter",
                &project,
                "--filter",
                &service_filter,
            ],
            QUICK,
        )
        .await?;
        ids.split_whitespace()
            .next()
            .map(str::to_string)
            .with_context(|| format!("no container for service {service} of {}", self.project))
    }

    fn container(&self, id: u64) -> anyhow::Result<&str> {
        self.containers
            .get(&id)
            .map(String::as_str)
            .with_context(|| format!("no node {id}"))
    }

    /// The name of the project's Raft network.
    async fn peers_network(&self) -> anyhow::Result<String> {
        let project = format!("label={PROJECT_LABEL}={}", self.project);
        let network = format!("label={NETWORK_LABEL}={PEERS_NETWORK}");
        let names = docker(
            &[
                "network",
                "ls",
                "--filter",
                &project,
                "--filter",
                &network,
                "--format",
                "{{.Name}}",
            ],
            QUICK,
        )
        .await?;
        names
            .split_whitespace()
            .next()
            .map(str::to_string)
            .with_context(|| format!("{} has no {PEERS_NETWORK} network", self.project))
    }

    /// Waits until the `init` service has exited, and requires it to have formed the cluster.
    async fn wait_for_init(&self) -> anyhow::Result<()> {
        let container = self.container_of("init").await?;
        let state = wait::until("the init service to finish", WAIT, || {
            let container = container.clone();
            async move {
                let state = docker(
                    &[
                        "inspect",
                        "--format",
                        "{{.State.Status}} {{.State.ExitCode}}",
                        &container,
                    ],
                    QUICK,
                )
                .await
                .map_err(|e| format!("{e:#}"))?;
                match state.split_whitespace().collect::<Vec<_>>()[..] {
                    ["exited", code] => Ok(code.to_string()),
                    _ => Err(format!("init is {}", state.trim())),
                }
            }
        })
        .await?;
        if state != "0" {
            let log = exec("docker", &["logs", &container], &[], QUICK).await?;
            bail!("`baton cluster init` exited {state}:\n{log}");
        }
        Ok(())
    }
}

impl Target for DockerCluster {
    fn endpoints(&self) -> Vec<String> {
        self.ports
            .values()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect()
    }

    /// # Panics
    /// When there is no such node (a bug in the test).
    fn addr(&self, id: u64) -> String {
        let port = self
            .ports
            .get(&id)
            .unwrap_or_else(|| panic!("no node {id}"));
        format!("127.0.0.1:{port}")
    }

    fn ids(&self) -> Vec<u64> {
        self.ports.keys().copied().collect()
    }

    fn live_ids(&self) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| !self.stopped.contains(id))
            .collect()
    }

    fn timeout(&self) -> Duration {
        WAIT
    }

    async fn node_info(&self, id: u64) -> Result<NodeInfoResponse, baton_rpc::Error> {
        self.admin.node_info(&self.addr(id)).await
    }

    async fn state_digest(
        &self,
        id: u64,
    ) -> Result<baton_rpc::proto::StateDigestResponse, baton_rpc::Error> {
        self.admin.state_digest(&self.addr(id)).await
    }

    /// `docker kill` (SIGKILL), then waits until the container has stopped.
    async fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let container = self.container(id)?.to_string();
        docker(&["kill", &container], QUICK).await?;
        docker(&["wait", &container], QUICK).await?;
        self.stopped.insert(id);
        Ok(())
    }

    /// `docker start`, then waits until the node answers at its published port.
    async fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        let container = self.container(id)?.to_string();
        docker(&["start", &container], QUICK).await?;
        self.stopped.remove(&id);
        let what = format!("restarted node {id} to answer");
        let this = &*self;
        let answered = wait::until(&what, WAIT, || async move {
            match this.node_info(id).await {
                Ok(info) if info.id == id => Ok(()),
                Ok(info) => Err(format!("node {} answered at its address", info.id)),
                Err(error) => Err(error.to_string()),
            }
        })
        .await;
        if let Err(error) = answered {
            let log = exec("docker", &["logs", "--tail", "30", &container], &[], QUICK).await?;
            return Err(error.context(format!("--- node {id} log ---\n{log}")));
        }
        Ok(())
    }

    /// `docker pause`: the cgroup freezer stops every process of the container.
    async fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        let container = self.container(id)?.to_string();
        docker(&["pause", &container], QUICK).await?;
        self.paused.insert(id);
        Ok(())
    }

    /// `docker unpause`.
    async fn resume(&mut self, id: u64) -> anyhow::Result<()> {
        let container = self.container(id)?.to_string();
        docker(&["unpause", &container], QUICK).await?;
        self.paused.remove(&id);
        Ok(())
    }

    /// `docker network disconnect` from the Raft network (the client network stays).
    async fn isolate(&mut self, id: u64) -> anyhow::Result<()> {
        let container = self.container(id)?.to_string();
        docker(&["network", "disconnect", &self.peers, &container], QUICK).await?;
        self.isolated.insert(id);
        Ok(())
    }

    /// `docker network connect` back, with the node's peer alias.
    async fn heal_all(&mut self) -> anyhow::Result<()> {
        for id in self.isolated.clone() {
            let container = self.container(id)?.to_string();
            let alias = format!("peer{id}");
            docker(
                &[
                    "network",
                    "connect",
                    "--alias",
                    &alias,
                    &self.peers,
                    &container,
                ],
                QUICK,
            )
            .await?;
            self.isolated.remove(&id);
        }
        Ok(())
    }

    fn fault_words(&self, fault: LeaderFault) -> (&'static str, &'static str) {
        match fault {
            LeaderFault::Kill => ("docker kill", "docker start"),
            LeaderFault::Pause => ("docker pause", "docker unpause"),
            LeaderFault::Isolate => ("docker network disconnect", "docker network connect (heal)"),
        }
    }

    /// Writes every node's full log to a directory that is kept (the containers and volumes are
    /// removed with the cluster).
    fn keep(&mut self) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("{}-logs", self.project));
        let containers = self.containers.clone();
        let target = dir.clone();
        blocking(async move {
            if let Err(error) = std::fs::create_dir_all(&target) {
                eprintln!("cannot create {}: {error}", target.display());
                return;
            }
            for (id, container) in containers {
                let text = match exec("docker", &["logs", &container], &[], QUICK).await {
                    Ok(output) => format!("{}{}", output.stdout, output.stderr),
                    Err(error) => format!("cannot read the log: {error:#}"),
                };
                let _ = std::fs::write(target.join(format!("node-{id}.log")), text);
            }
        });
        dir
    }
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let engine = self.engine.clone();
        let deploy = self.deploy.clone();
        let project = self.project.clone();
        let image = self.image.clone();
        let paused: Vec<String> = self
            .paused
            .iter()
            .filter_map(|id| self.containers.get(id).cloned())
            .collect();
        let logs = panicking.then(|| self.logs(40));
        blocking(async move {
            if let Some(logs) = logs {
                eprintln!("{}", logs.await);
            }
            // A frozen container cannot act on the stop signal; thaw it first.
            for container in paused {
                let _ = docker(&["unpause", &container], QUICK).await;
            }
            remove_project(&engine, &deploy, &project).await;
            let _ = docker(&["rmi", "--force", &image], QUICK).await;
        });
    }
}

/// Removes every container, network and volume of `project`: `compose down -v`, then whatever
/// still carries the project's label (a half-created project, or a compose that failed).
async fn remove_project(engine: &Engine, deploy: &Path, project: &str) {
    let down = compose(
        engine,
        deploy,
        project,
        &[],
        &["down", "--volumes", "--remove-orphans", "--timeout", "2"],
        SLOW,
    )
    .await;
    match down {
        Ok(output) if output.success() => {}
        Ok(output) => eprintln!("docker: compose down of {project} failed:\n{output}"),
        Err(error) => eprintln!("docker: compose down of {project} failed: {error:#}"),
    }
    let label = format!("label={PROJECT_LABEL}={project}");
    let kinds: [(&[&str], &[&str]); 3] = [
        (&["ps", "-aq"], &["rm", "--force"]),
        (&["network", "ls", "-q"], &["network", "rm"]),
        (&["volume", "ls", "-q"], &["volume", "rm", "--force"]),
    ];
    for (list, remove) in kinds {
        let mut args = list.to_vec();
        args.extend(["--filter", &label]);
        let Ok(ids) = docker(&args, QUICK).await else {
            continue;
        };
        for id in ids.split_whitespace() {
            let mut args = remove.to_vec();
            args.push(id);
            if let Err(error) = docker(&args, QUICK).await {
                eprintln!("docker: cannot remove {id} of {project}: {error:#}");
            }
        }
    }
}

/// Removes the projects and images earlier test processes left behind when they were killed
/// before their cluster was dropped: those named after a pid that no longer runs.
async fn remove_leftovers(engine: &Engine, deploy: &Path) {
    let label = format!("label={PROJECT_LABEL}");
    let format = format!("{{{{.Label \"{PROJECT_LABEL}\"}}}}");
    let mut projects = BTreeSet::new();
    for list in [&["ps", "-a"][..], &["network", "ls"], &["volume", "ls"]] {
        let mut args = list.to_vec();
        args.extend(["--filter", &label, "--format", &format]);
        if let Ok(names) = docker(&args, QUICK).await {
            projects.extend(names.split_whitespace().map(str::to_string));
        }
    }
    for project in projects.iter().filter(|p| is_abandoned(p)) {
        eprintln!("docker: removing {project}, left behind by a test process that is gone");
        remove_project(engine, deploy, project).await;
    }
    let images = docker(&["images", IMAGE_REPO, "--format", "{{.Tag}}"], QUICK).await;
    for tag in images.iter().flat_map(|tags| tags.split_whitespace()) {
        if is_abandoned(tag) {
            let _ = docker(&["rmi", "--force", &format!("{IMAGE_REPO}:{tag}")], QUICK).await;
        }
    }
}

/// Whether `project` is a test project whose process no longer runs.
fn is_abandoned(project: &str) -> bool {
    let Some(pid) = project
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
    else {
        return false;
    };
    pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
}

/// What a finished command printed.
#[derive(Debug)]
struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Output {
    fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\nstdout: {}\nstderr: {}",
            self.code,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

/// Runs `program args...` with `env` added, killed when it outlives `limit`.
async fn exec(
    program: &str,
    args: &[&str],
    env: &[(String, String)],
    limit: Duration,
) -> anyhow::Result<Output> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let line = format!("{program} {}", args.join(" "));
    let output = tokio::time::timeout(limit, command.output())
        .await
        .with_context(|| format!("`{line}` did not finish within {limit:?}"))?
        .with_context(|| format!("cannot run `{line}`"))?;
    Ok(Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// Runs `docker args...`; its standard output, or an error with everything it printed.
async fn docker(args: &[&str], limit: Duration) -> anyhow::Result<String> {
    let output = exec("docker", args, &[], limit).await?;
    if !output.success() {
        bail!("docker {} failed: {output}", args.join(" "));
    }
    Ok(output.stdout)
}

/// Runs compose on `deploy/docker-compose.yml` under `project`.
async fn compose(
    engine: &Engine,
    deploy: &Path,
    project: &str,
    env: &[(String, String)],
    args: &[&str],
    limit: Duration,
) -> anyhow::Result<Output> {
    let file = deploy.join("docker-compose.yml");
    let mut all: Vec<&str> = engine.compose[1..].iter().map(String::as_str).collect();
    all.extend(["--project-name", project, "--file", path_str(&file)?]);
    all.extend(args);
    exec(&engine.compose[0], &all, env, limit).await
}

/// Runs `work` to completion from synchronous code (a `Drop`, a trait method that cannot be
/// async), on a thread of its own with its own runtime, so it works inside and outside a tokio
/// runtime.
fn blocking(work: impl Future<Output = ()> + Send) {
    std::thread::scope(|scope| {
        let joined = scope
            .spawn(|| {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(work),
                    Err(error) => eprintln!("docker: cannot start a runtime: {error}"),
                }
            })
            .join();
        if joined.is_err() {
            eprintln!("docker: the clean-up thread panicked");
        }
    });
}

/// Timeouts for per-node introspection (no retries: a stopped node must answer "no" fast).
fn admin_config() -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_secs(2),
        attempt_timeout: Duration::from_millis(700),
        connect_timeout: Duration::from_millis(300),
    }
}

/// `n` distinct ports, free right now, below the kernel's ephemeral range (so an outgoing
/// connection cannot be holding one when a restarted container publishes it again).
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let mut rng = rand::rng();
    let mut ports = Vec::new();
    for _ in 0..500 {
        if ports.len() == n {
            return Ok(ports);
        }
        let port = rng.random_range(20_000..32_000u16);
        if !ports.contains(&port)
            && TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok()
        {
            ports.push(port);
        }
    }
    bail!("no {n} free ports found in 20000..32000")
}

/// The workspace root, known at compile time.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not valid UTF-8", path.display()))
}
