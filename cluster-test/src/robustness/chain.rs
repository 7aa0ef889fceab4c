//! Board dependency chains: tasks seeded in chains of [`STEPS`], each step depending on the one
//! before it. Agents walk the chains together, step by step: claim the step, then complete it.
//! They learn where the chain stands only from the store's answers — a step another agent
//! completed is refused `ALREADY_DONE` (move on), one whose predecessor is not done yet `BLOCKED`
//! (wait), one held `TAKEN` (wait). Now and then an agent tries the step after its own (refused
//! `BLOCKED` until its own is done) or stalls past its claim's TTL before it completes, so the
//! claim passes on and the late completion must be refused.
//!
//! Checked (contract §2): one acknowledged claim per step and fence, one token per claim, no
//! claim granted while
//! another was certainly live and not completed, fences increasing in real time, no completion
//! acknowledged with a superseded claim, at most one completion acknowledged per step; a step
//! claimed only once its predecessor's completion was sent, and never after its own completion
//! was answered; no `BLOCKED` after the predecessor's completion was answered and no
//! `ALREADY_DONE` before a completion of the step was sent; no `LEASE_LOST` for a completion
//! whose claim was certainly live; and after recovery every step whose
//! completion was acknowledged is done, at a fence no lower than any acknowledged claim of it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::Client;
use baton_statemachine::board::{Task, TaskSpec};
use rand::rngs::StdRng;
use rand::Rng;

use super::board;
use super::check::{
    exclusive_holds, increasing_fences, no_stale_holder, unexplained_lease_lost, unique_grants,
    unique_tokens, Use, Violation,
};
use super::history::{Input, Op, Output, Recorder};

/// Steps per chain.
pub const STEPS: usize = 3;
/// Chains seeded per run: more than a run's agents walk through (about 130 in a 40 s fault
/// time on 2 cores; `--verbose` counts the steps claimed).
pub const CHAINS: usize = 600;
/// Claim TTL.
pub const TTL_MS: i64 = 3_000;
/// How long a stalling agent sleeps before completing (past its claim).
const STALL: Duration = Duration::from_millis(3_600);

/// The id of step `step` of chain `chain`.
pub fn step_id(chain: usize, step: usize) -> String {
    format!("chain-{chain}-{step}")
}

/// The step before `id` in its chain (its one dependency), if any.
fn predecessor(id: &str) -> Option<String> {
    let (chain, step) = id.strip_prefix("chain-")?.rsplit_once('-')?;
    let step: usize = step.parse().ok()?;
    let chain: usize = chain.parse().ok()?;
    step.checked_sub(1).map(|before| step_id(chain, before))
}

/// Seeds every chain before the run, retrying infrastructure failures (set-up, not part of the
/// checked history; seeding again would clear claims, so it is done once).
pub async fn seed(client: &Client) -> anyhow::Result<()> {
    let specs: Vec<TaskSpec> = (0..CHAINS)
        .flat_map(|chain| {
            (0..STEPS).map(move |step| TaskSpec {
                id: step_id(chain, step),
                deps: step
                    .checked_sub(1)
                    .map(|before| step_id(chain, before))
                    .into_iter()
                    .collect(),
            })
        })
        .collect();
    board::seed_specs(client, &specs).await
}

/// One agent: walks the chains from the first, until `stop` (or the last chain is done).
pub async fn run(
    client: Client,
    name: String,
    rec: Recorder,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    // The chain and the step this agent is at.
    let (mut chain, mut at) = (0, 0);
    while !stop.load(Ordering::Relaxed) && chain < CHAINS {
        // Now and then try the step after, which is `BLOCKED` until this one is done.
        let step = if at + 1 < STEPS && rng.random_bool(0.1) {
            at + 1
        } else {
            at
        };
        let task = step_id(chain, step);
        let input = Input::ClaimStep {
            task: task.clone(),
            agent: name.clone(),
        };
        let claimed = rec
            .record(
                &name,
                input,
                client.claim(&task, &name, TTL_MS),
                board::lease_output,
            )
            .await;
        let lease = match claimed {
            Ok(Task {
                lease: Some(lease), ..
            }) => lease,
            Err(baton_rpc::Error::Refused(refusal)) if refusal.code() == "ALREADY_DONE" => {
                (chain, at) = next(chain, step);
                continue;
            }
            // Taken, blocked, unanswered or unexpected: try again shortly.
            _ => {
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..60))).await;
                continue;
            }
        };
        if rng.random_range(0..100) < 4 {
            tokio::time::sleep(STALL).await;
        } else {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..40))).await;
        }
        let input = Input::CompleteStep {
            task: task.clone(),
            fence: lease.fence,
        };
        let completed = rec
            .record(
                &name,
                input,
                client.complete_task(&task, &lease.token),
                |_| Output::Done,
            )
            .await;
        if completed.is_ok() {
            (chain, at) = next(chain, step);
        }
    }
}

/// The step after `step` of `chain`: the next one, or the next chain's first.
fn next(chain: usize, step: usize) -> (usize, usize) {
    if step + 1 < STEPS {
        (chain, step + 1)
    } else {
        (chain + 1, 0)
    }
}

/// Every chain checker. `final_from`: when the reads after recovery began (µs).
pub fn check(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut grants = Vec::new();
    let mut ends = Vec::new();
    let mut uses = Vec::new();
    let mut refusals = Vec::new();
    for op in history {
        match (&op.input, op.ok(), op.refused()) {
            (Input::ClaimStep { task, .. }, Some(output), _) => {
                grants.extend(board::claim_grant(task, output, op))
            }
            (Input::CompleteStep { task, fence }, _, Some(_)) => refusals.push(Use {
                key: task.clone(),
                fence: *fence,
                op: op.index,
            }),
            // A completion ends its claim (a refused one ended nothing).
            (Input::CompleteStep { task, fence }, answered, None) => {
                let used = Use {
                    key: task.clone(),
                    fence: *fence,
                    op: op.index,
                };
                if answered.is_some() {
                    uses.push(used.clone());
                }
                ends.push(used);
            }
            _ => {}
        }
    }
    let mut violations = unique_grants("chain claim", &grants, history);
    violations.extend(unique_tokens(
        "chain claim",
        &grants,
        board::lease_token,
        history,
    ));
    violations.extend(exclusive_holds(
        "chain claim",
        &grants,
        &ends,
        TTL_MS,
        history,
    ));
    violations.extend(increasing_fences("chain claim", &grants, history));
    violations.extend(no_stale_holder("completion", &grants, &uses, history));
    violations.extend(unexplained_lease_lost(
        "a completion",
        &grants,
        &[],
        &refusals,
        TTL_MS,
        |_| false,
        history,
    ));
    violations.extend(order(history));
    violations.extend(board::durable(history, &grants, final_from));
    violations.extend(completions_kept(history, final_from));
    violations
}

/// What completions allow and forbid, in real time, per step: a claim acknowledged only once a
/// completion of the predecessor was sent (answered or not, not refused) before the claim
/// returned, and never sent after a completion of the step itself was answered; `BLOCKED` never
/// sent after the predecessor's completion was answered; `ALREADY_DONE` only once a completion
/// of the step was sent; at most one completion acknowledged.
fn order(history: &[Op]) -> Vec<Violation> {
    // Per step: the earliest sending of a completion that may have applied, and the earliest
    // answer of an acknowledged one, with its op.
    let mut sent: BTreeMap<&str, u64> = BTreeMap::new();
    let mut answered: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history {
        if let Input::CompleteStep { task, .. } = &op.input {
            if op.refused().is_none() {
                let at = sent.entry(task).or_insert(op.call);
                *at = (*at).min(op.call);
            }
            if op.ok().is_some() {
                answered.entry(task).or_default().push(op);
            }
        }
    }
    let done_at = |task: &str| {
        answered.get(task).and_then(|ops| {
            ops.iter()
                .filter_map(|op| op.ret.map(|r| (r, op.index)))
                .min()
        })
    };
    let mut violations = Vec::new();
    let mut report = |rule: &str, task: &str, detail: String, ops: Vec<usize>| {
        violations.push(Violation::new(rule, task, detail, ops));
    };
    for (task, ops) in &answered {
        if ops.len() > 1 {
            report(
                "complete-once",
                task,
                format!("{} completions of this step were acknowledged", ops.len()),
                ops.iter().map(|op| op.index).collect(),
            );
        }
    }
    for op in history {
        let Input::ClaimStep { task, .. } = &op.input else {
            continue;
        };
        let (Some(ret), before) = (op.ret, predecessor(task)) else {
            continue;
        };
        match (op.ok(), op.refused()) {
            (Some(_), _) => {
                if let Some(before) = &before {
                    if sent.get(before.as_str()).is_none_or(|at| *at >= ret) {
                        report(
                            "blocked-claim",
                            task,
                            format!("claimed before any completion of {before} was sent"),
                            vec![op.index],
                        );
                    }
                }
                if let Some((_, done)) = done_at(task).filter(|(at, _)| *at < op.call) {
                    report(
                        "done-claimed",
                        task,
                        "claimed after its completion was acknowledged".into(),
                        vec![done, op.index],
                    );
                }
            }
            (None, Some("BLOCKED")) => {
                let done = before.as_deref().and_then(done_at);
                match (before, done) {
                    (Some(before), Some((at, done))) if at < op.call => report(
                        "stale-blocked",
                        task,
                        format!(
                            "refused BLOCKED after the completion of {before} was acknowledged"
                        ),
                        vec![done, op.index],
                    ),
                    (None, _) => report(
                        "stale-blocked",
                        task,
                        "a first step, which depends on nothing, was refused BLOCKED".into(),
                        vec![op.index],
                    ),
                    _ => {}
                }
            }
            (None, Some("ALREADY_DONE")) if sent.get(task.as_str()).is_none_or(|at| *at >= ret) => {
                report(
                    "phantom-done",
                    task,
                    "refused ALREADY_DONE before any completion of it was sent".into(),
                    vec![op.index],
                )
            }
            _ => {}
        }
    }
    violations
}

/// After recovery every step whose completion was acknowledged is done.
fn completions_kept(history: &[Op], final_from: u64) -> Vec<Violation> {
    let completed: Vec<(&str, usize)> = history
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (Input::CompleteStep { task, .. }, Some(_)) => Some((task.as_str(), op.index)),
            _ => None,
        })
        .collect();
    if completed.is_empty() {
        return Vec::new();
    }
    let (tasks, last) = match board::final_listing(history, final_from) {
        Ok(listing) => listing,
        Err(violation) => return vec![violation],
    };
    let state: BTreeMap<&str, &str> = tasks
        .iter()
        .map(|(id, state, _)| (id.as_str(), state.as_str()))
        .collect();
    completed
        .into_iter()
        .filter(|(task, _)| state.get(task) != Some(&"done"))
        .map(|(task, op)| {
            Violation::new(
                "lost-ack",
                task,
                format!(
                    "its completion was acknowledged; after recovery it is {:?}",
                    state.get(task)
                ),
                vec![op, last],
            )
        })
        .collect()
}
