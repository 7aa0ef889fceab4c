//! `baton bench`: closed-loop coordination workloads against a cluster, with the figures that
//! matter (ops/s, requests/s, contended/s, latency percentiles, the nodes' peak RSS).
//!
//! Without `--endpoints` it starts its own three-node cluster (three `baton node` processes in a
//! temporary directory, every write fsynced on a quorum), so a newcomer gets a figure with one
//! command. `BATON_ENDPOINTS` is not read for it: a shell that exported a real cluster's address
//! must not have that cluster seeded and loaded by a newcomer's first `baton bench`. Every run is
//! bounded by `--warmup + --duration` plus set-up.
//!
//! Two workloads measure robustness rather than throughput and always run on the bench's own
//! cluster: `failover` kills the leader under load ([`failover`]), `scale` loads many live leases
//! and measures a snapshot to a new learner and their mass expiry ([`scale`]).

mod cluster;
mod failover;
mod scale;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_rpc::{Client, ClientConfig, Error, Security};
use baton_statemachine::board::TaskSpec as BoardTask;
use baton_statemachine::handoff::{OfferArgs, Receipt, ReceiptStatus};
use baton_statemachine::queue::TaskSpec as QueueTask;
use baton_statemachine::Refusal;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::Rng;
use serde_json::json;

use self::cluster::{OwnCluster, QUIET_LOGS};
use super::exit;

/// Arguments of `baton bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// What to run.
    #[arg(long, value_enum)]
    workload: Workload,
    /// Concurrent closed-loop clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Measured time.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured time first.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Tasks submitted up front for `queue-claim` (a run whose queue runs dry fails: it would
    /// measure the queue's size, not the claim rate).
    #[arg(long, default_value_t = 100_000)]
    queue_tasks: usize,
    /// Live leases `scale` loads.
    #[arg(long, default_value_t = 100_000)]
    leases: usize,
    /// A flag appended to every `baton node` the bench starts (repeatable), e.g.
    /// `--node-arg=--election-timeout=300ms`.
    #[arg(long = "node-arg", value_name = "FLAG", allow_hyphen_values = true)]
    node_args: Vec<String>,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    json: bool,
}

/// The coordination workloads (each op atomic and durable).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Board claim + release on a random task out of 10,000 (a held task counts as contended).
    PermitUniform,
    /// The same over 8 tasks: mostly contended.
    PermitHot,
    /// Offer a fresh ticket, take it, reply done (three commands per op).
    Handoff,
    /// Lease the next task of one queue, start it, complete it (three commands per op).
    QueueClaim,
    /// 90% linearizable reads of one ticket, 10% permit-uniform pairs.
    MixedRead,
    /// Permit-uniform pairs while the leader is SIGKILLed halfway: the write gap it causes.
    Failover,
    /// Load `--leases` live leases, then time a snapshot to a new learner and their mass expiry
    /// (`--duration` and `--warmup` do not apply: the run takes as long as its phases).
    Scale,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::PermitUniform => "permit-uniform",
            Workload::PermitHot => "permit-hot",
            Workload::Handoff => "handoff",
            Workload::QueueClaim => "queue-claim",
            Workload::MixedRead => "mixed-read",
            Workload::Failover => "failover",
            Workload::Scale => "scale",
        }
    }

    fn tasks(self) -> usize {
        match self {
            Workload::PermitHot => 8,
            _ => 10_000,
        }
    }
}

/// How one operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// Every step succeeded.
    Done,
    /// A claim found the task held (the permit workloads' expected refusal).
    Contended,
    /// A lease found no task to lease (`queue-claim`): the queue ran dry, or every leasable task
    /// went to other clients.
    Empty,
    /// A step failed: an infrastructure error, or a refusal the workload never expects.
    Failed,
}

/// What one client counted.
struct Tally {
    ops: u64,
    contended: u64,
    /// Leases that found no task.
    empty: u64,
    /// Operations cut short by a failed step.
    failed: u64,
    requests: u64,
    /// Requests that failed for want of an answer (not refusals).
    errors: u64,
    latency_us: Histogram<u64>,
    /// When each successful request was answered, kept only where the timeline matters
    /// (`failover`).
    acks: Option<Vec<Instant>>,
}

impl Tally {
    fn new() -> Self {
        Self {
            ops: 0,
            contended: 0,
            empty: 0,
            failed: 0,
            requests: 0,
            errors: 0,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)
                .expect("valid histogram bounds"),
            acks: None,
        }
    }

    /// A tally that also keeps the time of every successful request.
    fn with_acks() -> Self {
        Self {
            acks: Some(Vec::new()),
            ..Self::new()
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.ops += other.ops;
        self.contended += other.contended;
        self.empty += other.empty;
        self.failed += other.failed;
        self.requests += other.requests;
        self.errors += other.errors;
        let _ = self.latency_us.add(&other.latency_us);
        if let (Some(mine), Some(theirs)) = (&mut self.acks, &other.acks) {
            mine.extend_from_slice(theirs);
        }
    }
}

/// Runs the benchmark and prints its figures.
pub async fn run(args: BenchArgs, target: Option<(Vec<String>, Security)>) -> u8 {
    let (endpoints, security) = match target {
        Some((endpoints, security)) => (Some(endpoints), security),
        None => (None, Security::default()),
    };
    if args.clients == 0 {
        eprintln!("baton bench: --clients must be at least 1");
        return exit::USAGE;
    }
    if matches!(args.workload, Workload::Failover | Workload::Scale) {
        if endpoints.is_some() {
            eprintln!(
                "baton bench: --workload {} kills or adds nodes, so it runs only on its own \
                 cluster: leave out --endpoints",
                args.workload.name()
            );
            return exit::USAGE;
        }
        return match args.workload {
            Workload::Scale => scale::run(&args).await,
            _ => failover::run(&args).await,
        };
    }
    let own = match endpoints {
        Some(_) => None,
        None => match start_own_cluster(&args).await {
            Ok(cluster) => Some(cluster),
            Err(code) => return code,
        },
    };
    let endpoints = endpoints.unwrap_or_else(|| {
        own.as_ref()
            .map(|c| c.endpoints.clone())
            .unwrap_or_default()
    });
    let (client, run_id) = match connect_and_set_up(&args, &endpoints, security).await {
        Ok(connected) => connected,
        Err(code) => return code,
    };
    let drivers = Drivers::start(&client, args.workload, run_id, args.clients);
    tokio::time::sleep(args.warmup).await;
    let cpu_before = CpuUse::now(own.as_ref());
    drivers.measure();
    let started = Instant::now();
    tokio::time::sleep(args.duration).await;
    drivers.stop();
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = CpuUse::now(own.as_ref()).since(&cpu_before);
    let total = drivers.collect().await;
    let rss = own
        .as_ref()
        .map(OwnCluster::peak_rss_kib)
        .unwrap_or_default();
    report(&args, &total, elapsed, &rss, &cpu);
    verdict(&total)
}

/// The run's exit code. A run in which no operation succeeded measured nothing, whatever its
/// figures say (a p99 of 0 ms among them), and a `queue-claim` run whose leases found no task
/// measured how many tasks were queued rather than how fast they are claimed (each empty lease a
/// cheap round trip): both fail.
fn verdict(total: &Tally) -> u8 {
    if total.ops == 0 {
        eprintln!(
            "baton bench: no operation succeeded ({} failed, {} contended, {} found no task; {} \
             of {} requests got no answer)",
            total.failed, total.contended, total.empty, total.errors, total.requests
        );
        return exit::FAILURE;
    }
    if total.empty > 0 {
        eprintln!(
            "baton bench: the queue ran dry: {} leases found no task, so the figures are not a \
             claim rate; give --queue-tasks at least the ops/s times (warm-up + duration), with \
             room to spare",
            total.empty
        );
        return exit::FAILURE;
    }
    exit::OK
}

/// Starts the bench's own three-node cluster; on failure, reports it and returns the exit code.
async fn start_own_cluster(args: &BenchArgs) -> Result<OwnCluster, u8> {
    OwnCluster::start(&args.node_args, QUIET_LOGS)
        .await
        .map_err(|why| {
            eprintln!("baton bench: cannot start a local cluster: {why}");
            exit::FAILURE
        })
}

/// Connects to `endpoints` and sets the workload's data up under a fresh run id; on failure,
/// reports it and returns the exit code.
async fn connect_and_set_up(
    args: &BenchArgs,
    endpoints: &[String],
    security: Security,
) -> Result<(Client, u32), u8> {
    let client = bench_client(endpoints, security)
        .await
        .map_err(|error| exit::report(&error))?;
    let run_id: u32 = rand::random();
    if let Err(error) = setup(&client, args, run_id).await {
        eprintln!("baton bench: set-up failed");
        return Err(exit::report(&error));
    }
    Ok((client, run_id))
}

/// A client for the bench's requests: a generous deadline, so a request that meets a leader
/// change is retried rather than counted as an error. The cluster must first answer within
/// [`REACH_DEADLINE`], so that addresses nobody answers on are reported at once rather than after
/// the requests' deadline.
async fn bench_client(endpoints: &[String], security: Security) -> Result<Client, Error> {
    let reach = ClientConfig {
        deadline: REACH_DEADLINE,
        ..ClientConfig::default()
    };
    Client::connect_with_security(endpoints, reach, security.clone()).await?;
    let config = ClientConfig {
        deadline: Duration::from_secs(30),
        ..ClientConfig::default()
    };
    Client::new_with_security(endpoints, config, security)
}

/// How long the bench waits for a cluster to show a leader before it gives up (an election takes
/// well under a second).
const REACH_DEADLINE: Duration = Duration::from_secs(5);

/// The closed-loop clients of one run: they start unmeasured (warm-up) and count once told to.
struct Drivers {
    workload: Workload,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Tally>>,
}

impl Drivers {
    /// Starts `clients` loops of `workload`, sharing `client`'s connections.
    fn start(client: &Client, workload: Workload, run_id: u32, clients: usize) -> Self {
        let measuring = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|index| {
                let (client, measuring, stop) = (client.clone(), measuring.clone(), stop.clone());
                tokio::spawn(async move {
                    client_loop(client, workload, run_id, index, measuring, stop).await
                })
            })
            .collect();
        Self {
            workload,
            measuring,
            stop,
            tasks,
        }
    }

    /// Ends the warm-up: from now on the loops count.
    fn measure(&self) {
        self.measuring.store(true, Ordering::Relaxed);
    }

    /// Tells the loops to stop after their current operation.
    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for the stopped loops and adds up what they counted.
    async fn collect(self) -> Tally {
        let mut total = match self.workload {
            Workload::Failover => Tally::with_acks(),
            _ => Tally::new(),
        };
        for task in self.tasks {
            if let Ok(tally) = task.await {
                total.merge(&tally);
            }
        }
        total
    }
}

/// CPU time spent so far by the bench process and the nodes it started, in ms: with every
/// process sharing a small machine, CPU per operation is a steadier figure than ops/s.
struct CpuUse {
    bench_ms: u64,
    nodes_ms: Option<u64>,
}

impl CpuUse {
    fn now(own: Option<&OwnCluster>) -> Self {
        Self {
            bench_ms: cluster::proc_cpu_ms(std::process::id()).unwrap_or(0),
            nodes_ms: own.map(|cluster| cluster.cpu_ms().iter().sum()),
        }
    }

    fn since(&self, earlier: &Self) -> Self {
        Self {
            bench_ms: self.bench_ms.saturating_sub(earlier.bench_ms),
            nodes_ms: self
                .nodes_ms
                .zip(earlier.nodes_ms)
                .map(|(now, then)| now.saturating_sub(then)),
        }
    }

    /// Microseconds of CPU per operation: the nodes' (if they are the bench's own) and the
    /// bench's own.
    fn per_op_us(&self, ops: u64) -> (Option<f64>, f64) {
        let per_op = |ms: u64| ms as f64 * 1000.0 / ops.max(1) as f64;
        (self.nodes_ms.map(per_op), per_op(self.bench_ms))
    }
}

fn report(args: &BenchArgs, total: &Tally, elapsed: f64, rss_kib: &[u64], cpu: &CpuUse) {
    let (nodes_cpu_us, bench_cpu_us) = cpu.per_op_us(total.ops);
    let per_s = |n: u64| n as f64 / elapsed;
    let ms = |q: f64| total.latency_us.value_at_quantile(q) as f64 / 1000.0;
    let rss_mib: Vec<f64> = rss_kib.iter().map(|k| *k as f64 / 1024.0).collect();
    if args.json {
        println!(
            "{}",
            json!({
                "workload": args.workload.name(),
                "clients": args.clients,
                "duration_s": elapsed,
                "ops": total.ops,
                "ops_per_s": per_s(total.ops),
                "contended_per_s": per_s(total.contended),
                "requests_per_s": per_s(total.requests),
                "errors": total.errors,
                "failed_ops": total.failed,
                "empty_leases": total.empty,
                "p50_ms": ms(0.50),
                "p99_ms": ms(0.99),
                "p999_ms": ms(0.999),
                "node_peak_rss_mib": rss_mib,
                "nodes_cpu_us_per_op": nodes_cpu_us,
                "bench_cpu_us_per_op": bench_cpu_us,
            })
        );
        return;
    }
    let rss = if rss_mib.is_empty() {
        "n/a (external cluster)".to_string()
    } else {
        rss_mib
            .iter()
            .map(|m| format!("{m:.0}"))
            .collect::<Vec<_>>()
            .join("/")
            + " MiB"
    };
    println!(
        "workload={} clients={} ops/s={:.0} contended/s={:.0} requests/s={:.0} p50={:.2}ms p99={:.2}ms p999={:.2}ms errors={} failed_ops={}{} node_peak_rss={rss} cpu_per_op={}",
        args.workload.name(),
        args.clients,
        per_s(total.ops),
        per_s(total.contended),
        per_s(total.requests),
        ms(0.50),
        ms(0.99),
        ms(0.999),
        total.errors,
        total.failed,
        if args.workload == Workload::QueueClaim {
            format!(" empty_leases={}", total.empty)
        } else {
            String::new()
        },
        match nodes_cpu_us {
            Some(nodes) => format!("{nodes:.0}us(nodes)+{bench_cpu_us:.0}us(bench)"),
            None => format!("{bench_cpu_us:.0}us(bench)"),
        },
    );
}

fn task_id(run_id: u32, n: usize) -> String {
    format!("bench-{run_id:08x}-{n}")
}

fn queue_name(run_id: u32) -> String {
    format!("bench-{run_id:08x}")
}

async fn setup(client: &Client, args: &BenchArgs, run_id: u32) -> Result<(), Error> {
    match args.workload {
        Workload::PermitUniform
        | Workload::PermitHot
        | Workload::MixedRead
        | Workload::Failover => {
            let ids: Vec<usize> = (0..args.workload.tasks()).collect();
            for chunk in ids.chunks(1_000) {
                let specs: Vec<BoardTask> = chunk
                    .iter()
                    .map(|n| BoardTask {
                        id: task_id(run_id, *n),
                        deps: vec![],
                    })
                    .collect();
                client.seed(&specs).await?;
            }
            if args.workload == Workload::MixedRead {
                for n in 0..1_000 {
                    client.offer(offer(run_id, n)).await?;
                }
            }
            Ok(())
        }
        Workload::Handoff | Workload::Scale => Ok(()),
        Workload::QueueClaim => {
            let queue = queue_name(run_id);
            client.create_queue(&queue, "bench").await?;
            client.register_worker(&queue, false).await?;
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut submitters = Vec::new();
            for _ in 0..32 {
                let (client, next, queue, total) = (
                    client.clone(),
                    next.clone(),
                    queue.clone(),
                    args.queue_tasks,
                );
                submitters.push(tokio::spawn(async move {
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= total {
                            return Ok::<(), Error>(());
                        }
                        client.submit(&queue_task(&queue, n)).await?;
                    }
                }));
            }
            for submitter in submitters {
                submitter
                    .await
                    .map_err(|e| Error::Protocol(format!("submitter failed: {e}")))??;
            }
            Ok(())
        }
    }
}

fn offer(run_id: u32, n: usize) -> OfferArgs {
    OfferArgs {
        key: format!("bench-{run_id:08x}-ticket-{n}"),
        from: "bench".into(),
        to: "bench-taker".into(),
        payload: vec![],
        reply_to: "bench".into(),
        ttl_ms: 600_000,
    }
}

fn queue_task(queue: &str, n: usize) -> QueueTask {
    QueueTask {
        queue: queue.to_string(),
        idempotency_key: format!("{queue}-{n}"),
        handler: "bench".into(),
        handler_version: "v1".into(),
        payload_version: "v1".into(),
        payload: vec![],
        concurrency_key: String::new(),
        business_key: String::new(),
        max_attempts: 3,
        ttl_ms: 3_600_000,
    }
}

/// Runs one request and records its latency while measuring.
async fn timed<T>(
    tally: &mut Tally,
    measuring: bool,
    request: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let started = Instant::now();
    let result = request.await;
    if measuring {
        tally.requests += 1;
        let _ = tally
            .latency_us
            .record(started.elapsed().as_micros().max(1) as u64);
        if matches!(&result, Err(e) if e.is_infrastructure()) {
            tally.errors += 1;
        }
        if let (Ok(_), Some(acks)) = (&result, &mut tally.acks) {
            acks.push(Instant::now());
        }
    }
    result
}

async fn client_loop(
    client: Client,
    workload: Workload,
    run_id: u32,
    index: usize,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Tally {
    let mut tally = match workload {
        Workload::Failover => Tally::with_acks(),
        _ => Tally::new(),
    };
    let agent = format!("bench-client-{index}");
    let mut sequence = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let measure = measuring.load(Ordering::Relaxed);
        let outcome = match workload {
            Workload::PermitUniform | Workload::PermitHot | Workload::Failover => {
                permit_pair(&client, &mut tally, measure, run_id, workload, &agent).await
            }
            Workload::MixedRead => {
                if rand::rng().random_range(0..10) == 0 {
                    permit_pair(&client, &mut tally, measure, run_id, workload, &agent).await
                } else {
                    let key = offer(run_id, rand::rng().random_range(0..1_000)).key;
                    done_if_ok(timed(&mut tally, measure, client.ticket(&key)).await)
                }
            }
            Workload::Handoff => {
                sequence += 1;
                let mut args = offer(run_id, 0);
                args.key = format!("bench-{run_id:08x}-c{index}-{sequence}");
                handoff(&client, &mut tally, measure, args).await
            }
            Workload::QueueClaim => queue_claim(&client, &mut tally, measure, run_id).await,
            // Never driven by this loop: `run` hands it to its own module.
            Workload::Scale => break,
        };
        if measure {
            match outcome {
                Outcome::Done => tally.ops += 1,
                Outcome::Contended => tally.contended += 1,
                Outcome::Empty => tally.empty += 1,
                Outcome::Failed => tally.failed += 1,
            }
        }
    }
    tally
}

/// [`Outcome::Done`] when the operation's last step succeeded, else [`Outcome::Failed`].
fn done_if_ok<T>(result: Result<T, Error>) -> Outcome {
    match result {
        Ok(_) => Outcome::Done,
        Err(_) => Outcome::Failed,
    }
}

async fn permit_pair(
    client: &Client,
    tally: &mut Tally,
    measure: bool,
    run_id: u32,
    workload: Workload,
    agent: &str,
) -> Outcome {
    let id = task_id(run_id, rand::rng().random_range(0..workload.tasks()));
    match timed(tally, measure, client.claim(&id, agent, 30_000)).await {
        Ok(task) => {
            let token = task.lease.map(|lease| lease.token).unwrap_or_default();
            done_if_ok(timed(tally, measure, client.release_task(&id, &token)).await)
        }
        Err(Error::Refused(Refusal::Taken)) => Outcome::Contended,
        Err(_) => Outcome::Failed,
    }
}

async fn handoff(client: &Client, tally: &mut Tally, measure: bool, args: OfferArgs) -> Outcome {
    let key = args.key.clone();
    let to = args.to.clone();
    if timed(tally, measure, client.offer(args)).await.is_err() {
        return Outcome::Failed;
    }
    let Ok(handle) = timed(tally, measure, client.take(&key, &to)).await else {
        return Outcome::Failed;
    };
    let receipt = Receipt {
        status: ReceiptStatus::Done,
        summary: "ok".into(),
        failure: String::new(),
        artifacts: vec![],
    };
    done_if_ok(timed(tally, measure, client.reply(&key, &handle.token, &receipt)).await)
}

async fn queue_claim(client: &Client, tally: &mut Tally, measure: bool, run_id: u32) -> Outcome {
    let queue = queue_name(run_id);
    let leased = timed(
        tally,
        measure,
        client.lease(
            &queue,
            std::slice::from_ref(&queue),
            1,
            30_000,
            Duration::ZERO,
        ),
    )
    .await;
    let assignment = match leased.map(|mut list| list.pop()) {
        Ok(Some(assignment)) => assignment,
        Ok(None) => return Outcome::Empty,
        Err(_) => return Outcome::Failed,
    };
    let (task, attempt) = (assignment.task_id, assignment.attempt);
    if timed(tally, measure, client.start_attempt(task, attempt, &queue))
        .await
        .is_err()
    {
        return Outcome::Failed;
    }
    done_if_ok(
        timed(
            tally,
            measure,
            client.complete_attempt(task, attempt, &queue, b"ok"),
        )
        .await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(ops: u64, empty: u64) -> Tally {
        Tally {
            ops,
            empty,
            ..Tally::new()
        }
    }

    #[test]
    fn a_run_fails_when_nothing_succeeded_or_its_queue_ran_dry() {
        assert_eq!(verdict(&tally(10, 0)), exit::OK);
        assert_eq!(verdict(&tally(0, 0)), exit::FAILURE);
        assert_eq!(verdict(&tally(10, 1)), exit::FAILURE);
    }
}
