//! The command line: argument types and dispatch.

/// `println!` for a client command's output. A reader that went away (`baton board list | head
/// -1`) ends the command at once with [`exit::CLOSED_PIPE`], as a filter killed by SIGPIPE ends;
/// `println!` would panic (exit 101) on the closed pipe. Not for commands that must finish what
/// they started whatever happens to their output (`worker run`).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::print_line(format_args!($($arg)*))
    };
}

mod bench;
mod board;
mod certs;
mod checkpoint;
mod cluster;
mod dev;
mod effect;
pub mod exit;
mod leader;
mod members;
mod node;
mod queue;
pub mod runtime;
mod security;
mod sink;
mod snapshot;
mod task_command;
mod ticket;
mod verify;
mod watch;

/// Bytes for a `name=value` line: as they are when UTF-8, else `name_base64=...` (never
/// printed altered, as a lossy conversion would).
pub(crate) fn bytes_field(name: &str, bytes: &[u8]) -> String {
    use base64::Engine;
    match std::str::from_utf8(bytes) {
        Ok(text) => format!("{name}={text}"),
        Err(_) => format!(
            "{name}_base64={}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        ),
    }
}

/// Puts `bytes` into a JSON object as `name`: as text when they are UTF-8, otherwise `null` with
/// the bytes in `<name>_base64` (never altered, as a lossy conversion or a parse would).
pub(crate) fn put_bytes(object: &mut serde_json::Value, name: &str, bytes: &[u8]) {
    use base64::Engine;
    match std::str::from_utf8(bytes) {
        Ok(text) => object[name] = text.into(),
        Err(_) => {
            object[name] = serde_json::Value::Null;
            object[format!("{name}_base64")] = base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .into();
        }
    }
}

/// Writes one line of output for [`out!`].
pub(crate) fn print_line(line: std::fmt::Arguments<'_>) {
    write_out(format!("{line}\n").as_bytes());
}

/// Writes `bytes` to stdout, or ends the process: with [`exit::CLOSED_PIPE`] when the reader
/// went away, with exit 1 on another failure (a full disk under `> file` must not look like a
/// complete copy).
pub(crate) fn write_out(bytes: &[u8]) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(i32::from(exit::CLOSED_PIPE));
        }
        eprintln!("baton: cannot print: {error}");
        std::process::exit(i32::from(exit::FAILURE));
    }
}

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton_node::config::{LogFormat, NodeConfig, Settings};
use baton_rpc::{Client, ClientConfig};
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// How long a client command keeps retrying when `--timeout` is not given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// The default endpoints: the cluster `baton dev` starts.
const DEV_ENDPOINTS: &str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003";

/// Baton: a replicated coordination store for handoffs, leases and exactly-once rights.
#[derive(Parser, Debug)]
#[command(name = "baton", version, about, long_about = None)]
pub struct Cli {
    /// Cluster endpoints (host:port, comma-separated) for client commands [default: the
    /// `baton dev` cluster, 127.0.0.1:7001-7003; `baton bench` starts its own cluster instead
    /// and reads this only from the command line].
    #[arg(long, global = true, env = "BATON_ENDPOINTS", value_delimiter = ',')]
    endpoints: Option<Vec<String>>,

    /// Whether `endpoints` came from `BATON_ENDPOINTS` rather than the command line: `baton
    /// bench` loads and seeds a cluster only when told to on its command line, never because a
    /// shell exported the production cluster's address.
    #[arg(skip)]
    endpoints_from_env: bool,

    /// The global flags given on the command line (not from the environment), by their clap
    /// ids: a command that has no use for one refuses it rather than ignore it silently.
    #[arg(skip)]
    given: Vec<&'static str>,

    /// How long each call of a client command keeps retrying before it gives up [default:
    /// 15s]: finding the leader, then every request the command makes, so a command of several
    /// steps (`members promote`) can take a few times as long; no single attempt waits longer
    /// (`status` probes each node once). For `ticket wait`: how long to wait
    /// for a ticket [default: 60s]. `leader transfer` bounds finding the leader by it, then waits
    /// for the handover itself up to 30 s (the leader gives up after 25 s).
    #[arg(long, global = true, value_parser = timeout)]
    timeout: Option<Duration>,

    #[command(flatten)]
    security: security::SecurityArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a local three-node cluster in this process (data survives restarts).
    Dev(dev::DevArgs),
    /// Run one node (configured by --config FILE, BATON_* variables and flags).
    Node(Box<node::NodeArgs>),
    /// Cluster formation.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Measure a coordination workload (starts its own local cluster without --endpoints).
    Bench(bench::BenchArgs),
    /// Membership: list, add a learner, promote it, remove a member.
    #[command(subcommand)]
    Members(members::MembersCommand),
    /// Show every member: id, address, role, term, last log index, applied index.
    Status {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Exit 1 when no member leads (by default `status` exits 0 without a leader: it is
        /// also the containers' health check, which must pass before a cluster is formed).
        #[arg(long)]
        require_leader: bool,
    },
    /// Handoff tickets.
    #[command(subcommand)]
    Ticket(ticket::TicketCommand),
    /// Judge the current ticket snapshot; exits 1 and lists the problems when there are any.
    Check,
    /// Task board: seeded tasks, claims with tokens and fences.
    #[command(subcommand)]
    Board(board::BoardCommand),
    /// Side-effect gate: at most once for actions that touch the outside world.
    #[command(subcommand)]
    Effect(effect::EffectCommand),
    /// Fenced sink: writes that a stale fence can never overwrite.
    #[command(subcommand)]
    Sink(sink::SinkCommand),
    /// Checkpoint compare-and-set: a run's progress only moves forward.
    #[command(subcommand)]
    Checkpoint(checkpoint::CheckpointCommand),
    /// Task queues: create and list them (queues in a namespace share concurrency keys).
    #[command(subcommand)]
    Queue(queue::QueueCommand),
    /// Queue tasks: submit with an optional concurrency key, inspect, cancel, attempt history.
    #[command(subcommand)]
    Task(queue::TaskCommand),
    /// Queue workers: run a demo worker that executes a command per task.
    #[command(subcommand)]
    Worker(queue::WorkerCommand),
    /// Follow committed changes as they happen: one line per change, in commit order.
    Watch(watch::WatchArgs),
    /// Leadership: hand it to another voter.
    #[command(subcommand)]
    Leader(leader::LeaderCommand),
    /// Backups: save the state to a file, inspect a file, restore a new cluster from one.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// TLS certificates: a private CA and node/client certificates.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
}

fn parse_peer_addr(value: &str) -> Result<(u64, String), String> {
    let (id, addr) = value
        .split_once('=')
        .ok_or_else(|| format!("expected ID=ADDR, got {value:?}"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("bad node id {id:?}"))?;
    let addr = addr.trim();
    if addr.is_empty() {
        return Err("the address is empty".into());
    }
    if let Some(why) = baton_node::config::undialable(addr) {
        return Err(why);
    }
    Ok((id, addr.to_string()))
}

/// Raft tuning flags shared by `baton node` and `baton dev`.
#[derive(Args, Debug, Clone)]
pub struct TuningArgs {
    /// Leader heartbeat interval.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    heartbeat: Duration,
    /// Minimum election timeout (the maximum is twice this).
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    election_timeout: Duration,
    /// Build a snapshot every this many log entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Log entries kept behind a snapshot.
    #[arg(long, default_value_t = 1_000)]
    keep_logs: u64,
    /// The longest the leader goes without looking for due expiries; it sweeps as soon as a
    /// deadline passes anyway.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    sweep_interval: Duration,
    /// Changes kept in memory for watches; a watch from an older revision is refused COMPACTED,
    /// and a stream left this many / 2 changes behind is cut SLOW_CONSUMER.
    #[arg(long, env = "BATON_WATCH_HISTORY", default_value_t = 100_000)]
    watch_history: usize,
}

impl TuningArgs {
    /// A node configuration with these settings, checked as `baton node` checks its own; if
    /// one cannot be used, the flag and why.
    pub fn node_config(
        &self,
        id: u64,
        listen: SocketAddr,
        data_dir: PathBuf,
    ) -> Result<NodeConfig, String> {
        let mut settings = Settings {
            id: Some(id),
            listen,
            data_dir,
            sweep_interval: self.sweep_interval,
            ..Settings::default()
        };
        settings.raft.heartbeat = self.heartbeat;
        settings.raft.election_timeout = self.election_timeout;
        settings.raft.snapshot_every = self.snapshot_every;
        settings.raft.keep_logs = self.keep_logs;
        settings.watch.history = self.watch_history;
        // Not a flag of its own here: kept longer than the heartbeats it must outlast.
        settings.watch.leaderless_cutoff = settings
            .watch
            .leaderless_cutoff
            .max(self.heartbeat.saturating_mul(3));
        settings.to_node_config().map_err(|invalid| {
            if invalid.key == "watch.max_backlog" {
                // Derived from the history: half of it, which must leave room to resume.
                return "--watch-history must be at least 2".to_string();
            }
            let flag = match invalid.key.as_str() {
                "raft.heartbeat" => "--heartbeat",
                "raft.election_timeout" => "--election-timeout",
                "raft.snapshot_every" => "--snapshot-every",
                "raft.keep_logs" => "--keep-logs",
                "sweep_interval" => "--sweep-interval",
                "watch.history" => "--watch-history",
                other => other,
            };
            format!("{flag} {}", invalid.reason)
        })
    }
}

/// Starts logging to stderr with `filter` (`RUST_LOG` syntax) in `format`.
pub fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("baton: bad log filter {filter:?} ({e}); logging at info");
        tracing_subscriber::EnvFilter::new("info")
    });
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// The log filter of the commands other than `baton node` (which reads its own from its
/// configuration): `BATON_LOG`, else `RUST_LOG`, else `default`.
fn env_log_filter(default: &str) -> String {
    ["BATON_LOG", "RUST_LOG"]
        .iter()
        .find_map(|name| std::env::var(name).ok())
        .unwrap_or_else(|| default.to_string())
}

impl Cli {
    /// Parses the process's arguments (exits with clap's message and code on bad usage).
    pub fn from_process_args() -> Cli {
        let matches = Cli::command().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
        cli.endpoints_from_env =
            matches.value_source("endpoints") == Some(ValueSource::EnvVariable);
        cli.given = GLOBAL_FLAGS
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| matches.value_source(id) == Some(ValueSource::CommandLine))
            .collect();
        cli
    }

    /// The first global flag given on the command line that this command has no use for, with
    /// what to do instead; `None` when every one given applies.
    fn unused_flag(&self) -> Option<String> {
        const CLIENT_ONLY: &[&str] = &["endpoints", "timeout", "auth_token"];
        const TLS: &[&str] = &["tls_ca", "tls_cert", "tls_key"];
        let (command, unused): (&str, Vec<&str>) = match &self.command {
            // A node's TLS flags are its own identity; its tokens come from a file.
            Command::Node(_) => ("node", CLIENT_ONLY.to_vec()),
            // Plaintext, without tokens, on 127.0.0.1.
            Command::Dev(_) => ("dev", [CLIENT_ONLY, TLS].concat()),
            Command::Certs(_) => ("certs", [CLIENT_ONLY, TLS].concat()),
            // Its own cluster is plaintext and unprotected: the security flags are for
            // measuring another one.
            Command::Bench(_) if !self.given.contains(&"endpoints") => {
                ("bench", [&["auth_token", "timeout"][..], TLS].concat())
            }
            // Its requests keep their own deadline (a leader change is retried, not counted).
            Command::Bench(_) => ("bench", vec!["timeout"]),
            // Files and a data dir only: no cluster is asked (a user passing --endpoints may
            // believe a restore goes into the running cluster).
            Command::Snapshot(snapshot::SnapshotCommand::Inspect { .. }) => {
                ("snapshot inspect", [CLIENT_ONLY, TLS].concat())
            }
            Command::Snapshot(snapshot::SnapshotCommand::Restore { .. }) => {
                ("snapshot restore", [CLIENT_ONLY, TLS].concat())
            }
            _ => return None,
        };
        let id = self.given.iter().find(|id| unused.contains(id))?;
        let flag = GLOBAL_FLAGS
            .iter()
            .find(|(known, _)| known == id)
            .map_or("?", |(_, flag)| *flag);
        let instead = match (command, *id) {
            ("node", "auth_token") => {
                " (a node reads the tokens it accepts from a file: --auth-token-file, or \
                 auth.token_file in its configuration)"
            }
            ("bench", "timeout") => " (each request has a deadline of its own)",
            ("bench", _) => " without --endpoints (its own cluster runs plaintext, without tokens)",
            ("snapshot restore", _) => {
                " (it seeds a new node's data dir offline; start the node afterwards)"
            }
            ("snapshot inspect", _) => " (it reads the file only)",
            _ => "",
        };
        Some(format!("baton {command}: {flag} does not apply{instead}"))
    }

    /// How many Baton nodes this command runs in the process (sizes the runtime).
    pub fn nodes_in_process(&self) -> usize {
        match self.command {
            Command::Dev(_) => dev::NODES as usize,
            Command::Node(_) => 1,
            _ => 0,
        }
    }
}

/// The global flags by clap id, as a user spells them.
const GLOBAL_FLAGS: &[(&str, &str)] = &[
    ("endpoints", "--endpoints"),
    ("timeout", "--timeout"),
    ("tls_ca", "--tls-ca"),
    ("tls_cert", "--tls-cert"),
    ("tls_key", "--tls-key"),
    ("auth_token", "--auth-token"),
];

/// Runs the parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    if let Some(unused) = cli.unused_flag() {
        eprintln!("{unused}");
        return ExitCode::from(exit::USAGE);
    }
    match cli.command {
        Command::Node(args) => return ExitCode::from(node::run(*args, &cli.security).await),
        Command::Dev(_) => init_logging(
            &env_log_filter("info,openraft=error,sled=warn"),
            LogFormat::Text,
        ),
        _ => init_logging(&env_log_filter("warn"), LogFormat::Text),
    }
    let config = client_config(cli.timeout.unwrap_or(DEFAULT_TIMEOUT));
    let command = match cli.command {
        Command::Certs(command) => return ExitCode::from(certs::run(command)),
        Command::Dev(args) => return ExitCode::from(dev::run(args).await),
        Command::Snapshot(command) => match snapshot::run_offline(&command).await {
            Some(code) => return ExitCode::from(code),
            None => Command::Snapshot(command),
        },
        other => other,
    };
    let security = match cli.security.client() {
        Ok(security) => security,
        Err(error) => {
            eprintln!("baton: {error:#}");
            return ExitCode::from(exit::USAGE);
        }
    };
    if let Command::Bench(args) = command {
        let endpoints = if cli.endpoints_from_env {
            eprintln!(
                "baton bench: BATON_ENDPOINTS is ignored (a benchmark seeds and loads the \
                     cluster it runs on): starting its own cluster; pass --endpoints to measure \
                     an existing one"
            );
            None
        } else {
            cli.endpoints
        };
        // The security settings reach another cluster; its own takes none.
        let target = endpoints.map(|endpoints| (endpoints, security));
        // Interrupted, the bench is dropped: its own cluster's nodes are killed and their
        // temporary data removed (left to the default signal action, both stayed behind).
        let code = tokio::select! {
            code = bench::run(args, target) => code,
            _ = shutdown_signal() => {
                eprintln!("baton bench: interrupted; its own cluster (if any) is stopped and removed");
                exit::FAILURE
            }
        };
        return ExitCode::from(code);
    }
    let endpoints = cli
        .endpoints
        .unwrap_or_else(|| DEV_ENDPOINTS.split(',').map(str::to_string).collect());
    // Commands that run servers or talk to nodes one by one need no leader.
    let command = match command {
        Command::Cluster(command) => {
            return ExitCode::from(cluster::run(command, &endpoints, config, security).await)
        }
        Command::Status {
            json,
            require_leader,
        } => {
            let wanted = cluster::StatusOptions {
                json,
                require_leader,
            };
            return ExitCode::from(cluster::status(&endpoints, config, security, wanted).await);
        }
        other => other,
    };
    let deadline = config.deadline;
    let client = match Client::new_with_security(&endpoints, config, security) {
        Ok(client) => client,
        Err(error) => return ExitCode::from(exit::report(&error)),
    };
    // A worker's flags and program are checked before the cluster is reached.
    let worker = match &command {
        Command::Worker(command) => match queue::prepare_worker(command, &client) {
            Ok(worker) => Some(worker),
            Err(code) => return ExitCode::from(code),
        },
        _ => None,
    };
    let connecting = client.discover_leader();
    tokio::pin!(connecting);
    // Quiet while it retries, a command against a cluster that is down would look hung.
    let connected = tokio::select! {
        connected = &mut connecting => connected,
        _ = tokio::time::sleep(SAY_RETRYING_AFTER) => {
            eprintln!(
                "baton: no leader answered at {} yet; retrying for up to {deadline:?} (--timeout)",
                endpoints.join(",")
            );
            connecting.await
        }
    };
    if let Err(error) = connected {
        return ExitCode::from(exit::report(&error));
    }
    let code = match command {
        Command::Members(command) => members::run(command, &client, deadline).await,
        Command::Ticket(command) => {
            ticket::run(
                command,
                &client,
                cli.timeout.unwrap_or(ticket::WAIT_TIMEOUT),
            )
            .await
        }
        Command::Check => ticket::check(&client).await,
        Command::Board(command) => board::run(command, &client).await,
        Command::Effect(command) => effect::run(command, &client).await,
        Command::Sink(command) => sink::run(command, &client).await,
        Command::Checkpoint(command) => checkpoint::run(command, &client).await,
        Command::Queue(command) => queue::run_queue(command, &client).await,
        Command::Task(command) => queue::run_task(command, &client).await,
        Command::Worker(command) => {
            let mut env = cli.security.child_env();
            env.push(("BATON_ENDPOINTS", endpoints.join(",").into()));
            let worker = worker.expect("prepared above");
            queue::run_worker(worker, command, env).await
        }
        Command::Watch(args) => watch::run(args, &client).await,
        Command::Leader(command) => leader::run(command, &client).await,
        Command::Snapshot(command) => snapshot::run(command, &client).await,
        Command::Dev(_)
        | Command::Node(_)
        | Command::Certs(_)
        | Command::Cluster(_)
        | Command::Status { .. }
        | Command::Bench(_) => {
            unreachable!("handled above")
        }
    };
    ExitCode::from(code)
}

/// How long a client command waits for a leader before it says it is still trying.
const SAY_RETRYING_AFTER: Duration = Duration::from_secs(2);

fn client_config(deadline: Duration) -> ClientConfig {
    ClientConfig {
        deadline,
        ..ClientConfig::default()
    }
}

/// One node's `NodeInfo`, waiting at most `within` (`--timeout`) besides the client's own
/// attempt timeout: a health check with a 2 s timeout must not wait 3 s for a frozen node.
/// (Lowering the client's attempt timeout instead would also tighten its keep-alive pings.)
pub(crate) async fn probe(
    client: &Client,
    addr: &str,
    within: Duration,
) -> Result<baton_rpc::proto::NodeInfoResponse, baton_rpc::Error> {
    tokio::time::timeout(within, client.node_info(addr))
        .await
        .unwrap_or_else(|_| {
            Err(baton_rpc::Error::Unavailable {
                endpoints: vec![addr.to_string()],
                waited: within,
                last: format!("no answer within {within:?}"),
            })
        })
}

/// Resolves on Ctrl-C, SIGTERM or SIGHUP (the terminal closed, the ssh session dropped): each
/// asks for the graceful end — a node hands its leadership over, a worker drains — where the
/// default action would kill the process on the spot. A process started with SIGHUP ignored
/// (`nohup`) keeps ignoring it, and so does one run by systemd (`NOTIFY_SOCKET` set): there a
/// HUP conventionally asks for a reload, and a clean exit is not restarted
/// (`Restart=on-failure`), so a stray `systemctl kill -s HUP` would stop a node for good. It is
/// logged and ignored.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let other = async {
        use tokio::signal::unix::{signal, SignalKind};
        let wait = |kind| async move {
            match signal(kind) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        // Read before the first handler is installed: once it is, the process no longer shows
        // the ignore it was started with.
        let hangup = async {
            if hangup_ignored_at_start() {
                std::future::pending::<()>().await;
            }
            if std::env::var_os("NOTIFY_SOCKET").is_some() {
                if let Ok(mut hangups) = signal(SignalKind::hangup()) {
                    while hangups.recv().await.is_some() {
                        tracing::warn!(
                            "SIGHUP ignored: under systemd it would stop the node for good \
                             (there is no configuration to reload); stop it with SIGTERM \
                             (`systemctl stop baton`)"
                        );
                    }
                }
                std::future::pending::<()>().await;
            }
            wait(SignalKind::hangup()).await;
        };
        tokio::select! {
            _ = wait(SignalKind::terminate()) => {}
            _ = hangup => {}
        }
    };
    #[cfg(not(unix))]
    let other = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = other => {}
    }
}

/// Whether this process started with SIGHUP ignored (as `nohup` starts it), read once from
/// `/proc/self/status` before any handler of ours replaces the disposition.
#[cfg(unix)]
fn hangup_ignored_at_start() -> bool {
    static IGNORED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IGNORED.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("SigIgn:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            // Bit n-1 stands for signal n; SIGHUP is 1.
            .is_some_and(|mask| mask & 1 != 0)
    })
}

/// `--timeout`: a duration of at least 1 ms (zero gave every attempt no time at all, and every
/// command "cluster unavailable").
fn timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if timeout < Duration::from_millis(1) {
        return Err("a timeout must be at least 1ms".into());
    }
    Ok(timeout)
}

/// A TTL from the command line: a duration of at least a millisecond (TTLs travel in whole
/// milliseconds, and the store refuses 0), so that `--ttl 0s` is bad usage (exit 2) rather than
/// a store refusal, and a judgement never seeds its task for a race it cannot run.
pub fn ttl(text: &str) -> Result<Duration, String> {
    let ttl = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if ttl < Duration::from_millis(1) {
        return Err("a TTL must be at least 1ms".into());
    }
    Ok(ttl)
}

/// A duration from the command line as the milliseconds a TTL travels in.
pub fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z).
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

/// Formats Unix milliseconds as RFC 3339 UTC, or `never` past the year 9999.
///
/// The store accepts any positive TTL and saturates the deadline it derives, so a grant for
/// "practically ever" is legal and must print rather than bring the command down.
pub fn rfc3339(ms: u64) -> String {
    if ms > LAST_RFC3339_MS {
        return "never".to_string();
    }
    let time = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
}

/// Prints a race's tally (`winners= losers= infra_errors=`) and its exit code: 0 when the
/// verdict holds; 1 when it fails on what the store answered (two winners, or none among
/// answered contenders); 4 when contenders got no usable answer and no second winner was seen:
/// the race was not judged, an outage to run it again after (on a fresh key), not a finding (3
/// when a node refused a contender's call itself, a token, as for any command).
fn report_race<W>(outcome: &baton_rpc::judge::Race<W>) -> u8 {
    out!(
        "winners={} losers={} infra_errors={}",
        outcome.winners.len(),
        outcome.losers,
        outcome.infra_errors.len()
    );
    race_exit(outcome)
}

fn race_exit<W>(outcome: &baton_rpc::judge::Race<W>) -> u8 {
    match outcome.verdict() {
        Ok(()) => exit::OK,
        Err(why) if outcome.winners.len() <= 1 && !outcome.infra_errors.is_empty() => {
            eprintln!("race not judged: {why}");
            // A node's own refusal of the call (its token) is said as for any command (exit 3).
            let server = outcome
                .infra_errors
                .iter()
                .find(|error| matches!(error, baton_rpc::Error::Server { .. }));
            if let Some(error) = server {
                return exit::report(error);
            }
            eprintln!(
                "baton: contenders got no usable answer, so the race could not be judged; run it \
                 again on a fresh key once the cluster answers"
            );
            exit::UNREACHABLE
        }
        Err(why) => {
            eprintln!("race failed: {why}");
            exit::FAILURE
        }
    }
}

/// Prints a snapshot judge's problems (`key<TAB>code<TAB>text`) and exits 1 when there are any.
fn report_problems<'a>(
    noun: &str,
    judged: usize,
    revision: u64,
    problems: impl ExactSizeIterator<Item = (&'a str, &'a str, &'a str)>,
) -> u8 {
    let count = problems.len();
    if count == 0 {
        out!("ok: {judged} {noun}, no problems (revision {revision})");
        return exit::OK;
    }
    for (key, code, text) in problems {
        out!("{key}\t{code}\t{text}");
    }
    out!("{count} problems");
    exit::FAILURE
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// `baton dev`'s tuning flags, parsed as clap parses them.
    fn tuning(flags: &[&str]) -> TuningArgs {
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            tuning: TuningArgs,
        }
        Flags::parse_from(std::iter::once("dev").chain(flags.iter().copied())).tuning
    }

    fn config(flags: &[&str]) -> Result<NodeConfig, String> {
        let listen = SocketAddr::from(([127, 0, 0, 1], 7001));
        tuning(flags).node_config(1, listen, PathBuf::from("d"))
    }

    /// Slow heartbeats are taken with a watch cutoff that outlasts them (a setting `baton dev`
    /// has no flag for), and a watch history too short to resume in is refused by its flag.
    #[test]
    fn dev_tuning_is_refused_only_by_its_own_flags() {
        let slow = config(&["--heartbeat", "1500ms", "--election-timeout", "5s"]).unwrap();
        assert!(slow.watch.leaderless_cutoff >= Duration::from_millis(4_500));
        assert_eq!(
            config(&["--watch-history", "1"]).unwrap_err(),
            "--watch-history must be at least 2"
        );
        let defaults = config(&[]).unwrap();
        assert_eq!(defaults.raft.heartbeat, Duration::from_millis(50));
        assert_eq!(defaults.watch.history.events, 100_000);
        assert_eq!(defaults.watch.max_backlog, 50_000);
    }

    /// A second winner is a finding whatever else happened; a race that only lacks answers was
    /// not judged (exit 4, as for any outage), and one whose answers show no single winner
    /// failed.
    #[test]
    fn a_race_without_answers_is_an_outage_and_a_second_winner_a_failure() {
        let race = |winners: usize, losers: usize, infra: usize| baton_rpc::judge::Race {
            contenders: winners + losers + infra,
            winners: vec![(); winners],
            losers,
            misses: Vec::new(),
            infra_errors: (0..infra)
                .map(|_| baton_rpc::Error::Protocol("no answer".into()))
                .collect(),
        };
        assert_eq!(race_exit(&race(1, 3, 0)), exit::OK);
        assert_eq!(race_exit(&race(1, 2, 1)), exit::UNREACHABLE);
        assert_eq!(race_exit(&race(0, 0, 4)), exit::UNREACHABLE);
        assert_eq!(race_exit(&race(2, 1, 1)), exit::FAILURE);
        assert_eq!(race_exit(&race(2, 2, 0)), exit::FAILURE);
        assert_eq!(race_exit(&race(0, 4, 0)), exit::FAILURE);
        let mut refused = race(0, 3, 0);
        refused.infra_errors.push(baton_rpc::Error::Server {
            code: "UNAUTHENTICATED".into(),
            message: "token not accepted".into(),
        });
        assert_eq!(race_exit(&refused), exit::REFUSED);
    }

    #[test]
    fn deadlines_print_up_to_the_last_writable_millisecond_and_never_panic_beyond() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(LAST_RFC3339_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(LAST_RFC3339_MS + 1), "never");
        assert_eq!(rfc3339(u64::MAX), "never");
    }
}
