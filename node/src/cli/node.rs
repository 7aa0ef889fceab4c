//! `baton node`: run one node, configured from a TOML file, `BATON_*` variables and flags
//! (flags > environment > file > defaults), or print / check that configuration.

use std::path::PathBuf;

use baton_node::config::{self, ConfigError, Loaded, Override, DEFAULT_CONFIG_TOML};
use clap::Args;

use super::security::SecurityArgs;
use super::{exit, init_logging, parse_peer_addr, shutdown_signal};

/// Arguments of `baton node`. Every setting is optional here: what a flag leaves out comes from
/// the environment, the config file or the defaults (`--print-default-config` shows them all).
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// Read settings from this TOML file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print a complete, commented default configuration file and exit.
    #[arg(long, conflicts_with = "check_config")]
    print_default_config: bool,
    /// Check the configuration (file, environment and flags), print the effective one and exit:
    /// 0 when it is valid, 2 with the bad key named when it is not.
    #[arg(long)]
    check_config: bool,
    /// Set any key, e.g. `--set raft.keep_logs=5000` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    set: Vec<(String, String)>,
    /// This node's id (unique in the cluster, fixed for its data dir) [key: id].
    #[arg(long)]
    id: Option<String>,
    /// Address to listen on for clients and peers [key: listen].
    #[arg(long)]
    listen: Option<String>,
    /// Address others reach this node at (default: --listen) [key: advertise].
    #[arg(long)]
    advertise: Option<String>,
    /// Directory for this node's data; restarting with the same directory resumes the node
    /// [key: data_dir].
    #[arg(long)]
    data_dir: Option<String>,
    /// Serve /metrics, /livez and /readyz over HTTP at this address [key: http].
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Reach peer ID at ADDR instead of the address in the membership (repeatable), e.g. when
    /// peers sit behind NAT or a proxy: `--peer-addr 2=10.0.0.7:7001` [key: peer_addrs.ID].
    #[arg(long = "peer-addr", value_name = "ID=ADDR", value_parser = parse_peer_addr)]
    peer_addrs: Vec<(u64, String)>,
    /// Leader heartbeat interval [key: raft.heartbeat].
    #[arg(long)]
    heartbeat: Option<String>,
    /// Minimum election timeout; the maximum is twice this [key: raft.election_timeout].
    #[arg(long)]
    election_timeout: Option<String>,
    /// Build a snapshot every this many log entries [key: raft.snapshot_every].
    #[arg(long)]
    snapshot_every: Option<String>,
    /// Log entries kept behind a snapshot [key: raft.keep_logs].
    #[arg(long)]
    keep_logs: Option<String>,
    /// The longest the leader goes without looking for due expiries; it sweeps as soon as a
    /// deadline passes anyway [key: sweep_interval].
    #[arg(long)]
    sweep_interval: Option<String>,
    /// Changes kept in memory for watches [key: watch.history].
    #[arg(long)]
    watch_history: Option<String>,
    /// Largest client request in bytes [key: limits.max_request_bytes].
    #[arg(long)]
    max_request_bytes: Option<String>,
    /// Client requests served at once on this node [key: limits.max_in_flight].
    #[arg(long)]
    max_in_flight: Option<String>,
    /// Client requests served at once on one connection
    /// [key: limits.max_in_flight_per_connection].
    #[arg(long)]
    max_in_flight_per_connection: Option<String>,
    /// Client connections open at once [key: limits.max_connections].
    #[arg(long)]
    max_connections: Option<String>,
    /// Log format: text or json [key: log.format].
    #[arg(long)]
    log_format: Option<String>,
    /// Which events to log, in RUST_LOG syntax [key: log.filter].
    #[arg(long)]
    log_filter: Option<String>,
    /// Client tokens, one per line: clients must send one as `authorization: Bearer <token>`
    /// (see docs/security.md; TLS is set with the global --tls-* flags or `[tls]`)
    /// [key: auth.token_file].
    #[arg(long, value_name = "FILE")]
    auth_token_file: Option<String>,
}

fn parse_set(value: &str) -> Result<(String, String), String> {
    let (key, value) = value
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {value:?}"))?;
    Ok((key.trim().to_string(), value.to_string()))
}

impl NodeArgs {
    /// The settings the flags give, weakest first (`--set` before the named flags).
    fn overrides(&self, security: &SecurityArgs) -> Vec<Override> {
        let mut overrides: Vec<Override> = self
            .set
            .iter()
            .map(|(key, value)| Override {
                key: key.clone(),
                value: value.clone(),
                flag: format!("--set {key}"),
            })
            .collect();
        let named = [
            ("--id", "id", &self.id),
            ("--listen", "listen", &self.listen),
            ("--advertise", "advertise", &self.advertise),
            ("--data-dir", "data_dir", &self.data_dir),
            ("--http", "http", &self.http),
            ("--heartbeat", "raft.heartbeat", &self.heartbeat),
            (
                "--election-timeout",
                "raft.election_timeout",
                &self.election_timeout,
            ),
            (
                "--snapshot-every",
                "raft.snapshot_every",
                &self.snapshot_every,
            ),
            ("--keep-logs", "raft.keep_logs", &self.keep_logs),
            ("--sweep-interval", "sweep_interval", &self.sweep_interval),
            ("--watch-history", "watch.history", &self.watch_history),
            (
                "--max-request-bytes",
                "limits.max_request_bytes",
                &self.max_request_bytes,
            ),
            (
                "--max-in-flight",
                "limits.max_in_flight",
                &self.max_in_flight,
            ),
            (
                "--max-in-flight-per-connection",
                "limits.max_in_flight_per_connection",
                &self.max_in_flight_per_connection,
            ),
            (
                "--max-connections",
                "limits.max_connections",
                &self.max_connections,
            ),
            ("--log-format", "log.format", &self.log_format),
            ("--log-filter", "log.filter", &self.log_filter),
            (
                "--auth-token-file",
                "auth.token_file",
                &self.auth_token_file,
            ),
        ];
        for (flag, key, value) in named {
            if let Some(value) = value {
                overrides.push(Override {
                    key: key.into(),
                    value: value.clone(),
                    flag: flag.into(),
                });
            }
        }
        overrides.extend(security.node_overrides());
        for (id, addr) in &self.peer_addrs {
            overrides.push(Override {
                key: format!("peer_addrs.{id}"),
                value: addr.clone(),
                flag: "--peer-addr".into(),
            });
        }
        overrides
    }
}

/// Runs `baton node` and returns its exit code.
pub async fn run(args: NodeArgs, security: &SecurityArgs) -> u8 {
    if args.print_default_config {
        super::write_out(DEFAULT_CONFIG_TOML.as_bytes());
        return exit::OK;
    }
    let overrides = args.overrides(security);
    let environment = match utf8_environment() {
        Ok(environment) => environment,
        Err(key) => {
            eprintln!("baton node: bad configuration: {key} is not valid UTF-8");
            return exit::USAGE;
        }
    };
    let loaded = match config::load(args.config.as_deref(), environment, &overrides) {
        Ok(loaded) => loaded,
        Err(error) => return config_error(&error),
    };
    let security = match loaded.security() {
        Ok(security) => security,
        Err(error) => return config_error(&error),
    };
    if args.check_config {
        return check(&loaded);
    }
    init_logging(&loaded.settings.log.filter, loaded.settings.log.format);
    for name in &loaded.ignored_env {
        tracing::warn!(variable = %name, "ignoring an environment variable that names no config key");
    }
    let mut node = loaded.node;
    if node.data_dir.is_relative() {
        // Resolved against the working directory: started from another one (by hand, or by a
        // service manager that starts in /), the same settings name another, empty, data dir —
        // a node under its old id that lost everything it had acknowledged.
        if let Ok(absolute) = std::path::absolute(&node.data_dir) {
            tracing::warn!(
                data_dir = %absolute.display(),
                "data_dir {} is relative to the working directory; give an absolute path",
                node.data_dir.display()
            );
            node.data_dir = absolute;
        }
    }
    baton_node::descriptors::raise_for(node.limits.max_connections);
    match baton_node::server::run_secured(node, security, shutdown_signal()).await {
        Ok(()) => exit::OK,
        Err(e) => {
            // Said even when the log filter leaves errors out (`RUST_LOG=off`, a filter naming
            // other targets only): a node that does not start must say why.
            if tracing::enabled!(tracing::Level::ERROR) {
                tracing::error!("baton node: {e:#}");
            } else {
                eprintln!("baton node: {e:#}");
            }
            exit::FAILURE
        }
    }
}

/// The environment as text. `env::vars` panics on any variable that is not UTF-8, also ones
/// Baton never reads (a Latin-1 path a container runtime set): those are skipped. A `BATON_` one
/// is refused (its name is the error): read lossily, a data dir path would become another path.
fn utf8_environment() -> Result<Vec<(String, String)>, String> {
    let mut environment = Vec::new();
    for (key, value) in std::env::vars_os() {
        match (key.into_string(), value.into_string()) {
            (Ok(key), Ok(value)) => environment.push((key, value)),
            (Ok(key), Err(_)) if key.starts_with("BATON_") => return Err(key),
            _ => {}
        }
    }
    Ok(environment)
}

fn config_error(error: &ConfigError) -> u8 {
    eprintln!("baton node: bad configuration: {error}");
    exit::USAGE
}

/// `--check-config`: the effective configuration, with where each override came from.
fn check(loaded: &Loaded) -> u8 {
    let text = match toml::to_string(&loaded.settings) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("baton node: cannot print the configuration: {e}");
            return exit::FAILURE;
        }
    };
    for name in &loaded.ignored_env {
        eprintln!("baton node: warning: {name} names no config key; it is ignored");
    }
    out!("# The configuration is valid. Effective settings:");
    for (key, origin) in &loaded.overridden {
        out!("# {key} is set by {origin}");
    }
    super::write_out(text.as_bytes());
    exit::OK
}
