//! Side-effect workload: clients acquire a fresh action key on one of a few shared resources,
//! write the fenced sink of that resource with the lease's fence, complete and release. Now and
//! then a holder stalls past its lease before writing, so a newer holder gets a higher fence and
//! the stale writer must be refused.
//!
//! Checked: one acknowledged grant per resource and fence, no grant while another holder's was
//! certainly still live, fences increasing in real time, no
//! completion or release acknowledged with a superseded lease, an acquire of a fresh key is
//! never answered as if an earlier attempt existed (a retried acquire applied twice), the fenced
//! sink's rules ([`super::check::sink`]), every acknowledged completion still recorded after
//! recovery, and every granted intent left unresolved (its holder stalled, was refused, or never
//! heard back) turned its key uncertain: acquired again after recovery, such a key answers
//! `uncertain` (or, before its intent could have run out, `in_progress`), never a fresh grant.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::Client;
use baton_statemachine::effect::{Action, ActionView, Outcome, RetrySafety};
use rand::rngs::StdRng;
use rand::Rng;

use super::check::{
    exclusive_holds, increasing_fences, no_stale_holder, sink, unique_grants, unique_tokens, Grant,
    Use, Violation,
};
use super::history::{Input, Op, Output, Recorder};

/// Lease TTL of an acquire.
pub const TTL_MS: i64 = 2_000;
/// How long a stalling holder sleeps between its grant and its write (past its lease).
const STALL: Duration = Duration::from_millis(2_600);
/// Prefix of the sink resources this workload writes.
pub const SINK_PREFIX: &str = "sink-effect-";

/// The resources a run uses.
pub fn resources(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("res-{i}")).collect()
}

/// The sink a resource's holders write.
pub fn sink_of(resource: &str) -> String {
    format!("{SINK_PREFIX}{resource}")
}

fn outcome_output(outcome: &Outcome) -> Output {
    match outcome {
        Outcome::Granted(lease) => Output::Granted {
            fence: lease.fence,
            holder: lease.holder.clone(),
            until_ms: Some(lease.until_ms),
        },
        other => Output::NotGranted(other.name().to_string()),
    }
}

/// Acquires `key` on `resource` again after recovery (its intent left unresolved), recorded.
pub async fn acquire_again(rec: &Recorder, client: &Client, name: &str, key: &str, resource: &str) {
    let action = Action {
        key: key.to_string(),
        resource: resource.to_string(),
        safety: RetrySafety::Safe,
    };
    let input = Input::Acquire {
        key: action.key.clone(),
        resource: action.resource.clone(),
    };
    let _ = rec
        .record(name, input, client.acquire(&action, TTL_MS), outcome_output)
        .await;
}

/// Shows an action key, recorded.
pub async fn show(rec: &Recorder, client: &Client, name: &str, key: &str) {
    let input = Input::ShowAction {
        key: key.to_string(),
    };
    let _ = rec
        .record(name, input, client.show_action(key), |view: &ActionView| {
            Output::Action {
                status: view.status.as_str().to_string(),
                fence: view.fence,
                result: view.result.clone(),
            }
        })
        .await;
}

/// Reads a sink resource, recorded.
pub async fn read_sink(rec: &Recorder, client: &Client, name: &str, resource: &str) {
    let input = Input::SinkRead {
        resource: resource.to_string(),
    };
    let _ = rec
        .record(name, input, client.read_sink(resource), |value| {
            Output::Sink {
                seen_fence: value.seen_fence,
                writes: value.writes,
                value: String::from_utf8_lossy(&value.value).into_owned(),
            }
        })
        .await;
}

/// Writes `value` to a sink with `fence`, recorded; whether it was acknowledged.
pub async fn write_sink(
    rec: &Recorder,
    client: &Client,
    name: &str,
    resource: &str,
    fence: u64,
    value: &str,
) -> bool {
    let input = Input::SinkWrite {
        resource: resource.to_string(),
        fence,
        value: value.to_string(),
    };
    rec.record(
        name,
        input,
        client.write_fenced(resource, fence, value.as_bytes()),
        |written| Output::Sink {
            seen_fence: written.seen_fence,
            writes: written.writes,
            value: String::new(),
        },
    )
    .await
    .is_ok()
}

/// One holder: acquire, (stall,) write, complete, release, until `stop`.
pub async fn run(
    client: Client,
    name: String,
    rec: Recorder,
    resources: Arc<Vec<String>>,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    let mut attempt = 0u64;
    while !stop.load(Ordering::Relaxed) {
        attempt += 1;
        let resource = resources[rng.random_range(0..resources.len())].clone();
        let action = Action {
            key: format!("{name}/{attempt}"),
            resource: resource.clone(),
            safety: RetrySafety::Safe,
        };
        let input = Input::Acquire {
            key: action.key.clone(),
            resource: resource.clone(),
        };
        let acquired = rec
            .record(
                &name,
                input,
                client.acquire(&action, TTL_MS),
                outcome_output,
            )
            .await;
        let Ok(Outcome::Granted(lease)) = acquired else {
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
            continue;
        };
        if rng.random_bool(0.08) {
            tokio::time::sleep(STALL).await;
        }
        if !write_sink(
            &rec,
            &client,
            &name,
            &sink_of(&resource),
            lease.fence,
            &action.key,
        )
        .await
        {
            // Refused (a newer holder) or unknown: give the resource back if it is still ours.
            let input = Input::ReleaseEffect {
                key: action.key.clone(),
                resource: resource.clone(),
                fence: lease.fence,
            };
            let _ = rec
                .record(&name, input, client.release_effect(&action, &lease), |_| {
                    Output::Done
                })
                .await;
            continue;
        }
        let input = Input::CompleteEffect {
            key: action.key.clone(),
            resource: resource.clone(),
            fence: lease.fence,
        };
        let _ = rec
            .record(
                &name,
                input,
                client.complete_effect(&action, &lease, &action.key),
                |result| Output::Result(result.clone()),
            )
            .await;
        let input = Input::ReleaseEffect {
            key: action.key.clone(),
            resource,
            fence: lease.fence,
        };
        let _ = rec
            .record(&name, input, client.release_effect(&action, &lease), |_| {
                Output::Done
            })
            .await;
    }
}

/// Every side-effect checker. `final_from`: when the reads after recovery began (µs).
pub fn check(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut grants = Vec::new();
    let mut uses = Vec::new();
    let mut ends = Vec::new();
    let mut violations = Vec::new();
    for op in history {
        // Only a release ends a hold: a completion keeps it (the key is done, the resource
        // still held) until its release or its TTL.
        if let Input::ReleaseEffect {
            resource, fence, ..
        } = &op.input
        {
            // A refusal ended nothing.
            if op.refused().is_none() {
                ends.push(Use {
                    key: resource.clone(),
                    fence: *fence,
                    op: op.index,
                });
            }
        }
        match (&op.input, op.ok()) {
            (Input::Acquire { resource, .. }, Some(Output::Granted { fence, until_ms, .. })) => {
                grants.push(Grant {
                    key: resource.clone(),
                    fence: *fence,
                    op: op.index,
                    until_ms: *until_ms,
                    renewed_until_ms: *until_ms,
                })
            }
            (Input::Acquire { key, .. }, Some(Output::NotGranted(outcome)))
                if outcome != "contended" && op.call < final_from =>
            {
                violations.push(Violation::new(
                    "fresh-key-acquire",
                    key,
                    format!(
                        "the first and only acquire of this key answered {outcome}: an earlier attempt of it was applied (a retried acquire applied twice?)"
                    ),
                    vec![op.index],
                ))
            }
            (Input::CompleteEffect { resource, fence, .. }, Some(_))
            | (Input::ReleaseEffect { resource, fence, .. }, Some(_)) => uses.push(Use {
                key: resource.clone(),
                fence: *fence,
                op: op.index,
            }),
            _ => {}
        }
    }
    violations.extend(unique_grants("acquire", &grants, history));
    violations.extend(unique_tokens(
        "acquire",
        &grants,
        |output| match output {
            Output::Granted { holder, .. } => Some(holder.as_str()),
            _ => None,
        },
        history,
    ));
    violations.extend(exclusive_holds("acquire", &grants, &ends, TTL_MS, history));
    violations.extend(increasing_fences("acquire", &grants, history));
    violations.extend(no_stale_holder("complete/release", &grants, &uses, history));
    violations.extend(sink(history, |resource| resource.starts_with(SINK_PREFIX)));
    violations.extend(durable(history, final_from));
    violations.extend(intent_expiry(history, final_from));
    violations
}

/// The keys (with their resources) granted to a workload whose intent nobody is known to have
/// resolved: no completion was acknowledged. Each key's intent runs out unresolved, or ran out
/// already — unless a completion sent without an answer was applied ([`maybe_completed`]).
pub fn unresolved_keys(history: &[Op]) -> Vec<(String, String)> {
    let acknowledged: HashSet<&str> = history
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (Input::CompleteEffect { key, .. }, Some(_)) => Some(key.as_str()),
            _ => None,
        })
        .collect();
    let mut seen = HashSet::new();
    history
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (Input::Acquire { key, resource }, Some(Output::Granted { .. }))
                if !acknowledged.contains(key.as_str()) && seen.insert(key.as_str()) =>
            {
                Some((key.clone(), resource.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The keys with a completion sent and never answered: it may have been applied.
fn maybe_completed(history: &[Op]) -> HashSet<&str> {
    history
        .iter()
        .filter_map(|op| match &op.input {
            Input::CompleteEffect { key, .. } if op.ok().is_none() && op.refused().is_none() => {
                Some(key.as_str())
            }
            _ => None,
        })
        .collect()
}

/// Every key left unresolved ([`unresolved_keys`]) and acquired again after recovery answers
/// `uncertain`, or `in_progress` while its intent may still have been live, or `completed` when
/// a completion of it went unanswered (contract §3: an intent that expires unresolved turns the
/// key uncertain, never a fresh grant). Of those acquires, at least one must have been answered.
fn intent_expiry(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut violations = Vec::new();
    let unresolved = unresolved_keys(history);
    let maybe_completed = maybe_completed(history);
    let (mut asked, mut answered) = (0, 0);
    for (key, _) in &unresolved {
        let Some(granted) = history.iter().find(|op| {
            op.call < final_from
                && matches!(&op.input, Input::Acquire { key: k, .. } if k == key)
                && matches!(op.ok(), Some(Output::Granted { .. }))
        }) else {
            continue;
        };
        // The intent's deadline is the grant's store time + TTL: no later than the answer's
        // arrival + TTL, plus a second for the store clock's lead over this one.
        let live_until = granted.ret.unwrap_or(granted.call) + (TTL_MS as u64 + 1_000) * 1_000;
        for again in history.iter().filter(|op| {
            op.call >= final_from && matches!(&op.input, Input::Acquire { key: k, .. } if k == key)
        }) {
            asked += 1;
            let Some(output) = again.ok() else {
                // Unanswered or refused: says nothing about the key.
                continue;
            };
            answered += 1;
            let answer = match output {
                Output::NotGranted(outcome) if outcome == "uncertain" => continue,
                Output::NotGranted(outcome)
                    if outcome == "in_progress" && again.call < live_until =>
                {
                    continue
                }
                Output::NotGranted(outcome)
                    if outcome == "completed" && maybe_completed.contains(key.as_str()) =>
                {
                    continue
                }
                Output::NotGranted(outcome) => outcome.clone(),
                Output::Granted { fence, .. } => format!("granted (fence {fence})"),
                other => format!("{other:?}"),
            };
            violations.push(Violation::new(
                "intent-expiry",
                key,
                format!(
                    "granted and never resolved, so its intent ran out unresolved; acquired again after recovery it answered {answer}, not uncertain"
                ),
                vec![granted.index, again.index],
            ));
        }
    }
    if asked > 0 && answered == 0 {
        violations.push(Violation::new(
            "intent-expiry",
            "-",
            format!(
                "{} keys were left unresolved and none of the {asked} acquires of them after recovery was answered: nothing was checked",
                unresolved.len()
            ),
            Vec::new(),
        ));
    }
    violations
}

/// Every acknowledged completion answered, and is still recorded after recovery with, the result
/// the workload submitted: the action's key (each key is completed by its one holder, so the
/// first result is always that one). Compared with what was submitted, not with what the
/// completion answered, so a store that recorded and echoed a wrong result is caught too.
fn durable(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut violations = Vec::new();
    for op in history {
        let (Input::CompleteEffect { key, .. }, Some(Output::Result(result))) =
            (&op.input, op.ok())
        else {
            continue;
        };
        if result != key {
            violations.push(Violation::new(
                "wrong-result",
                key,
                format!("a completion submitting result {key:?} answered {result:?}"),
                vec![op.index],
            ));
            continue;
        }
        let shown = history.iter().rfind(|s| {
            s.call >= final_from && matches!(&s.input, Input::ShowAction { key: k } if k == key)
        });
        let ok = matches!(
            shown.and_then(Op::ok),
            Some(Output::Action { status, result: Some(r), .. }) if status == "completed" && r == key
        );
        if !ok {
            let mut ops = vec![op.index];
            ops.extend(shown.map(|s| s.index));
            violations.push(Violation::new(
                "lost-ack",
                key,
                "a completion was acknowledged; after recovery the key is not completed with that result",
                ops,
            ));
        }
    }
    violations
}

/// The action keys whose completion was acknowledged (for the reads after recovery).
pub fn completed_keys(history: &[Op]) -> Vec<String> {
    history
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (Input::CompleteEffect { key, .. }, Some(_)) => Some(key.clone()),
            _ => None,
        })
        .collect()
}
