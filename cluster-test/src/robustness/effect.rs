//! Side-effect workload: clients acquire a fresh action key (a quarter of them unsafe to repeat)
//! on one of a few shared resources, write the fenced sink of that resource with the lease's
//! fence, complete and release. Now and then a holder stalls past its lease before writing, so a
//! newer holder gets a higher fence and the stale writer must be refused, or reports its outcome
//! unknown (`mark_uncertain`) instead of completing. Keys whose outcome the holder does not know
//! go to the reconcilers ([`super::reconcile`]), which resolve them and retry some.
//!
//! Checked: one acknowledged grant per resource and fence, no grant while another holder's was
//! certainly still live and no `contended` while none can have been, fences increasing in real
//! time, no completion or release acknowledged
//! with a superseded lease, the first acquire of a key never answered as if an earlier attempt
//! existed (a retried acquire applied twice), the fenced sink's rules
//! ([`super::check::sink`]), one recorded result per key and a submitted one, a completed key
//! answered as completed ever after and still completed after recovery, and every granted
//! intent left unresolved (its holder stalled, was refused, never heard back, or marked it
//! uncertain, and no reconciler resolved it) turned its key uncertain: acquired again after
//! recovery, such a key answers `uncertain` (or, before its intent could have run out,
//! `in_progress`), never a fresh grant.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::{Client, Error};
use baton_statemachine::effect::{Action, ActionView, EffectLease, Outcome, RetrySafety};
use rand::rngs::StdRng;
use rand::Rng;

use super::check::{
    by_key, exclusive_holds, increasing_fences, no_stale_holder, sink, unique_grants,
    unique_tokens, Grant, Use, Violation, CLOCK_SLACK_US,
};
use super::effect_watch;
use super::history::{Input, Op, Output, Recorder};
use super::reconcile::Backlog;
use super::watcher::deliveries;

/// Share of fresh keys declared unsafe to repeat.
const UNSAFE_SHARE: f64 = 0.25;
/// Share of written attempts whose holder reports the outcome unknown instead of completing.
const MARK_SHARE: f64 = 0.05;
/// Lease TTL of an acquire.
pub const TTL_MS: i64 = 2_000;
/// How long a stalling holder sleeps between its grant and its write (past its lease).
const STALL: Duration = Duration::from_millis(2_600);
/// What the names of this workload's clients, and so its action keys (`<client>/<attempt>`),
/// begin with.
pub const KEY_PREFIX: &str = "holder-";
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
        Outcome::Completed(result) => Output::Result(result.clone()),
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

/// Shows an action key, recorded; its view when answered.
pub async fn show(rec: &Recorder, client: &Client, name: &str, key: &str) -> Option<ActionView> {
    let input = Input::ShowAction {
        key: key.to_string(),
    };
    rec.record(name, input, client.show_action(key), |view: &ActionView| {
        Output::Action {
            status: view.status.as_str().to_string(),
            fence: view.fence,
            result: view.result.clone(),
        }
    })
    .await
    .ok()
}

/// Reads a sink resource, recorded; its value when answered.
pub async fn read_sink(
    rec: &Recorder,
    client: &Client,
    name: &str,
    resource: &str,
) -> Option<String> {
    let input = Input::SinkRead {
        resource: resource.to_string(),
    };
    rec.record(name, input, client.read_sink(resource), |value| {
        Output::Sink {
            seen_fence: value.seen_fence,
            writes: value.writes,
            value: String::from_utf8_lossy(&value.value).into_owned(),
        }
    })
    .await
    .ok()
    .map(|value| String::from_utf8_lossy(&value.value).into_owned())
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

/// One holder: a fresh key (a quarter of them unsafe to repeat) per attempt ([`perform`]), until
/// `stop`.
pub async fn run(
    client: Client,
    name: String,
    rec: Recorder,
    resources: Arc<Vec<String>>,
    backlog: Arc<Backlog>,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    let mut attempt = 0u64;
    while !stop.load(Ordering::Relaxed) {
        attempt += 1;
        let resource = resources[rng.random_range(0..resources.len())].clone();
        let safety = if rng.random_bool(UNSAFE_SHARE) {
            RetrySafety::Unsafe
        } else {
            RetrySafety::Safe
        };
        let action = Action {
            key: format!("{name}/{attempt}"),
            resource,
            safety,
        };
        if perform(&client, &name, &rec, &action, &mut rng, &backlog).await != Acquired::Granted {
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
        }
    }
}

/// What an acquire of [`perform`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Granted: the attempt went on.
    Granted,
    /// Another key holds the resource.
    Contended,
    /// Any other answer, or a refusal.
    Other,
    /// No answer: it may have been granted.
    Unknown,
}

/// One attempt of `action`: acquire, (stall,) write the sink with the lease's fence, complete,
/// release. An attempt whose outcome its holder does not know — its write refused or
/// unanswered, its completion unanswered or refused, or (now and then) a holder that reports
/// its outcome unknown after the write (`mark_uncertain`) — hands the key to the reconcilers.
pub async fn perform(
    client: &Client,
    name: &str,
    rec: &Recorder,
    action: &Action,
    rng: &mut StdRng,
    backlog: &Backlog,
) -> Acquired {
    let input = Input::Acquire {
        key: action.key.clone(),
        resource: action.resource.clone(),
    };
    let lease = match rec
        .record(name, input, client.acquire(action, TTL_MS), outcome_output)
        .await
    {
        Ok(Outcome::Granted(lease)) => lease,
        Ok(Outcome::Contended) => return Acquired::Contended,
        Ok(_) | Err(Error::Refused(_)) => return Acquired::Other,
        Err(_) => return Acquired::Unknown,
    };
    if rng.random_bool(0.08) {
        tokio::time::sleep(STALL).await;
    }
    let sink = sink_of(&action.resource);
    if !write_sink(rec, client, name, &sink, lease.fence, &action.key).await {
        // Refused (a newer holder) or unknown: give the resource back if it is still ours.
        release(rec, client, name, action, &lease).await;
        backlog.push(action);
        return Acquired::Granted;
    }
    if rng.random_bool(MARK_SHARE) {
        let input = Input::MarkUncertain {
            key: action.key.clone(),
            resource: action.resource.clone(),
            fence: lease.fence,
        };
        let _ = rec
            .record(
                name,
                input,
                client.mark_uncertain(action, &lease, "robustness: outcome unknown"),
                |_| Output::Done,
            )
            .await;
        release(rec, client, name, action, &lease).await;
        backlog.push(action);
        return Acquired::Granted;
    }
    let input = Input::CompleteEffect {
        key: action.key.clone(),
        resource: action.resource.clone(),
        fence: lease.fence,
    };
    let completed = rec
        .record(
            name,
            input,
            client.complete_effect(action, &lease, &action.key),
            |result| Output::Result(result.clone()),
        )
        .await;
    if completed.is_err() {
        backlog.push(action);
    }
    release(rec, client, name, action, &lease).await;
    Acquired::Granted
}

/// Releases the lease's hold, recorded.
async fn release(
    rec: &Recorder,
    client: &Client,
    name: &str,
    action: &Action,
    lease: &EffectLease,
) {
    let input = Input::ReleaseEffect {
        key: action.key.clone(),
        resource: action.resource.clone(),
        fence: lease.fence,
    };
    let _ = rec
        .record(name, input, client.release_effect(action, lease), |_| {
            Output::Done
        })
        .await;
}

/// Every side-effect checker. `final_from`: when the reads after recovery began (µs).
pub fn check(history: &[Op], final_from: u64) -> Vec<Violation> {
    let settlers = by_key(history, |input| submitted(input).map(|(key, _)| key));
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
            (
                Input::Acquire { resource, .. },
                Some(Output::Granted {
                    fence, until_ms, ..
                }),
            ) => grants.push(Grant {
                key: resource.clone(),
                fence: *fence,
                op: op.index,
                until_ms: *until_ms,
                renewed_until_ms: *until_ms,
            }),
            // A completion of a key another completion or resolution may have completed first
            // can be a repeat: it changes nothing and answers the first result whatever
            // credentials it carries (the first completion wins), so it shows no use of them.
            (
                Input::CompleteEffect {
                    key,
                    resource,
                    fence,
                },
                Some(Output::Result(_)),
            ) if !completed_by_another(&settlers, key, op) => uses.push(Use {
                key: resource.clone(),
                fence: *fence,
                op: op.index,
            }),
            (
                Input::ReleaseEffect {
                    resource, fence, ..
                },
                Some(_),
            ) => uses.push(Use {
                key: resource.clone(),
                fence: *fence,
                op: op.index,
            }),
            _ => {}
        }
    }
    violations.extend(fresh_keys(history, final_from));
    violations.extend(unexplained_contended(history));
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
    violations.extend(sink(history, final_from, |resource| {
        resource.starts_with(SINK_PREFIX)
    }));
    let answers = completed_answers(history, final_from);
    violations.extend(results(history, &answers));
    violations.extend(completed_final(history, final_from, &answers));
    violations.extend(durable(history, final_from, &answers));
    violations.extend(intent_expiry(history, final_from));
    violations
}

/// Whether a completion or "happened" resolution of `key` other than `op` (`settlers`: every
/// one, by key) was sent before `op` returned.
fn completed_by_another(settlers: &BTreeMap<&str, Vec<&Op>>, key: &str, op: &Op) -> bool {
    let ret = op.ret.unwrap_or(u64::MAX);
    settlers
        .get(key)
        .is_some_and(|ops| ops.iter().any(|o| o.index != op.index && o.call < ret))
}

/// When the intent of a granted acquire has certainly run out (µs, history clock): its deadline
/// is the grant's store time + TTL, no later than the answer's arrival + TTL; plus a second for
/// the store clock's lead over the history's.
pub fn intent_over_by(granted: &Op) -> u64 {
    granted.ret.unwrap_or(granted.call) + (TTL_MS as u64 + 1_000) * 1_000
}

/// The action key an operation concerns.
pub fn key_of(input: &Input) -> Option<&str> {
    match input {
        Input::Acquire { key, .. }
        | Input::CompleteEffect { key, .. }
        | Input::ReleaseEffect { key, .. }
        | Input::MarkUncertain { key, .. }
        | Input::BeginReconcile { key }
        | Input::Resolve { key, .. }
        | Input::ShowAction { key } => Some(key),
        _ => None,
    }
}

/// The first operation on a key is its holder's first acquire, of a key nobody used before: it
/// is granted or contended. Any other answer says an earlier attempt of the key was applied (a
/// retried acquire applied twice).
fn fresh_keys(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut seen = HashSet::new();
    let mut violations = Vec::new();
    for op in history.iter().filter(|op| op.call < final_from) {
        let Some(key) = key_of(&op.input) else {
            continue;
        };
        if !seen.insert(key) || !matches!(op.input, Input::Acquire { .. }) {
            continue;
        }
        let answer = match op.ok() {
            Some(Output::NotGranted(outcome)) if outcome != "contended" => outcome.clone(),
            Some(Output::Result(result)) => format!("completed ({result})"),
            _ => continue,
        };
        violations.push(Violation::new(
            "fresh-key-acquire",
            key,
            format!(
                "the first acquire of this key answered {answer}: an earlier attempt of it was applied (a retried acquire applied twice?)"
            ),
            vec![op.index],
        ));
    }
    violations
}

/// An acquire answered `contended` is explained by a grant on its resource that may have held it
/// when the acquire was applied: an acquire other than itself, granted or unanswered, sent
/// before the answer came back, whose hold was not certainly over when the acquire was sent —
/// not freed by a release answered before then, and not certainly expired (its answer + TTL,
/// plus [`CLOCK_SLACK_US`], before then). An unanswered acquire's hold, if it won one, is
/// bounded by what the effect watch delivered ([`WatchedGrants::may_hold`]); without that
/// evidence it explains any later answer. A store that kept a freed or expired hold passes
/// every other rule (`contended` changes nothing). Reports the first few per resource.
fn unexplained_contended(history: &[Op]) -> Vec<Violation> {
    let acquires = by_key(history, |input| match input {
        Input::Acquire { resource, .. } => Some(resource.as_str()),
        _ => None,
    });
    let releases = by_key(history, |input| match input {
        Input::ReleaseEffect { resource, .. } => Some(resource.as_str()),
        _ => None,
    });
    let ttl_us = TTL_MS as u64 * 1_000;
    let watched = WatchedGrants::of(history);
    let mut violations = Vec::new();
    for (resource, ops) in &acquires {
        let mut found = 0;
        for contended in ops.iter().filter(
            |op| matches!(op.ok(), Some(Output::NotGranted(outcome)) if outcome == "contended"),
        ) {
            let answered = contended.ret.unwrap_or(u64::MAX);
            let explained = ops.iter().any(|grant| {
                if grant.index == contended.index || grant.call >= answered {
                    return false;
                }
                match (grant.ok(), grant.ret) {
                    (Some(Output::Granted { fence, .. }), Some(ret)) => {
                        let expired = ret + ttl_us + CLOCK_SLACK_US < contended.call;
                        let freed = releases.get(resource).is_some_and(|releases| {
                            releases.iter().any(|release| {
                                matches!(release.input, Input::ReleaseEffect { fence: f, .. } if f == *fence)
                                    && release.ok().is_some()
                                    && release.precedes(contended)
                            })
                        });
                        !expired && !freed
                    }
                    _ => grant.is_ambiguous() && watched.may_hold(grant, contended),
                }
            });
            if !explained {
                violations.push(Violation::new(
                    "unexplained-contended",
                    resource,
                    "an acquire was answered contended though no hold of the resource can have been live",
                    vec![contended.index],
                ));
                found += 1;
                if found >= 3 {
                    break;
                }
            }
        }
    }
    violations
}

/// What the effect watch delivered, to bound when an unanswered acquire can have held its
/// resource — the counterpart of the board's [`super::board`] `silent_winners`, which learns the
/// same of unanswered claims from the fences listed after recovery.
///
/// The watch delivers every grant of an effect workload key (`granted`) in log order, each
/// after it was applied. An unanswered acquire applied before a `contended` answer came back
/// was applied before every acquire sent after that answer: so once the watch delivered the
/// grant of an acknowledged acquire sent after it (the answer is *covered*), it had delivered
/// the unanswered acquire's grant too, if it won one — or met a `COMPACTED` that may have hidden
/// it. Its hold began no later than that delivery or compaction, and lasted its TTL at most on
/// the store's clock (the workload never renews; every node stamps with this machine's clock, and
/// a store time is stamped before its apply): it was certainly over when the `contended` acquire
/// was sent if that came later than the TTL plus [`CLOCK_SLACK_US`]. No delivery and no
/// compaction: it had won nothing by then. An answer the watch does not cover (it ended, or
/// nothing was acknowledged after it) keeps the old bound: any unanswered acquire before it
/// explains it.
struct WatchedGrants<'h> {
    /// Action key -> when the watch delivered each of its `granted`, in order.
    granted: BTreeMap<&'h str, Vec<u64>>,
    /// When the watch met each `COMPACTED`, in order.
    compactions: Vec<u64>,
    /// The acknowledged grants the watch delivered: (sending, first delivery), by sending, with
    /// each delivery replaced by the earliest of its own and those of every grant sent later.
    covers: Vec<(u64, u64)>,
}

impl<'h> WatchedGrants<'h> {
    fn of(history: &'h [Op]) -> Self {
        let mut granted: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        let mut first: BTreeMap<(&str, u64), u64> = BTreeMap::new();
        for d in deliveries(history, effect_watch::NAME) {
            if d.kind == "granted" {
                granted.entry(d.key).or_default().push(d.op.call);
                first.entry((d.key, d.fence)).or_insert(d.op.call);
            }
        }
        let compactions = history
            .iter()
            .filter(|op| {
                op.client == effect_watch::NAME && matches!(op.input, Input::WatchCompacted { .. })
            })
            .map(|op| op.call)
            .collect();
        let mut covers: Vec<(u64, u64)> = history
            .iter()
            .filter_map(|op| match (&op.input, op.ok()) {
                (Input::Acquire { key, .. }, Some(Output::Granted { fence, .. })) => {
                    Some((op.call, *first.get(&(key.as_str(), *fence))?))
                }
                _ => None,
            })
            .collect();
        covers.sort_unstable();
        let mut earliest = u64::MAX;
        for (_, delivered) in covers.iter_mut().rev() {
            earliest = earliest.min(*delivered);
            *delivered = earliest;
        }
        WatchedGrants {
            granted,
            compactions,
            covers,
        }
    }

    /// By when the watch had delivered every change applied before `at`: the earliest delivery
    /// of an acknowledged grant sent after `at` (`None`: no such delivery).
    fn covered_by(&self, at: u64) -> Option<u64> {
        let from = self.covers.partition_point(|(sent, _)| *sent <= at);
        self.covers.get(from).map(|(_, delivered)| *delivered)
    }

    /// Whether the unanswered acquire `grant` may have held its resource when `contended` was
    /// applied (see [`WatchedGrants`]).
    fn may_hold(&self, grant: &Op, contended: &Op) -> bool {
        let Input::Acquire { key, .. } = &grant.input else {
            return true;
        };
        // The watch records only the workload's keys.
        if !key.starts_with(KEY_PREFIX) {
            return true;
        }
        let Some(covered) = contended.ret.and_then(|ret| self.covered_by(ret)) else {
            return true;
        };
        let since_sent = grant.call..=covered;
        let granted_by = self
            .granted
            .get(key.as_str())
            .into_iter()
            .flatten()
            .chain(&self.compactions)
            .filter(|at| since_sent.contains(*at))
            .max();
        granted_by.is_some_and(|at| at + TTL_MS as u64 * 1_000 + CLOCK_SLACK_US >= contended.call)
    }
}

/// The result an operation submitted for its key: a completion submits the key itself, a
/// "happened" resolution its own result.
fn submitted(input: &Input) -> Option<(&str, &str)> {
    match input {
        Input::CompleteEffect { key, .. } => Some((key, key)),
        Input::Resolve {
            key,
            happened: true,
            result,
            ..
        } => Some((key, result)),
        _ => None,
    }
}

/// The recorded result an answer names: a completion's or resolution's answer, an acquire of a
/// completed key, a view of one.
fn answered_result(op: &Op) -> Option<&str> {
    match op.ok()? {
        Output::Result(result) => Some(result),
        Output::Action {
            result: Some(result),
            status,
            ..
        } if status == "completed" => Some(result),
        _ => None,
    }
}

/// Every answer during the run that names a key's recorded result ([`answered_result`]), by key,
/// in history order.
fn completed_answers(history: &[Op], final_from: u64) -> BTreeMap<&str, Vec<&Op>> {
    let mut answers: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history.iter().filter(|op| op.call < final_from) {
        if let (Some(key), Some(_)) = (key_of(&op.input), answered_result(op)) {
            answers.entry(key).or_default().push(op);
        }
    }
    answers
}

/// One result per key, and one that was submitted: every answer during the run that names a
/// key's recorded result names the same one (the first completion or resolution wins, and is
/// never replaced), and it is a result some completion or resolution of the key submitted.
fn results(history: &[Op], answers: &BTreeMap<&str, Vec<&Op>>) -> Vec<Violation> {
    let mut submissions: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    for op in history {
        if let Some((key, result)) = submitted(&op.input) {
            submissions.entry(key).or_default().insert(result);
        }
    }
    let mut first: BTreeMap<&str, &Op> = BTreeMap::new();
    let mut violations = Vec::new();
    for (key, op) in answers
        .iter()
        .flat_map(|(key, ops)| ops.iter().map(move |op| (*key, *op)))
    {
        let result = answered_result(op).unwrap_or_default();
        if !submissions.get(key).is_some_and(|s| s.contains(result)) {
            violations.push(Violation::new(
                "wrong-result",
                key,
                format!("answered result {result:?}, which no completion or resolution of the key submitted"),
                vec![op.index],
            ));
            continue;
        }
        let earlier = *first.entry(key).or_insert(op);
        if answered_result(earlier) != Some(result) {
            violations.push(Violation::new(
                "result-changed",
                key,
                format!(
                    "answered result {result:?} after another answer had named {:?}: the first completion must win",
                    answered_result(earlier).unwrap_or_default()
                ),
                vec![earlier.index, op.index],
            ));
        }
    }
    violations
}

/// A completed key stays completed: an operation on it invoked after an answer named its result
/// is answered as a completed key — an acquire with the result, a resolution with the result, a
/// reconcile refused `NOT_UNCERTAIN`, a view `completed` — never granted, made retryable,
/// reconciled, refused otherwise or shown otherwise. (After recovery, [`durable`] judges.)
fn completed_final(
    history: &[Op],
    final_from: u64,
    answers: &BTreeMap<&str, Vec<&Op>>,
) -> Vec<Violation> {
    // The earliest answer to come back.
    let completed_at: BTreeMap<&str, &Op> = answers
        .iter()
        .filter_map(|(key, ops)| Some((*key, *ops.iter().min_by_key(|op| op.ret)?)))
        .collect();
    let mut violations = Vec::new();
    for op in history.iter().filter(|op| op.call < final_from) {
        let Some(key) = key_of(&op.input) else {
            continue;
        };
        let Some(completed) = completed_at.get(key).filter(|c| c.precedes(op)) else {
            continue;
        };
        let answer = match (&op.input, op.ok()) {
            (Input::ShowAction { .. }, Some(Output::Action { status, .. }))
                if status != "completed" =>
            {
                format!("status {status}")
            }
            (
                Input::Acquire { .. } | Input::Resolve { .. } | Input::BeginReconcile { .. },
                Some(output),
            ) if answered_result(op).is_none() => output.to_string(),
            // Only a reconcile is refused on a completed key (`NOT_UNCERTAIN`); an acquire or a
            // resolution answers the result.
            (
                Input::Acquire { .. } | Input::Resolve { .. } | Input::BeginReconcile { .. },
                None,
            ) => match op.refused() {
                Some("NOT_UNCERTAIN") if matches!(op.input, Input::BeginReconcile { .. }) => {
                    continue
                }
                Some(code) => format!("refused {code}"),
                None => continue,
            },
            _ => continue,
        };
        violations.push(Violation::new(
            "completed-final",
            key,
            format!("the key had been answered as completed; invoked afterwards, this answered {answer}"),
            vec![completed.index, op.index],
        ));
    }
    violations
}

/// The keys (with their resources) granted to a workload whose intent nobody is known to have
/// resolved: no completion of it was acknowledged, and every resolution of it sent (if any)
/// was refused. Each key's intent runs out unresolved, or ran out already (or its holder marked it
/// uncertain) — unless a completion sent without an answer was applied (`maybe_completed`).
pub fn unresolved_keys(history: &[Op]) -> Vec<(String, String)> {
    // A completion acknowledged, or a resolution that may have changed the key (answered or
    // not; a refused one changed nothing): not judged here.
    let settled: HashSet<&str> = history
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (Input::CompleteEffect { key, .. }, Some(_)) => Some(key.as_str()),
            (Input::Resolve { key, .. }, _) if op.refused().is_none() => Some(key.as_str()),
            _ => None,
        })
        .collect();
    let mut seen = HashSet::new();
    history
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (Input::Acquire { key, resource }, Some(Output::Granted { .. }))
                if !settled.contains(key.as_str()) && seen.insert(key.as_str()) =>
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
        let live_until = intent_over_by(granted);
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
                Output::Result(_) if maybe_completed.contains(key.as_str()) => continue,
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

/// Every key answered as completed during the run is still completed after recovery, with the
/// result it was answered with (the first answer's: [`results`] holds them to one).
fn durable(history: &[Op], final_from: u64, answers: &BTreeMap<&str, Vec<&Op>>) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (key, op) in answers
        .iter()
        .filter_map(|(key, ops)| Some((*key, *ops.first()?)))
    {
        let result = answered_result(op).unwrap_or_default();
        let shown = history.iter().rfind(|s| {
            s.call >= final_from && matches!(&s.input, Input::ShowAction { key: k } if k == key)
        });
        let ok = matches!(
            shown.and_then(Op::ok),
            Some(Output::Action { status, result: Some(r), .. }) if status == "completed" && r == result
        );
        if !ok {
            let mut ops = vec![op.index];
            ops.extend(shown.map(|s| s.index));
            violations.push(Violation::new(
                "lost-ack",
                key,
                format!("answered as completed with result {result:?}; after recovery the key is not completed with that result"),
                ops,
            ));
        }
    }
    violations
}

/// The action keys answered as completed (for the reads after recovery).
pub fn completed_keys(history: &[Op]) -> Vec<String> {
    let keys: BTreeSet<&str> = history
        .iter()
        .filter(|op| answered_result(op).is_some())
        .filter_map(|op| key_of(&op.input))
        .collect();
    keys.into_iter().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::robustness::test_history::{rules, H};

    fn acquire(key: &str) -> Input {
        Input::Acquire {
            key: key.into(),
            resource: "res-0".into(),
        }
    }

    fn granted(fence: u64) -> Output {
        Output::Granted {
            fence,
            holder: format!("h{fence}"),
            until_ms: None,
        }
    }

    fn contended() -> Output {
        Output::NotGranted("contended".into())
    }

    /// `holder-0/1`'s acquire goes unanswered and the watch delivers its grant at 5 ms (when
    /// `won`); `holder-1/1`'s acquire sent at 3,000 ms is granted and delivered, covering what
    /// was answered before it; `holder-2/1`'s acquire sent at `contended_at` ms is answered
    /// `contended` 10 ms later.
    fn unanswered_grant(won: bool, contended_at: u64) -> H {
        let mut h = H::default();
        h.ambiguous("holder-0", acquire("holder-0/1"), 0);
        if won {
            h.delivered(effect_watch::NAME, ("granted", "holder-0/1", "", 1), 5, 5);
        }
        h.ok(
            "holder-2",
            acquire("holder-2/1"),
            contended_at,
            contended_at + 10,
            contended(),
        );
        h.ok("holder-1", acquire("holder-1/1"), 3_000, 3_010, granted(2));
        h.delivered(
            effect_watch::NAME,
            ("granted", "holder-1/1", "", 2),
            3_011,
            6,
        );
        h
    }

    fn found(h: &H) -> Vec<String> {
        rules(&unexplained_contended(&h.ops))
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// The unanswered grant's hold ran out (delivered at 5 ms, TTL 2 s, slack 250 ms) before
    /// the acquire answered `contended` was sent; or it never won (no `granted` delivered before
    /// the watch delivered a grant sent after the answer).
    #[test]
    fn a_contended_answer_after_an_unanswered_grant_ran_out_is_unexplained() {
        assert_eq!(
            found(&unanswered_grant(true, 2_300)),
            ["unexplained-contended"]
        );
        assert_eq!(
            found(&unanswered_grant(false, 100)),
            ["unexplained-contended"]
        );
    }

    /// Legal: within the unanswered grant's TTL (plus slack) of its delivery; without a delivery
    /// covering the answer (the watch may not have got that far); with a `COMPACTED` that may
    /// have hidden the grant; on a key the watch does not record.
    #[test]
    fn an_unanswered_grant_that_may_still_hold_explains_contended() {
        assert!(found(&unanswered_grant(true, 2_200)).is_empty());

        let mut h = unanswered_grant(true, 2_300);
        h.ops.truncate(3);
        assert!(found(&h).is_empty());

        let mut h = unanswered_grant(false, 2_300);
        h.compacted(effect_watch::NAME, 1_000, 4);
        assert!(found(&h).is_empty());

        let mut h = unanswered_grant(false, 100);
        h.ops[0].input = Input::Acquire {
            key: "other/1".into(),
            resource: "res-0".into(),
        };
        assert!(found(&h).is_empty());
    }
}
