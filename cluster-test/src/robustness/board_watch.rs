//! The board's watch: a second watch ([`super::watcher`] runs it) follows every board change
//! from the first revision for the whole run and records each change of a claim on the board
//! workload's tasks — `claimed`, `renewed`, `released`, `completed`, `lost` — with its agent,
//! fence and position.
//!
//! A `lost` is the prompt a holder acts on when its lease ends without its asking (docs/watch.md,
//! "Lease loss"): a store that sends one for a lease still live tells a holder to stop while it
//! may go on, and one that never sends it leaves a watcher waiting on a lease that ended. Neither
//! changes anything the board's own rules look at, and no other workload watches leases.
//!
//! Checked, on the tasks the board workload claims ([`board::TASK_PREFIX`]):
//! - `watch-lease-missed` (once the run was read back): every acknowledged claim, renewal and
//!   release was delivered, with its agent and fence; so was the `lost` of every acknowledged
//!   claim that no release can have ended (none sent, or every one refused) — except calls sent
//!   before a compaction the watch met (they may have been in the history compacted away);
//! - `watch-lease-phantom`: every delivered change names a call sent, and not refused, before it
//!   was delivered: a claim by its agent (for `claimed` and `lost`), a renewal or a release of
//!   its fence (the workload never completes a task, so no `completed` is explained); and every
//!   `renewed`, `released` or `lost` comes after the watch delivered that claim (judged up to
//!   the first compaction the watch met);
//! - `watch-lost-early`: no `lost` is delivered before its lease certainly ran out: its TTL,
//!   counted from the sending of the claim or of an acknowledged renewal of it (each applied
//!   after it was sent, and before the loss: a lost lease cannot be renewed), less
//!   [`CLOCK_SLACK_US`];
//! - `watch-lost-released`: no lease is both delivered `lost` and released by an acknowledged
//!   release (a released lease cannot run out, and a lost one is not released: `LEASE_LOST`);
//! - `watch-lease-overlap`: no `claimed` while the claim the watch last delivered on the task
//!   has not ended in the stream — released, completed or lost (docs/board.md: a lease ends
//!   only so; an expiry a claim finds is journalled as `lost` in the claim's own command, before
//!   its `claimed`). The watch delivers changes in log order, so a claim over a live one is two
//!   holders at once, which the answer-based rules (`exclusive-hold`, `unique-grant`) miss when
//!   one of the two answers was lost. A `COMPACTED` the watch met may have hidden an end, so a
//!   claim delivered before it is not held against one delivered after;
//! - `watch-order`: positions strictly increase, resumes included (as the checkpoint watch's).

use std::collections::{BTreeMap, BTreeSet};

use baton_statemachine::{Change, ChangeKind};

use super::board::{self, TTL_MS};
use super::check::{Violation, CLOCK_SLACK_US};
use super::history::{Input, Op, Output};
use super::watcher::{self, deliveries, Finding, Met};

/// The client name the board watch's changes are recorded under.
pub const NAME: &str = "board-watcher";

/// What the watch records of `change`: a change of a claim on a board workload task.
pub(super) fn recorded(change: &Change) -> Option<Input> {
    let judged = matches!(
        change.kind,
        ChangeKind::Claimed
            | ChangeKind::Renewed
            | ChangeKind::Released
            | ChangeKind::Completed
            | ChangeKind::Lost
    );
    (judged && change.key.starts_with(board::TASK_PREFIX)).then(|| Input::WatchLease {
        kind: change.kind.as_str().to_string(),
        key: change.key.clone(),
        holder: change.holder.clone(),
        fence: change.fence,
    })
}

/// An acknowledged claim: its task, agent and fence.
fn acknowledged_claim(op: &Op) -> Option<(&str, &str, u64)> {
    match (&op.input, op.ok()) {
        (Input::Claim { task, agent }, Some(Output::Lease { fence, .. })) if *fence > 0 => {
            Some((task, agent, *fence))
        }
        _ => None,
    }
}

/// Whether every change the watch must deliver so far was delivered (see `missed`).
pub fn all_delivered(history: &[Op]) -> bool {
    missed(history).is_empty()
}

/// Every change an acknowledged call made that the watch has not delivered (see the module
/// comment): its task, what is missing, and the call's op.
fn missed(history: &[Op]) -> Vec<(&str, String, usize)> {
    let since = watcher::compacted_at(history, NAME);
    let judged = |op: &Op| since.is_none_or(|since| op.call > since);
    let delivered = watcher::delivered_by_change(history, NAME);
    let count = |kind: &str, task: &str, fence: u64| {
        delivered
            .get(&(kind, task, fence))
            .map_or(0, std::vec::Vec::len)
    };
    let delivered_to = |kind: &str, task: &str, fence: u64, agent: &str| {
        delivered
            .get(&(kind, task, fence))
            .is_some_and(|agents| agents.contains(&agent))
    };
    // Per lease (task, fence): whether a release of it may have ended it, and its acknowledged
    // renewals.
    let mut released: BTreeSet<(&str, u64)> = BTreeSet::new();
    let mut renewals: BTreeMap<(&str, u64), Vec<usize>> = BTreeMap::new();
    for op in history {
        match &op.input {
            Input::ReleaseTask { task, fence, .. } if op.refused().is_none() => {
                released.insert((task, *fence));
            }
            Input::RenewTask { task, fence, .. } if op.ok().is_some() && judged(op) => {
                renewals.entry((task, *fence)).or_default().push(op.index);
            }
            _ => {}
        }
    }
    let mut missing = Vec::new();
    for op in history.iter().filter(|op| judged(op)) {
        if let Some((task, agent, fence)) = acknowledged_claim(op) {
            if !delivered_to("claimed", task, fence, agent) {
                missing.push((
                    task,
                    format!("the claim at fence {fence} by {agent}"),
                    op.index,
                ));
            }
            if !released.contains(&(task, fence)) && !delivered_to("lost", task, fence, agent) {
                missing.push((
                    task,
                    format!("the loss of the claim at fence {fence} by {agent} (never released)"),
                    op.index,
                ));
            }
        }
        if let (Input::ReleaseTask { task, fence, .. }, Some(_)) = (&op.input, op.ok()) {
            if count("released", task, *fence) == 0 {
                missing.push((
                    task,
                    format!("the release of the claim at fence {fence}"),
                    op.index,
                ));
            }
        }
    }
    for ((task, fence), ops) in renewals {
        let got = count("renewed", task, fence);
        if got < ops.len() {
            missing.push((
                task,
                format!(
                    "{} of the {} acknowledged renewals of the claim at fence {fence} (delivered {got})",
                    ops.len() - got,
                    ops.len()
                ),
                ops[got],
            ));
        }
    }
    missing
}

/// Every board watch checker (see the module comment). `complete`: the run was read back and
/// the watch given time to catch up, so every acknowledged change must have been delivered.
pub fn check(history: &[Op], complete: bool) -> Vec<Violation> {
    let ttl_us = u64::try_from(TTL_MS).unwrap_or(0) * 1000;
    let mut claims: BTreeMap<(&str, u64), &Op> = BTreeMap::new();
    let mut renewed: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    let mut released: BTreeMap<(&str, u64), &Op> = BTreeMap::new();
    for op in history {
        if let Some((task, _, fence)) = acknowledged_claim(op) {
            claims.entry((task, fence)).or_insert(op);
        }
        match (&op.input, op.ok()) {
            (Input::RenewTask { task, fence, .. }, Some(_)) => {
                let at = renewed.entry((task, *fence)).or_insert(op.call);
                *at = (*at).max(op.call);
            }
            (Input::ReleaseTask { task, fence, .. }, Some(_)) => {
                released.entry((task, *fence)).or_insert(op);
            }
            _ => {}
        }
    }
    // The first sending, not refused, of each call a delivery can name: (kind, task, agent or
    // fence as text) -> when.
    let mut first_sent: BTreeMap<(&str, &str, String), u64> = BTreeMap::new();
    for op in history.iter().filter(|op| op.refused().is_none()) {
        let named = match &op.input {
            Input::Claim { task, agent } => vec![
                ("claimed", task, agent.clone()),
                ("lost", task, agent.clone()),
            ],
            Input::RenewTask { task, fence, .. } => vec![("renewed", task, fence.to_string())],
            Input::ReleaseTask { task, fence, .. } => vec![("released", task, fence.to_string())],
            _ => Vec::new(),
        };
        for (kind, task, who) in named {
            let at = first_sent.entry((kind, task, who)).or_insert(op.call);
            *at = (*at).min(op.call);
        }
    }
    let mut findings = Vec::new();
    for d in deliveries(history, NAME) {
        let who = match d.kind {
            "claimed" | "lost" => d.holder.to_string(),
            _ => d.fence.to_string(),
        };
        let explained = first_sent
            .get(&(d.kind, d.key, who))
            .is_some_and(|sent| *sent < d.op.call);
        if !explained {
            findings.push((
                "watch-lease-phantom",
                d.key,
                format!(
                    "delivered {} of the claim at fence {} by {}, which no call sent before \
                     (and not refused) explains",
                    d.kind, d.fence, d.holder
                ),
                vec![d.op.index],
            ));
        }
        if d.kind == "lost" {
            let key = (d.key, d.fence);
            if let Some(claim) = claims.get(&key) {
                let since = renewed.get(&key).copied().unwrap_or(0).max(claim.call);
                if d.op.call + CLOCK_SLACK_US < since + ttl_us {
                    findings.push((
                        "watch-lost-early",
                        d.key,
                        format!(
                            "delivered the loss of the claim at fence {} {} ms after it (or an \
                             acknowledged renewal of it) was sent, within its {TTL_MS} ms TTL",
                            d.fence,
                            d.op.call.saturating_sub(since) / 1000
                        ),
                        vec![claim.index, d.op.index],
                    ));
                }
            }
            if let Some(release) = released.get(&key) {
                findings.push((
                    "watch-lost-released",
                    d.key,
                    format!(
                        "delivered the loss of the claim at fence {}, whose release was \
                         acknowledged",
                        d.fence
                    ),
                    vec![release.index, d.op.index],
                ));
            }
        }
    }
    findings.extend(overlaps(history));
    let missed = complete.then(|| ("watch-lease-missed", missed(history)));
    watcher::lease_verdict(
        history,
        NAME,
        ("claimed", "watch-lease-phantom"),
        findings,
        missed,
    )
}

/// The kinds of change that end a claim on a task (docs/board.md): its holder gave it back or
/// finished the task, or it ran out or a re-seed cleared it (`lost`).
const ENDS: [&str; 3] = ["released", "completed", "lost"];

/// `watch-lease-overlap`: a `claimed` delivered while the claim the watch last delivered on the
/// task had not ended in the stream (see the module comment).
fn overlaps(history: &[Op]) -> Vec<Finding<'_>> {
    // Task -> the claim delivered on it and not ended since, since the latest compaction.
    let mut live: BTreeMap<&str, (u64, &Op)> = BTreeMap::new();
    let mut findings = Vec::new();
    for met in watcher::met(history, NAME) {
        let d = match met {
            Met::Compacted => {
                live.clear();
                continue;
            }
            Met::Change(d) => d,
        };
        if ENDS.contains(&d.kind) {
            if live.get(d.key).is_some_and(|(fence, _)| *fence == d.fence) {
                live.remove(d.key);
            }
            continue;
        }
        if d.kind != "claimed" {
            continue;
        }
        if let Some((fence, claim)) = live.insert(d.key, (d.fence, d.op)) {
            findings.push((
                "watch-lease-overlap",
                d.key,
                format!(
                    "delivered a claim at fence {} by {} while the claim at fence {fence} ({}) \
                     had been neither released, completed nor lost: two holders at once (or a \
                     stream that skipped its end)",
                    d.fence, d.holder, claim.input
                ),
                vec![claim.index, d.op.index],
            ));
        }
    }
    findings
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::robustness::test_history::{rules, H};

    const TASK: &str = "task-0";

    fn claim(agent: &str) -> Input {
        Input::Claim {
            task: TASK.into(),
            agent: agent.into(),
        }
    }

    fn lease(fence: u64) -> Output {
        Output::Lease {
            fence,
            token: format!("t{fence}"),
            until_ms: None,
        }
    }

    fn release(fence: u64) -> Input {
        Input::ReleaseTask {
            task: TASK.into(),
            token: format!("t{fence}"),
            fence,
        }
    }

    /// a0's claim at fence 1, acknowledged and delivered; a1's claim sent at 20 ms, its answer
    /// lost.
    fn claimed_once() -> H {
        let mut h = H::default();
        h.ok("a0", claim("a0"), 0, 10, lease(1));
        h.delivered(NAME, ("claimed", TASK, "a0", 1), 11, 5);
        h.ambiguous("a1", claim("a1"), 20);
        h
    }

    /// The rules the checker reports on `h` (before the read-back).
    fn found(h: &H) -> Vec<String> {
        rules(&check(&h.ops, false))
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// a1's claim granted over a0's live one: only the watch shows it.
    #[test]
    fn a_claim_over_a_live_one_is_an_overlap() {
        let mut h = claimed_once();
        h.delivered(NAME, ("claimed", TASK, "a1", 2), 30, 6);
        let violations = check(&h.ops, false);
        assert_eq!(rules(&violations), ["watch-lease-overlap"]);
        assert_eq!(violations[0].ops, [1, 3]);

        // The end of another claim (itself a phantom) does not end this one.
        let mut h = claimed_once();
        h.delivered(NAME, ("lost", TASK, "a0", 7), 4_001, 6);
        h.delivered(NAME, ("claimed", TASK, "a1", 2), 4_001, 7);
        assert_eq!(found(&h), ["watch-lease-overlap", "watch-lease-phantom"]);
    }

    /// Legal: the claim before ended — released, or lost once its TTL ran out (the claim that
    /// found it expired journals the `lost` first) — before the next was delivered.
    #[test]
    fn a_claim_after_the_end_of_the_one_before_is_no_overlap() {
        let mut h = claimed_once();
        h.ok("a0", release(1), 15, 18, Output::Done);
        h.delivered(NAME, ("released", TASK, "a0", 1), 19, 6);
        h.delivered(NAME, ("claimed", TASK, "a1", 2), 30, 7);
        assert!(found(&h).is_empty());

        let mut h = claimed_once();
        h.delivered(NAME, ("lost", TASK, "a0", 1), 4_001, 6);
        h.delivered(NAME, ("claimed", TASK, "a1", 2), 4_001, 7);
        assert!(found(&h).is_empty());
    }

    /// Legal: a `COMPACTED` may have hidden the end of the claim delivered before it; and one
    /// change delivered twice at one position is `watch-order`'s, not a second claim.
    #[test]
    fn a_gap_or_a_repeated_delivery_is_no_overlap() {
        let mut h = claimed_once();
        h.compacted(NAME, 25, 9);
        h.delivered(NAME, ("claimed", TASK, "a1", 2), 30, 10);
        assert!(found(&h).is_empty());

        let mut h = claimed_once();
        h.delivered(NAME, ("claimed", TASK, "a0", 1), 30, 5);
        assert_eq!(found(&h), ["watch-order"]);
    }
}
