//! The queue's watch: a fifth watch ([`super::watcher`] runs it) follows every queue change from
//! the first revision for the whole run and records each change of an attempt's lease —
//! `leased`, `started`, `succeeded`, `lost` — with its worker, permit token (the change's fence)
//! and position.
//!
//! A `lost` is the prompt a worker, or whoever watches its work, acts on when an attempt's lease
//! ran out (docs/watch.md, "Lease loss"): one sent for a live lease tells a worker to stop while
//! its permit still holds, and one never sent leaves the watcher waiting. Neither changes a task
//! or a permit, which is all the queue's own rules look at.
//!
//! An attempt ends `EXPIRED` exactly when its lease runs out, and that is when `lost` is sent;
//! the read-back after recovery lists every task's attempts with their outcomes.
//!
//! Checked, on the queue workload's tasks (every one of them keyed, so an attempt is its task
//! and permit token):
//! - `watch-queue-missed` (once the run was read back): every attempt an acknowledged lease
//!   handed out was delivered `leased`, with its worker and token; every acknowledged start
//!   `started`, every acknowledged completion `succeeded`, with the worker that sent it; and the
//!   `lost` of every attempt a read showed `EXPIRED`, or, where no read did, of every leased
//!   attempt no call can have ended (no end of it and no cancel of its task sent, or every one
//!   refused) — except what can have happened before a compaction the watch met (a call sent
//!   before it; any expiry of an attempt whose lease was not acknowledged after it);
//! - `watch-queue-phantom`: every delivered change names a call sent, and not refused, before
//!   it was delivered: a lease by its worker not answered with other work (`leased`, `lost`), a
//!   start (`started`) or completion (`succeeded`) of that attempt by that worker; no attempt
//!   is delivered one kind of change twice; and every other change of an attempt comes after the
//!   watch delivered its `leased` (judged up to the first compaction the watch met);
//! - `watch-lost-early`: no `lost` is delivered before its lease certainly ran out: the lease
//!   TTL counted from the lease's sending (the workload never renews, a start does not extend a
//!   lease, and a task lives an hour, so its total deadline never ends an attempt), less
//!   [`CLOCK_SLACK_US`];
//! - `watch-lost-ended`: no attempt is delivered `lost` whose end (complete, fail or unknown) was
//!   acknowledged (an attempt that ran out is refused `LEASE_LOST`), or that a read answered
//!   after the delivery showed with another outcome than `EXPIRED` (an ended attempt's outcome
//!   never changes; a live one's lease had not run out).

use std::collections::{BTreeMap, BTreeSet};

use baton_statemachine::{Change, ChangeKind, ChangeValue};

use super::check::{Violation, CLOCK_SLACK_US};
use super::history::{AttemptEnd, Input, Op, Output};
use super::queue::{LEASE_TTL_MS, QUEUE};
use super::watcher::{self, deliveries, Delivery, Finding};

/// The client name the queue watch's changes are recorded under.
pub const NAME: &str = "queue-watcher";

/// What the watch records of `change`: a change of an attempt's lease.
pub(super) fn recorded(change: &Change) -> Option<Input> {
    let judged = matches!(
        change.kind,
        ChangeKind::Leased | ChangeKind::Started | ChangeKind::Succeeded | ChangeKind::Lost
    );
    let ours = matches!(&change.value, ChangeValue::QueueTask(task) if task.spec.queue == QUEUE);
    (judged && ours).then(|| Input::WatchLease {
        kind: change.kind.as_str().to_string(),
        key: change.key.clone(),
        holder: change.holder.clone(),
        fence: change.fence,
    })
}

/// An attempt: its task (as the watch names it, in decimal) and permit token.
type Attempt = (String, u64);

/// What the run's calls say about each attempt.
#[derive(Default)]
struct Calls<'h> {
    /// Attempt -> its worker and the acknowledged lease that handed it out.
    leased: BTreeMap<Attempt, (&'h str, &'h Op)>,
    /// Worker -> its leases, whatever their outcome.
    leases: BTreeMap<&'h str, Vec<&'h Op>>,
    /// (kind, attempt, worker) -> the first sending, not refused, of a start (`started`), a
    /// completion (`succeeded`) or any end (`ended`) of it by that worker.
    sent: BTreeMap<(&'static str, Attempt, &'h str), u64>,
    /// Acknowledged starts (`started`), completions (`succeeded`) and ends (`ended`), and by
    /// which worker.
    acknowledged: BTreeMap<(&'static str, Attempt), (&'h Op, &'h str)>,
    /// Tasks some cancel not refused was sent for.
    cancelled: BTreeSet<String>,
    /// Attempt -> each read of its task that showed it, with its worker and outcome there.
    outcomes: BTreeMap<Attempt, Vec<(&'h Op, &'h str, &'h str)>>,
}

impl<'h> Calls<'h> {
    fn of(history: &'h [Op]) -> Self {
        let mut calls = Calls::default();
        for op in history {
            let refused = op.refused().is_some();
            match &op.input {
                Input::Lease { worker } => {
                    calls.leases.entry(worker).or_default().push(op);
                    if let Some(Output::Leased(assignments)) = op.ok() {
                        for a in assignments {
                            let attempt = (a.task.to_string(), a.token.unwrap_or(a.attempt.into()));
                            calls.leased.entry(attempt).or_insert((worker, op));
                        }
                    }
                }
                Input::StartAttempt {
                    task,
                    token,
                    worker,
                    ..
                } => {
                    calls.note(op, refused, "started", (task.to_string(), *token), worker);
                }
                Input::EndAttempt {
                    task,
                    token,
                    worker,
                    end,
                    ..
                } => {
                    let attempt = (task.to_string(), *token);
                    if *end == AttemptEnd::Complete {
                        calls.note(op, refused, "succeeded", attempt.clone(), worker);
                    }
                    calls.note(op, refused, "ended", attempt, worker);
                }
                Input::Attempts { task } => {
                    if let Some(Output::AttemptList { attempts, .. }) = op.ok() {
                        for a in attempts {
                            let attempt = (task.to_string(), a.token.unwrap_or(a.number.into()));
                            let seen = calls.outcomes.entry(attempt).or_default();
                            seen.push((op, &a.worker, &a.outcome));
                        }
                    }
                }
                Input::CancelTask { task, .. } if !refused => {
                    calls.cancelled.insert(task.to_string());
                }
                _ => {}
            }
        }
        calls
    }

    fn note(
        &mut self,
        op: &'h Op,
        refused: bool,
        kind: &'static str,
        attempt: Attempt,
        worker: &'h str,
    ) {
        if !refused {
            let at = self
                .sent
                .entry((kind, attempt.clone(), worker))
                .or_insert(op.call);
            *at = (*at).min(op.call);
        }
        if op.ok().is_some() {
            self.acknowledged
                .entry((kind, attempt))
                .or_insert((op, worker));
        }
    }

    /// The worker of `attempt` if a read showed it `EXPIRED`, `Some(None)` if reads showed it
    /// only with other outcomes, `None` when no read showed it.
    fn expired(&self, attempt: &Attempt) -> Option<Option<&'h str>> {
        let seen = self.outcomes.get(attempt)?;
        Some(
            seen.iter()
                .find(|(_, _, outcome)| *outcome == "EXPIRED")
                .map(|(_, worker, _)| *worker),
        )
    }

    /// Whether a lease by `worker` sent before `before` may have handed out `attempt`: one not
    /// refused, and not answered with other work (or none).
    fn may_have_leased(&self, worker: &str, attempt: &Attempt, before: u64) -> bool {
        self.leases.get(worker).is_some_and(|leases| {
            leases.iter().any(|op| {
                let other = match op.ok() {
                    Some(Output::Leased(assignments)) => !assignments.iter().any(|a| {
                        a.task.to_string() == attempt.0
                            && a.token.unwrap_or(a.attempt.into()) == attempt.1
                    }),
                    _ => false,
                };
                op.call < before && op.refused().is_none() && !other
            })
        })
    }
}

/// Whether every change the watch must deliver so far was delivered (see `missed`).
pub fn all_delivered(history: &[Op]) -> bool {
    missed(history).is_empty()
}

/// Every change an acknowledged call made that the watch has not delivered (see the module
/// comment): its task, what is missing, and the call's op.
fn missed(history: &[Op]) -> Vec<(String, String, usize)> {
    let since = watcher::compacted_at(history, NAME);
    let judged = |op: &Op| since.is_none_or(|since| op.call > since);
    let calls = Calls::of(history);
    let delivered = watcher::delivered_by_change(history, NAME);
    let delivered_to = |kind: &str, (task, token): &Attempt, worker: Option<&str>| {
        delivered
            .get(&(kind, task.as_str(), *token))
            .is_some_and(|workers| worker.is_none_or(|worker| workers.contains(&worker)))
    };
    let mut missing = Vec::new();
    for (attempt, &(worker, op)) in calls.leased.iter().filter(|(_, (_, op))| judged(op)) {
        let (task, token) = attempt;
        if !delivered_to("leased", attempt, Some(worker)) {
            missing.push((
                task.clone(),
                format!("the lease of the attempt with token {token} to {worker}"),
                op.index,
            ));
        }
        // Where no read showed the attempt, the calls tell whether it may have ended otherwise.
        let may_have_ended = calls
            .sent
            .keys()
            .any(|(kind, a, _)| *kind == "ended" && a == attempt)
            || calls.cancelled.contains(task);
        let unread = calls.expired(attempt).is_none();
        if unread && !may_have_ended && !delivered_to("lost", attempt, Some(worker)) {
            missing.push((
                task.clone(),
                format!(
                    "the loss of the attempt with token {token} leased to {worker} (never ended)"
                ),
                op.index,
            ));
        }
    }
    // Every attempt a read showed expired, unless its expiry may have been compacted away.
    for (attempt, seen) in &calls.outcomes {
        let Some(Some(worker)) = calls.expired(attempt) else {
            continue;
        };
        let after_compaction = since.is_none()
            || calls
                .leased
                .get(attempt)
                .is_some_and(|(_, lease)| judged(lease));
        if after_compaction && !delivered_to("lost", attempt, Some(worker)) {
            let index = seen
                .iter()
                .find(|(_, _, outcome)| *outcome == "EXPIRED")
                .map_or(0, |(read, _, _)| read.index);
            missing.push((
                attempt.0.clone(),
                format!(
                    "the loss of the attempt with token {} leased to {worker} (read back EXPIRED)",
                    attempt.1
                ),
                index,
            ));
        }
    }
    for ((kind, attempt), (op, worker)) in &calls.acknowledged {
        if *kind != "ended" && judged(op) && !delivered_to(kind, attempt, Some(worker)) {
            missing.push((
                attempt.0.clone(),
                format!(
                    "the {kind} of the attempt with token {} by {worker}",
                    attempt.1
                ),
                op.index,
            ));
        }
    }
    missing
}

/// Every queue watch checker (see the module comment). `complete`: the run was read back and
/// the watch given time to catch up, so every acknowledged change must have been delivered.
pub fn check(history: &[Op], complete: bool) -> Vec<Violation> {
    let calls = Calls::of(history);
    let ttl_us = u64::try_from(LEASE_TTL_MS).unwrap_or(0) * 1000;
    let mut findings: Vec<Finding<'_>> = Vec::new();
    let mut seen: BTreeSet<(&str, Attempt)> = BTreeSet::new();
    for d in deliveries(history, NAME) {
        let attempt = (d.key.to_string(), d.fence);
        let explained = match d.kind {
            "leased" | "lost" => calls.may_have_leased(d.holder, &attempt, d.op.call),
            kind => calls
                .sent
                .get(&(kind, attempt.clone(), d.holder))
                .is_some_and(|sent| *sent < d.op.call),
        };
        if !explained {
            findings.push(phantom(&d));
        }
        if !seen.insert((d.kind, attempt.clone())) {
            findings.push((
                "watch-queue-phantom",
                d.key,
                format!(
                    "delivered {} of the attempt with token {} a second time",
                    d.kind, d.fence
                ),
                vec![d.op.index],
            ));
        }
        if d.kind != "lost" {
            continue;
        }
        if let Some((_, lease)) = calls.leased.get(&attempt) {
            if d.op.call + CLOCK_SLACK_US < lease.call + ttl_us {
                findings.push((
                    "watch-lost-early",
                    d.key,
                    format!(
                        "delivered the loss of the attempt with token {} {} ms after its lease \
                         was sent, within its {LEASE_TTL_MS} ms TTL",
                        d.fence,
                        d.op.call.saturating_sub(lease.call) / 1000
                    ),
                    vec![lease.index, d.op.index],
                ));
            }
        }
        let read_otherwise = calls.outcomes.get(&attempt).and_then(|seen| {
            seen.iter()
                .find(|(read, _, outcome)| read.call > d.op.call && *outcome != "EXPIRED")
        });
        if let Some((read, _, outcome)) = read_otherwise {
            findings.push((
                "watch-lost-ended",
                d.key,
                format!(
                    "delivered the loss of the attempt with token {}, which a later read showed \
                     {outcome}",
                    d.fence
                ),
                vec![d.op.index, read.index],
            ));
        }
        if let Some((end, _)) = calls.acknowledged.get(&("ended", attempt)) {
            findings.push((
                "watch-lost-ended",
                d.key,
                format!(
                    "delivered the loss of the attempt with token {}, whose end was acknowledged",
                    d.fence
                ),
                vec![end.index, d.op.index],
            ));
        }
    }
    let missed = complete.then(|| missed(history));
    let missed = missed.as_ref().map(|missed| {
        let missed = missed
            .iter()
            .map(|(task, what, op)| (task.as_str(), what.clone(), *op))
            .collect();
        ("watch-queue-missed", missed)
    });
    watcher::lease_verdict(
        history,
        NAME,
        ("leased", "watch-queue-phantom"),
        findings,
        missed,
    )
}

/// The `watch-queue-phantom` finding for `d`.
fn phantom<'h>(d: &Delivery<'h>) -> Finding<'h> {
    (
        "watch-queue-phantom",
        d.key,
        format!(
            "delivered {} of the attempt with token {} by {}, which no call sent before (and not \
             refused) explains",
            d.kind, d.fence, d.holder
        ),
        vec![d.op.index],
    )
}
