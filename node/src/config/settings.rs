//! [`Settings`]: the configuration file's shape, its defaults, and how it becomes a
//! [`NodeConfig`].
//!
//! Every key has a default, so an empty file is a valid one (except that `id` must be given
//! somewhere). Adding a section is adding a field of a `#[serde(default)]` struct here, its keys
//! to `default.toml`, and its conversion in [`Settings::to_node_config`]; the environment
//! variables and `--set` follow from the key names by themselves.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use baton_rpc::WATCH_SILENCE;
use serde::{Deserialize, Serialize};

use super::{Limits, NodeConfig, RaftTuning, WatchTuning};
use crate::history::HistoryLimits;
use crate::tls::TlsFiles;

/// The commented default configuration `baton node --print-default-config` prints. It parses
/// back to [`Settings::default`] (tested), and names every key (tested).
pub const DEFAULT_CONFIG_TOML: &str = include_str!("default.toml");

/// A node's settings as the TOML file spells them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// This node's id: unique in the cluster and fixed for the life of its data dir. Required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Where to listen for clients and peers.
    pub listen: SocketAddr,
    /// The address others reach this node at (default: `listen`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// Where the node keeps its data.
    pub data_dir: PathBuf,
    /// Where to serve `/metrics`, `/livez` and `/readyz` (default: not served).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<SocketAddr>,
    /// `/readyz` fails while this node is more than this many entries behind the leader.
    pub ready_max_lag: u64,
    /// The longest the leader goes without looking for due expiries (it sweeps as soon as a
    /// deadline passes anyway).
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Raft timings and snapshot policy.
    pub raft: RaftSettings,
    /// Watch history and stream limits.
    pub watch: WatchSettings,
    /// Client request limits.
    pub limits: LimitSettings,
    /// Logging.
    pub log: LogSettings,
    /// TLS for clients and mutual TLS between peers (default: plaintext).
    pub tls: TlsSettings,
    /// Client tokens (default: none asked for).
    pub auth: AuthSettings,
    /// Peers to reach at another address than the one in the membership: node id -> address.
    pub peer_addrs: BTreeMap<String, String>,
}

/// `[raft]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftSettings {
    /// Leader heartbeat interval.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Minimum election timeout; the maximum is twice this.
    #[serde(with = "humantime_serde")]
    pub election_timeout: Duration,
    /// Build a snapshot after this many log entries since the last one.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot.
    pub keep_logs: u64,
}

/// `[watch]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WatchSettings {
    /// Changes kept in memory for watches.
    pub history: usize,
    /// Bytes of changes kept in memory for watches (approximately).
    pub history_bytes: usize,
    /// A stream this many changes behind is cut `SLOW_CONSUMER` (default: half of `history`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_backlog: Option<usize>,
    /// Changes buffered per stream.
    pub stream_buffer: usize,
    /// Streams served at once; more are refused `OVERLOADED`.
    pub max_streams: usize,
    /// How often an idle stream reports its progress.
    #[serde(with = "humantime_serde")]
    pub progress_every: Duration,
    /// A node that has not heard from a leader for this long ends its streams `NO_LEADER`.
    #[serde(with = "humantime_serde")]
    pub leaderless_cutoff: Duration,
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    /// Largest client request message in bytes.
    pub max_request_bytes: usize,
    /// Client requests served at once on the node.
    pub max_in_flight: usize,
    /// Client requests served at once on one connection.
    pub max_in_flight_per_connection: usize,
    /// Client connections open at once.
    pub max_connections: usize,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// `text` or `json` (one object per line).
    pub format: LogFormat,
    /// Which events to log, in `RUST_LOG` syntax.
    pub filter: String,
}

/// `[tls]`: the node's PEM files. All three or none: peers verify each other with the CA.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// The cluster CA certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// This node's certificate chain (its identity towards clients and peers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The private key of `cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

/// `[auth]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// The tokens clients must present, one per line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl Default for Settings {
    fn default() -> Self {
        let defaults = NodeConfig::new(
            0,
            SocketAddr::from(([127, 0, 0, 1], 7001)),
            PathBuf::from("baton-data"),
        );
        Self {
            id: None,
            listen: defaults.listen,
            advertise: None,
            data_dir: defaults.data_dir,
            http: defaults.http,
            ready_max_lag: defaults.ready_max_lag,
            sweep_interval: defaults.sweep_interval,
            raft: RaftSettings::default(),
            watch: WatchSettings::default(),
            limits: LimitSettings::default(),
            log: LogSettings::default(),
            tls: TlsSettings::default(),
            auth: AuthSettings::default(),
            peer_addrs: BTreeMap::new(),
        }
    }
}

impl Default for RaftSettings {
    fn default() -> Self {
        let tuning = RaftTuning::default();
        Self {
            heartbeat: tuning.heartbeat,
            election_timeout: tuning.election_timeout.0,
            snapshot_every: tuning.snapshot_every,
            keep_logs: tuning.keep_logs,
        }
    }
}

impl Default for WatchSettings {
    fn default() -> Self {
        let tuning = WatchTuning::default();
        Self {
            history: tuning.history.events,
            history_bytes: tuning.history.bytes,
            max_backlog: None,
            stream_buffer: tuning.stream_buffer,
            max_streams: tuning.max_streams,
            progress_every: tuning.progress_every,
            leaderless_cutoff: tuning.leaderless_cutoff,
        }
    }
}

impl Default for LimitSettings {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            max_request_bytes: limits.max_request_bytes,
            max_in_flight: limits.max_in_flight,
            max_in_flight_per_connection: limits.max_in_flight_per_connection,
            max_connections: limits.max_connections,
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info,openraft=error,sled=warn".into(),
        }
    }
}

/// A setting that cannot be used: the key (as the file spells it) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The key, e.g. `raft.heartbeat`.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

fn invalid(key: &str, reason: impl Into<String>) -> Invalid {
    Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// `value` must be at least 1.
fn positive(key: &str, value: u64) -> Result<(), Invalid> {
    if value == 0 {
        return Err(invalid(key, "must be at least 1"));
    }
    Ok(())
}

/// Most places a counted setting may ask for: far beyond what one node serves or buffers, and
/// within what the semaphores and channels that count them can hold (a larger one, such as an
/// "unlimited" i64::MAX, made the node panic as it started).
const MAX_COUNT: usize = 1 << 24;

/// `value` must be at least 1 and at most [`MAX_COUNT`].
fn counted(key: &str, value: usize) -> Result<(), Invalid> {
    positive(key, value as u64)?;
    if value > MAX_COUNT {
        return Err(invalid(key, format!("must be at most {MAX_COUNT}")));
    }
    Ok(())
}

/// `value` must be longer than zero.
fn nonzero(key: &str, value: Duration) -> Result<(), Invalid> {
    if value.is_zero() {
        return Err(invalid(key, "must be longer than 0"));
    }
    Ok(())
}

/// `addr` must be `host:port` with a port peers can dial.
fn dialable(key: &str, addr: &str) -> Result<(), Invalid> {
    undialable(addr).map_or(Ok(()), |why| Err(invalid(key, why)))
}

/// Why peers could not dial `addr`, if they could not: it must be `host:port` with a port other
/// than 0 and a host other than an unspecified address (`0.0.0.0`, `[::]`: a listener's "every
/// interface", which a peer dialling it reaches as its own loopback).
pub fn undialable(addr: &str) -> Option<String> {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Some(format!("{addr:?} is not host:port (e.g. 10.0.0.5:7001)"));
    };
    let host = host.trim();
    if host.is_empty() || !port.parse::<u16>().is_ok_and(|p| p > 0) {
        return Some(format!("{addr:?} is not host:port (e.g. 10.0.0.5:7001)"));
    }
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    if ip
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified())
    {
        return Some(format!(
            "{addr:?} is an unspecified address, which no peer can dial: give this node's own \
             name or IP (e.g. 10.0.0.5:7001)"
        ));
    }
    None
}

/// The smallest `limits.max_request_bytes`: room for a call carrying the largest payload
/// (1 MiB) with the rest of its request, and for the client library's batches (at most 512 KiB,
/// or one call alone).
const MIN_REQUEST_BYTES: usize = 2 << 20;

/// The largest `limits.max_request_bytes`. A request becomes a log entry, and reading an entry
/// back is bounded by what it may claim in memory (`codec::DECODE_LIMIT`, 256 MiB), where a
/// value counts at its width in memory: an empty string costs 2 bytes on the wire and 8 there.
/// At an eighth of that bound no accepted request can make an entry its own node, or any
/// member, refuses to read.
const MAX_REQUEST_BYTES: usize = 32 << 20;

/// How many heartbeats an election timeout must span at least, so that one late heartbeat
/// (the heartbeat is also the AppendEntries deadline) does not start an election.
const MIN_HEARTBEATS_PER_ELECTION: u32 = 3;

impl Settings {
    /// Settings with every optional key given, so that serializing them names every key
    /// (`peer_addrs` stands for its whole table with one made-up entry).
    pub(super) fn with_every_key() -> Self {
        let mut settings = Self {
            id: Some(1),
            advertise: Some(String::new()),
            http: Some(SocketAddr::from(([127, 0, 0, 1], 9090))),
            ..Self::default()
        };
        settings.watch.max_backlog = Some(1);
        settings.tls = TlsSettings {
            ca: Some(PathBuf::new()),
            cert: Some(PathBuf::new()),
            key: Some(PathBuf::new()),
        };
        settings.auth.token_file = Some(PathBuf::new());
        settings.peer_addrs.insert("1".into(), String::new());
        settings
    }

    /// The node configuration these settings describe, or the first key that cannot be used.
    pub fn to_node_config(&self) -> Result<NodeConfig, Invalid> {
        let id = self.id.ok_or_else(|| {
            invalid(
                "id",
                "is required (set `id` in the config file, BATON_ID or --id)",
            )
        })?;
        let advertise = match &self.advertise {
            Some(advertise) if advertise.trim().is_empty() => {
                return Err(invalid("advertise", "is empty"))
            }
            Some(advertise) => {
                dialable("advertise", advertise.trim())?;
                advertise.trim().to_string()
            }
            None if self.listen.ip().is_unspecified() => {
                return Err(invalid(
                    "advertise",
                    format!(
                        "is required when listen is {} (nobody can reach an unspecified address)",
                        self.listen
                    ),
                ))
            }
            // Port 0 picks a port when the node binds, which no peer or client is told.
            None if self.listen.port() == 0 => {
                return Err(invalid(
                    "advertise",
                    format!(
                        "is required when listen is {} (the port is picked at start; nobody \
                         could be told it)",
                        self.listen
                    ),
                ))
            }
            None => self.listen.to_string(),
        };
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "is empty"));
        }
        // The same (fixed) port on both, where one address covers the other, cannot both be
        // bound: equal addresses, or a wildcard of the other's family (an IPv6 one covers
        // IPv4 too on a dual-stack host).
        let covers = |wide: SocketAddr, other: SocketAddr| {
            wide.ip().is_unspecified() && (wide.is_ipv6() || other.is_ipv4())
        };
        let overlaps = |http: SocketAddr| {
            http.port() != 0
                && http.port() == self.listen.port()
                && (http.ip() == self.listen.ip()
                    || covers(http, self.listen)
                    || covers(self.listen, http))
        };
        if self.http.is_some_and(overlaps) {
            return Err(invalid(
                "http",
                format!(
                    "is the gRPC address too ({}); give it a port of its own",
                    self.listen
                ),
            ));
        }
        nonzero("sweep_interval", self.sweep_interval)?;
        tracing_subscriber::EnvFilter::try_new(&self.log.filter)
            .map_err(|e| invalid("log.filter", e.to_string()))?;
        let mut config = NodeConfig::new(id, self.listen, self.data_dir.clone());
        config.advertise = advertise;
        config.http = self.http;
        config.ready_max_lag = self.ready_max_lag;
        config.sweep_interval = self.sweep_interval;
        config.raft = self.raft.to_tuning()?;
        config.watch = self.watch.to_tuning()?;
        let three_heartbeats = config.raft.heartbeat.saturating_mul(3);
        if config.watch.leaderless_cutoff < three_heartbeats {
            // A follower hears from its leader every heartbeat; a cutoff within a few of them
            // would take a late one for a partition and drop healthy streams.
            return Err(invalid(
                "watch.leaderless_cutoff",
                format!("must be at least three heartbeats ({three_heartbeats:?})"),
            ));
        }
        config.limits = self.limits.to_limits()?;
        config.peer_addrs = self.peer_addrs()?;
        self.tls_files()?;
        if self
            .auth
            .token_file
            .as_ref()
            .is_some_and(|path| path.as_os_str().is_empty())
        {
            return Err(invalid("auth.token_file", "is empty"));
        }
        Ok(config)
    }

    /// The node's TLS files, when it runs TLS. The files are read when the node starts (and by
    /// `--check-config`, [`super::Loaded::security`]), not here.
    pub fn tls_files(&self) -> Result<Option<TlsFiles>, Invalid> {
        let TlsSettings { ca, cert, key } = &self.tls;
        for (name, path) in [("tls.ca", ca), ("tls.cert", cert), ("tls.key", key)] {
            if path
                .as_ref()
                .is_some_and(|path| path.as_os_str().is_empty())
            {
                return Err(invalid(name, "is empty"));
            }
        }
        match (ca, cert, key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            })),
            _ => Err(invalid(
                "tls",
                "needs all of ca, cert and key (peers verify each other with the CA), or none of them",
            )),
        }
    }

    fn peer_addrs(&self) -> Result<BTreeMap<u64, String>, Invalid> {
        let mut peers = BTreeMap::new();
        for (id, addr) in &self.peer_addrs {
            let key = format!("peer_addrs.{id}");
            let id = id
                .trim()
                .parse()
                .map_err(|_| invalid(&key, "is not a node id (a number)"))?;
            if addr.trim().is_empty() {
                return Err(invalid(&key, "the address is empty"));
            }
            dialable(&key, addr.trim())?;
            peers.insert(id, addr.trim().to_string());
        }
        Ok(peers)
    }
}

impl RaftSettings {
    fn to_tuning(&self) -> Result<RaftTuning, Invalid> {
        // openraft counts in whole milliseconds: a shorter heartbeat would become 0, a timeout
        // no AppendEntries could meet, and replication would stop.
        if self.heartbeat < Duration::from_millis(1) {
            return Err(invalid(
                "raft.heartbeat",
                "must be at least 1ms (Raft counts in whole milliseconds)",
            ));
        }
        let shortest = self.heartbeat.checked_mul(MIN_HEARTBEATS_PER_ELECTION);
        if shortest.is_none_or(|shortest| self.election_timeout < shortest) {
            return Err(invalid(
                "raft.election_timeout",
                format!(
                    "must be at least {MIN_HEARTBEATS_PER_ELECTION} times raft.heartbeat ({}): \
                     a heartbeat that comes late must not start an election",
                    humantime::format_duration(self.heartbeat)
                ),
            ));
        }
        // The node waits between the timeout and twice it.
        let Some(longest) = self.election_timeout.checked_mul(2) else {
            return Err(invalid("raft.election_timeout", "is too long"));
        };
        positive("raft.snapshot_every", self.snapshot_every)?;
        let tuning = RaftTuning {
            heartbeat: self.heartbeat,
            election_timeout: (self.election_timeout, longest),
            snapshot_every: self.snapshot_every,
            keep_logs: self.keep_logs,
        };
        tuning
            .to_openraft()
            .map_err(|e| invalid("raft", e.to_string()))?;
        Ok(tuning)
    }
}

/// The smallest `watch.history_bytes` that leaves a cut slow stream room to resume.
const MIN_HISTORY_BYTES: usize = 32 << 20;

impl WatchSettings {
    fn to_tuning(&self) -> Result<WatchTuning, Invalid> {
        positive("watch.history", self.history as u64)?;
        if self.history_bytes < MIN_HISTORY_BYTES {
            // A slow stream is cut at half the history's bytes, and up to ~6 MiB of its changes
            // are still on their way to the reader, who resumes after the last one it got: that
            // point must still be held when it asks.
            return Err(invalid(
                "watch.history_bytes",
                format!("must be at least {MIN_HISTORY_BYTES} (32 MiB)"),
            ));
        }
        counted("watch.stream_buffer", self.stream_buffer)?;
        counted("watch.max_streams", self.max_streams)?;
        nonzero("watch.progress_every", self.progress_every)?;
        if self.progress_every > WATCH_SILENCE / 2 {
            // Clients take a stream silent for WATCH_SILENCE for a dead node and move on.
            return Err(invalid(
                "watch.progress_every",
                format!(
                    "must be at most {:?} (clients give up on a stream silent for {:?})",
                    WATCH_SILENCE / 2,
                    WATCH_SILENCE
                ),
            ));
        }
        nonzero("watch.leaderless_cutoff", self.leaderless_cutoff)?;
        let max_backlog = self.max_backlog.unwrap_or((self.history / 2).max(1));
        positive("watch.max_backlog", max_backlog as u64)?;
        if max_backlog >= self.history {
            // A stream must be cut while its resume point is still in the history, or it gets
            // COMPACTED instead of the resumable SLOW_CONSUMER.
            return Err(invalid(
                "watch.max_backlog",
                format!("must be below watch.history ({})", self.history),
            ));
        }
        Ok(WatchTuning {
            history: HistoryLimits {
                events: self.history,
                bytes: self.history_bytes,
            },
            max_backlog,
            stream_buffer: self.stream_buffer,
            max_streams: self.max_streams,
            progress_every: self.progress_every,
            leaderless_cutoff: self.leaderless_cutoff,
        })
    }
}

impl LimitSettings {
    fn to_limits(&self) -> Result<Limits, Invalid> {
        if self.max_request_bytes < MIN_REQUEST_BYTES {
            return Err(invalid(
                "limits.max_request_bytes",
                format!(
                    "must be at least {MIN_REQUEST_BYTES} (2 MiB): room for the largest payload \
                     (1 MiB) with its request, and for the client library's batches"
                ),
            ));
        }
        if self.max_request_bytes > MAX_REQUEST_BYTES {
            return Err(invalid(
                "limits.max_request_bytes",
                format!(
                    "must be at most {MAX_REQUEST_BYTES} (32 MiB): a larger request could become a \
                     log entry the members cannot read back"
                ),
            ));
        }
        counted("limits.max_in_flight", self.max_in_flight)?;
        counted(
            "limits.max_in_flight_per_connection",
            self.max_in_flight_per_connection,
        )?;
        counted("limits.max_connections", self.max_connections)?;
        Ok(Limits {
            max_request_bytes: self.max_request_bytes,
            max_in_flight: self.max_in_flight,
            max_in_flight_per_connection: self.max_in_flight_per_connection,
            max_connections: self.max_connections,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_default_config_parses_back_to_the_defaults() {
        let parsed: Settings = toml::from_str(DEFAULT_CONFIG_TOML).expect("default.toml parses");
        assert_eq!(parsed, Settings::default());
    }

    /// The printed defaults, and the example deploy/ ships (the defaults with node 1's keys
    /// filled in), name every key.
    #[test]
    fn the_printed_default_config_names_every_key() {
        let every = toml::Table::try_from(Settings::with_every_key()).expect("serializes");
        let example = include_str!("../../../deploy/baton.example.toml");
        for (file, text) in [
            ("default.toml", DEFAULT_CONFIG_TOML),
            ("baton.example.toml", example),
        ] {
            for (key, value) in &every {
                match value {
                    toml::Value::Table(section) if key != "peer_addrs" => {
                        assert!(text.contains(&format!("[{key}]")), "{file}: no [{key}]");
                        for inner in section.keys() {
                            assert!(
                                mentions(text, inner),
                                "{file} does not mention {key}.{inner}"
                            );
                        }
                    }
                    _ => assert!(mentions(text, key), "{file} does not mention {key}"),
                }
            }
        }
    }

    /// Whether `key` is set or shown commented out (`# key = ...`) at the start of a line.
    fn mentions(text: &str, key: &str) -> bool {
        text.lines().any(|line| {
            let line = line.trim_start_matches('#').trim_start();
            line.starts_with(&format!("{key} =")) || line.starts_with(&format!("[{key}]"))
        })
    }

    #[test]
    fn defaults_make_the_same_node_as_node_config_new() {
        let settings = Settings {
            id: Some(3),
            ..Settings::default()
        };
        let config = settings.to_node_config().expect("valid");
        let direct = NodeConfig::new(3, settings.listen, settings.data_dir.clone());
        assert_eq!(format!("{config:?}"), format!("{direct:?}"));
    }

    #[test]
    fn a_dialable_address_names_a_host_and_a_port() {
        for good in [
            "10.0.0.5:7001",
            "node-1.example:7001",
            "[::1]:7001",
            "127.0.0.1:1",
        ] {
            assert_eq!(undialable(good), None, "{good}");
        }
        for (bad, why) in [
            ("10.0.0.5", "is not host:port"),
            (":7001", "is not host:port"),
            ("10.0.0.5:0", "is not host:port"),
            ("10.0.0.5:x", "is not host:port"),
            ("0.0.0.0:7001", "unspecified address"),
            ("[::]:7001", "unspecified address"),
        ] {
            let said = undialable(bad).unwrap_or_else(|| panic!("{bad} passed"));
            assert!(said.contains(why), "{bad}: {said}");
        }
    }

    #[test]
    fn bad_values_name_their_key() {
        let base = Settings {
            id: Some(1),
            ..Settings::default()
        };
        type Breaker = Box<dyn Fn(&mut Settings)>;
        let cases: Vec<(&str, Breaker)> = vec![
            ("id", Box::new(|s| s.id = None)),
            (
                "advertise",
                Box::new(|s| s.listen = "0.0.0.0:7001".parse().expect("addr")),
            ),
            (
                "advertise",
                Box::new(|s| s.advertise = Some("0.0.0.0:7001".into())),
            ),
            (
                "raft.election_timeout",
                Box::new(|s| s.raft.election_timeout = s.raft.heartbeat),
            ),
            (
                "raft.snapshot_every",
                Box::new(|s| s.raft.snapshot_every = 0),
            ),
            ("watch.history", Box::new(|s| s.watch.history = 0)),
            (
                "limits.max_in_flight",
                Box::new(|s| s.limits.max_in_flight = 0),
            ),
            ("tls", Box::new(|s| s.tls.cert = Some("node.pem".into()))),
            ("tls.ca", Box::new(|s| s.tls.ca = Some(PathBuf::new()))),
            (
                "auth.token_file",
                Box::new(|s| s.auth.token_file = Some(PathBuf::new())),
            ),
            (
                "peer_addrs.x",
                Box::new(|s| {
                    s.peer_addrs.insert("x".into(), "h:1".into());
                }),
            ),
        ];
        for (key, break_it) in cases {
            let mut settings = base.clone();
            break_it(&mut settings);
            let error = settings.to_node_config().expect_err(key);
            assert_eq!(error.key, key, "{error:?}");
        }
    }

    #[test]
    fn the_fixed_limits_the_default_config_describes_are_the_state_machines() {
        use baton_statemachine::limits::*;
        assert_eq!(
            (
                MAX_PAYLOAD_BYTES,
                MAX_KEY_BYTES,
                MAX_AGENT_BYTES,
                MAX_ADDRESS_BYTES,
                MAX_TEXT_BYTES,
                MAX_ARTIFACTS,
                MAX_DEPENDENCIES
            ),
            (1 << 20, 512, 256, 1 << 10, 64 << 10, 256, 256)
        );
        assert!(DEFAULT_CONFIG_TOML.contains(
            "payload 1 MiB, key 512 bytes, agent name 256 bytes,\n# address 1 KiB, receipt text 64 KiB, 256 artifacts per receipt, 256 dependencies per task"
        ));
    }

    #[test]
    fn max_backlog_follows_history_unless_given() {
        let mut settings = Settings {
            id: Some(1),
            ..Settings::default()
        };
        settings.watch.history = 1_000;
        assert_eq!(
            settings.to_node_config().expect("valid").watch.max_backlog,
            500
        );
        settings.watch.max_backlog = Some(10);
        assert_eq!(
            settings.to_node_config().expect("valid").watch.max_backlog,
            10
        );
    }
}
