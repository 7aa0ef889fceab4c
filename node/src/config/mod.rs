//! A node's configuration: one typed struct with documented defaults.
//!
//! [`NodeConfig`] is what a running node uses; `baton dev` and tests build it in code with
//! [`NodeConfig::new`]. `baton node` reads it from layers instead — a TOML file, `BATON_*`
//! environment variables and flags — through [`Settings`] (the file's shape) and [`load`].

mod layers;
mod settings;

pub use layers::{load, ConfigError, Loaded, Origin, Override};
pub use settings::{undialable, Invalid, LogFormat, Settings, DEFAULT_CONFIG_TOML};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::history::HistoryLimits;

/// Everything one node needs to run.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's id, unique in its cluster and fixed for the life of its data dir.
    pub id: u64,
    /// Where to listen for clients and peers.
    pub listen: SocketAddr,
    /// The address others reach this node at (default: `listen`).
    pub advertise: String,
    /// Where the node keeps its sled database.
    pub data_dir: PathBuf,
    /// Raft timing and snapshot policy.
    pub raft: RaftTuning,
    /// The longest the leader goes without looking for due expiries (default 1 s); it sweeps as
    /// soon as a deadline passes anyway (see [`crate::sweeper`]).
    pub sweep_interval: Duration,
    /// Peers to reach at another address than the one in the membership (default: none).
    pub peer_addrs: BTreeMap<u64, String>,
    /// Watch history and stream limits.
    pub watch: WatchTuning,
    /// Request size and concurrency limits of the client services.
    pub limits: Limits,
    /// Where to serve `/metrics`, `/livez` and `/readyz` over HTTP (default: nowhere).
    pub http: Option<SocketAddr>,
    /// `/readyz` answers 503 while this node's applied index is more than this many entries
    /// behind the leader's (default 1,000).
    pub ready_max_lag: u64,
    /// Whether a leader that is asked to stop first hands leadership to a caught-up voter (default
    /// true; see [`crate::shutdown`]). `baton dev` turns it off: it stops all three nodes at once,
    /// so there is no voter left to take over.
    pub hand_over_on_shutdown: bool,
}

impl NodeConfig {
    /// A node with the default settings for everything but its identity, address and data dir.
    pub fn new(id: u64, listen: SocketAddr, data_dir: PathBuf) -> Self {
        Self {
            id,
            listen,
            advertise: listen.to_string(),
            data_dir,
            raft: RaftTuning::default(),
            sweep_interval: Duration::from_secs(1),
            peer_addrs: BTreeMap::new(),
            watch: WatchTuning::default(),
            limits: Limits::default(),
            http: None,
            ready_max_lag: 1_000,
            hand_over_on_shutdown: true,
        }
    }
}

/// What a node accepts from clients before it refuses with `RESOURCE_EXHAUSTED` rather than
/// queueing without bound. Raft traffic between nodes, watch streams, health checks and
/// reflection are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest client request message (default 4 MiB: the largest payload the state machine
    /// accepts, 1 MiB, plus headroom). A larger one is refused `REQUEST_TOO_LARGE`.
    pub max_request_bytes: usize,
    /// Client requests being served at once on the whole node (default 4,096); one more is
    /// refused `OVERLOADED`.
    pub max_in_flight: usize,
    /// Client requests being served at once on one connection (default 512); one more is
    /// refused `OVERLOADED`.
    pub max_in_flight_per_connection: usize,
    /// Client connections open at once (default 4,096); one more is closed as soon as it is
    /// told apart from a peer's ([`crate::client_connections`]). Peers' Raft connections are
    /// not counted.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_bytes: 4 << 20,
            max_in_flight: 4_096,
            max_in_flight_per_connection: 512,
            max_connections: 4_096,
        }
    }
}

/// How much change history a node keeps for watches, and how its streams behave.
#[derive(Debug, Clone)]
pub struct WatchTuning {
    /// The history's bounds (default 100,000 changes, 64 MiB): a watch may start at any revision
    /// the history still holds, an older one is refused `COMPACTED`.
    pub history: HistoryLimits,
    /// A stream whose consumer leaves this many changes unread behind it is ended with
    /// `SLOW_CONSUMER` (default 50,000, half the history, so that it can resume where it was cut).
    pub max_backlog: usize,
    /// Changes buffered per stream between the history and the connection (default 256).
    pub stream_buffer: usize,
    /// Streams the node serves at once (default 1,000); more are refused `OVERLOADED`, so that
    /// the clients move to another node. Each may hold up to 4 MiB of changes on their way.
    pub max_streams: usize,
    /// How often an idle stream sends its progress, which is also its keep-alive (default 1 s).
    pub progress_every: Duration,
    /// A node that has not heard from a leader (or, leading, from a quorum) for this long ends its
    /// streams with `NO_LEADER` and refuses new ones, so clients move to a node that is current
    /// (default 3 s).
    pub leaderless_cutoff: Duration,
}

impl Default for WatchTuning {
    fn default() -> Self {
        let history = HistoryLimits::default();
        Self {
            history,
            max_backlog: history.events / 2,
            stream_buffer: 256,
            max_streams: 1_000,
            progress_every: Duration::from_secs(1),
            leaderless_cutoff: Duration::from_secs(3),
        }
    }
}

impl WatchTuning {
    /// The defaults with a history of `events` changes and a backlog limit of half of it.
    pub fn with_history(events: usize) -> Self {
        let mut tuning = Self::default();
        tuning.history.events = events;
        tuning.max_backlog = (events / 2).max(1);
        tuning
    }
}

/// Raft timings and snapshot policy.
#[derive(Debug, Clone)]
pub struct RaftTuning {
    /// Leader heartbeat interval (default 50 ms).
    pub heartbeat: Duration,
    /// Election timeout range (default 200–400 ms): a follower that hears nothing from a leader
    /// for its lease (the maximum) plus a random time in this range starts an election, so a
    /// dead leader is replaced ~0.7 s later (the failover target is 1 s; docs/benchmarks.md).
    pub election_timeout: (Duration, Duration),
    /// Build a snapshot about every this many log entries (default 10,000), at points offset
    /// from the other members' ([`crate::snapshot_schedule`]).
    pub snapshot_every: u64,
    /// Keep this many entries behind a snapshot so slightly lagging followers catch up from
    /// the log rather than by snapshot (default 1,000).
    pub keep_logs: u64,
}

impl Default for RaftTuning {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(50),
            election_timeout: (Duration::from_millis(200), Duration::from_millis(400)),
            snapshot_every: 10_000,
            keep_logs: 1_000,
        }
    }
}

impl RaftTuning {
    /// The openraft configuration these settings describe.
    pub fn to_openraft(&self) -> Result<openraft::Config, openraft::ConfigError> {
        let config = openraft::Config {
            cluster_name: "baton".into(),
            heartbeat_interval: self.heartbeat.as_millis() as u64,
            election_timeout_min: self.election_timeout.0.as_millis() as u64,
            election_timeout_max: self.election_timeout.1.as_millis() as u64,
            // Elections are started by crate::pre_vote, only when a quorum would vote.
            enable_elect: false,
            // Builds are scheduled by crate::snapshot_schedule, staggered across the members.
            snapshot_policy: openraft::SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: self.keep_logs,
            // Each chunk's deadline. The last chunk is answered only once the follower has
            // stored the whole snapshot (decoded, written, synced: 4.4 s for a million leases,
            // docs/benchmarks.md); a shorter deadline would have the leader send it all again.
            // A dead link ends sooner: the transport's keepalive and TCP_USER_TIMEOUT break it.
            install_snapshot_timeout: 60_000,
            max_payload_entries: 64,
            ..Default::default()
        };
        config.validate()
    }

    /// The election timings [`crate::pre_vote::run`] keeps: openraft's leader lease is the
    /// largest election timeout.
    pub fn election_timing(&self) -> crate::pre_vote::Timing {
        crate::pre_vote::Timing {
            lease: self.election_timeout.1,
            timeout: self.election_timeout,
        }
    }
}
