//! `baton bench --workload scale`: many live leases in one cluster, a snapshot of them shipped to
//! a new learner, and all of them expiring at the same moment.
//!
//! 1. **Load.** `--leases` board tasks are seeded (in seeds of [`MAX_SEED_TASKS`]) and claimed
//!    by `--clients` concurrent clients. Every lease is due at one moment `T`: each claim asks for
//!    `ttl = T - now`, so the store's deadline `clock + ttl` lands on `T` (plus the few ms between
//!    the client reading its clock and the leader stamping the command — one machine, one clock).
//!    `T` must leave room for the rest of the load and for the learner, so the first 2% of the
//!    claims calibrate the claim rate with a long TTL; they are renewed to `T` at the end.
//!    Should the load run far slower than calibrated, it stops early and reports how many leases
//!    it holds, so the run stays bounded.
//! 2. **State.** Each node's RSS, a listing that counts the live leases, and the size of the
//!    snapshots the nodes built while loading (from their logs).
//! 3. **Learner.** A fourth node starts empty and is added as a learner; the time until its
//!    applied index reaches the leader's. The log was compacted while loading (a snapshot every
//!    10,000 entries by default), so it catches up by snapshot install. It is then removed, so the
//!    expiry runs on the three-node cluster.
//! 4. **Mass expiry.** From the moment the last lease is due until the sweeps that expired them
//!    are applied on the leader (read from its log, where each sweep reports how many expiries it
//!    materialised) and on each follower (their applied index), then a listing confirms that no
//!    lease is left.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_rpc::proto::board_client::BoardClient;
use baton_rpc::proto::ListTasksRequest;
use baton_rpc::{Client, ClientConfig, Error, Security};
use baton_statemachine::board::{TaskSpec, MAX_SEED_TASKS};
use serde_json::json;

use super::cluster::OwnCluster;
use super::{bench_client, exit, BenchArgs, Tally};

/// Node logs: snapshot builds and installs (info) and each sweep's count (debug) are read back.
const SCALE_LOGS: &str = "warn,baton_node::store=info,baton_node::sweeper=debug";
/// Seeds sent at once.
const SEEDERS: usize = 4;
/// Lease length of the calibration claims (renewed to the common deadline later).
const CALIBRATION_TTL_MS: i64 = 3_600_000;
/// Time kept free after the load for counting, the learner and slack, before the leases are due:
/// this much, plus [`AFTER_LOAD_PER_MILLION`] for each million leases.
const AFTER_LOAD: Duration = Duration::from_secs(10);
/// See [`AFTER_LOAD`].
const AFTER_LOAD_PER_MILLION: Duration = Duration::from_secs(40);
/// How much slower than calibrated the load may run before it stops early.
const SLACK: f64 = 1.5;
/// A claim or renewal slower than this counts as a stall (the client library retries an attempt
/// after 3 s, so a stall usually means the leader stopped answering for a while).
const STALL: Duration = Duration::from_secs(1);
/// How long the learner may take to catch up before the bench moves on.
const LEARNER_BOUND: Duration = Duration::from_secs(120);
/// How long after the due moment the sweeps may take before the bench gives up waiting.
const EXPIRY_BOUND: Duration = Duration::from_secs(60);
/// How often nodes are polled while something is being timed.
const POLL_EVERY: Duration = Duration::from_millis(10);
/// Largest listing the bench accepts (a million tasks list in well under this).
const MAX_LISTING_BYTES: usize = 1 << 30;
/// Listing attempts before the bench gives up (a leader change can make one fail).
const LISTING_TRIES: usize = 5;
/// The learner's node id.
const LEARNER: u64 = 4;

/// Why a scale run stopped.
#[derive(Debug)]
enum Failure {
    /// The cluster, a node or the run itself misbehaved.
    Bench(String),
    /// A client call failed.
    Client(Error),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Client(error)
    }
}

/// Runs the workload and prints its figures.
pub(super) async fn run(args: &BenchArgs) -> u8 {
    if args.leases == 0 {
        eprintln!("baton bench: --leases must be at least 1");
        return exit::USAGE;
    }
    match measure(args).await {
        Ok(figures) => {
            figures.print(args);
            exit::OK
        }
        Err(Failure::Client(error)) => exit::report(&error),
        Err(Failure::Bench(why)) => {
            eprintln!("baton bench: {why}");
            exit::FAILURE
        }
    }
}

/// The wall clock in Unix ms: the store clock is the leader's wall clock on this same machine.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn lease_task(run_id: u32, n: usize) -> String {
    format!("scale-{run_id:08x}-{n}")
}

async fn measure(args: &BenchArgs) -> Result<Figures, Failure> {
    let mut cluster = OwnCluster::start(&args.node_args, SCALE_LOGS)
        .await
        .map_err(|why| Failure::Bench(format!("cannot start a local cluster: {why}")))?;
    let client = bench_client(&cluster.endpoints, Security::default()).await?;
    let run_id: u32 = rand::random();
    let n = args.leases;
    progress(args, format!("seeding {n} tasks"));
    let seed = seed(&client, run_id, n).await?;

    let load = load(&client, args, run_id).await?;
    let live = load.claimed;
    let rss_loaded_kib = cluster.rss_kib();
    let peak_loaded_kib = cluster.peak_rss_kib();
    progress(args, format!("loaded {live} leases; counting them"));
    let counted_at = Instant::now();
    let counted = count_claimed(&client).await?;
    let count_time = counted_at.elapsed();
    let snapshots: Vec<SnapshotLog> = cluster
        .running_ids()
        .into_iter()
        .map(|id| SnapshotLog::read(&cluster.log_path(id)))
        .collect();

    progress(args, "adding a learner".to_string());
    let learner = add_learner(&mut cluster).await?;

    let wait = Duration::from_millis(load.due_last_ms.saturating_sub(unix_ms()));
    progress(
        args,
        format!(
            "waiting {:.1} s for the leases to fall due",
            wait.as_secs_f64()
        ),
    );
    let term_before = highest_term(&client, &nodes_of(&cluster)).await;
    tokio::time::sleep(wait).await;
    let cpu_before = cluster.cpu_ms();
    let expiry = expire(&client, &cluster, &load, live, term_before).await?;
    let expiry_cpu_ms: Vec<u64> = cluster
        .cpu_ms()
        .iter()
        .zip(&cpu_before)
        .map(|(after, before)| after.saturating_sub(*before))
        .collect();
    let left = count_claimed(&client).await?;
    Ok(Figures {
        leases: n,
        seed,
        load,
        counted,
        count_time,
        rss_loaded_kib,
        peak_loaded_kib,
        snapshots,
        learner,
        expiry,
        expiry_cpu_ms,
        left,
        peak_end_kib: cluster.peak_rss_kib(),
    })
}

fn progress(args: &BenchArgs, what: String) {
    if !args.json {
        eprintln!("baton bench: {what}");
    }
}

/// Seeds tasks `0..n`, a few seeds at a time; returns how long it took.
async fn seed(client: &Client, run_id: u32, n: usize) -> Result<Duration, Failure> {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let chunks = n.div_ceil(MAX_SEED_TASKS);
    let mut seeders = Vec::new();
    for _ in 0..SEEDERS {
        let (client, next) = (client.clone(), next.clone());
        seeders.push(tokio::spawn(async move {
            loop {
                let chunk = next.fetch_add(1, Ordering::Relaxed);
                if chunk >= chunks {
                    return Ok::<(), Error>(());
                }
                let range = chunk * MAX_SEED_TASKS..((chunk + 1) * MAX_SEED_TASKS).min(n);
                let specs: Vec<TaskSpec> = range
                    .map(|i| TaskSpec {
                        id: lease_task(run_id, i),
                        deps: vec![],
                    })
                    .collect();
                client.seed(&specs).await?;
            }
        }));
    }
    for seeder in seeders {
        seeder
            .await
            .map_err(|e| Failure::Bench(format!("seeder failed: {e}")))??;
    }
    Ok(started.elapsed())
}

/// How a claim or renewal chooses its lease length.
#[derive(Clone, Copy)]
enum Ttl {
    /// The same length for every lease.
    Fixed(i64),
    /// Whatever makes the lease end at this Unix ms.
    Until(u64),
}

impl Ttl {
    fn ms(self) -> i64 {
        match self {
            Ttl::Fixed(ms) => ms,
            Ttl::Until(at) => (at.saturating_sub(unix_ms()) as i64).max(1),
        }
    }
}

/// What the load did.
struct Load {
    /// Leases held at the end.
    claimed: usize,
    /// Claims and renewals sent.
    requests: usize,
    /// Time spent claiming and renewing.
    elapsed: Duration,
    /// Claim and renewal latencies.
    tally: Tally,
    /// The earliest and latest deadline the store gave the leases (Unix ms).
    due_first_ms: u64,
    due_last_ms: u64,
    /// Requests slower than [`STALL`].
    stalls: usize,
    /// Whether the load stopped before `--leases` because it ran slower than calibrated.
    cut_short: bool,
}

/// What one batch of claims or renewals produced.
#[derive(Default)]
struct Claimed {
    done: usize,
    tokens: Vec<(usize, String)>,
    due_first_ms: Option<u64>,
    due_last_ms: u64,
    latency: Option<Tally>,
    /// Requests slower than [`STALL`].
    stalls: usize,
}

impl Claimed {
    fn record(&mut self, until_ms: u64) {
        self.done += 1;
        self.due_first_ms = Some(self.due_first_ms.map_or(until_ms, |d| d.min(until_ms)));
        self.due_last_ms = self.due_last_ms.max(until_ms);
    }

    fn merge(&mut self, other: Claimed) {
        self.done += other.done;
        self.stalls += other.stalls;
        self.tokens.extend(other.tokens);
        if let Some(first) = other.due_first_ms {
            self.due_first_ms = Some(self.due_first_ms.map_or(first, |d| d.min(first)));
        }
        self.due_last_ms = self.due_last_ms.max(other.due_last_ms);
        match (&mut self.latency, other.latency) {
            (Some(mine), Some(theirs)) => mine.merge(&theirs),
            (mine @ None, theirs) => *mine = theirs,
            (Some(_), None) => {}
        }
    }
}

/// Claims every task, all due at one moment (see the module doc).
async fn load(client: &Client, args: &BenchArgs, run_id: u32) -> Result<Load, Failure> {
    let n = args.leases;
    let calibration = (n / 50).max(1_000).min(n);
    let started = Instant::now();
    progress(args, format!("claiming {calibration} leases to calibrate"));
    let first = claim(
        client,
        args.clients,
        run_id,
        0..calibration,
        Ttl::Fixed(CALIBRATION_TTL_MS),
        None,
        true,
    )
    .await?;
    let rate = calibration as f64 / started.elapsed().as_secs_f64().max(1e-3);
    let rest = Duration::from_secs_f64((n - calibration) as f64 / rate * SLACK);
    let renewals = Duration::from_secs_f64(calibration as f64 / rate * SLACK);
    let after_load = AFTER_LOAD + AFTER_LOAD_PER_MILLION.mul_f64(n as f64 / 1e6);
    let due = unix_ms() + (rest + renewals + after_load).as_millis() as u64;
    progress(
        args,
        format!(
            "{rate:.0} claims/s: claiming {} more, all due in {:.0} s",
            n - calibration,
            Duration::from_millis(due - unix_ms()).as_secs_f64()
        ),
    );
    let stop_at = Instant::now() + rest;
    let mut claimed = claim(
        client,
        args.clients,
        run_id,
        calibration..n,
        Ttl::Until(due),
        Some(stop_at),
        false,
    )
    .await?;
    let cut_short = calibration + claimed.done < n;
    progress(
        args,
        format!("renewing the {calibration} calibration leases"),
    );
    let renewed = renew(client, args.clients, run_id, first.tokens, Ttl::Until(due)).await?;
    let requests = calibration + claimed.done + renewed.done;
    let held = calibration + claimed.done;
    claimed.merge(renewed);
    let mut tally = first.latency.unwrap_or_else(Tally::new);
    if let Some(more) = &claimed.latency {
        tally.merge(more);
    }
    Ok(Load {
        claimed: held,
        requests,
        elapsed: started.elapsed(),
        tally,
        due_first_ms: claimed.due_first_ms.unwrap_or(due),
        due_last_ms: claimed.due_last_ms.max(due),
        stalls: first.stalls + claimed.stalls,
        cut_short,
    })
}

/// Claims tasks `range` with `clients` concurrent clients (until `stop_at`, if given).
async fn claim(
    client: &Client,
    clients: usize,
    run_id: u32,
    range: Range<usize>,
    ttl: Ttl,
    stop_at: Option<Instant>,
    keep_tokens: bool,
) -> Result<Claimed, Failure> {
    let next = Arc::new(AtomicUsize::new(range.start));
    let end = range.end;
    let mut workers = Vec::new();
    for index in 0..clients {
        let (client, next) = (client.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let agent = format!("scale-client-{index}");
            let mut claimed = Claimed {
                latency: Some(Tally::new()),
                ..Claimed::default()
            };
            loop {
                if stop_at.is_some_and(|at| Instant::now() >= at) {
                    return Ok::<Claimed, Error>(claimed);
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= end {
                    return Ok(claimed);
                }
                let sent = Instant::now();
                let task = client
                    .claim(&lease_task(run_id, n), &agent, ttl.ms())
                    .await?;
                record_latency(&mut claimed, sent);
                let lease = task.lease.ok_or_else(|| {
                    Error::Protocol("a granted claim came back without a lease".into())
                })?;
                claimed.record(lease.until_ms);
                if keep_tokens {
                    claimed.tokens.push((n, lease.token));
                }
            }
        }));
    }
    gather(workers).await
}

/// Renews the leases in `tokens` (task number, token), spread over `clients` clients.
async fn renew(
    client: &Client,
    clients: usize,
    run_id: u32,
    tokens: Vec<(usize, String)>,
    ttl: Ttl,
) -> Result<Claimed, Failure> {
    let tokens = Arc::new(Mutex::new(tokens));
    let mut workers = Vec::new();
    for _ in 0..clients {
        let (client, tokens) = (client.clone(), tokens.clone());
        workers.push(tokio::spawn(async move {
            let mut renewed = Claimed {
                latency: Some(Tally::new()),
                ..Claimed::default()
            };
            loop {
                let next = tokens
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .pop();
                let Some((n, token)) = next else {
                    return Ok::<Claimed, Error>(renewed);
                };
                let sent = Instant::now();
                let task = client
                    .renew_task(&lease_task(run_id, n), &token, ttl.ms())
                    .await?;
                record_latency(&mut renewed, sent);
                let until = task.lease.map_or(0, |lease| lease.until_ms);
                renewed.record(until);
            }
        }));
    }
    gather(workers).await
}

fn record_latency(claimed: &mut Claimed, sent: Instant) {
    let took = sent.elapsed();
    if took >= STALL {
        claimed.stalls += 1;
    }
    if let Some(tally) = &mut claimed.latency {
        tally.requests += 1;
        let _ = tally.latency_us.record(took.as_micros().max(1) as u64);
    }
}

async fn gather(
    workers: Vec<tokio::task::JoinHandle<Result<Claimed, Error>>>,
) -> Result<Claimed, Failure> {
    let mut total = Claimed::default();
    for worker in workers {
        let claimed = worker
            .await
            .map_err(|e| Failure::Bench(format!("client task failed: {e}")))??;
        total.merge(claimed);
    }
    Ok(total)
}

/// Counts the claimed tasks in one linearizable listing of the board, from the leader (the
/// listing bypasses the client library to raise the decoding limit for a million tasks, so it
/// follows a leader change itself: a few tries, a moment apart).
async fn count_claimed(client: &Client) -> Result<usize, Failure> {
    let mut last = String::new();
    for _ in 0..LISTING_TRIES {
        let leader = client.discover_leader().await?;
        match list_board(&leader).await {
            Ok(tasks) => return Ok(tasks.iter().filter(|t| t.state == "claimed").count()),
            Err(why) => last = why,
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(Failure::Bench(format!("the board listing failed: {last}")))
}

async fn list_board(leader: &str) -> Result<Vec<baton_rpc::proto::Task>, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{leader}"))
        .map_err(|e| format!("bad leader address {leader:?}: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("cannot reach the leader at {leader}: {e}"))?;
    let mut board = BoardClient::new(channel).max_decoding_message_size(MAX_LISTING_BYTES);
    let listing = board.list(ListTasksRequest {});
    let reply = tokio::time::timeout(Duration::from_secs(120), listing)
        .await
        .map_err(|_| "no answer within 120 s".to_string())?
        .map_err(|status| status.to_string())?;
    Ok(reply.into_inner().tasks)
}

/// What a node logged about the snapshots it built and installed.
#[derive(Debug, Default)]
struct SnapshotLog {
    built: usize,
    /// Snapshots installed from the leader (a follower that fell behind its purged log).
    installed: usize,
    /// The log index and size of the last snapshot built.
    last_built_index: Option<u64>,
    last_built_bytes: Option<u64>,
    installed_bytes: Option<u64>,
}

impl SnapshotLog {
    fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut log = SnapshotLog::default();
        for line in text.lines() {
            let bytes = field_u64(line, "bytes=");
            if line.contains("built snapshot") {
                log.built += 1;
                log.last_built_bytes = bytes;
                log.last_built_index = snapshot_index(line);
            } else if line.contains("installed snapshot") {
                log.installed += 1;
                log.installed_bytes = bytes;
            }
        }
        log
    }
}

/// The log index in a snapshot id (`snapshot=<term>-<index>-<random>`).
fn snapshot_index(line: &str) -> Option<u64> {
    let id = &line[line.find("snapshot=")? + "snapshot=".len()..];
    id.split('-').nth(1)?.parse().ok()
}

/// The number right after `key` in a log line.
fn field_u64(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// One sweep a node logged: when (its log line's timestamp, Unix ms) and how many expiries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sweep {
    at_ms: u64,
    expired: u64,
}

/// The sweeps a node's log reports (`... swept reply=Swept { expired: N }`).
fn sweeps_in(text: &str) -> Vec<Sweep> {
    text.lines()
        .filter(|line| line.contains("swept reply=Swept"))
        .filter_map(|line| {
            let stamp = line.split_whitespace().next()?;
            let at = humantime::parse_rfc3339(stamp).ok()?;
            Some(Sweep {
                at_ms: at.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64,
                expired: field_u64(line, "expired: ")?,
            })
        })
        .collect()
}

/// The learner's catch-up.
struct Learner {
    /// The leader's applied index when the learner was added.
    target_index: u64,
    /// Until the learner's applied index reached it (`None`: not within [`LEARNER_BOUND`]).
    caught_up: Option<Duration>,
    /// Until `add_learner` (which waits for the learner to catch up) returned.
    add_returned: Option<Duration>,
    /// The learner's snapshot index once caught up (non-zero: it installed a snapshot).
    snapshot_index: u64,
    log: SnapshotLog,
    /// The learner's peak RSS.
    peak_rss_kib: u64,
}

/// Adds an empty fourth node as a learner, times its catch-up, then removes it again.
async fn add_learner(cluster: &mut OwnCluster) -> Result<Learner, Failure> {
    let admin = Client::new(
        &cluster.endpoints,
        ClientConfig {
            deadline: LEARNER_BOUND,
            attempt_timeout: LEARNER_BOUND,
            ..ClientConfig::default()
        },
    )?;
    let addr = cluster.spawn(LEARNER).map_err(Failure::Bench)?;
    OwnCluster::wait_until_up(&admin, &addr)
        .await
        .map_err(Failure::Bench)?;
    let leader = admin.discover_leader().await?;
    let target_index = admin.node_info(&leader).await?.applied_index;

    let started = Instant::now();
    let adding = {
        let (admin, addr) = (admin.clone(), addr.clone());
        tokio::spawn(async move {
            let result = admin.add_learner(LEARNER, &addr).await;
            (result, started.elapsed())
        })
    };
    let mut caught_up = None;
    let mut snapshot_index = 0;
    while started.elapsed() < LEARNER_BOUND {
        if let Ok(info) = admin.node_info(&addr).await {
            if info.applied_index >= target_index {
                caught_up = Some(started.elapsed());
                snapshot_index = info.snapshot_index;
                break;
            }
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    let add_returned = match tokio::time::timeout(Duration::from_secs(5), adding).await {
        Ok(Ok((Ok(_), took))) => Some(took),
        _ => None,
    };
    let peak_rss_kib = cluster
        .running_ids()
        .iter()
        .position(|id| *id == LEARNER)
        .and_then(|index| cluster.peak_rss_kib().get(index).copied())
        .unwrap_or(0);
    let log = SnapshotLog::read(&cluster.log_path(LEARNER));
    admin.change_membership(&[1, 2, 3]).await?;
    cluster.kill(LEARNER).map_err(Failure::Bench)?;
    Ok(Learner {
        target_index,
        caught_up,
        add_returned,
        snapshot_index,
        log,
        peak_rss_kib,
    })
}

/// The mass expiry, timed from the moment the last lease fell due.
struct Expiry {
    /// The sweeps the leader logged from the first deadline on, with times relative to the last
    /// deadline (ms, negative: before it).
    sweeps: Vec<(i64, u64)>,
    /// When the sweeps had expired every lease, relative to the last deadline (ms).
    swept_ms: Option<i64>,
    /// When each node's applied index reached the leader's after that sweep (ms after the last
    /// deadline), in node order.
    applied_ms: Vec<(u64, Option<i64>)>,
    /// The Raft term before the leases fell due and after the expiry: a higher term means an
    /// election happened meanwhile.
    term_before: u64,
    term_after: u64,
}

impl Expiry {
    /// Expiries per second while every lease was due: the sweeps applied after the last deadline
    /// (all back to back, each ending at its time), counted from the end of the first of them.
    /// The time from the last deadline alone flatters: how early sweeping could start depends
    /// on how far the load spread the deadlines, so this rate also says how long a million
    /// falling due at one instant would take.
    fn backlog_rate(&self) -> Option<f64> {
        let after: Vec<&(i64, u64)> = self.sweeps.iter().filter(|(at, _)| *at >= 0).collect();
        let span = after.last()?.0 - after.first()?.0;
        if span <= 0 {
            return None;
        }
        let expired: u64 = after[1..].iter().map(|(_, n)| n).sum();
        Some(expired as f64 * 1000.0 / span as f64)
    }
}

/// The highest term any of `nodes` reports.
async fn highest_term(client: &Client, nodes: &[(u64, String)]) -> u64 {
    let mut term = 0;
    for (_, addr) in nodes {
        if let Ok(info) = client.node_info(addr).await {
            term = term.max(info.term);
        }
    }
    term
}

/// The nodes still running, as `(id, address)`.
fn nodes_of(cluster: &OwnCluster) -> Vec<(u64, String)> {
    cluster
        .running_ids()
        .into_iter()
        .filter_map(|id| cluster.addr_of(id).map(|addr| (id, addr.to_string())))
        .collect()
}

/// Times the expiry. Until the sweeps are done it only reads the nodes' logs and sends them no
/// request: a node applying a huge sweep holds its state and watch-history locks for seconds,
/// and a status request waiting for them would take one of its two runtime threads away (see
/// docs/benchmarks.md), so polling would perturb what it measures.
async fn expire(
    client: &Client,
    cluster: &OwnCluster,
    load: &Load,
    live: usize,
    term_before: u64,
) -> Result<Expiry, Failure> {
    let due = load.due_last_ms;
    let relative = |at: u64| at as i64 - due as i64;
    let nodes = nodes_of(cluster);
    let deadline = Instant::now() + EXPIRY_BOUND;
    let mut swept: Vec<(u64, Sweep)> = Vec::new();
    let mut done = false;
    while Instant::now() < deadline {
        swept = nodes
            .iter()
            .flat_map(|(id, _)| {
                let text = std::fs::read_to_string(cluster.log_path(*id)).unwrap_or_default();
                sweeps_in(&text).into_iter().map(move |sweep| (*id, sweep))
            })
            .filter(|(_, sweep)| sweep.at_ms + 1 >= load.due_first_ms && sweep.expired > 0)
            .collect();
        swept.sort_by_key(|(_, sweep)| sweep.at_ms);
        let total: u64 = swept.iter().map(|(_, sweep)| sweep.expired).sum();
        if total >= live as u64 {
            done = true;
            break;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    let last = swept.last().filter(|_| done).copied();
    let mut applied_ms: Vec<(u64, Option<i64>)> = nodes.iter().map(|(id, _)| (*id, None)).collect();
    if let Some((leader, sweep)) = last {
        // The leader logs a sweep once it has applied it, so its index now covers the sweep.
        let leader_addr = nodes
            .iter()
            .find(|(id, _)| *id == leader)
            .map(|(_, addr)| addr.clone())
            .unwrap_or_default();
        let target = client.node_info(&leader_addr).await?.applied_index;
        for (slot, (id, addr)) in nodes.iter().enumerate() {
            if *id == leader {
                applied_ms[slot].1 = Some(relative(sweep.at_ms));
                continue;
            }
            while Instant::now() < deadline {
                if let Ok(info) = client.node_info(addr).await {
                    if info.applied_index >= target {
                        applied_ms[slot].1 = Some(relative(unix_ms()));
                        break;
                    }
                }
                tokio::time::sleep(POLL_EVERY).await;
            }
        }
    }
    Ok(Expiry {
        sweeps: swept
            .iter()
            .map(|(_, sweep)| (relative(sweep.at_ms), sweep.expired))
            .collect(),
        swept_ms: last.map(|(_, sweep)| relative(sweep.at_ms)),
        applied_ms,
        term_before,
        term_after: highest_term(client, &nodes).await,
    })
}

/// Everything one scale run measured.
struct Figures {
    leases: usize,
    seed: Duration,
    load: Load,
    counted: usize,
    count_time: Duration,
    rss_loaded_kib: Vec<u64>,
    peak_loaded_kib: Vec<u64>,
    snapshots: Vec<SnapshotLog>,
    learner: Learner,
    expiry: Expiry,
    /// CPU time each node spent from the last deadline until the expiry was applied everywhere.
    expiry_cpu_ms: Vec<u64>,
    left: usize,
    peak_end_kib: Vec<u64>,
}

fn mib(kib: &[u64]) -> Vec<f64> {
    kib.iter().map(|k| (*k as f64 / 1024.0).round()).collect()
}

fn secs(duration: Option<Duration>) -> Option<f64> {
    duration.map(|d| d.as_secs_f64())
}

impl Figures {
    fn print(&self, args: &BenchArgs) {
        let load = &self.load;
        let claims_per_s = load.requests as f64 / load.elapsed.as_secs_f64().max(1e-9);
        let seeds_per_s = self.leases as f64 / self.seed.as_secs_f64().max(1e-9);
        let ms = |q: f64| load.tally.latency_us.value_at_quantile(q) as f64 / 1000.0;
        let learner = &self.learner;
        let expiry = &self.expiry;
        if args.json {
            println!(
                "{}",
                json!({
                    "workload": args.workload.name(),
                    "clients": args.clients,
                    "node_args": args.node_args,
                    "leases": self.leases,
                    "leases_loaded": load.claimed,
                    "load_cut_short": load.cut_short,
                    "seed_s": self.seed.as_secs_f64(),
                    "seed_tasks_per_s": seeds_per_s,
                    "load_s": load.elapsed.as_secs_f64(),
                    "ops_per_s": claims_per_s,
                    "p50_ms": ms(0.50),
                    "p99_ms": ms(0.99),
                    "p999_ms": ms(0.999),
                    "max_ms": load.tally.latency_us.max() as f64 / 1000.0,
                    "stalls_over_1s": load.stalls,
                    "live_leases_counted": self.counted,
                    "count_s": self.count_time.as_secs_f64(),
                    "node_rss_mib": mib(&self.rss_loaded_kib),
                    "node_peak_rss_mib_loaded": mib(&self.peak_loaded_kib),
                    "node_peak_rss_mib": mib(&self.peak_end_kib),
                    "snapshots_built": self.snapshots.iter().map(|s| s.built).collect::<Vec<_>>(),
                    "snapshots_installed": self.snapshots.iter().map(|s| s.installed).collect::<Vec<_>>(),
                    "snapshot_bytes": self.snapshots.iter().map(|s| s.last_built_bytes).collect::<Vec<_>>(),
                    "snapshot_index": self.snapshots.iter().map(|s| s.last_built_index).collect::<Vec<_>>(),
                    "learner_target_index": learner.target_index,
                    "learner_caught_up_s": secs(learner.caught_up),
                    "learner_add_returned_s": secs(learner.add_returned),
                    "learner_snapshot_index": learner.snapshot_index,
                    "learner_installed_bytes": learner.log.installed_bytes,
                    "learner_peak_rss_mib": (learner.peak_rss_kib as f64 / 1024.0).round(),
                    "due_spread_ms": load.due_last_ms - load.due_first_ms,
                    "sweeps": expiry.sweeps.iter().map(|(at, n)| json!({"at_ms": at, "expired": n})).collect::<Vec<_>>(),
                    "swept_ms": expiry.swept_ms,
                    "backlog_expiries_per_s": expiry.backlog_rate().map(f64::round),
                    "applied_ms": expiry.applied_ms.iter().map(|(id, at)| json!({"node": id, "at_ms": at})).collect::<Vec<_>>(),
                    "leases_left": self.left,
                    "expiry_node_cpu_ms": self.expiry_cpu_ms,
                    "term_before_expiry": expiry.term_before,
                    "term_after_expiry": expiry.term_after,
                })
            );
            return;
        }
        let list = |values: &[f64]| {
            values
                .iter()
                .map(|v| format!("{v:.0}"))
                .collect::<Vec<_>>()
                .join("/")
        };
        let opt_s = |d: Option<Duration>| {
            d.map_or("not within the bound".into(), |d| {
                format!("{:.2} s", d.as_secs_f64())
            })
        };
        println!(
            "workload=scale clients={} leases={} node_args={:?}",
            args.clients, self.leases, args.node_args
        );
        println!(
            "  seed: {} tasks in {:.1} s ({seeds_per_s:.0} tasks/s)",
            self.leases,
            self.seed.as_secs_f64()
        );
        println!(
            "  load: {} leases held{} — {} claims+renewals in {:.1} s ({claims_per_s:.0}/s), p50={:.2}ms p99={:.2}ms p999={:.2}ms max={:.0}ms, {} slower than 1 s",
            load.claimed,
            if load.cut_short { " (cut short: slower than calibrated)" } else { "" },
            load.requests,
            load.elapsed.as_secs_f64(),
            ms(0.50),
            ms(0.99),
            ms(0.999),
            load.tally.latency_us.max() as f64 / 1000.0,
            load.stalls,
        );
        println!(
            "  state: listing counts {} live leases ({:.1} s); node RSS {} MiB (peak {} MiB)",
            self.counted,
            self.count_time.as_secs_f64(),
            list(&mib(&self.rss_loaded_kib)),
            list(&mib(&self.peak_loaded_kib)),
        );
        for (id, snapshot) in (1..).zip(&self.snapshots) {
            println!(
                "  node {id}: {} snapshots built while loading, the last at log index {} ({} bytes); {} installed from the leader",
                snapshot.built,
                snapshot
                    .last_built_index
                    .map_or("n/a".to_string(), |i| i.to_string()),
                snapshot
                    .last_built_bytes
                    .map_or("n/a".to_string(), |b| b.to_string()),
                snapshot.installed,
            );
        }
        println!(
            "  learner: applied index reached the leader's ({}) after {}; add_learner returned after {}; snapshot index {}, installed {} bytes, peak RSS {:.0} MiB",
            learner.target_index,
            opt_s(learner.caught_up),
            opt_s(learner.add_returned),
            learner.snapshot_index,
            learner
                .log
                .installed_bytes
                .map_or("n/a".to_string(), |b| b.to_string()),
            learner.peak_rss_kib as f64 / 1024.0,
        );
        println!(
            "  expiry: deadlines spread over {} ms; sweeps (ms after the last deadline: expired) {:?}",
            load.due_last_ms - load.due_first_ms,
            expiry.sweeps
        );
        println!(
            "  expiry: every lease swept on the leader {} ms after the last deadline; applied on {}; leases left {}",
            expiry
                .swept_ms
                .map_or("not within the bound".to_string(), |ms| format!("{ms:+}")),
            expiry
                .applied_ms
                .iter()
                .map(|(id, at)| format!(
                    "node {id} {}",
                    at.map_or("n/a".to_string(), |ms| format!("{ms:+} ms"))
                ))
                .collect::<Vec<_>>()
                .join(", "),
            self.left,
        );
        if let Some(rate) = expiry.backlog_rate() {
            println!(
                "  expiry: {rate:.0} expiries/s once every lease was due: a million falling due at one instant would take ~{:.1} s",
                1_000_000.0 / rate
            );
        }
        println!(
            "  expiry: CPU time per node meanwhile {} ms",
            self.expiry_cpu_ms
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join("/")
        );
        if expiry.term_after != expiry.term_before {
            println!(
                "  expiry: a leader election happened meanwhile (term {} -> {})",
                expiry.term_before, expiry.term_after
            );
        }
        println!(
            "  node peak RSS at the end: {} MiB",
            list(&mib(&self.peak_end_kib))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_rate_counts_only_sweeps_after_the_last_deadline() {
        let expiry = |sweeps: Vec<(i64, u64)>| Expiry {
            sweeps,
            swept_ms: None,
            applied_ms: Vec::new(),
            term_before: 1,
            term_after: 1,
        };
        // Sweeps before the last deadline are paced by what is due, not by the sweeper; the
        // first sweep after it ends the span's start, so its own expiries are not counted.
        let e = expiry(vec![
            (-500, 10),
            (-100, 40_000),
            (100, 40_000),
            (300, 40_000),
            (500, 20_000),
        ]);
        assert_eq!(e.backlog_rate(), Some(60_000.0 * 1000.0 / 400.0));
        assert_eq!(expiry(vec![(-5, 10), (50, 40_000)]).backlog_rate(), None);
        assert_eq!(expiry(Vec::new()).backlog_rate(), None);
    }

    #[test]
    fn a_node_log_tells_snapshots_built_from_installed() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("node.log");
        let line = |what: &str, index: u64, bytes: u64| {
            format!("2026-11-30T10:00:00Z  INFO baton_node::store::state_machine: {what} snapshot=1-{index}-ab bytes={bytes}\n")
        };
        let text = [
            line("built snapshot", 100, 10),
            line("installed snapshot", 250, 25),
            line("built snapshot", 400, 40),
            line("installed snapshot", 500, 50),
        ]
        .concat();
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        let log = SnapshotLog::read(&path);
        assert_eq!((log.built, log.installed), (2, 2));
        assert_eq!(log.last_built_index, Some(400));
        assert_eq!(log.last_built_bytes, Some(40));
        assert_eq!(log.installed_bytes, Some(50));
    }

    #[test]
    fn sweeps_are_read_from_a_node_log() {
        let log = "2026-11-30T10:00:00.250000Z DEBUG baton_node::sweeper: swept reply=Swept { expired: 1000000 }\n\
                   2026-11-30T10:00:00.300000Z  INFO baton_node::store::state_machine: built snapshot snapshot=1-2-3 bytes=42\n";
        let sweeps = sweeps_in(log);
        assert_eq!(sweeps.len(), 1);
        assert_eq!(sweeps[0].expired, 1_000_000);
        assert_eq!(sweeps[0].at_ms % 1_000, 250);
        let built = log.lines().nth(1).unwrap_or("");
        assert_eq!(field_u64(built, "bytes="), Some(42));
        assert_eq!(snapshot_index(built), Some(2));
    }
}
