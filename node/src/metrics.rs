//! Prometheus metrics: what the process counts as it works (proposals, reads, applies,
//! requests, errors, snapshots) and what a node reports of its state each time it is scraped
//! (term, leader, indexes, replication lag, live leases, watch streams).
//!
//! The counters live in one registry per process, like Prometheus' default registry: a process
//! that runs several nodes (`baton dev`) adds their work up. The state gauges are read from one
//! node when [`Metrics::render`] is called for it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use baton_rpc::error::detail_of;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use prost::Message;

use crate::node::Node;

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `method` label of a request to gRPC path `method` (without its leading slash): the path
/// itself when a Baton service declares it, `unknown` otherwise.
///
/// Paths come from clients (a request's URI, a batch item's method), and every distinct label is
/// a series kept for the life of the process: made-up paths must not grow the metrics.
fn method_label(method: &str) -> &str {
    static DECLARED: LazyLock<BTreeSet<String>> = LazyLock::new(|| {
        let set = prost_types::FileDescriptorSet::decode(baton_rpc::proto::FILE_DESCRIPTOR_SET)
            .unwrap_or_default();
        set.file
            .iter()
            .flat_map(|file| {
                file.service.iter().flat_map(move |service| {
                    service.method.iter().map(move |method| {
                        format!("{}.{}/{}", file.package(), service.name(), method.name())
                    })
                })
            })
            .collect()
    });
    if DECLARED.contains(method) {
        method
    } else {
        "unknown"
    }
}

/// The process' metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

/// Times a proposal of `command` (a [`baton_statemachine::Command::name`]) until dropped, and
/// then counts it, unless [`ProposalTimer::never_proposed`] says it never was.
pub fn time_proposal(command: &'static str) -> ProposalTimer {
    let metrics = metrics();
    let labels = CommandLabels { command };
    ProposalTimer {
        started: Instant::now(),
        histogram: metrics.proposal_seconds.get_or_create(&labels).clone(),
        counter: metrics.commands.get_or_create(&labels).clone(),
        proposed: true,
    }
}

/// A proposal being timed: observed and counted when dropped.
pub struct ProposalTimer {
    started: Instant,
    histogram: Histogram,
    counter: Counter,
    proposed: bool,
}

impl ProposalTimer {
    /// Forgets the proposal: it was turned away before it reached the log (this node does not
    /// lead, or is stopping), so it is neither a proposal nor its latency one (a follower's
    /// instant refusals would pull the latency down just when leadership moves).
    pub fn never_proposed(mut self) {
        self.proposed = false;
    }
}

impl Drop for ProposalTimer {
    fn drop(&mut self) {
        if self.proposed {
            self.counter.inc();
            self.histogram.observe(self.started.elapsed().as_secs_f64());
        }
    }
}

/// Times a linearizable read until dropped.
pub fn time_read() -> Timer {
    Timer::start(metrics().read_seconds.clone())
}

/// Observes the time from its start to its drop into a histogram, however the timed work ends.
pub struct Timer {
    started: Instant,
    histogram: Histogram,
}

impl Timer {
    fn start(histogram: Histogram) -> Self {
        Self {
            started: Instant::now(),
            histogram,
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// What the metered stores see of one node that openraft's own metrics do not say.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// The last committed log index this node knows (0 before the first commit).
    pub committed: AtomicU64,
}

impl StoreStats {
    /// A shareable, empty set.
    pub fn shared() -> Arc<Self> {
        Arc::default()
    }

    /// The last committed log index this node knows.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    command: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FollowerLabels {
    follower: String,
}

/// Every metric a node exports.
pub struct Metrics {
    registry: Registry,
    proposal_seconds: Family<CommandLabels, Histogram>,
    commands: Family<CommandLabels, Counter>,
    read_seconds: Histogram,
    apply_seconds: Histogram,
    applied_entries: Counter,
    requests: Family<MethodLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    in_flight: Gauge,
    client_connections: Gauge,
    connections_refused: Counter,
    snapshot_bytes: Gauge,
    snapshot_build_seconds: Gauge<f64, AtomicU64>,
    snapshots_built: Counter,
    snapshots_installed: Counter,
    node: NodeGauges,
    /// Held while a scrape sets the node gauges and encodes them: the gauges are shared, and a
    /// second scrape clearing the lag series in between would drop them from the first's text.
    rendering: Mutex<()>,
}

/// Gauges set from one node's state when it is scraped.
#[derive(Default)]
struct NodeGauges {
    term: Gauge,
    leader_id: Gauge,
    is_leader: Gauge,
    has_leader: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    last_log_index: Gauge,
    snapshot_index: Gauge,
    purged_index: Gauge,
    quorum_ack_age_seconds: Gauge<f64, AtomicU64>,
    replication_lag: Family<FollowerLabels, Gauge>,
    voters: Gauge,
    live_tickets: Gauge,
    board_leases: Gauge,
    effect_holds: Gauge,
    queue_attempts: Gauge,
    client_sessions: Gauge,
    client_session_bytes: Gauge,
    watch_streams: Gauge,
    watch_history_events: Gauge,
    watch_history_bytes: Gauge,
}

/// 0.25 ms to ~8 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("baton");
        let proposal_seconds = Family::<CommandLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let read_seconds = latency_histogram();
        let apply_seconds = latency_histogram();
        let mut metrics = Self {
            registry: Registry::default(),
            proposal_seconds,
            commands: Family::default(),
            read_seconds,
            apply_seconds,
            applied_entries: Counter::default(),
            requests: Family::default(),
            errors: Family::default(),
            in_flight: Gauge::default(),
            client_connections: Gauge::default(),
            connections_refused: Counter::default(),
            snapshot_bytes: Gauge::default(),
            snapshot_build_seconds: Gauge::default(),
            snapshots_built: Counter::default(),
            snapshots_installed: Counter::default(),
            node: NodeGauges::default(),
            rendering: Mutex::new(()),
        };
        let r = &mut registry;
        r.register(
            "proposal_duration_seconds",
            "Time from proposing a command to its applied answer, by command",
            metrics.proposal_seconds.clone(),
        );
        r.register(
            "commands",
            "Commands proposed by this node, by command",
            metrics.commands.clone(),
        );
        r.register(
            "read_duration_seconds",
            "Time of a linearizable read (leadership check, wait for apply, read)",
            metrics.read_seconds.clone(),
        );
        r.register(
            "apply_duration_seconds",
            "Time to apply one batch of committed entries to the state machine",
            metrics.apply_seconds.clone(),
        );
        r.register(
            "applied_entries",
            "Log entries applied to the state machine",
            metrics.applied_entries.clone(),
        );
        r.register(
            "grpc_requests",
            "Client gRPC requests received, by method",
            metrics.requests.clone(),
        );
        r.register(
            "grpc_errors",
            "Client gRPC requests that ended in an error, by method and Baton code (a contract refusal such as TAKEN, or an infrastructure code such as NOT_LEADER or OVERLOADED; the gRPC code when the error carries none)",
            metrics.errors.clone(),
        );
        r.register(
            "grpc_in_flight_requests",
            "Client gRPC requests being served now",
            metrics.in_flight.clone(),
        );
        r.register(
            "grpc_client_connections",
            "Client connections open now, at most limits.max_connections per node (peers' Raft connections are not counted)",
            metrics.client_connections.clone(),
        );
        r.register(
            "grpc_connections_refused",
            "Client connections closed at once because the node held limits.max_connections of them",
            metrics.connections_refused.clone(),
        );
        r.register(
            "snapshot_size_bytes",
            "Size of the last snapshot built or installed",
            metrics.snapshot_bytes.clone(),
        );
        r.register(
            "snapshot_build_duration_seconds",
            "Time the last snapshot build took",
            metrics.snapshot_build_seconds.clone(),
        );
        r.register(
            "snapshots_built",
            "Snapshots built by this node",
            metrics.snapshots_built.clone(),
        );
        r.register(
            "snapshots_installed",
            "Snapshots received from a leader and installed",
            metrics.snapshots_installed.clone(),
        );
        metrics.node.register(r);
        metrics.registry = registry;
        metrics
    }

    /// One batch of `entries` applied in `took`.
    pub fn observe_apply(&self, entries: usize, took: Duration) {
        self.apply_seconds.observe(took.as_secs_f64());
        self.applied_entries.inc_by(entries as u64);
    }

    /// A snapshot of `bytes` built in `took`.
    pub fn snapshot_built(&self, bytes: usize, took: Duration) {
        self.snapshots_built.inc();
        self.snapshot_bytes.set(bytes as i64);
        self.snapshot_build_seconds.set(took.as_secs_f64());
    }

    /// The node resumed from its own snapshot of `bytes` at start-up (not an install: only the
    /// size is reported).
    pub fn snapshot_resumed(&self, bytes: usize) {
        self.snapshot_bytes.set(bytes as i64);
    }

    /// A snapshot of `bytes` installed from the leader.
    pub fn snapshot_installed(&self, bytes: usize) {
        self.snapshots_installed.inc();
        self.snapshot_bytes.set(bytes as i64);
    }

    /// A client request to `method` began; the guard marks its end.
    pub fn request_started(&self, method: &str) -> InFlight {
        self.requests
            .get_or_create(&MethodLabels {
                method: method_label(method).to_string(),
            })
            .inc();
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// How many client requests to `method` (e.g. `baton.v1.Board/Claim`) began so far.
    pub fn requests_of(&self, method: &str) -> u64 {
        self.requests
            .get_or_create(&MethodLabels {
                method: method_label(method).to_string(),
            })
            .get()
    }

    /// How many client requests this process is serving right now.
    pub fn requests_in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// A client connection took a place.
    pub fn client_connection_opened(&self) {
        self.client_connections.inc();
    }

    /// A client connection gave its place back.
    pub fn client_connection_closed(&self) {
        self.client_connections.dec();
    }

    /// A client connection found no place and was closed.
    pub fn client_connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// How many client connections this process has closed for want of a place so far.
    pub fn connections_refused(&self) -> u64 {
        self.connections_refused.get()
    }

    /// A client request to `method` ended with `status` (a gRPC status as in its response).
    pub fn request_failed(&self, method: &str, status: &tonic::Status) {
        let code = detail_of(status)
            .map(|detail| detail.code)
            .filter(|code| !code.is_empty())
            .unwrap_or_else(|| format!("{:?}", status.code()));
        self.errors
            .get_or_create(&ErrorLabels {
                method: method_label(method).to_string(),
                code,
            })
            .inc();
    }

    /// Every metric in the text exposition format, with the state gauges read from `node`.
    pub fn render(&self, node: &Node, stats: &StoreStats) -> String {
        let _one_at_a_time = self
            .rendering
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.node.update(node, stats);
        let mut text = String::new();
        match prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            Ok(()) => text,
            Err(e) => format!("# cannot encode metrics: {e}\n"),
        }
    }
}

/// Marks a client request as no longer in flight when dropped.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl NodeGauges {
    fn register(&self, r: &mut Registry) {
        let gauges: [(&str, &str, &Gauge); 19] = [
            ("raft_term", "Current Raft term", &self.term),
            (
                "raft_leader_id",
                "Id of the leader this node knows (-1: none)",
                &self.leader_id,
            ),
            ("raft_is_leader", "1 when this node leads", &self.is_leader),
            (
                "raft_has_leader",
                "1 when this node knows a leader",
                &self.has_leader,
            ),
            (
                "raft_commit_index",
                "Last log index this node knows to be committed",
                &self.commit_index,
            ),
            (
                "raft_applied_index",
                "Last log index applied to the state machine",
                &self.applied_index,
            ),
            (
                "raft_last_log_index",
                "Last log index appended to this node's log",
                &self.last_log_index,
            ),
            (
                "raft_snapshot_index",
                "Last log index included in the current snapshot",
                &self.snapshot_index,
            ),
            (
                "raft_purged_index",
                "Last log index purged from the log",
                &self.purged_index,
            ),
            ("raft_voters", "Voting members in the membership", &self.voters),
            (
                "tickets_live",
                "Handoff tickets offered or accepted",
                &self.live_tickets,
            ),
            (
                "board_leases_active",
                "Task-board claims with a live lease",
                &self.board_leases,
            ),
            (
                "effect_holds_active",
                "Side-effect gate resources held by a live lease",
                &self.effect_holds,
            ),
            (
                "queue_attempts_active",
                "Queue tasks with an active attempt (each holds its concurrency key's permit, if any)",
                &self.queue_attempts,
            ),
            (
                "client_sessions",
                "Client sessions remembered for exactly-once retries",
                &self.client_sessions,
            ),
            (
                "client_session_bytes",
                "Bytes of answers the session table remembers (bounded at 256 MiB)",
                &self.client_session_bytes,
            ),
            ("watch_streams", "Watch streams open", &self.watch_streams),
            (
                "watch_history_events",
                "Changes held in the watch history",
                &self.watch_history_events,
            ),
            (
                "watch_history_bytes",
                "Approximate bytes held in the watch history",
                &self.watch_history_bytes,
            ),
        ];
        for (name, help, gauge) in gauges {
            r.register(name, help, gauge.clone());
        }
        r.register(
            "raft_quorum_ack_age_seconds",
            "On the leader: time since a quorum last acknowledged it (-1 elsewhere)",
            self.quorum_ack_age_seconds.clone(),
        );
        r.register(
            "raft_replication_lag_entries",
            "On the leader: log entries each follower lacks (leader's last log index minus the follower's matched index)",
            self.replication_lag.clone(),
        );
    }

    fn update(&self, node: &Node, stats: &StoreStats) {
        let raft = node.raft.metrics().borrow().clone();
        let index = |id: Option<openraft::LogId<u64>>| id.map_or(0, |id| id.index as i64);
        self.term.set(raft.current_term as i64);
        self.leader_id
            .set(raft.current_leader.map_or(-1, |id| id as i64));
        self.is_leader
            .set(i64::from(raft.current_leader == Some(node.id)));
        self.has_leader
            .set(i64::from(raft.current_leader.is_some()));
        self.commit_index.set(stats.committed() as i64);
        self.applied_index.set(index(raft.last_applied));
        self.last_log_index
            .set(raft.last_log_index.map_or(0, |i| i as i64));
        self.snapshot_index.set(index(raft.snapshot));
        self.purged_index.set(index(raft.purged));
        self.voters
            .set(raft.membership_config.membership().voter_ids().count() as i64);
        self.quorum_ack_age_seconds.set(
            raft.millis_since_quorum_ack
                .map_or(-1.0, |ms| ms as f64 / 1000.0),
        );
        self.replication_lag.clear();
        if let Some(replication) = &raft.replication {
            let last = raft.last_log_index.unwrap_or(0);
            for (follower, matched) in replication {
                if *follower == node.id {
                    continue;
                }
                let matched = matched.map_or(0, |id| id.index);
                self.replication_lag
                    .get_or_create(&FollowerLabels {
                        follower: follower.to_string(),
                    })
                    .set(last.saturating_sub(matched) as i64);
            }
        }
        {
            let applied = node.state_machine.read();
            let state = &applied.state;
            self.live_tickets.set(state.handoff.live() as i64);
            self.board_leases.set(state.board.leases() as i64);
            self.effect_holds.set(state.effects.holds() as i64);
            self.queue_attempts.set(state.queue.active_leases() as i64);
            self.client_sessions.set(state.sessions.len() as i64);
            self.client_session_bytes.set(state.sessions.bytes() as i64);
        }
        let history = node.state_machine.history().stats();
        self.watch_streams.set(history.streams as i64);
        self.watch_history_events.set(history.events as i64);
        self.watch_history_bytes.set(history.bytes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::method_label;

    #[test]
    fn only_declared_methods_become_labels() {
        for declared in [
            "baton.v1.Board/Claim",
            "baton.v1.Batch/Call",
            "baton.v1.Cluster/RemoveMember",
            "baton.v1.Queue/Lease",
        ] {
            assert_eq!(method_label(declared), declared);
        }
        for made_up in [
            "baton.v1.Board/Steal",
            "baton.v1.Nope/Claim",
            "/baton.v1.Board/Claim",
            "",
        ] {
            assert_eq!(method_label(made_up), "unknown", "{made_up:?}");
        }
    }
}
