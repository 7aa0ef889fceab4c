//! Claim: fences stay strictly increasing, and no fence is granted twice, across SIGKILLs of the
//! leader (contract §0 "generations/fences: per-key counters, strictly increasing, never reset,
//! never reused"; §2 claim fence = highest + 1; §3 acquire fence = resource's highest + 1).
//!
//! Two loops run acquire -> complete -> release on their own resource (a fresh key each time),
//! two loops run claim -> release on their own board task, each with its own client (session).
//! Twice, mid-stream, the leader is SIGKILLed; once the new leader has granted a batch, the old
//! one is restarted from its data dir. Per resource / task, every fence a client was granted
//! (acknowledged) must be greater than the one before, and none may repeat — also not a fence
//! learnt for an ambiguous attempt. Infrastructure errors are allowed but are ambiguous: they
//! are never counted as grants. A loop owns its resource or task, so `contended` / `TAKEN` are
//! only legitimate while a hold left by one of its own ambiguous attempts may be live (a retried
//! request turned against its own win, or a release that freed nothing, would show up here), and
//! a granted lease's complete / release are never refused (a claim's release only once the
//! claim's TTL ran out, or after an ambiguous attempt of the same release).
//! Afterwards every acknowledged completion is in the store at its fence, and a fresh grant on
//! each resource and task is above every fence seen.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_cluster_test::{first, wait, Cluster, Options};
use baton_rpc::judge::check_board;
use baton_rpc::{Client, Error};
use baton_statemachine::board::TaskSpec;
use baton_statemachine::effect::{Action, KeyStatus, Outcome, RetrySafety};
use baton_statemachine::Refusal;

const LOOPS: usize = 2;
const KILLS: usize = 2;
/// Grants to collect (over all loops) before each kill, and after it before the restart.
const BATCH: usize = 40;
/// Lease TTL: outlives a failover, short enough that a lease lost to ambiguity frees soon.
const TTL_MS: i64 = 4_000;
const MAX_TIME: Duration = Duration::from_secs(60);
/// How long after an ambiguous attempt a hold it may have left can still answer `contended` /
/// `TAKEN`: the attempt is applied at the latest once a new leader commits its first entry
/// (well within this), and holds for the TTL from then.
const AMBIGUITY_REACH: Duration = Duration::from_millis(TTL_MS as u64 + 10_000);
/// How much earlier than this process the store may count a lease's TTL out (its clock is the
/// leader's wall clock on this machine).
const CLOCK_SLACK: Duration = Duration::from_millis(500);

/// What one loop saw.
#[derive(Debug, Default)]
struct Log {
    /// Acknowledged grants in the order they were answered: (fence, key or agent).
    grants: Vec<(u64, String)>,
    /// When each grant was acknowledged.
    granted_at: Vec<Instant>,
    /// Keys whose completion was acknowledged, with the result.
    completed: Vec<(String, u64, String)>,
    /// Operations that failed for infrastructure reasons (outcome unknown).
    ambiguous: Vec<String>,
    /// When the last of them failed.
    last_ambiguous: Option<Instant>,
    /// Fences learnt for ambiguous attempts (never counted as grants).
    ambiguous_fences: Vec<u64>,
    /// Legitimate refusals / non-grant answers by kind.
    refusals: BTreeMap<String, usize>,
    /// Answers that must not happen.
    violations: Vec<String>,
}

type Shared = Arc<Mutex<Log>>;

fn lock(log: &Shared) -> std::sync::MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

impl Log {
    fn grant(&mut self, fence: u64, who: String) {
        self.grants.push((fence, who));
        self.granted_at.push(Instant::now());
    }

    /// An operation whose outcome is unknown.
    fn unknown(&mut self, what: String) {
        self.ambiguous.push(what);
        self.last_ambiguous = Some(Instant::now());
    }

    /// A "someone else holds it" answer: legitimate only while a hold left by an ambiguous
    /// attempt may still be live.
    fn busy(&mut self, what: &str) {
        match self.last_ambiguous {
            None => self.violations.push(format!(
                "{what} although no attempt of this loop was ambiguous"
            )),
            Some(at) if at.elapsed() > AMBIGUITY_REACH => self.violations.push(format!(
                "{what} {:?} after this loop's last ambiguous attempt, when any hold it left had \
                 run out",
                at.elapsed()
            )),
            Some(_) => {}
        }
        *self.refusals.entry(what.to_string()).or_default() += 1;
    }
}

/// Runs `call` again (up to 3 times) while it fails for infrastructure reasons; every such
/// failure, the last one too, is recorded as ambiguous.
async fn retried<T, F, Fut>(log: &Shared, what: &str, mut call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match call().await {
            Err(error) if error.is_infrastructure() => {
                lock(log).unknown(format!("{what}: {error}"));
                if attempt == 3 {
                    return Err(error);
                }
            }
            other => return other,
        }
    }
}

async fn effect_loop(client: Client, r: usize, log: Shared, stop: Arc<AtomicBool>) {
    let started = Instant::now();
    let resource = format!("t63-res-{r}");
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < MAX_TIME {
        n += 1;
        let action = Action {
            key: format!("t63-r{r}-k{n}"),
            resource: resource.clone(),
            safety: RetrySafety::Safe,
        };
        match client.acquire(&action, TTL_MS).await {
            Ok(Outcome::Granted(lease)) => {
                lock(&log).grant(lease.fence, action.key.clone());
                let result = format!("done-{n}");
                match retried(&log, "complete", || {
                    client.complete_effect(&action, &lease, &result)
                })
                .await
                {
                    Ok(recorded) if recorded == result => {
                        lock(&log)
                            .completed
                            .push((action.key.clone(), lease.fence, result))
                    }
                    Ok(recorded) => lock(&log)
                        .violations
                        .push(format!("complete {}: recorded {recorded:?}", action.key)),
                    Err(Error::Refused(refusal)) => lock(&log).violations.push(format!(
                        "complete {} fence {}: {}",
                        action.key,
                        lease.fence,
                        refusal.code()
                    )),
                    Err(_) => {}
                }
                let released =
                    retried(&log, "release", || client.release_effect(&action, &lease)).await;
                if let Err(Error::Refused(refusal)) = released {
                    lock(&log).violations.push(format!(
                        "release {} fence {}: {}",
                        action.key,
                        lease.fence,
                        refusal.code()
                    ));
                }
            }
            Ok(Outcome::Contended) => {
                lock(&log).busy("acquire contended");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(other) => lock(&log)
                .violations
                .push(format!("acquire {} (a fresh key): {other:?}", action.key)),
            Err(Error::Refused(refusal)) => {
                lock(&log)
                    .violations
                    .push(format!("acquire {}: {}", action.key, refusal.code()))
            }
            Err(error) => {
                lock(&log).unknown(format!("acquire {}: {error}", action.key));
                recover_effect(&client, &action, &log).await;
            }
        }
    }
}

/// After an ambiguous acquire: if it was applied, note its fence (it is not a grant: nobody was
/// told it). Its resource hold frees itself when its TTL runs out: nobody knows its holder
/// identity, the lease's credential, so nobody can abandon it sooner.
async fn recover_effect(client: &Client, action: &Action, log: &Shared) {
    let Ok(view) = client.show_action(&action.key).await else {
        return; // UNKNOWN_ACTION (it was not applied) or the cluster is still away.
    };
    lock(log).ambiguous_fences.push(view.fence);
}

async fn board_loop(client: Client, r: usize, log: Shared, stop: Arc<AtomicBool>) {
    let started = Instant::now();
    let task = format!("t63-task-{r}");
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) && started.elapsed() < MAX_TIME {
        n += 1;
        let agent = format!("b{r}-{n}");
        let sent = Instant::now();
        match client.claim(&task, &agent, TTL_MS).await {
            Ok(claimed) => {
                let Some(lease) = claimed.lease else {
                    lock(&log)
                        .violations
                        .push(format!("claim {task} by {agent}: no lease"));
                    continue;
                };
                lock(&log).grant(lease.fence, agent.clone());
                let unknown_before = lock(&log).ambiguous.len();
                match retried(&log, "release", || client.release_task(&task, &lease.token)).await {
                    // The lease outlived its TTL during a failover, or an earlier attempt of
                    // this release, unanswered, was applied.
                    Err(Error::Refused(Refusal::LeaseLost))
                        if sent.elapsed() + CLOCK_SLACK >= Duration::from_millis(TTL_MS as u64)
                            || lock(&log).ambiguous.len() > unknown_before =>
                    {
                        *lock(&log)
                            .refusals
                            .entry("release LEASE_LOST".into())
                            .or_default() += 1
                    }
                    Err(Error::Refused(refusal)) => lock(&log).violations.push(format!(
                        "release {task} fence {}: {}",
                        lease.fence,
                        refusal.code()
                    )),
                    Ok(()) | Err(_) => {}
                }
            }
            Err(Error::Refused(Refusal::Taken)) => {
                lock(&log).busy("claim TAKEN");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(Error::Refused(refusal)) => lock(&log)
                .violations
                .push(format!("claim {task} by {agent}: {}", refusal.code())),
            Err(error) => {
                lock(&log).unknown(format!("claim {task} by {agent}: {error}"));
                // If it was applied, the listing names this agent (tokens are withheld, so the
                // lease cannot be released: it expires).
                if let Ok(snapshot) = client.tasks().await {
                    if let Some(lease) = snapshot
                        .tasks
                        .iter()
                        .find(|t| t.id == task)
                        .and_then(|t| t.lease.as_ref())
                        .filter(|l| l.agent == agent)
                    {
                        lock(&log).ambiguous_fences.push(lease.fence);
                    }
                }
            }
        }
    }
}

async fn grants_since(logs: &[Shared], since: Instant, want: usize, what: &str) {
    wait::until(what, Duration::from_secs(30), || async {
        let got: usize = logs
            .iter()
            .map(|log| {
                lock(log)
                    .granted_at
                    .iter()
                    .filter(|at| **at >= since)
                    .count()
            })
            .sum();
        if got >= want {
            Ok(())
        } else {
            Err(format!("{got} grants"))
        }
    })
    .await
    .unwrap();
}

/// Strictly increasing acknowledged fences, none equal to an ambiguous attempt's; returns
/// "name: n grants fences a..b" for the summary.
fn verify_fences(name: &str, log: &Log) -> String {
    let fences: Vec<u64> = log.grants.iter().map(|(fence, _)| *fence).collect();
    for pair in log.grants.windows(2) {
        assert!(
            pair[1].0 > pair[0].0,
            "{name}: fence {} ({}) acknowledged after fence {} ({}): not strictly increasing",
            pair[1].0,
            pair[1].1,
            pair[0].0,
            pair[0].1
        );
    }
    let granted: BTreeSet<u64> = fences.iter().copied().collect();
    for fence in &log.ambiguous_fences {
        assert!(
            !granted.contains(fence),
            "{name}: fence {fence} was granted to a client and to an ambiguous attempt"
        );
    }
    assert!(
        log.violations.is_empty(),
        "{name}: {}",
        first(&log.violations, 10)
    );
    format!(
        "{name}: {} grants fences {}..={} ({} ambiguous, refusals {:?})",
        fences.len(),
        fences.first().copied().unwrap_or(0),
        fences.last().copied().unwrap_or(0),
        log.ambiguous.len(),
        log.refusals
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_fences_strictly_increase_across_leader_kills() {
    let mut cluster = Cluster::start(3, Options::default()).await.unwrap();
    let started = Instant::now();
    let setup = cluster.client().await.unwrap();
    let specs: Vec<TaskSpec> = (0..LOOPS)
        .map(|r| TaskSpec {
            id: format!("t63-task-{r}"),
            deps: Vec::new(),
        })
        .collect();
    setup.seed(&specs).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let effect_logs: Vec<Shared> = (0..LOOPS).map(|_| Shared::default()).collect();
    let board_logs: Vec<Shared> = (0..LOOPS).map(|_| Shared::default()).collect();
    let mut tasks = Vec::new();
    for r in 0..LOOPS {
        tasks.push(tokio::spawn(effect_loop(
            cluster.client().await.unwrap(),
            r,
            effect_logs[r].clone(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(board_loop(
            cluster.client().await.unwrap(),
            r,
            board_logs[r].clone(),
            stop.clone(),
        )));
    }
    let all_logs: Vec<Shared> = effect_logs.iter().chain(&board_logs).cloned().collect();

    let mut kills = Vec::new();
    for _ in 0..KILLS {
        grants_since(&all_logs, Instant::now(), BATCH, "grants before the kill").await;
        let old_leader = cluster.leader().await.unwrap();
        let killed_at = Instant::now();
        cluster.kill(old_leader).unwrap();
        let new_leader = cluster.leader().await.unwrap();
        assert_ne!(new_leader, old_leader);
        let elected = killed_at.elapsed();
        // Every loop must make progress through the new leader.
        for log in &all_logs {
            grants_since(
                std::slice::from_ref(log),
                killed_at,
                3,
                "every loop granted again after the kill",
            )
            .await;
        }
        grants_since(&all_logs, killed_at, BATCH, "grants after the kill").await;
        kills.push(format!(
            "{old_leader}->{new_leader} in {}ms",
            elected.as_millis()
        ));
        cluster.restart(old_leader).await.unwrap();
    }
    // Some more grants with the restarted node back in the quorum.
    grants_since(
        &all_logs,
        Instant::now(),
        BATCH / 2,
        "grants after the restart",
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
    }
    let converged_at = cluster.wait_all_caught_up().await.unwrap();

    let client = cluster.client().await.unwrap();
    let mut lines = Vec::new();
    // The loops have ended: take their logs out (no lock is held across an await).
    let effect_logs: Vec<Log> = effect_logs
        .iter()
        .map(|log| std::mem::take(&mut *lock(log)))
        .collect();
    let board_logs: Vec<Log> = board_logs
        .iter()
        .map(|log| std::mem::take(&mut *lock(log)))
        .collect();
    let grants: usize = effect_logs
        .iter()
        .chain(&board_logs)
        .map(|log| log.grants.len())
        .sum();
    for (r, log) in effect_logs.iter().enumerate() {
        lines.push(verify_fences(&format!("resource t63-res-{r}"), log));
        // Every acknowledged completion is in the store at its fence.
        for (key, fence, result) in &log.completed {
            let view = client.show_action(key).await.unwrap();
            assert_eq!(view.status, KeyStatus::Completed, "{key}: {view:?}");
            assert_eq!(view.result.as_deref(), Some(result.as_str()), "{key}");
            assert_eq!(view.fence, *fence, "{key}: acknowledged fence vs store");
        }
        // A fresh grant is above every fence seen.
        let highest = log
            .grants
            .iter()
            .map(|(f, _)| *f)
            .chain(log.ambiguous_fences.iter().copied())
            .max()
            .unwrap_or(0);
        let action = Action {
            key: format!("t63-r{r}-final"),
            resource: format!("t63-res-{r}"),
            safety: RetrySafety::Safe,
        };
        let lease = wait::until("a final grant", Duration::from_secs(15), || async {
            match client.acquire(&action, TTL_MS).await {
                Ok(Outcome::Granted(lease)) => Ok(lease),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap();
        assert!(
            lease.fence > highest,
            "t63-res-{r}: final fence {} not above {highest}",
            lease.fence
        );
    }
    let snapshot = client.tasks().await.unwrap();
    for (r, log) in board_logs.iter().enumerate() {
        let id = format!("t63-task-{r}");
        lines.push(verify_fences(&format!("task {id}"), log));
        let highest = log
            .grants
            .iter()
            .map(|(f, _)| *f)
            .chain(log.ambiguous_fences.iter().copied())
            .max()
            .unwrap_or(0);
        let task = snapshot.tasks.iter().find(|t| t.id == id).unwrap();
        assert!(task.max_fence >= highest, "{id}: {task:?} vs {highest}");
        let claimed = wait::until("a final claim", Duration::from_secs(15), || async {
            client
                .claim(&id, "final", TTL_MS)
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap();
        let fence = claimed.lease.unwrap().fence;
        assert!(
            fence > highest,
            "{id}: final fence {fence} not above {highest}"
        );
    }
    let problems = check_board(&client).await.unwrap();
    assert!(problems.is_empty(), "{}", first(&problems, 5));

    println!(
        "t63: {KILLS} leader kills ({}); {} acknowledged grants; {}; all nodes applied index {converged_at}; {:.1}s",
        kills.join(", "),
        grants,
        lines.join("; "),
        started.elapsed().as_secs_f64()
    );
}
