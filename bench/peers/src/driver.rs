//! The closed loop: N clients, each with its own connection, each waiting for its answer before
//! sending the next request; a warm-up that is not counted, then a bounded measured window.
//!
//! A system plugs in through [`Peer`]: each method is one step of a workload in that system's
//! best form, and times every round trip it makes through the [`Meter`] it is given.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;

use crate::error::Error;
use crate::meter::{Meter, Outcome};
use crate::workload::{agent, Plan, Workload, READ_TICKETS, UNIFORM_TASKS};

/// The answer to a permit claim.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The permit is ours, with this fencing token.
    Granted {
        /// Increases with every grant of the permit.
        fence: i64,
    },
    /// Someone else holds it (the claim changed nothing).
    Taken,
}

/// A task leased from the queue, as the worker needs it to complete the task.
#[derive(Debug, Clone)]
pub struct Job {
    /// The task's number.
    pub id: i64,
    /// What the store needs to complete exactly this lease (an etcd revision; 0 for SQL).
    pub handle: i64,
}

/// One client's connection to a system, speaking each workload step in the system's best form.
pub trait Peer: Sized + Send + 'static {
    /// Resets and seeds what the workload needs (not measured).
    fn prepare(endpoint: &str, plan: &Plan) -> impl Future<Output = Result<(), Error>> + Send;

    /// Opens client `index`'s own connection.
    fn connect(
        endpoint: &str,
        plan: &Plan,
        index: usize,
    ) -> impl Future<Output = Result<Self, Error>> + Send;

    /// Claims permit `permit` for `holder` with `token`, for the permit TTL.
    fn claim(
        &mut self,
        meter: &mut Meter,
        permit: u32,
        holder: &str,
        token: i64,
    ) -> impl Future<Output = Result<Claim, Error>> + Send;

    /// Releases permit `permit` if `token` still holds it; answers whether it did.
    fn release(
        &mut self,
        meter: &mut Meter,
        permit: u32,
        token: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Offers a fresh ticket under `key`; answers a handle for `take` (an etcd revision; 0 for SQL).
    fn offer(
        &mut self,
        meter: &mut Meter,
        key: &str,
    ) -> impl Future<Output = Result<Option<i64>, Error>> + Send;

    /// Takes the offered ticket `key` with `token`; answers a handle for `reply`.
    fn take(
        &mut self,
        meter: &mut Meter,
        key: &str,
        offered: i64,
        token: i64,
    ) -> impl Future<Output = Result<Option<i64>, Error>> + Send;

    /// Replies done to the ticket `key` taken with `token`; answers whether it was accepted.
    fn reply(
        &mut self,
        meter: &mut Meter,
        key: &str,
        taken: i64,
        token: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Leases the next available task of the queue for `worker`, if any is left.
    fn lease_next(
        &mut self,
        meter: &mut Meter,
        worker: &str,
    ) -> impl Future<Output = Result<Option<Job>, Error>> + Send;

    /// Completes the leased `job`; answers whether the lease was still ours.
    fn complete(
        &mut self,
        meter: &mut Meter,
        job: &Job,
        worker: &str,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Reads ticket `key` (linearizably where the system distinguishes); answers whether it exists.
    fn read(
        &mut self,
        meter: &mut Meter,
        key: &str,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Removes what the run left behind (not measured).
    fn clean_up(endpoint: &str, plan: &Plan) -> impl Future<Output = Result<(), Error>> + Send;
}

/// Timing of one run.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Unmeasured time first.
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
}

/// Prepares the system, runs the closed loop and answers the run's JSON object.
pub async fn run<P: Peer>(
    system: &str,
    endpoint: &str,
    plan: Plan,
    window: Window,
) -> Result<Value, Error> {
    P::prepare(endpoint, &plan).await?;
    let mut peers = Vec::with_capacity(plan.clients);
    for index in 0..plan.clients {
        peers.push(P::connect(endpoint, &plan, index).await?);
    }

    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::with_capacity(plan.clients);
    for (index, peer) in peers.into_iter().enumerate() {
        let (plan, measuring, stop) = (plan.clone(), measuring.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            client_loop(peer, plan, index, measuring, stop).await
        }));
    }
    tokio::time::sleep(window.warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(window.duration).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();

    let mut total = Meter::new();
    for client in clients {
        match client.await {
            Ok(meter) => total.merge(&meter),
            Err(why) => eprintln!("peers-bench: a client task failed: {why}"),
        }
    }
    if let Err(why) = P::clean_up(endpoint, &plan).await {
        eprintln!("peers-bench: clean-up failed (the figures stand): {why}");
    }
    Ok(total.report(system, plan.workload.name(), plan.clients, elapsed))
}

/// A failed request is not retried at once: a broken connection would otherwise spin.
const AFTER_ERROR: Duration = Duration::from_millis(10);

/// The longest one op may take (the drivers set no deadline of their own): past it the client
/// counts the op failed and stops, since its connection is in an unknown state, so that a
/// stalled server cannot hold the run open.
const OP_DEADLINE: Duration = Duration::from_secs(30);

async fn client_loop<P: Peer>(
    mut peer: P,
    plan: Plan,
    index: usize,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Meter {
    let mut meter = Meter::new();
    let agent = agent(index);
    let mut sequence = 0u64;
    while !stop.load(Ordering::Relaxed) {
        meter.measuring = measuring.load(Ordering::Relaxed);
        let step = async {
            match plan.workload {
                Workload::PermitUniform | Workload::PermitHot => {
                    permit_pair(&mut peer, &mut meter, plan.workload.permits(), &agent).await
                }
                Workload::MixedRead => {
                    if rand::rng().random_range(0..10) == 0 {
                        permit_pair(&mut peer, &mut meter, UNIFORM_TASKS, &agent).await
                    } else {
                        let key = plan.read_ticket(rand::rng().random_range(0..READ_TICKETS));
                        peer.read(&mut meter, &key).await.map(Outcome::from)
                    }
                }
                Workload::Handoff => {
                    sequence += 1;
                    handoff(&mut peer, &mut meter, &plan.handoff_ticket(index, sequence)).await
                }
                Workload::QueueClaim => queue_claim(&mut peer, &mut meter, &agent).await,
            }
        };
        let Ok(step) = tokio::time::timeout(OP_DEADLINE, step).await else {
            meter.outcome(Outcome::Failed);
            meter.stalled();
            eprintln!("peers-bench: client {index}: no answer within {OP_DEADLINE:?}; it stops");
            break;
        };
        match step {
            Ok(outcome) => meter.outcome(outcome),
            Err(why) => {
                meter.outcome(Outcome::Failed);
                if meter.measuring {
                    eprintln!("peers-bench: client {index}: {why}");
                }
                tokio::time::sleep(AFTER_ERROR).await;
            }
        }
    }
    meter
}

/// A token no other claim uses (positive, so that it fits every store's signed integers).
fn fresh_token() -> i64 {
    rand::rng().random_range(1..i64::MAX)
}

async fn permit_pair<P: Peer>(
    peer: &mut P,
    meter: &mut Meter,
    permits: u32,
    agent: &str,
) -> Result<Outcome, Error> {
    let permit = rand::rng().random_range(0..permits);
    let token = fresh_token();
    match peer.claim(meter, permit, agent, token).await? {
        Claim::Granted { .. } => peer.release(meter, permit, token).await.map(Outcome::from),
        Claim::Taken => Ok(Outcome::Contended),
    }
}

async fn handoff<P: Peer>(peer: &mut P, meter: &mut Meter, key: &str) -> Result<Outcome, Error> {
    let Some(offered) = peer.offer(meter, key).await? else {
        return Ok(Outcome::Failed);
    };
    let token = fresh_token();
    let Some(taken) = peer.take(meter, key, offered, token).await? else {
        return Ok(Outcome::Failed);
    };
    peer.reply(meter, key, taken, token)
        .await
        .map(Outcome::from)
}

async fn queue_claim<P: Peer>(
    peer: &mut P,
    meter: &mut Meter,
    agent: &str,
) -> Result<Outcome, Error> {
    match peer.lease_next(meter, agent).await? {
        Some(job) => peer.complete(meter, &job, agent).await.map(Outcome::from),
        None => Ok(Outcome::Empty),
    }
}
