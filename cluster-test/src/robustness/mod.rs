//! The robustness suite: fault scenarios against a real three-node cluster under concurrent,
//! recorded workloads, judged afterwards by checkers over the whole history (the approach of
//! etcd's `tests/robustness` and of Jepsen).
//!
//! One run of a [`Scenario`]:
//!
//! 1. start three `baton node` processes whose peer links go through TCP proxies;
//! 2. start the workloads — handoff races ([`handoff`]), board claims ([`board`]) and
//!    dependency chains ([`chain`]), side-effect
//!    acquires with fenced sink writes ([`effect`]) and the reconciling of those whose outcome
//!    is unknown ([`reconcile`]), short-lived tickets racing their deadlines ([`courier`]),
//!    keyed queue permits ([`queue`]), checkpoint
//!    saves ([`checkpoint`]) and a watch of them ([`watcher`]), with one of the tickets
//!    ([`handoff_watch`]), one of the board's claims ([`board_watch`]), one of the
//!    side-effect attempts ([`effect_watch`]), one of the queue's attempts ([`queue_watch`])
//!    and one of the fenced sinks' writes ([`sink_watch`]) — every client
//!    recording each operation (a watch: each change delivered) in one [`history::Recorder`];
//! 3. inject the scenario's faults for a while ([`faults::Nemesis`]), then undo them all and
//!    wait for the cluster to converge;
//! 4. require that every workload gets a grant again after recovery, stop the workloads, read
//!    back everything that was acknowledged, let the watches catch up, and compare the members'
//!    states ([`replicas_agree`]);
//! 5. run every checker over the finished history.
//!
//! Choices (keys, operations, timings, victims) come from one seed, so a failing seed can be
//! replayed; the interleaving itself is real and not reproducible to the microsecond.
//!
//! Steps 2–5 run against any [`target::Target`]: [`run`] drives node processes through every
//! [`Scenario`], [`run_leader_faults`] drives any target (containers, see [`crate::docker`])
//! through the faults aimed at the leader.

pub mod board;
pub mod board_watch;
pub mod chain;
pub mod check;
pub mod checkpoint;
pub mod courier;
pub mod effect;
pub mod effect_watch;
pub mod faults;
pub mod handoff;
pub mod handoff_watch;
pub mod history;
pub mod queue;
pub mod queue_watch;
pub mod reconcile;
pub mod sink_watch;
pub mod target;
pub mod test_history;
pub mod watcher;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use baton_rpc::replicas::SeenDigests;
use baton_rpc::{Client, ClientConfig};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::task::JoinHandle;

use self::check::Violation;
use self::faults::{LeaderFault, Nemesis};
use self::history::{Clock, Input, Op, Outcome, Output, Recorder};
use self::target::Target;
use crate::cluster::{client_config, Cluster, Options};
use crate::power_cut;

/// A fault scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// SIGKILL the leader, restart it from its data dir; repeatedly.
    LeaderKill,
    /// SIGKILL a follower, restart it; repeatedly.
    FollowerKill,
    /// SIGKILL all three nodes at once (power loss), restart them all; repeatedly. Where FUSE can
    /// be mounted, everything the nodes wrote but did not sync is thrown away too.
    RestartAll,
    /// SIGSTOP the leader for longer than the election timeout, probe it, SIGCONT it.
    LeaderPause,
    /// Cut every link of the leader, probe it, heal.
    IsolateLeader,
    /// Cut every link of a follower, heal.
    IsolateFollower,
    /// Rolling 1|2 partitions of random nodes.
    Split,
    /// Links cut in one direction only, or between some nodes while others still reach both
    /// sides: the leader's outgoing links, the leader and one follower, random directed links.
    OneWay,
    /// Links slowed, not cut: every link a little, or one follower's or the leader's past the
    /// AppendEntries deadline.
    SlowLinks,
    /// Add a node as learner, promote it, remove an old voter (maybe the leader), under load.
    Membership,
    /// Each round one of the faults above but membership, chosen at random.
    Mixed,
}

impl Scenario {
    /// Every scenario.
    pub const ALL: [Scenario; 11] = [
        Scenario::LeaderKill,
        Scenario::FollowerKill,
        Scenario::RestartAll,
        Scenario::LeaderPause,
        Scenario::IsolateLeader,
        Scenario::IsolateFollower,
        Scenario::Split,
        Scenario::OneWay,
        Scenario::SlowLinks,
        Scenario::Membership,
        Scenario::Mixed,
    ];

    /// The scenario's name in summaries and on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Scenario::LeaderKill => "leader-kill",
            Scenario::FollowerKill => "follower-kill",
            Scenario::RestartAll => "restart-all",
            Scenario::LeaderPause => "leader-pause",
            Scenario::IsolateLeader => "isolate-leader",
            Scenario::IsolateFollower => "isolate-follower",
            Scenario::Split => "split-1-2",
            Scenario::OneWay => "one-way",
            Scenario::SlowLinks => "slow-links",
            Scenario::Membership => "membership",
            Scenario::Mixed => "mixed",
        }
    }

    /// The scenario called `name`.
    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many clients each workload runs.
#[derive(Debug, Clone)]
pub struct Mix {
    /// Handoff clients.
    pub handoff: usize,
    /// Handoff ticket keys they share.
    pub tickets: usize,
    /// Board agents.
    pub board: usize,
    /// Board tasks they share.
    pub tasks: usize,
    /// Board agents walking dependency chains.
    pub chain_agents: usize,
    /// Couriers of short-lived handoff tickets.
    pub couriers: usize,
    /// Side-effect holders.
    pub effect: usize,
    /// Resources they share.
    pub resources: usize,
    /// Reconcilers of the keys whose outcome a holder did not know.
    pub reconcilers: usize,
    /// Queue workers (plus one submitter).
    pub workers: usize,
    /// Checkpoint savers.
    pub savers: usize,
    /// Checkpoint runs they share.
    pub runs: usize,
}

impl Default for Mix {
    /// Enough contention to race on every key, light enough for a 2-core machine.
    fn default() -> Self {
        Mix {
            handoff: 4,
            tickets: 3,
            board: 3,
            tasks: 2,
            chain_agents: 2,
            couriers: 2,
            effect: 3,
            resources: 2,
            reconcilers: 2,
            workers: 2,
            savers: 2,
            runs: 2,
        }
    }
}

/// How one run is shaped.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long faults are injected (the fault in progress is finished).
    pub fault_time: Duration,
    /// Workload before the first fault.
    pub warmup: Duration,
    /// How long every workload may take to get a grant acknowledged again after recovery.
    pub recovery_limit: Duration,
    /// Clients per workload.
    pub mix: Mix,
    /// Where to write the history of a run that found a violation (none: the temp dir).
    pub history_dir: Option<PathBuf>,
    /// `--snapshot-every` of the nodes: small, so that runs build snapshots, restarted nodes
    /// load them, and lagging followers catch up by snapshot install.
    pub snapshot_every: u64,
    /// `--keep-logs` of the nodes: small, so that a follower down for a second or two has to
    /// catch up by snapshot.
    pub keep_logs: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            fault_time: Duration::from_secs(15),
            warmup: Duration::from_secs(1),
            recovery_limit: Duration::from_secs(20),
            mix: Mix::default(),
            history_dir: None,
            snapshot_every: 500,
            keep_logs: 100,
        }
    }
}

/// What one run found.
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// The finished history.
    pub history: Vec<Op>,
    /// Faults injected.
    pub faults: usize,
    /// The nemesis's log.
    pub fault_log: Vec<String>,
    /// Every violation found.
    pub violations: Vec<Violation>,
    /// Wall time of the whole run.
    pub elapsed: Duration,
    /// Wall time of each step after the set-up, in order (so a slow run shows where it spent it).
    pub phases: Vec<(&'static str, Duration)>,
    /// Where the full history was written (a run with violations, or one that did not recover).
    pub history_file: Option<PathBuf>,
    /// Where the cluster's data and logs were kept (as `history_file`).
    pub cluster_dir: Option<PathBuf>,
    /// The command that replays this run.
    pub replay: String,
}

impl Report {
    /// Operations recorded.
    pub fn ops(&self) -> usize {
        self.history.len()
    }

    /// Operations whose outcome is unknown.
    pub fn ambiguous(&self) -> usize {
        self.history.iter().filter(|op| op.is_ambiguous()).count()
    }

    /// `ok` or `VIOLATION`.
    pub fn verdict(&self) -> &'static str {
        if self.violations.is_empty() {
            "ok"
        } else {
            "VIOLATION"
        }
    }

    /// The one-line summary.
    pub fn summary(&self) -> String {
        format!(
            "scenario={} seed={} ops={} ambiguous={} faults={} verdict={}",
            self.scenario,
            self.seed,
            self.ops(),
            self.ambiguous(),
            self.faults,
            self.verdict()
        )
    }

    /// Per-workload counts, the run time and the fault log, for the lines after the summary.
    pub fn details(&self) -> String {
        let mut counts = [(0usize, 0usize); WORKLOADS.len()];
        for op in &self.history {
            let slot = workload_of(op);
            counts[slot].0 += 1;
            if op.is_ambiguous() {
                counts[slot].1 += 1;
            }
        }
        let parts: Vec<String> = WORKLOADS
            .iter()
            .zip(counts)
            .map(|(name, (ops, amb))| format!("{name}={ops}/{amb}"))
            .collect();
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(name, took)| format!("{name} {:.1}s", took.as_secs_f64()))
            .collect();
        let mut text = format!(
            "  ops/ambiguous per workload: {}; {:.1}s ({})\n  faults:",
            parts.join(" "),
            self.elapsed.as_secs_f64(),
            phases.join(", ")
        );
        for line in &self.fault_log {
            text.push_str(&format!("\n    {line}"));
        }
        text
    }

    /// How each kind of operation ended, one line per kind (`board/claim-step: ok=12 TAKEN=30
    /// ambiguous=1`): what the run exercised, a refusal code that never shows being a path the
    /// faults never reached.
    pub fn outcomes(&self) -> String {
        let mut kinds: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for op in &self.history {
            let input = op.input.to_string();
            let verb = input.split_whitespace().next().unwrap_or("?");
            let kind = format!("{}/{verb}", WORKLOADS[workload_of(op)]);
            let outcome = match &op.outcome {
                Outcome::Pending | Outcome::Ambiguous(_) => "ambiguous".to_string(),
                Outcome::Ok(_) => "ok".to_string(),
                Outcome::Refused(code) => code.clone(),
                Outcome::Unexpected(_) => "unexpected".to_string(),
            };
            *kinds.entry(kind).or_default().entry(outcome).or_default() += 1;
        }
        let lines: Vec<String> = kinds
            .iter()
            .map(|(kind, outcomes)| {
                let counts: Vec<String> = outcomes
                    .iter()
                    .map(|(outcome, n)| format!("{outcome}={n}"))
                    .collect();
                format!("    {kind}: {}", counts.join(" "))
            })
            .collect();
        format!("  outcomes by operation:\n{}", lines.join("\n"))
    }

    /// Every violation with its slice of history, the fault log, and where the rest is.
    pub fn explain(&self) -> String {
        let mut text = String::new();
        for violation in &self.violations {
            text.push_str(&violation.render(&self.history, false));
        }
        text.push_str("faults:\n");
        for line in &self.fault_log {
            text.push_str(&format!("    {line}\n"));
        }
        if let Some(file) = &self.history_file {
            text.push_str(&format!("full history: {}\n", file.display()));
        }
        if let Some(dir) = &self.cluster_dir {
            text.push_str(&format!(
                "cluster data and logs kept in {}\n",
                dir.display()
            ));
        }
        text.push_str(&format!("replay: {}\n", self.replay));
        text
    }
}

/// The error of a run that could not run its faults, did not recover, or could not be read back
/// after it (the context of the cause), with what its history showed until then: everything that
/// can be judged without the read-back was (`drive`), and a violation found so is as real as in
/// any other run, so the binary counts it with the others (`violations=`) besides counting the
/// run as an error.
/// (`lost-ack` needs the read-back and `progress` a run that went its whole course: neither is
/// judged.)
#[derive(Debug)]
pub struct Unrecovered {
    /// Operations recorded.
    pub ops: usize,
    /// Operations whose outcome is unknown.
    pub ambiguous: usize,
    /// Faults injected.
    pub faults: usize,
    /// Violations found in the history until then.
    pub violations: usize,
    /// What the run was and found ([`Report::explain`]).
    explained: String,
}

impl Unrecovered {
    fn of(report: &Report) -> Self {
        Unrecovered {
            ops: report.ops(),
            ambiguous: report.ambiguous(),
            faults: report.faults,
            violations: report.violations.len(),
            explained: format!(
                "scenario {} seed {} could not run its faults, recover or be read back; {} \
                 violation(s) in the history until then (not read back)\n{}",
                report.scenario,
                report.seed,
                report.violations.len(),
                report.explain()
            ),
        }
    }
}

impl fmt::Display for Unrecovered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.explained)
    }
}

/// The workloads, in the order [`workload_of`] numbers them.
const WORKLOADS: [&str; 5] = ["handoff", "board", "effect+sink", "queue", "checkpoint"];
/// [`WORKLOADS`]' handoff.
const HANDOFF: usize = 0;
/// [`WORKLOADS`]' queue.
const QUEUE_WORKLOAD: usize = 3;

/// Which of [`WORKLOADS`] `op` belongs to.
fn workload_of(op: &Op) -> usize {
    // A watch's compaction or end belongs with the changes it follows.
    if matches!(
        op.input,
        Input::WatchCompacted { .. } | Input::WatchEnded { .. }
    ) {
        if op.client == handoff_watch::NAME {
            return 0;
        }
        if op.client == board_watch::NAME {
            return 1;
        }
        if op.client == effect_watch::NAME {
            return 2;
        }
        if op.client == queue_watch::NAME {
            return 3;
        }
        if op.client == sink_watch::NAME {
            return 2;
        }
    }
    match &op.input {
        Input::Offer { .. }
        | Input::Take { .. }
        | Input::Reply { .. }
        | Input::Cancel { .. }
        | Input::Read { .. } => 0,
        Input::Claim { .. }
        | Input::ReleaseTask { .. }
        | Input::RenewTask { .. }
        | Input::ListTasks
        | Input::ClaimStep { .. }
        | Input::CompleteStep { .. } => 1,
        Input::WatchLease { .. } if op.client == handoff_watch::NAME => 0,
        Input::WatchLease { key, .. } if key.starts_with(board::TASK_PREFIX) => 1,
        Input::WatchLease { .. } if op.client == queue_watch::NAME => 3,
        Input::Acquire { .. }
        | Input::CompleteEffect { .. }
        | Input::ReleaseEffect { .. }
        | Input::MarkUncertain { .. }
        | Input::BeginReconcile { .. }
        | Input::Resolve { .. }
        | Input::ShowAction { .. }
        | Input::WatchLease { .. } => 2,
        Input::SinkWrite { resource, .. }
        | Input::SinkRead { resource }
        | Input::WatchSinkWritten { resource, .. }
            if resource.starts_with(effect::SINK_PREFIX) =>
        {
            2
        }
        Input::SaveCheckpoint { .. }
        | Input::LoadCheckpoint { .. }
        | Input::WatchSaved { .. }
        | Input::WatchCompacted { .. }
        | Input::WatchEnded { .. } => 4,
        _ => 3,
    }
}

/// The seed of client `n` of a run.
fn client_seed(seed: u64, n: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(n)
}

/// The running workload tasks.
struct Workloads {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Workloads {
    async fn start(
        endpoints: &[String],
        rec: &Recorder,
        seed: u64,
        mix: &Mix,
        tickets: &[String],
    ) -> anyhow::Result<Workloads> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        let mut n = 0u64;
        let mut next_rng = || {
            n += 1;
            StdRng::seed_from_u64(client_seed(seed, n))
        };
        let tickets = handoff::Keys::new(tickets);
        let tokens = handoff::Tokens::default();
        for i in 0..mix.handoff {
            tasks.push(tokio::spawn(handoff::run(
                connect(endpoints, i).await?,
                format!("handoff-{i}"),
                rec.clone(),
                tickets.clone(),
                tokens.clone(),
                next_rng(),
                stop.clone(),
            )));
        }
        let board_tasks = Arc::new(board::task_ids(mix.tasks));
        for i in 0..mix.board {
            tasks.push(tokio::spawn(board::run(
                connect(endpoints, i).await?,
                format!("agent-{i}"),
                rec.clone(),
                board_tasks.clone(),
                next_rng(),
                stop.clone(),
            )));
        }
        for i in 0..mix.chain_agents {
            tasks.push(tokio::spawn(chain::run(
                connect(endpoints, i).await?,
                format!("chain-agent-{i}"),
                rec.clone(),
                next_rng(),
                stop.clone(),
            )));
        }
        let resources = Arc::new(effect::resources(mix.resources));
        let backlog = Arc::new(reconcile::Backlog::default());
        for i in 0..mix.effect {
            tasks.push(tokio::spawn(effect::run(
                connect(endpoints, i).await?,
                format!("{}{i}", effect::KEY_PREFIX),
                rec.clone(),
                resources.clone(),
                backlog.clone(),
                next_rng(),
                stop.clone(),
            )));
        }
        let pace = Arc::new(queue::Pace::default());
        tasks.push(tokio::spawn(queue::submit(
            connect(endpoints, 0).await?,
            "submitter".into(),
            rec.clone(),
            pace.clone(),
            next_rng(),
            stop.clone(),
        )));
        for i in 0..mix.workers {
            tasks.push(tokio::spawn(queue::work(
                connect(endpoints, i).await?,
                worker_name(i),
                rec.clone(),
                pace.clone(),
                next_rng(),
                stop.clone(),
            )));
        }
        let runs = Arc::new(checkpoint::run_ids(mix.runs));
        let highest = checkpoint::highest(mix.runs);
        for i in 0..mix.savers {
            tasks.push(tokio::spawn(checkpoint::run(
                connect(endpoints, i).await?,
                format!("saver-{i}"),
                rec.clone(),
                runs.clone(),
                highest.clone(),
                next_rng(),
                stop.clone(),
            )));
        }
        // Added last, so that the clients before them keep the random streams they had before
        // reconcilers and couriers existed (the holders draw more from theirs now).
        for i in 0..mix.reconcilers {
            tasks.push(tokio::spawn(reconcile::run(
                connect(endpoints, i).await?,
                format!("reconciler-{i}"),
                rec.clone(),
                backlog.clone(),
                next_rng(),
                stop.clone(),
            )));
        }
        for i in 0..mix.couriers {
            tasks.push(tokio::spawn(courier::run(
                connect(endpoints, i).await?,
                format!("{}{i}", courier::PREFIX),
                rec.clone(),
                next_rng(),
                stop.clone(),
            )));
        }
        Ok(Workloads { stop, tasks })
    }

    /// Stops every client and waits for the operations in flight (each is bounded by the
    /// client's deadline); a client still busy after `limit` is aborted and its operation stays
    /// ambiguous. A client that panicked (the library on an answer it could not handle, say) is
    /// a violation: its operation stayed pending, which the rules count as merely unknown.
    async fn stop(self, limit: Duration) -> Vec<Violation> {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + limit;
        let mut violations = Vec::new();
        for mut task in self.tasks {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Err(_) => task.abort(),
                Ok(Err(error)) if error.is_panic() => violations.push(Violation::new(
                    "workload-panic",
                    "-",
                    format!("a workload client stopped by a panic: {error}"),
                    Vec::new(),
                )),
                Ok(_) => {}
            }
        }
        violations
    }
}

/// A client for workload client number `i`: even ones are patient (the harness's usual 10 s
/// deadline, so they ride out a failover through retries), odd ones give up after 1.5 s, so
/// operations in flight during a fault end ambiguous — while the store may still apply them.
async fn connect(endpoints: &[String], i: usize) -> anyhow::Result<Client> {
    let config = if i.is_multiple_of(2) {
        client_config()
    } else {
        ClientConfig {
            deadline: Duration::from_millis(1_500),
            attempt_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(300),
        }
    };
    Ok(Client::connect_with(endpoints, config).await?)
}

fn worker_name(i: usize) -> String {
    format!("worker-{i}")
}

/// Runs one scenario with one seed on a fresh cluster.
pub async fn run(scenario: Scenario, seed: u64, settings: &Settings) -> anyhow::Result<Report> {
    let started = Instant::now();
    let options = Options {
        proxied: true,
        snapshot_every: settings.snapshot_every,
        keep_logs: settings.keep_logs,
        // Where FUSE can be mounted (crate::power_cut), every kill is a power loss: what the
        // node wrote but did not sync is thrown away too. Elsewhere kills are SIGKILLs, unless
        // BATON_REQUIRE_FUSE=1 asks for power losses.
        power_cut: power_cut::available_unless_required()?.is_ok(),
        ..Options::default()
    };
    let mut cluster = Cluster::start(3, options)
        .await
        .context("cannot start the cluster")?;
    let label = Label {
        name: scenario.name().to_string(),
        seed,
        // The fault time too: without it the binary derives another one from the seed, and
        // the replay follows another schedule.
        replay: format!(
            "cargo run --release -p baton-cluster-test --bin robustness -- --scenario {scenario} \
             --seed {seed} --fault-time {}",
            humantime::format_duration(settings.fault_time)
        ),
        started,
    };
    let fault_time = settings.fault_time;
    drive(
        &mut cluster,
        label,
        settings,
        async |nemesis: &mut Nemesis, cluster: &mut Cluster| {
            nemesis.run(scenario, cluster, fault_time).await
        },
    )
    .await
}

/// Runs `faults` in turn on the leader of a running, initialised `cluster` under the recorded
/// workloads for about [`Settings::fault_time`] (at least once each), then judges the history.
/// `name` names the run in its report and `replay` is the command that replays it.
/// ([`Settings::snapshot_every`] and [`Settings::keep_logs`] are the cluster's business here.)
pub async fn run_leader_faults<T: Target>(
    cluster: &mut T,
    faults: &[LeaderFault],
    name: &str,
    seed: u64,
    replay: &str,
    settings: &Settings,
) -> anyhow::Result<Report> {
    let label = Label {
        name: name.to_string(),
        seed,
        replay: replay.to_string(),
        started: Instant::now(),
    };
    let fault_time = settings.fault_time;
    drive(
        cluster,
        label,
        settings,
        async |nemesis: &mut Nemesis, cluster: &mut T| {
            nemesis.run_leader_faults(faults, cluster, fault_time).await
        },
    )
    .await
}

/// What a run is called, how to replay it, and when it began.
struct Label {
    name: String,
    seed: u64,
    replay: String,
    started: Instant,
}

/// Steps 2–5 of a run on a started cluster: workloads, `inject` (the faults), recovery, read
/// back, checkers.
async fn drive<T: Target>(
    cluster: &mut T,
    label: Label,
    settings: &Settings,
    inject: impl AsyncFnOnce(&mut Nemesis, &mut T) -> anyhow::Result<()>,
) -> anyhow::Result<Report> {
    let Label {
        name: scenario,
        seed,
        replay,
        started,
    } = label;
    let rec = Recorder::new(Clock::start());
    let mix = &settings.mix;
    let endpoints = cluster.endpoints();

    let setup = Client::connect_with(&endpoints, client_config()).await?;
    board::seed(&setup, &board::task_ids(mix.tasks)).await?;
    chain::seed(&setup).await?;
    let workers: Vec<String> = (0..mix.workers).map(worker_name).collect();
    queue::setup(&setup, &workers).await?;

    let tickets: Vec<String> = (0..mix.tickets).map(|i| format!("ticket-{i}")).collect();
    let watcher = watcher::Watcher::start(connect(&endpoints, 0).await?, rec.clone());
    let workloads = Workloads::start(&endpoints, &rec, seed, mix, &tickets).await?;
    let voters: BTreeSet<u64> = cluster.ids().into_iter().collect();
    let mut nemesis = Nemesis::new(
        rec.clone(),
        StdRng::seed_from_u64(client_seed(seed, 0)),
        &tickets,
        voters,
    );
    tokio::time::sleep(settings.warmup).await;
    let mut phases = Vec::new();
    let mut phase_start = Instant::now();
    let mut phase = |name: &'static str| {
        phases.push((name, phase_start.elapsed()));
        phase_start = Instant::now();
    };
    let faulted = inject(&mut nemesis, cluster).await;
    phase("faults");
    let recovered = nemesis.recover(cluster).await;
    phase("recovery");
    let unrecovered = faulted.and(recovered).err();
    let (mut violations, final_from, unrecovered) = match unrecovered {
        // No read-back from a cluster that did not recover, but the history so far is still
        // judged: a store that broke a rule under the faults may be why it did not recover.
        Some(error) => {
            let stopped = workloads.stop(Duration::from_secs(15)).await;
            let mut violations = stopped;
            violations.extend(watcher.catch_up_and_stop(&rec, Duration::ZERO).await);
            (violations, None, Some(error))
        }
        None => {
            let recovered_at = rec.clock().now();
            let mut violations = available_again(&rec, recovered_at, settings.recovery_limit).await;
            phase("granted again");
            violations.extend(workloads.stop(Duration::from_secs(20)).await);
            phase("workloads stopped");
            let final_from = rec.clock().now();
            let mut keys = tickets.clone();
            keys.extend(nemesis.probe_keys.iter().cloned());
            match read_back(&endpoints, &rec, &keys, mix).await {
                // Judged as a run that did not recover: what the history shows until then
                // stands, and the binary counts it (before, the run ended here unjudged).
                Err(error) => {
                    violations.extend(watcher.catch_up_and_stop(&rec, Duration::ZERO).await);
                    let error = error.context("the read-back after recovery failed");
                    (violations, None, Some(error))
                }
                Ok(()) => {
                    phase("read-back");
                    violations.extend(
                        watcher
                            .catch_up_and_stop(&rec, settings.recovery_limit)
                            .await,
                    );
                    phase("watch caught up");
                    violations.extend(replicas_agree(cluster, settings.recovery_limit).await);
                    phase("replicas compared");
                    (violations, Some(final_from), None)
                }
            }
        }
    };
    let history = rec.finish();
    match final_from {
        Some(final_from) => {
            violations.extend(checks(&history, final_from));
            violations.extend(watcher::check(&history, true));
            violations.extend(handoff_watch::check(&history, true));
            violations.extend(board_watch::check(&history, true));
            violations.extend(effect_watch::check(&history, true));
            violations.extend(queue_watch::check(&history, true));
            violations.extend(sink_watch::check(&history, true));
            violations.extend(progress(&history, nemesis.faults));
        }
        // Without a read-back, every acknowledged write would count as lost.
        None => violations.extend(
            checks(&history, rec.clock().now())
                .into_iter()
                .chain(watcher::check(&history, false))
                .chain(handoff_watch::check(&history, false))
                .chain(board_watch::check(&history, false))
                .chain(effect_watch::check(&history, false))
                .chain(queue_watch::check(&history, false))
                .chain(sink_watch::check(&history, false))
                .filter(|violation| violation.rule != "lost-ack"),
        ),
    }
    phase("checks");

    let mut report = Report {
        scenario,
        seed,
        history,
        faults: nemesis.faults,
        fault_log: std::mem::take(&mut nemesis.log),
        violations,
        elapsed: started.elapsed(),
        phases,
        history_file: None,
        cluster_dir: None,
        replay,
    };
    if let Some(error) = unrecovered {
        report.cluster_dir = Some(cluster.keep());
        let summary = format!(
            "scenario={} seed={seed} ops={} ambiguous={} faults={} verdict=ERROR ({} violation(s) \
             until then; did not recover or could not be read back: {error:#})",
            report.scenario,
            report.ops(),
            report.ambiguous(),
            report.faults,
            report.violations.len()
        );
        report.history_file = write_history(&report, &summary, settings).ok();
        return Err(error.context(Unrecovered::of(&report)));
    }
    if !report.violations.is_empty() {
        report.cluster_dir = Some(cluster.keep());
        report.history_file = write_history(&report, &report.summary(), settings).ok();
    }
    Ok(report)
}

/// After recovery every member holds the same state: members are asked for their applied index
/// and state digest (polled, up to `limit`: the leader's sweeps settle after the workloads stop)
/// until every member has been seen at one index, and two digests seen at one index must be
/// equal ([`digests_disagree`]). A member that installed a snapshot, a restarted one that
/// replayed its log and one that applied every entry as it came must agree; a difference is a
/// non-deterministic apply rule or a snapshot that loses or adds state, which no read through
/// the leader shows until that member leads. Rule `replicas-agree`; members never all seen at
/// one index within `limit` are [`never_agreed`]'s violation.
pub async fn replicas_agree<T: Target>(cluster: &T, limit: Duration) -> Vec<Violation> {
    let started = Instant::now();
    let mut seen = SeenDigests::default();
    // The members the leader named last, and the applied index each last answered with.
    let mut named: Vec<u64> = Vec::new();
    let mut last_applied: BTreeMap<u64, u64> = BTreeMap::new();
    loop {
        let members: Vec<u64> = match cluster.leader().await {
            Ok(leader) => match cluster.node_info(leader).await {
                Ok(info) => info.members.iter().map(|m| m.id).collect(),
                Err(_) => Vec::new(),
            },
            Err(_) => Vec::new(),
        };
        for id in &members {
            if let Ok(answer) = cluster.state_digest(*id).await {
                seen.record(*id, &answer);
                last_applied.insert(*id, answer.applied_index);
            }
        }
        if !members.is_empty() {
            named.clone_from(&members);
        }
        let timed_out = (started.elapsed() > limit).then_some(limit);
        if let Some(violations) = settled(&seen, &named, &last_applied, timed_out) {
            return violations;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What [`replicas_agree`] has seen settles: two members that differ at one applied index
/// (`replicas-agree`), nothing wrong once every one of `members` was seen at one index, or —
/// once the limit `timed_out` — [`never_agreed`]; `None` while none of these.
fn settled(
    seen: &SeenDigests,
    members: &[u64],
    last_applied: &BTreeMap<u64, u64>,
    timed_out: Option<Duration>,
) -> Option<Vec<Violation>> {
    let violations = digests_disagree(seen);
    if !violations.is_empty() || seen.common(members).is_some() {
        return Some(violations);
    }
    timed_out.map(|limit| vec![never_agreed(members, last_applied, limit)])
}

/// `replicas-never-agreed`: the members (`named` by the leader last; none when no leader named
/// them) were never all seen at one applied index within `limit`; `last_applied`: the index
/// each member last answered with. After recovery the workloads and the watches have stopped
/// and the leader's sweeps settle (an idle cluster proposes nothing but a session sweep a
/// minute: node/src/sweeper.rs), and recovery itself required every member running and caught
/// up: a member still apart after `limit` has stopped applying the log or answering, and its
/// state, which [`replicas_agree`] exists to compare, went unjudged. That is the store's doing
/// after every fault was undone, as a workload left without a grant is
/// (`available-after-recovery`), so it is a violation and not a note on stderr.
pub fn never_agreed(
    named: &[u64],
    last_applied: &BTreeMap<u64, u64>,
    limit: Duration,
) -> Violation {
    let detail = if named.is_empty() {
        format!("no leader named the members within {limit:?} after recovery")
    } else {
        let shown: Vec<String> = named
            .iter()
            .map(|id| match last_applied.get(id) {
                Some(index) => format!("node {id}: applied {index}"),
                None => format!("node {id}: never answered"),
            })
            .collect();
        format!(
            "the members were never all seen at one applied index within {limit:?} after \
             recovery, so their states were not compared (last seen: {})",
            shown.join(", ")
        )
    };
    Violation::new("replicas-never-agreed", "state", detail, Vec::new())
}

/// Two members seen with different state digests at one applied index.
pub fn digests_disagree(seen: &SeenDigests) -> Vec<Violation> {
    seen.disagreement()
        .map(|(index, at)| {
            let shown: Vec<String> = at
                .iter()
                .map(|(id, digest)| format!("node {id}: {digest}"))
                .collect();
            Violation::new(
                "replicas-agree",
                "state",
                format!(
                    "at applied index {index} the members' states differ: {}",
                    shown.join(", ")
                ),
                Vec::new(),
            )
        })
        .into_iter()
        .collect()
}

/// Every workload's rules over `history`; `final_from`: when the reads after recovery began (µs;
/// a history without them skips the rules that compare with them).
fn checks(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut violations = handoff::check(history, final_from);
    violations.extend(courier::check(history, final_from));
    violations.extend(board::check(history, final_from));
    violations.extend(chain::check(history, final_from));
    violations.extend(effect::check(history, final_from));
    violations.extend(reconcile::check(history));
    violations.extend(queue::check(history, final_from));
    violations.extend(checkpoint::check(history, final_from));
    violations.extend(check::unexpected_errors(history));
    violations.extend(check::unexpected_refusals(history));
    violations
}

/// A run that checked something: it injected at least one fault, and every workload that ran got
/// at least one grant acknowledged (a take, claim, acquire, permit or stored save). Without these
/// every rule holds vacuously: a store that refused every grant (or a nemesis that did nothing)
/// would pass.
pub fn progress(history: &[Op], faults: usize) -> Vec<Violation> {
    let mut violations = Vec::new();
    if faults == 0 {
        violations.push(Violation::new(
            "progress",
            "nemesis",
            "the run injected no fault",
            Vec::new(),
        ));
    }
    let mut ran = [false; WORKLOADS.len()];
    let mut granted = [false; WORKLOADS.len()];
    for op in history {
        let slot = workload_of(op);
        ran[slot] = true;
        granted[slot] |= is_grant(op);
    }
    for (slot, name) in WORKLOADS.iter().enumerate() {
        if ran[slot] && !granted[slot] {
            violations.push(Violation::new(
                "progress",
                name,
                "no grant was acknowledged in the whole run, so its exclusivity rules checked \
                 nothing",
                Vec::new(),
            ));
        }
    }
    violations
}

/// Whether `op` is an acknowledged grant: a take, claim, acquire, non-empty lease or stored save.
fn is_grant(op: &Op) -> bool {
    match (&op.input, op.ok()) {
        (Input::Take { .. }, Some(_))
        | (Input::Claim { .. }, Some(_))
        | (Input::ClaimStep { .. }, Some(_)) => true,
        (Input::Acquire { .. }, Some(Output::Granted { .. })) => true,
        (Input::Lease { .. }, Some(Output::Leased(assignments))) => !assignments.is_empty(),
        (Input::SaveCheckpoint { .. }, Some(_)) => true,
        _ => false,
    }
}

/// Whether `op` was observed by a watch rather than invoked.
fn observed(op: &Op) -> bool {
    matches!(
        op.input,
        Input::WatchSaved { .. }
            | Input::WatchLease { .. }
            | Input::WatchSinkWritten { .. }
            | Input::WatchCompacted { .. }
            | Input::WatchEnded { .. }
    )
}

/// Every workload must get a grant acknowledged again within `limit` of recovery; one that does
/// not is reported. Any answer would not do: a store that stopped freeing holds or permits after
/// a failover (expiry broken, a release lost) answers every acquire `contended` and every lease
/// with nothing, promptly and for good. Handoff alone needs only an answer: a ticket whose take
/// was applied but whose answer was lost stays taken for its hour-long TTL (nobody has its token
/// to reply), so with few keys every take after recovery may rightly be refused; its answers are
/// judged by the linearizability check instead (a change a watch delivered is not an answer: it
/// may have been made before the faults). The queue's concurrency keys each need a lease of
/// their own: a key whose permit is never freed stops only its tasks, and the other key's leases
/// would hide it (the submitter picks either key at random, so both get tasks within seconds).
/// A queue without any grant is reported once, as the queue.
pub async fn available_again(rec: &Recorder, since: u64, limit: Duration) -> Vec<Violation> {
    let started = Instant::now();
    let recovered = |op: &Op, slot: usize| {
        workload_of(op) == slot && ((slot == HANDOFF && !observed(op)) || is_grant(op))
    };
    loop {
        let silent: Vec<usize> = (0..WORKLOADS.len())
            .filter(|slot| rec.answered_since(since, |op| recovered(op, *slot)) == 0)
            .collect();
        let stuck: Vec<&str> = queue::KEYS
            .into_iter()
            .filter(|key| rec.answered_since(since, |op| queue::leased_on(op, key)) == 0)
            .collect();
        if silent.is_empty() && stuck.is_empty() {
            return Vec::new();
        }
        if started.elapsed() >= limit {
            let queue_granted = !silent.contains(&QUEUE_WORKLOAD);
            let stuck = stuck.into_iter().filter(|_| queue_granted).map(|key| {
                Violation::new(
                    "available-after-recovery",
                    &format!("{} {key}", WORKLOADS[QUEUE_WORKLOAD]),
                    format!(
                        "no lease of a task on concurrency key {key} within {limit:?} after \
                         every fault was undone (its permit never freed?)"
                    ),
                    Vec::new(),
                )
            });
            return silent
                .into_iter()
                .map(|slot| {
                    Violation::new(
                        "available-after-recovery",
                        WORKLOADS[slot],
                        format!(
                            "no {} within {limit:?} after every fault was undone",
                            if slot == HANDOFF {
                                "answer"
                            } else {
                                "grant was acknowledged"
                            }
                        ),
                        Vec::new(),
                    )
                })
                .chain(stuck)
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads back, through a fresh client, everything the checkers compare with the
/// acknowledgements: every ticket, the board, every completed action, every queue task, every
/// sink, every checkpoint run; and acquires again every action whose intent was left unresolved.
async fn read_back(
    endpoints: &[String],
    rec: &Recorder,
    tickets: &[String],
    mix: &Mix,
) -> anyhow::Result<()> {
    let client: Client = Client::connect_with(endpoints, client_config()).await?;
    let snapshot = rec.finish();
    let name = "final";
    // Every ticket key used, those retired for fresh ones included.
    let mut keys: BTreeSet<&str> = tickets.iter().map(String::as_str).collect();
    keys.extend(snapshot.iter().filter_map(|op| handoff::key_of(&op.input)));
    for key in keys {
        handoff::read(rec, &client, name, key).await;
    }
    board::list(rec, &client, name).await;
    let completed = effect::completed_keys(&snapshot);
    futures::stream::iter(completed)
        .for_each_concurrent(8, |key| {
            let client = client.clone();
            async move {
                effect::show(rec, &client, name, &key).await;
            }
        })
        .await;
    futures::stream::iter(effect::unresolved_keys(&snapshot))
        .for_each_concurrent(8, |(key, resource)| {
            let client = client.clone();
            async move { effect::acquire_again(rec, &client, name, &key, &resource).await }
        })
        .await;
    for resource in effect::resources(mix.resources) {
        effect::read_sink(rec, &client, name, &effect::sink_of(&resource)).await;
    }
    futures::stream::iter(queue::task_ids(&snapshot))
        .for_each_concurrent(8, |task| {
            let client = client.clone();
            async move { queue::read_task(rec, &client, name, task).await }
        })
        .await;
    for key in queue::KEYS {
        effect::read_sink(rec, &client, name, &format!("{}{key}", queue::SINK_PREFIX)).await;
    }
    for run in checkpoint::run_ids(mix.runs) {
        checkpoint::load(rec, &client, name, &run).await;
    }
    Ok(())
}

/// Writes the fault log and the whole history of a run to a file; returns its path.
fn write_history(report: &Report, summary: &str, settings: &Settings) -> anyhow::Result<PathBuf> {
    let dir = settings
        .history_dir
        .clone()
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!(
        "baton-robustness-{}-{}.history",
        report.scenario, report.seed
    ));
    let mut text = format!("{summary}\n");
    for violation in &report.violations {
        text.push_str(&violation.render(&report.history, true));
    }
    text.push_str("faults:\n");
    for line in &report.fault_log {
        text.push_str(&format!("    {line}\n"));
    }
    text.push_str("history:\n");
    for op in &report.history {
        text.push_str(&format!("    {op}\n"));
    }
    std::fs::write(&path, text)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use baton_rpc::proto::StateDigestResponse;

    use super::*;

    fn seen(answers: &[(u64, u64, &str)]) -> SeenDigests {
        let mut seen = SeenDigests::default();
        for (member, applied_index, digest) in answers {
            let answer = StateDigestResponse {
                applied_index: *applied_index,
                digest: digest.to_string(),
            };
            seen.record(*member, &answer);
        }
        seen
    }

    /// Members never all seen at one index leave nothing settled, which `replicas_agree` then
    /// reports as `replicas-never-agreed`; seen at one index (at different polls) they agree.
    #[test]
    fn members_never_seen_at_one_index_never_agreed() {
        let members = [1, 2, 3];
        let limit = Some(Duration::from_secs(20));
        let last = BTreeMap::from([(1, 9), (2, 8)]);
        let rules = |seen: &SeenDigests, members: &[u64], timed_out| {
            settled(seen, members, &last, timed_out)
                .map(|violations| violations.into_iter().map(|v| v.rule).collect::<Vec<_>>())
        };
        // Node 3 never at an index where 1 and 2 were: not settled until the limit, then a
        // violation (also when no leader named the members).
        let apart = seen(&[(1, 7, "a"), (2, 8, "b"), (3, 6, "z"), (1, 9, "c")]);
        assert_eq!(rules(&apart, &members, None), None);
        assert_eq!(
            rules(&apart, &members, limit),
            Some(vec!["replicas-never-agreed".to_string()])
        );
        assert_eq!(
            rules(&apart, &[], limit),
            Some(vec!["replicas-never-agreed".to_string()])
        );
        let violation = never_agreed(&members, &last, Duration::from_secs(20));
        assert!(
            violation.detail.contains("node 3: never answered"),
            "{}",
            violation.detail
        );

        // Legal: all seen at one index, at different polls; differing there is replicas-agree.
        let together = seen(&[(1, 7, "a"), (2, 8, "b"), (3, 8, "b"), (1, 8, "b")]);
        assert_eq!(rules(&together, &members, limit), Some(Vec::new()));
        let differ = seen(&[(1, 7, "a"), (2, 7, "x")]);
        assert_eq!(
            rules(&differ, &members, limit),
            Some(vec!["replicas-agree".to_string()])
        );
    }

    /// The binary finds the violations of a run that did not recover behind the error's cause.
    #[test]
    fn a_run_that_did_not_recover_carries_its_violations() {
        let report = Report {
            scenario: "leader-kill".into(),
            seed: 7,
            history: Vec::new(),
            faults: 2,
            fault_log: Vec::new(),
            violations: vec![Violation::new(
                "exclusive-hold",
                "task-0",
                "two",
                Vec::new(),
            )],
            elapsed: Duration::ZERO,
            phases: Vec::new(),
            history_file: None,
            cluster_dir: None,
            replay: String::new(),
        };
        let error = anyhow::anyhow!("no leader").context(Unrecovered::of(&report));
        let unrecovered = error.downcast_ref::<Unrecovered>().unwrap();
        assert_eq!((unrecovered.violations, unrecovered.faults), (1, 2));
        let shown = format!("{error:#}");
        assert!(
            shown.contains("exclusive-hold") && shown.ends_with("no leader"),
            "{shown}"
        );
    }
}
