//! Task-board workload: agents race claims on a few tasks, hold briefly, then release (sometimes
//! after a renewal, sometimes never: the lease then runs out and the task is claimable again).
//!
//! Checked: one acknowledged claim per task and fence, no claim granted while another agent's
//! was certainly still live, no `TAKEN` while no claim could hold the task, listings during the
//! run neither stale nor ahead of the claims sent, fences increasing in real time, no
//! release or renewal acknowledged with a superseded claim, and every acknowledged fence still
//! there after recovery.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::Client;
use baton_statemachine::board::{Task, TaskSpec};
use rand::rngs::StdRng;
use rand::Rng;

use super::check::{
    exclusive_holds, increasing_fences, no_stale_holder, unexplained_lease_lost, unique_grants,
    unique_tokens, Grant, Use, Violation, CLOCK_SLACK_US,
};
use super::history::{Input, Op, Outcome, Output, Recorder};

/// Claim TTL: short enough that a claim whose holder never releases (or whose claim answer was
/// lost) frees the task within a run.
pub const TTL_MS: i64 = 4_000;

/// What the ids of the tasks a run seeds begin with (a chain's steps are named otherwise).
pub const TASK_PREFIX: &str = "task-";

/// The tasks a run seeds.
pub fn task_ids(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{TASK_PREFIX}{i}")).collect()
}

/// Seeds the tasks (independent, open) before the run, retrying infrastructure failures. Set-up,
/// not part of the checked history.
pub async fn seed(client: &Client, ids: &[String]) -> anyhow::Result<()> {
    let specs: Vec<TaskSpec> = ids
        .iter()
        .map(|id| TaskSpec {
            id: id.clone(),
            deps: Vec::new(),
        })
        .collect();
    seed_specs(client, &specs).await
}

/// Seeds `specs`, retrying infrastructure failures.
pub(super) async fn seed_specs(client: &Client, specs: &[TaskSpec]) -> anyhow::Result<()> {
    for _ in 0..5 {
        match client.seed(specs).await {
            Ok(_) => return Ok(()),
            Err(error) if error.is_infrastructure() => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(error) => return Err(error.into()),
        }
    }
    anyhow::bail!("cannot seed the board")
}

/// A claim's or renewal's answer as recorded: the task's lease (fence 0 without one).
pub(super) fn lease_output(task: &Task) -> Output {
    match &task.lease {
        Some(lease) => Output::Lease {
            fence: lease.fence,
            token: lease.token.clone(),
            until_ms: Some(lease.until_ms),
        },
        None => Output::Lease {
            fence: 0,
            token: String::new(),
            until_ms: None,
        },
    }
}

/// Lists the tasks, recorded.
pub async fn list(rec: &Recorder, client: &Client, name: &str) {
    let _ = rec
        .record(name, Input::ListTasks, client.tasks(), |snapshot| {
            Output::Tasks(
                snapshot
                    .tasks
                    .iter()
                    .map(|t| (t.id.clone(), t.state.as_str().to_string(), t.max_fence))
                    .collect(),
            )
        })
        .await;
}

/// One agent: claim, hold, release, until `stop`.
pub async fn run(
    client: Client,
    name: String,
    rec: Recorder,
    tasks: Arc<Vec<String>>,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        if rng.random_bool(0.05) {
            list(&rec, &client, &name).await;
            continue;
        }
        let task = tasks[rng.random_range(0..tasks.len())].clone();
        let input = Input::Claim {
            task: task.clone(),
            agent: name.clone(),
        };
        let claimed = rec
            .record(
                &name,
                input,
                client.claim(&task, &name, TTL_MS),
                lease_output,
            )
            .await;
        let Some(lease) = claimed.ok().and_then(|t| t.lease) else {
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
            continue;
        };
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..80))).await;
        let roll = rng.random_range(0..100);
        if roll < 5 {
            // Walk away: the lease runs out.
            continue;
        }
        if roll < 8 {
            // Hold past the claim's own deadline on a renewal: a renewal the store acknowledged
            // but did not keep shows as another agent's claim while this one still holds.
            tokio::time::sleep(Duration::from_millis(TTL_MS as u64 * 3 / 5)).await;
            if renew(&rec, &client, &name, &task, &lease).await && !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(TTL_MS as u64 * 3 / 5)).await;
            }
        } else if roll < 25 {
            renew(&rec, &client, &name, &task, &lease).await;
        }
        let input = Input::ReleaseTask {
            task: task.clone(),
            token: lease.token.clone(),
            fence: lease.fence,
        };
        let _ = rec
            .record(
                &name,
                input,
                client.release_task(&task, &lease.token),
                |_| Output::Done,
            )
            .await;
    }
}

/// Renews `lease` of `task` for another TTL, recorded; whether it was renewed.
async fn renew(
    rec: &Recorder,
    client: &Client,
    name: &str,
    task: &str,
    lease: &baton_statemachine::board::Lease,
) -> bool {
    let input = Input::RenewTask {
        task: task.to_string(),
        token: lease.token.clone(),
        fence: lease.fence,
    };
    rec.record(
        name,
        input,
        client.renew_task(task, &lease.token, TTL_MS),
        lease_output,
    )
    .await
    .is_ok()
}

/// Every board checker. `final_from`: when the reads after recovery began (µs).
pub fn check(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut grants = Vec::new();
    let mut uses = Vec::new();
    let mut ends = Vec::new();
    for op in history {
        // A refused release ended nothing.
        if let (Input::ReleaseTask { task, fence, .. }, false) = (&op.input, op.refused().is_some())
        {
            ends.push(Use {
                key: task.clone(),
                fence: *fence,
                op: op.index,
            });
        }
        match (&op.input, op.ok()) {
            (Input::Claim { task, .. }, Some(output)) => {
                grants.extend(claim_grant(task, output, op))
            }
            (Input::ReleaseTask { task, fence, .. }, Some(_))
            | (Input::RenewTask { task, fence, .. }, Some(_)) => uses.push(Use {
                key: task.clone(),
                fence: *fence,
                op: op.index,
            }),
            _ => {}
        }
    }
    let mut violations = unique_grants("claim", &grants, history);
    violations.extend(unique_tokens("claim", &grants, lease_token, history));
    // An acknowledged renewal moves its lease's deadline on.
    for op in history {
        if let (Input::RenewTask { task, fence, .. }, Some(Output::Lease { until_ms, .. })) =
            (&op.input, op.ok())
        {
            for grant in grants
                .iter_mut()
                .filter(|g| g.key == *task && g.fence == *fence)
            {
                grant.renewed_until_ms = grant.renewed_until_ms.max(*until_ms);
            }
        }
    }
    violations.extend(exclusive_holds("claim", &grants, &ends, TTL_MS, history));
    violations.extend(increasing_fences("claim", &grants, history));
    violations.extend(no_stale_holder("release/renew", &grants, &uses, history));
    let (renewals, refusals) = holder_calls(history);
    violations.extend(unexplained_lease_lost(
        "a release or renewal",
        &grants,
        &renewals,
        &refusals,
        TTL_MS,
        |_| false,
        history,
    ));
    for op in history {
        if let (
            Input::RenewTask { fence, task, token },
            Some(Output::Lease {
                fence: got,
                token: got_token,
                ..
            }),
        ) = (&op.input, op.ok())
        {
            if got != fence || got_token != token {
                violations.push(Violation::new(
                    "renew-keeps-fence",
                    task,
                    format!(
                        "renewing the claim with fence {fence} (token {token}) answered fence {got} (token {got_token})"
                    ),
                    vec![op.index],
                ));
            }
        }
    }
    violations.extend(durable(history, &grants, final_from));
    violations.extend(reads(history, final_from));
    violations.extend(explained_taken(history, final_from));
    violations
}

/// The grant an answered claim of `task` (a board task's or a chain step's) holds.
pub(super) fn claim_grant(task: &str, output: &Output, op: &Op) -> Option<Grant> {
    let Output::Lease {
        fence, until_ms, ..
    } = output
    else {
        return None;
    };
    Some(Grant {
        key: task.to_string(),
        fence: *fence,
        op: op.index,
        until_ms: *until_ms,
        renewed_until_ms: *until_ms,
    })
}

/// A claim's token, as recorded (for [`unique_tokens`]).
pub(super) fn lease_token(output: &Output) -> Option<&str> {
    match output {
        Output::Lease { token, .. } => Some(token),
        _ => None,
    }
}

/// The acknowledged renewals and the refused releases and renewals, as (task, fence) uses.
fn holder_calls(history: &[Op]) -> (Vec<Use>, Vec<Use>) {
    let (mut renewals, mut refusals) = (Vec::new(), Vec::new());
    for op in history {
        let (Input::ReleaseTask { task, fence, .. } | Input::RenewTask { task, fence, .. }) =
            &op.input
        else {
            continue;
        };
        let used = Use {
            key: task.clone(),
            fence: *fence,
            op: op.index,
        };
        if op.refused().is_some() {
            refusals.push(used);
        } else if matches!(op.input, Input::RenewTask { .. }) && op.ok().is_some() {
            renewals.push(used);
        }
    }
    (renewals, refusals)
}

/// Every listing during the run (the reads after recovery are [`durable`]'s) is a linearizable
/// read of the fences: a task's highest
/// fence is at least that of every claim acknowledged before the listing was sent (`stale-read`:
/// a follower's or a deposed leader's old state), and at most the number of claims of the task
/// sent before the listing came back (`phantom-fence`: each claim raises it by one at most).
fn reads(history: &[Op], final_from: u64) -> Vec<Violation> {
    // Per task (a chain's steps too, which the listings show): the claims' sending times, sorted
    // (how many were sent before a moment), and the acknowledged ones' fences and ops.
    let mut sent: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut granted: BTreeMap<&str, Vec<(u64, usize)>> = BTreeMap::new();
    for op in history {
        let (Input::Claim { task, .. } | Input::ClaimStep { task, .. }) = &op.input else {
            continue;
        };
        sent.entry(task).or_default().push(op.call);
        if let Some(Output::Lease { fence, .. }) = op.ok() {
            granted.entry(task).or_default().push((*fence, op.index));
        }
    }
    sent.values_mut().for_each(|calls| calls.sort_unstable());
    let mut violations = Vec::new();
    // The first few per task and rule show it; every listing after would only repeat it.
    let mut found: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let mut report = |rule: &'static str, task: &str, detail: String, ops: Vec<usize>| {
        let seen = found.entry((rule, task.to_string())).or_default();
        *seen += 1;
        if *seen <= 3 {
            violations.push(Violation::new(rule, task, detail, ops));
        }
    };
    for op in history.iter().filter(|op| op.call < final_from) {
        let (Input::ListTasks, Some(Output::Tasks(tasks)), Some(ret)) =
            (&op.input, op.ok(), op.ret)
        else {
            continue;
        };
        for (task, _, fence) in tasks {
            let acknowledged = granted
                .get(task.as_str())
                .into_iter()
                .flatten()
                .filter(|(_, claim)| history[*claim].ret.is_some_and(|r| r < op.call))
                .max();
            if let Some((granted, claim)) = acknowledged.filter(|(granted, _)| granted > fence) {
                report(
                    "stale-read",
                    task,
                    format!(
                        "a listing showed fence {fence} after a claim at fence {granted} was acknowledged"
                    ),
                    vec![*claim, op.index],
                );
            }
            let claims_sent = sent
                .get(task.as_str())
                .map_or(0, |calls| calls.partition_point(|call| *call < ret))
                as u64;
            if *fence > claims_sent {
                report(
                    "phantom-fence",
                    task,
                    format!(
                        "a listing showed fence {fence}, but only {claims_sent} claims were sent"
                    ),
                    vec![op.index],
                );
            }
        }
    }
    violations
}

/// Per task, when (history clock) a claim that won without its claimant hearing of it may have
/// held the task: the fences the final listing counts that no acknowledged claim holds were won
/// by unanswered claims. Fences are given in apply order, so each such win was applied after the
/// acknowledged claim with the next lower fence was sent (the window's start; 0 without one) and
/// before the first acknowledged claim with a higher fence was answered, so it held the task at
/// most until that answer plus the TTL (the window's end; `None`, for good, when no acknowledged
/// claim followed it). A task whose fences are all acknowledged has no entry: its unanswered
/// claims won nothing. The whole map is `None` when no final listing was made (then every
/// unanswered claim counts as a winner, for good).
fn silent_winners(history: &[Op], final_from: u64) -> Option<BTreeMap<&str, Vec<Window>>> {
    let last = history
        .iter()
        .rfind(|op| op.call >= final_from && matches!(op.input, Input::ListTasks));
    let Some(Output::Tasks(tasks)) = last.and_then(Op::ok) else {
        return None;
    };
    // Per task: each acknowledged claim's fence, earliest call and earliest answer.
    let mut acknowledged: BTreeMap<&str, BTreeMap<u64, (u64, u64)>> = BTreeMap::new();
    for op in history {
        if let (Input::Claim { task, .. }, Some(Output::Lease { fence, .. }), Some(ret)) =
            (&op.input, op.ok(), op.ret)
        {
            let at = acknowledged
                .entry(task)
                .or_default()
                .entry(*fence)
                .or_insert((op.call, ret));
            *at = (at.0.min(op.call), at.1.min(ret));
        }
    }
    let ttl_us = TTL_MS as u64 * 1000;
    let mut winners = BTreeMap::new();
    let none = BTreeMap::new();
    for (task, _, max_fence) in tasks {
        let fences = acknowledged.get(task.as_str()).unwrap_or(&none);
        let windows: Vec<Window> = (1..=*max_fence)
            .filter(|fence| !fences.contains_key(fence))
            .map(|fence| Window {
                from: fences
                    .range(..fence)
                    .next_back()
                    .map_or(0, |(_, (call, _))| *call),
                until: fences
                    .range(fence + 1..)
                    .map(|(_, (_, ret))| *ret)
                    .min()
                    .map(|ret| ret + ttl_us),
            })
            .collect();
        if !windows.is_empty() {
            winners.insert(task.as_str(), windows);
        }
    }
    Some(winners)
}

/// When an unanswered claim that won may have held its task ([`silent_winners`]).
struct Window {
    /// Not applied before this.
    from: u64,
    /// Not held after this; `None`: possibly for good.
    until: Option<u64>,
}

impl Window {
    /// Whether the hold may have overlapped the refusal `op`: applied before the refusal
    /// returned, and not over when it was sent.
    fn overlaps(&self, op: &Op, ret: u64) -> bool {
        self.from < ret
            && self
                .until
                .is_none_or(|until| until + CLOCK_SLACK_US >= op.call)
    }
}

/// A claim refused `TAKEN` is explained by a claim that may have held the task at some moment
/// while the refusal was on its way: sent before the refusal came back, not released (by an
/// acknowledged release that came back) before the refused claim was sent, and not certainly
/// expired by then — its TTL counted from the latest answer of it or of a renewal of it. An
/// unanswered claim explains a refusal only if it may have won ([`silent_winners`]) and held the
/// task then. A store that answers `TAKEN` for a free task (a stale judgement without a log
/// entry, say) passes every grant rule; this one catches it.
fn explained_taken(history: &[Op], final_from: u64) -> Vec<Violation> {
    let winners = silent_winners(history, final_from);
    let ttl_us = TTL_MS as u64 * 1000;
    // Indexed once: the claims per task; per claim (task, fence), the earliest return of an
    // acknowledged release, and its renewals.
    let mut claims: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    let mut released: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    let mut renewals: BTreeMap<(&str, u64), Vec<&Op>> = BTreeMap::new();
    for op in history {
        match &op.input {
            Input::Claim { task, .. } => claims.entry(task).or_default().push(op),
            Input::ReleaseTask { task, fence, .. } => {
                if let (Some(_), Some(ret)) = (op.ok(), op.ret) {
                    let at = released.entry((task, *fence)).or_insert(ret);
                    *at = (*at).min(ret);
                }
            }
            Input::RenewTask { task, fence, .. } => {
                renewals.entry((task, *fence)).or_default().push(op)
            }
            _ => {}
        }
    }
    let mut violations = Vec::new();
    // The first few per task show it; hundreds more would only bury the other rules.
    let mut found: BTreeMap<&str, usize> = BTreeMap::new();
    for op in history {
        let (Input::Claim { task, .. }, Some("TAKEN"), Some(ret)) =
            (&op.input, op.refused(), op.ret)
        else {
            continue;
        };
        if found.get(task.as_str()).is_some_and(|n| *n >= 3) {
            continue;
        }
        let explained = claims
            .get(task.as_str())
            .into_iter()
            .flatten()
            .any(|claim| {
                if claim.index == op.index || claim.call >= ret {
                    return false;
                }
                let fence = match (&claim.outcome, claim.ok()) {
                    (_, Some(Output::Lease { fence, .. })) => *fence,
                    (Outcome::Ambiguous(_) | Outcome::Unexpected(_), _) => {
                        return winners.as_ref().is_none_or(|winners| {
                            winners.get(task.as_str()).is_some_and(|windows| {
                                windows.iter().any(|window| window.overlaps(op, ret))
                            })
                        })
                    }
                    _ => return false,
                };
                let key = (task.as_str(), fence);
                if released.get(&key).is_some_and(|at| *at < op.call) {
                    return false;
                }
                // The latest moment the lease could run to: unknown (unbounded) after an
                // unanswered renewal.
                let mut last_answer = claim.ret;
                for renewal in renewals.get(&key).into_iter().flatten() {
                    // A refused renewal extended nothing.
                    if renewal.call < ret && renewal.refused().is_none() {
                        last_answer = last_answer.zip(renewal.ret).map(|(a, b)| a.max(b));
                    }
                }
                // Not certainly expired when the refused claim was sent.
                last_answer.is_none_or(|at| at + ttl_us + CLOCK_SLACK_US >= op.call)
            });
        if !explained {
            *found.entry(task).or_default() += 1;
            violations.push(Violation::new(
                "unexplained-taken",
                task,
                "a claim was refused TAKEN while no claim could have held the task",
                vec![op.index],
            ));
        }
    }
    violations
}

/// A listed task: id, state, highest fence.
type Listed = (String, String, u64);

/// The listing made after recovery (the last one from `final_from` on) and its op, or the
/// violation of not having one.
pub(super) fn final_listing(
    history: &[Op],
    final_from: u64,
) -> Result<(&[Listed], usize), Violation> {
    let last = history
        .iter()
        .rfind(|op| op.call >= final_from && matches!(op.input, Input::ListTasks));
    match last.map(|op| (op.ok(), op.index)) {
        Some((Some(Output::Tasks(tasks)), index)) => Ok((tasks, index)),
        _ => Err(Violation::new(
            "lost-ack",
            "board",
            "the tasks could not be listed after recovery",
            last.map(|op| vec![op.index]).unwrap_or_default(),
        )),
    }
}

/// After recovery every task's (and chain step's, for the chains' `grants`) highest fence is at
/// least the highest acknowledged one.
pub(super) fn durable(history: &[Op], grants: &[Grant], final_from: u64) -> Vec<Violation> {
    let mut highest: BTreeMap<&str, &Grant> = BTreeMap::new();
    for grant in grants {
        let entry = highest.entry(&grant.key).or_insert(grant);
        if grant.fence > entry.fence {
            *entry = grant;
        }
    }
    if highest.is_empty() {
        return Vec::new();
    }
    let (tasks, last) = match final_listing(history, final_from) {
        Ok(listing) => listing,
        Err(violation) => return vec![violation],
    };
    let mut violations = Vec::new();
    for (task, grant) in highest {
        let now = tasks
            .iter()
            .find(|(id, _, _)| id == task)
            .map(|(_, _, fence)| *fence);
        if now.is_none_or(|now| now < grant.fence) {
            violations.push(Violation::new(
                "lost-ack",
                task,
                format!(
                    "fence {} was acknowledged, after recovery the task's highest fence is {now:?}",
                    grant.fence
                ),
                vec![grant.op, last],
            ));
        }
    }
    violations
}
