//! The command line: argument types and dispatch.

mod board;
mod checkpoint;
mod cluster;
mod dev;
mod effect;
pub mod exit;
mod sink;
mod ticket;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use baton_node::config::{NodeConfig, RaftTuning};
use baton_rpc::{Client, ClientConfig};
use clap::{Args, Parser, Subcommand};

/// The default endpoints: the cluster `baton dev` starts.
const DEV_ENDPOINTS: &str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003";

/// Baton: a replicated coordination store for handoffs, leases and exactly-once rights.
#[derive(Parser, Debug)]
#[command(name = "baton", version, about, long_about = None)]
pub struct Cli {
    /// Cluster endpoints (host:port, comma-separated) for client commands.
    #[arg(long, global = true, env = "BATON_ENDPOINTS", value_delimiter = ',', default_value = DEV_ENDPOINTS)]
    endpoints: Vec<String>,

    /// How long a client command keeps retrying before it gives up.
    #[arg(long, global = true, default_value = "15s", value_parser = humantime::parse_duration)]
    timeout: Duration,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a local three-node cluster in this process (data survives restarts).
    Dev(dev::DevArgs),
    /// Run one node.
    Node(NodeArgs),
    /// Cluster administration.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Show every member: id, address, role, term, last log index, applied index.
    Status {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
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
}

/// Arguments of `baton node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// This node's id (unique in the cluster, fixed for its data dir).
    #[arg(long)]
    id: u64,
    /// Address to listen on for clients and peers.
    #[arg(long)]
    listen: SocketAddr,
    /// Address others reach this node at (default: --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// Directory for this node's data; restarting with the same directory resumes the node.
    #[arg(long)]
    data_dir: PathBuf,
    #[command(flatten)]
    tuning: TuningArgs,
}

/// Raft tuning flags shared by `baton node` and `baton dev`.
#[derive(Args, Debug, Clone)]
pub struct TuningArgs {
    /// Leader heartbeat interval.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    heartbeat: Duration,
    /// Minimum election timeout (the maximum is twice this).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    election_timeout: Duration,
    /// Build a snapshot every this many log entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Log entries kept behind a snapshot.
    #[arg(long, default_value_t = 1_000)]
    keep_logs: u64,
    /// How often the leader sweeps due expiries.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    sweep_interval: Duration,
}

impl TuningArgs {
    fn raft(&self) -> RaftTuning {
        RaftTuning {
            heartbeat: self.heartbeat,
            election_timeout: (self.election_timeout, self.election_timeout * 2),
            snapshot_every: self.snapshot_every,
            keep_logs: self.keep_logs,
        }
    }

    /// A node configuration with these settings.
    pub fn node_config(
        &self,
        id: u64,
        listen: SocketAddr,
        advertise: Option<String>,
        data_dir: PathBuf,
    ) -> NodeConfig {
        NodeConfig {
            id,
            listen,
            advertise: advertise.unwrap_or_else(|| listen.to_string()),
            data_dir,
            raft: self.raft(),
            sweep_interval: self.sweep_interval,
        }
    }
}

/// Logs go to stderr; servers default to `info`, client commands to `warn`. `RUST_LOG` overrides.
pub fn init_logging(cli: &Cli) {
    let default = match cli.command {
        Command::Dev(_) | Command::Node(_) => "info,openraft=error,sled=warn",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Runs the parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let code = match cli.command {
        Command::Dev(args) => dev::run(args).await,
        Command::Node(args) => run_node(args).await,
        Command::Cluster(command) => {
            cluster::run(command, &cli.endpoints, client_config(cli.timeout)).await
        }
        Command::Status { json } => {
            cluster::status(&cli.endpoints, client_config(cli.timeout), json).await
        }
        Command::Ticket(command) => match connect(&cli.endpoints, cli.timeout).await {
            Ok(client) => ticket::run(command, &client).await,
            Err(code) => code,
        },
        Command::Check => match connect(&cli.endpoints, cli.timeout).await {
            Ok(client) => ticket::check(&client).await,
            Err(code) => code,
        },
        Command::Board(command) => match connect(&cli.endpoints, cli.timeout).await {
            Ok(client) => board::run(command, &client).await,
            Err(code) => code,
        },
        Command::Effect(command) => match connect(&cli.endpoints, cli.timeout).await {
            Ok(client) => effect::run(command, &client).await,
            Err(code) => code,
        },
        Command::Sink(command) => match connect(&cli.endpoints, cli.timeout).await {
            Ok(client) => sink::run(command, &client).await,
            Err(code) => code,
        },
        Command::Checkpoint(command) => match connect(&cli.endpoints, cli.timeout).await {
            Ok(client) => checkpoint::run(command, &client).await,
            Err(code) => code,
        },
    };
    ExitCode::from(code)
}

fn client_config(deadline: Duration) -> ClientConfig {
    ClientConfig {
        deadline,
        ..ClientConfig::default()
    }
}

async fn connect(endpoints: &[String], deadline: Duration) -> Result<Client, u8> {
    Client::connect_with(endpoints, client_config(deadline))
        .await
        .map_err(|error| exit::report(&error))
}

async fn run_node(args: NodeArgs) -> u8 {
    let config = args
        .tuning
        .node_config(args.id, args.listen, args.advertise, args.data_dir);
    match baton_node::server::run(config, shutdown_signal()).await {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("baton node: {e:#}");
            exit::FAILURE
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// A duration from the command line as the milliseconds a TTL travels in.
pub fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// Formats Unix milliseconds as RFC 3339 UTC.
pub fn rfc3339(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
}
