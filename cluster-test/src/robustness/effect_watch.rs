//! The side-effect gate's watch: a third watch ([`super::watcher`] runs it) follows every
//! side-effect change from the first revision for the whole run and records each change of an
//! attempt on the effect workload's keys — `granted`, `completed`, `uncertain`, `lost`, and
//! `resolved` when a resolution completed the key — with its fence and position.
//!
//! An attempt's `lost` says that its execution intent ran out unresolved and the key became
//! uncertain (docs/watch.md, "Lease loss"): the prompt a reconciler acts on. A store that sent it
//! for an intent still live, or for an attempt its holder had completed in time, would send a
//! reconciler after an effect that is still running or done; one that never sent it leaves the
//! key unreconciled. Neither changes anything the gate's own rules look at.
//!
//! Checked, on the effect workload's action keys ([`effect::KEY_PREFIX`]):
//! - `watch-effect-missed` (once the run was read back): every acknowledged grant is delivered
//!   `granted` with its fence, every acknowledged `mark_uncertain` `uncertain` with its fence (or
//!   `lost`: a mark applied once the intent ran out is answered, the key already uncertain), a
//!   key with an acknowledged completion or "happened" resolution `completed` or `resolved`, and
//!   every acknowledged grant that no call can have completed or marked uncertain (none sent, or
//!   every one refused) `lost` with its fence — except calls sent before a compaction the watch
//!   met (they may have been in the history compacted away; for a key's completion, any
//!   completion or resolution of the key sent before it);
//! - `watch-effect-phantom`: every delivered change names a call sent, and not refused, before it
//!   was delivered: an acquire of the key (`granted`, `lost`), a `mark_uncertain` of its fence
//!   (`uncertain`), a completion (`completed`) or a resolution (`resolved`) of the key; and
//!   every `uncertain`, `completed` or `lost` comes after the watch delivered its attempt's
//!   grant (judged up to the first compaction the watch met);
//! - `watch-lost-early`: no `lost` is delivered before the intent certainly ran out: the acquire
//!   TTL counted from the acquire's sending, less [`CLOCK_SLACK_US`] (the workload never renews);
//! - `watch-lost-ended`: no `lost` of an attempt its holder ended in time: marked uncertain or
//!   completed by a call answered before the intent could have run out (one answered later may
//!   have found the intent run out: a mark is then answered with no change, and a completion
//!   with the latest fence still completes the key);
//! - `watch-order`: positions strictly increase, resumes included.

use std::collections::{BTreeMap, BTreeSet};

use baton_statemachine::effect::KeyStatus;
use baton_statemachine::{Change, ChangeKind, ChangeValue};

use super::check::{Violation, CLOCK_SLACK_US};
use super::effect::{self, TTL_MS};
use super::history::{Input, Op, Output};
use super::watcher::{self, deliveries};

/// The client name the side-effect watch's changes are recorded under.
pub const NAME: &str = "effect-watcher";

/// What the watch records of `change`: a change of an attempt on an effect workload key.
pub(super) fn recorded(change: &Change) -> Option<Input> {
    let judged = match change.kind {
        ChangeKind::Granted | ChangeKind::Completed | ChangeKind::Uncertain | ChangeKind::Lost => {
            true
        }
        // Only a resolution that the effect happened: it completes the key.
        ChangeKind::Resolved => matches!(
            &change.value,
            ChangeValue::Action(view) if view.status == KeyStatus::Completed
        ),
        _ => false,
    };
    (judged && change.key.starts_with(effect::KEY_PREFIX)).then(|| Input::WatchLease {
        kind: change.kind.as_str().to_string(),
        key: change.key.clone(),
        holder: String::new(),
        fence: change.fence,
    })
}

/// An acknowledged grant: its key and fence.
fn acknowledged_grant(op: &Op) -> Option<(&str, u64)> {
    match (&op.input, op.ok()) {
        (Input::Acquire { key, .. }, Some(Output::Granted { fence, .. })) => Some((key, *fence)),
        _ => None,
    }
}

/// Whether `op` is a holder's call that may have ended the attempt `(key, fence)`'s intent: a
/// completion or a `mark_uncertain` of it, not refused.
fn may_end(op: &Op) -> Option<(&str, u64)> {
    match &op.input {
        Input::CompleteEffect { key, fence, .. } | Input::MarkUncertain { key, fence, .. }
            if op.refused().is_none() =>
        {
            Some((key, *fence))
        }
        _ => None,
    }
}

/// Whether every change the watch must deliver so far was delivered (see `missed`).
pub fn all_delivered(history: &[Op]) -> bool {
    missed(history).is_empty()
}

/// Every change an acknowledged call made that the watch has not delivered (see the module
/// comment): its key, what is missing, and the call's op.
fn missed(history: &[Op]) -> Vec<(&str, String, usize)> {
    let since = watcher::compacted_at(history, NAME);
    let judged = |op: &Op| since.is_none_or(|since| op.call > since);
    let mut delivered: BTreeSet<(&str, &str, u64)> = BTreeSet::new();
    let mut settled: BTreeSet<&str> = BTreeSet::new();
    for d in deliveries(history, NAME) {
        delivered.insert((d.kind, d.key, d.fence));
        if matches!(d.kind, "completed" | "resolved") {
            settled.insert(d.key);
        }
    }
    let ended: BTreeSet<(&str, u64)> = history.iter().filter_map(may_end).collect();
    // Keys a completion or resolution was sent for before the compaction: the change that
    // completed the key may have been compacted away, and a later completion or resolution
    // only answers the first result, changing nothing.
    let compacted: BTreeSet<&str> = history
        .iter()
        .filter(|op| !judged(op))
        .filter_map(|op| match &op.input {
            Input::CompleteEffect { key, .. } | Input::Resolve { key, .. } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    let mut missing = Vec::new();
    for op in history.iter().filter(|op| judged(op)) {
        if let Some((key, fence)) = acknowledged_grant(op) {
            if !delivered.contains(&("granted", key, fence)) {
                missing.push((key, format!("the grant at fence {fence}"), op.index));
            }
            if !ended.contains(&(key, fence)) && !delivered.contains(&("lost", key, fence)) {
                missing.push((
                    key,
                    format!(
                        "the loss of the intent of the attempt at fence {fence} (never completed \
                         or marked uncertain)"
                    ),
                    op.index,
                ));
            }
        }
        match (&op.input, op.ok()) {
            // A mark applied once the intent had run out answers as well, with no change of its
            // own: the key was made uncertain by the `lost`.
            (Input::MarkUncertain { key, fence, .. }, Some(_))
                if !delivered.contains(&("uncertain", key, *fence))
                    && !delivered.contains(&("lost", key, *fence)) =>
            {
                missing.push((
                    key,
                    format!("the mark_uncertain of the attempt at fence {fence}"),
                    op.index,
                ));
            }
            (Input::CompleteEffect { key, .. }, Some(_))
            | (
                Input::Resolve {
                    key,
                    happened: true,
                    ..
                },
                Some(_),
            ) if !settled.contains(key.as_str()) && !compacted.contains(key.as_str()) => {
                missing.push((key, "the key's completion".to_string(), op.index));
            }
            _ => {}
        }
    }
    missing
}

/// Every side-effect watch checker (see the module comment). `complete`: the run was read back
/// and the watch given time to catch up, so every acknowledged change must have been delivered.
pub fn check(history: &[Op], complete: bool) -> Vec<Violation> {
    let ttl_us = u64::try_from(TTL_MS).unwrap_or(0) * 1000;
    let mut grants: BTreeMap<(&str, u64), &Op> = BTreeMap::new();
    // The holder's calls that ended an attempt for certain before its intent could run out.
    let mut ended_in_time: BTreeMap<(&str, u64), &Op> = BTreeMap::new();
    // The first sending, not refused, of each call a delivery can name: (kind, key, fence or 0).
    let mut first_sent: BTreeMap<(&str, &str, u64), u64> = BTreeMap::new();
    for op in history {
        if let Some((key, fence)) = acknowledged_grant(op) {
            grants.entry((key, fence)).or_insert(op);
        }
        if op.refused().is_some() {
            continue;
        }
        let named: Vec<(&str, &str, u64)> = match &op.input {
            Input::Acquire { key, .. } => vec![("granted", key, 0), ("lost", key, 0)],
            Input::MarkUncertain { key, fence, .. } => vec![("uncertain", key, *fence)],
            Input::CompleteEffect { key, .. } => vec![("completed", key, 0)],
            Input::Resolve { key, .. } => vec![("resolved", key, 0)],
            _ => Vec::new(),
        };
        for (kind, key, fence) in named {
            let at = first_sent.entry((kind, key, fence)).or_insert(op.call);
            *at = (*at).min(op.call);
        }
    }
    for op in history {
        let (Some((key, fence)), Some(ret)) = (may_end(op), op.ret) else {
            continue;
        };
        let in_time = op.ok().is_some()
            && grants
                .get(&(key, fence))
                .is_some_and(|grant| ret + CLOCK_SLACK_US < grant.call + ttl_us);
        if in_time {
            ended_in_time.entry((key, fence)).or_insert(op);
        }
    }
    let mut findings = Vec::new();
    for d in deliveries(history, NAME) {
        let named_fence = if d.kind == "uncertain" { d.fence } else { 0 };
        let explained = first_sent
            .get(&(d.kind, d.key, named_fence))
            .is_some_and(|sent| *sent < d.op.call);
        if !explained {
            findings.push((
                "watch-effect-phantom",
                d.key,
                format!(
                    "delivered {} at fence {}, which no call sent before (and not refused) \
                     explains",
                    d.kind, d.fence
                ),
                vec![d.op.index],
            ));
        }
        if d.kind == "lost" {
            let attempt = (d.key, d.fence);
            if let Some(grant) = grants.get(&attempt) {
                if d.op.call + CLOCK_SLACK_US < grant.call + ttl_us {
                    findings.push((
                        "watch-lost-early",
                        d.key,
                        format!(
                            "delivered the loss of the intent of the attempt at fence {} {} ms \
                             after its acquire was sent, within its {TTL_MS} ms TTL",
                            d.fence,
                            d.op.call.saturating_sub(grant.call) / 1000
                        ),
                        vec![grant.index, d.op.index],
                    ));
                }
            }
            if let Some(end) = ended_in_time.get(&attempt) {
                findings.push((
                    "watch-lost-ended",
                    d.key,
                    format!(
                        "delivered the loss of the intent of the attempt at fence {}, which its \
                         holder had ended in time ({})",
                        d.fence, end.input
                    ),
                    vec![end.index, d.op.index],
                ));
            }
        }
    }
    let missed = complete.then(|| ("watch-effect-missed", missed(history)));
    watcher::lease_verdict(
        history,
        NAME,
        ("granted", "watch-effect-phantom"),
        findings,
        missed,
    )
}
