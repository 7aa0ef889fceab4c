//! Reconciler workload: the side-effect gate's way out of "nobody knows whether it happened".
//! Holders hand over every key whose outcome they do not know ([`Backlog`]): a write refused or
//! unanswered, a completion unanswered, an outcome reported unknown (`mark_uncertain`). Two
//! reconcilers pick keys from it at random, so they race for the same key now and then: each
//! begins a reconcile (one reconciler per key at a time), sometimes stalls past its slot, reads
//! the resource to learn whether the effect happened, and resolves: "happened" with its own
//! result, or "did not happen" — refused for an unsafe action unless forced — after which it
//! retries the action itself (a new grant, the same key).
//!
//! Checked (besides the side-effect rules, which see the reconcilers' acquires, completions and
//! results too):
//! - no reconcile slot is granted while another one of the key is live (`reconcile-exclusive`,
//!   judged on the store clock the slots' deadlines carry);
//! - `RECONCILE_TAKEN` only when another reconcile of the key was sent (`reconcile-twice`), and
//!   `NOT_UNCERTAIN` for a resolution only when another resolution of the key was sent
//!   (`resolve-twice`): otherwise the call's own retry was applied twice;
//! - an unsafe action's unforced "did not happen" is never made retryable, and nothing else is
//!   refused `UNSAFE_NOT_RETRYABLE` (`unsafe-resolution`);
//! - after a "did not happen" made a key retryable, its next acquire is granted or contended
//!   (`resolved-not-retryable`);
//! - a key whose intent certainly ran out, or whose holder's `mark_uncertain` was answered, is
//!   uncertain when a reconcile begins (`not-uncertain`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_rpc::Client;
use baton_statemachine::effect::{Action, KeyStatus, Resolution, Resolved, RetrySafety};
use baton_statemachine::Refusal;
use rand::rngs::StdRng;
use rand::Rng;

use super::check::{by_key, Violation};
use super::effect::{self, Acquired};
use super::history::{Input, Op, Output, Recorder};

/// How long a reconcile slot lasts.
const SLOT_TTL_MS: i64 = 1_500;
/// How long a stalling reconciler sleeps between its slot and its resolution (past the slot).
const STALL: Duration = Duration::from_millis(1_800);
/// How often a retry after "did not happen" tries a contended resource before leaving the key
/// idle (it is then simply not retried: no rule needs it to be).
const RETRIES: usize = 20;

/// The keys whose outcome their holder does not know, waiting for a reconciler.
#[derive(Debug, Default)]
pub struct Backlog {
    inner: Mutex<Waiting>,
}

/// The keys waiting, each with the push that put it there.
#[derive(Debug, Default)]
struct Waiting {
    pushes: u64,
    entries: Vec<(Action, u64)>,
}

/// A key picked from the backlog, and which push of it.
struct Picked {
    action: Action,
    push: u64,
}

impl Backlog {
    /// Hands `action` to the reconcilers (again, if it is waiting already: a round that picked
    /// it before then does not take it out).
    pub fn push(&self, action: &Action) {
        let mut waiting = self.lock();
        waiting.pushes += 1;
        let push = waiting.pushes;
        waiting.entries.retain(|(a, _)| a.key != action.key);
        waiting.entries.push((action.clone(), push));
    }

    /// A key waiting, picked at random (it stays in the backlog until [`Backlog::settle`]).
    fn pick(&self, rng: &mut StdRng) -> Option<Picked> {
        let waiting = self.lock();
        if waiting.entries.is_empty() {
            return None;
        }
        let (action, push) = &waiting.entries[rng.random_range(0..waiting.entries.len())];
        Some(Picked {
            action: action.clone(),
            push: *push,
        })
    }

    /// Takes the picked key out, unless it was pushed again since: it is resolved, completed or
    /// idle.
    fn settle(&self, picked: &Picked) {
        self.lock()
            .entries
            .retain(|(a, push)| a.key != picked.action.key || *push != picked.push);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One reconciler, until `stop`.
pub async fn run(
    client: Client,
    name: String,
    rec: Recorder,
    backlog: Arc<Backlog>,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        if let Some(picked) = backlog.pick(&mut rng) {
            reconcile(&client, &name, &rec, &picked, &mut rng, &backlog).await;
        }
        // Rounds on a key another reconciler holds, or whose intent still runs, find the same
        // answer for a while: no need to ask many times a second.
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..200))).await;
    }
}

/// One round on one key: begin, (stall,) look downstream, resolve, and retry what did not
/// happen.
async fn reconcile(
    client: &Client,
    name: &str,
    rec: &Recorder,
    picked: &Picked,
    rng: &mut StdRng,
    backlog: &Backlog,
) {
    let action = &picked.action;
    let input = Input::BeginReconcile {
        key: action.key.clone(),
    };
    let begun = rec
        .record(
            name,
            input,
            client.begin_reconcile(action, SLOT_TTL_MS),
            |slot| Output::Reconciling {
                until_ms: slot.until_ms,
            },
        )
        .await;
    match begun {
        Ok(_) => {}
        Err(error) if error.refusal() == Some(&Refusal::NotUncertain) => {
            // Completed, idle, or its intent still running (or uncertain by the time it is
            // shown): only a completed or idle key leaves the backlog.
            if let Some(view) = effect::show(rec, client, name, &action.key).await {
                if matches!(view.status, KeyStatus::Completed | KeyStatus::Idle) {
                    backlog.settle(picked);
                }
            }
            return;
        }
        // Another reconciler has it, or no answer: a later round tries again.
        Err(_) => return,
    }
    if rng.random_bool(0.05) {
        tokio::time::sleep(STALL).await;
    }
    // Downstream facts: the resource's last accepted write is this key's, or (as a reconciler
    // that found a receipt elsewhere would) it happened anyway now and then.
    let written = effect::read_sink(rec, client, name, &effect::sink_of(&action.resource)).await;
    let happened = written.as_deref() == Some(action.key.as_str()) || rng.random_bool(0.3);
    let unsafe_action = action.safety == RetrySafety::Unsafe;
    let resolve = |happened: bool, forced: bool| {
        let resolution = Resolution {
            happened,
            result: if happened {
                format!("{} by {name}", action.key)
            } else {
                String::new()
            },
            force_retryable: forced,
        };
        let input = Input::Resolve {
            key: action.key.clone(),
            happened,
            result: resolution.result.clone(),
            forced,
            unsafe_action,
        };
        async move {
            rec.record(
                name,
                input,
                client.resolve_uncertain(action, &resolution),
                |resolved| match resolved {
                    Resolved::Completed(result) => Output::Result(result.clone()),
                    Resolved::Retryable => Output::Retryable,
                },
            )
            .await
        }
    };
    let mut resolved = resolve(happened, false).await;
    let blocked =
        matches!(&resolved, Err(error) if error.refusal() == Some(&Refusal::UnsafeNotRetryable));
    if blocked && rng.random_bool(0.5) {
        // An unsafe action that did not happen: decide to retry it all the same.
        resolved = resolve(false, true).await;
    }
    match resolved {
        Ok(Resolved::Completed(_)) => backlog.settle(picked),
        Ok(Resolved::Retryable) => {
            backlog.settle(picked);
            retry(client, name, rec, action, rng, backlog).await;
        }
        // Left uncertain (unsafe, unforced), resolved by another, or no answer: a later round.
        Err(_) => {}
    }
}

/// Retries what did not happen: attempts until one is granted (it then ends as any holder's
/// does) or the key turns out taken by another attempt; gives up, leaving the key idle, after
/// [`RETRIES`] contended tries. An attempt that may have been granted unseen (its acquire
/// unanswered, then answered `in_progress` or `uncertain`) goes back to the backlog: it ends
/// uncertain.
async fn retry(
    client: &Client,
    name: &str,
    rec: &Recorder,
    action: &Action,
    rng: &mut StdRng,
    backlog: &Backlog,
) {
    let mut unanswered = false;
    for _ in 0..RETRIES {
        match effect::perform(client, name, rec, action, rng, backlog).await {
            Acquired::Granted => return,
            Acquired::Other => {
                backlog.push(action);
                return;
            }
            Acquired::Unknown => unanswered = true,
            Acquired::Contended => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if unanswered {
        backlog.push(action);
    }
}

/// Every reconciler checker.
pub fn check(history: &[Op]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (key, ops) in &by_key(history, effect::key_of) {
        violations.extend(exclusive_slots(key, ops));
        violations.extend(applied_twice(key, ops));
        violations.extend(unsafe_resolutions(key, ops));
        violations.extend(retryable(key, ops));
        violations.extend(uncertain(key, ops));
    }
    violations
}

/// A slot granted while another slot of the key was live on the store clock: its deadline minus
/// the slot's length (when it was applied) before the other's deadline. A resolution or a
/// completion sent in between may have ended the other slot (and the key may have turned
/// uncertain again since), so it excuses the pair.
fn exclusive_slots(key: &str, ops: &[&Op]) -> Vec<Violation> {
    let mut slots: Vec<(u64, &Op)> = ops
        .iter()
        .filter_map(|op| match op.ok() {
            Some(Output::Reconciling { until_ms }) => Some((*until_ms, *op)),
            _ => None,
        })
        .collect();
    slots.sort_by_key(|(until, op)| (*until, op.index));
    let mut violations = Vec::new();
    for pair in slots.windows(2) {
        let ((first_until, first), (second_until, second)) = (pair[0], pair[1]);
        let applied = second_until.saturating_sub(SLOT_TTL_MS as u64);
        if applied >= first_until {
            continue;
        }
        let ended = ops.iter().any(|op| {
            matches!(
                op.input,
                Input::Resolve { .. } | Input::CompleteEffect { .. }
            ) && op.call < second.ret.unwrap_or(u64::MAX)
                && op.call > first.call
        });
        if !ended {
            violations.push(Violation::new(
                "reconcile-exclusive",
                key,
                format!(
                    "a reconcile slot was granted at store time {applied} while another one ran until {first_until}"
                ),
                vec![first.index, second.index],
            ));
        }
    }
    violations
}

/// A refusal only another call of the same kind explains: `RECONCILE_TAKEN` with no other
/// reconcile of the key sent (and not refused), `NOT_UNCERTAIN` for a resolution made under an
/// answered slot with no other resolution of the key sent (and not refused). Either means the
/// call's own retry was applied twice.
fn applied_twice(key: &str, ops: &[&Op]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for op in ops {
        let ret = op.ret.unwrap_or(u64::MAX);
        // Another call of the kind that may have changed the key (a refused one changed
        // nothing).
        let other_sent = |kind: fn(&Input) -> bool| {
            ops.iter().any(|o| {
                o.index != op.index && kind(&o.input) && o.refused().is_none() && o.call < ret
            })
        };
        let (rule, what) = match (&op.input, op.refused()) {
            (Input::BeginReconcile { .. }, Some("RECONCILE_TAKEN"))
                if !other_sent(|i| matches!(i, Input::BeginReconcile { .. })) =>
            {
                ("reconcile-twice", "a reconcile refused RECONCILE_TAKEN")
            }
            (Input::Resolve { .. }, Some("NOT_UNCERTAIN"))
                if !other_sent(|i| matches!(i, Input::Resolve { .. }))
                    && ops.iter().any(|o| {
                        matches!(o.ok(), Some(Output::Reconciling { .. })) && o.precedes(op)
                    }) =>
            {
                (
                    "resolve-twice",
                    "a resolution refused NOT_UNCERTAIN under an answered slot",
                )
            }
            _ => continue,
        };
        violations.push(Violation::new(
            rule,
            key,
            format!("{what}, though no other call of its kind was sent on the key: its own retry was applied twice"),
            vec![op.index],
        ));
    }
    violations
}

/// An unsafe action's unforced "did not happen" answered retryable, or any other resolution
/// refused `UNSAFE_NOT_RETRYABLE`.
fn unsafe_resolutions(key: &str, ops: &[&Op]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for op in ops {
        let Input::Resolve {
            happened,
            forced,
            unsafe_action,
            ..
        } = &op.input
        else {
            continue;
        };
        let blocked = *unsafe_action && !happened && !forced;
        let detail = match (blocked, op.ok(), op.refused()) {
            (true, Some(Output::Retryable), _) => {
                "an unsafe action's unforced \"did not happen\" made the key retryable"
            }
            (false, _, Some("UNSAFE_NOT_RETRYABLE")) => {
                "refused UNSAFE_NOT_RETRYABLE, though the resolution was forced, a \"happened\" or of a safe action"
            }
            _ => continue,
        };
        violations.push(Violation::new(
            "unsafe-resolution",
            key,
            detail,
            vec![op.index],
        ));
    }
    violations
}

/// After a resolution made the key retryable, the next acquire of it (invoked after that answer,
/// with no other acquire or resolution of the key sent meanwhile) is granted or contended.
fn retryable(key: &str, ops: &[&Op]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for resolved in ops
        .iter()
        .filter(|op| matches!(op.ok(), Some(Output::Retryable)))
    {
        let Some(next) = ops.iter().find(|op| {
            matches!(op.input, Input::Acquire { .. }) && resolved.precedes(op) && op.ok().is_some()
        }) else {
            continue;
        };
        let ret = next.ret.unwrap_or(u64::MAX);
        let meanwhile = ops.iter().any(|o| {
            o.index != next.index
                && o.index != resolved.index
                && matches!(o.input, Input::Acquire { .. } | Input::Resolve { .. })
                && o.call > resolved.call
                && o.call < ret
        });
        let fine = matches!(next.ok(), Some(Output::Granted { .. }))
            || matches!(next.ok(), Some(Output::NotGranted(outcome)) if outcome == "contended");
        if !meanwhile && !fine {
            violations.push(Violation::new(
                "resolved-not-retryable",
                key,
                format!(
                    "a resolution made the key retryable; the next acquire answered {}",
                    next.ok().map(ToString::to_string).unwrap_or_default()
                ),
                vec![resolved.index, next.index],
            ));
        }
    }
    violations
}

/// A reconcile refused `NOT_UNCERTAIN` though the key was certainly uncertain: its holder's
/// `mark_uncertain` had been answered, or its latest grant's intent had run out (the grant
/// answered more than its TTL, plus slack, before the reconcile was sent), and no completion,
/// resolution or other acquire of the key was sent before the refusal came back.
fn uncertain(key: &str, ops: &[&Op]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for op in ops.iter().filter(|op| {
        matches!(op.input, Input::BeginReconcile { .. }) && op.refused() == Some("NOT_UNCERTAIN")
    }) {
        let ret = op.ret.unwrap_or(u64::MAX);
        let changed = ops.iter().any(|o| {
            matches!(
                o.input,
                Input::CompleteEffect { .. } | Input::Resolve { .. }
            ) && o.call < ret
        });
        if changed {
            continue;
        }
        // The acquires sent before the refusal came back: exactly one, and granted.
        let acquires: Vec<&&Op> = ops
            .iter()
            .filter(|o| matches!(o.input, Input::Acquire { .. }) && o.call < ret)
            .collect();
        let [granted] = acquires.as_slice() else {
            continue;
        };
        if !matches!(granted.ok(), Some(Output::Granted { .. })) {
            continue;
        }
        let marked = ops.iter().find(|o| {
            matches!(o.input, Input::MarkUncertain { .. }) && o.ok().is_some() && o.precedes(op)
        });
        let ran_out = effect::intent_over_by(granted) < op.call;
        let why = match (marked, ran_out) {
            (Some(_), _) => "its holder's mark_uncertain had been answered",
            (None, true) => "its intent had run out",
            (None, false) => continue,
        };
        let mut shown = vec![granted.index];
        shown.extend(marked.map(|m| m.index));
        shown.push(op.index);
        violations.push(Violation::new(
            "not-uncertain",
            key,
            format!("a reconcile was refused NOT_UNCERTAIN though {why} and nothing had resolved or completed the key"),
            shown,
        ));
    }
    violations
}
