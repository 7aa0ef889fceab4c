//! Watch workload: one client follows every checkpoint change from the first revision for the
//! whole run — through every fault, resuming on another node as the library does — and records
//! each change it is delivered (a `saved` of a run: its seq and data) in the history, with its
//! position; five more follow the tickets', the board's, the side-effect gate's, the queue's and
//! the fenced sinks' changes the same way ([`handoff_watch`], [`board_watch`], [`effect_watch`],
//! [`queue_watch`] and [`sink_watch`] judge them). After the read-back they wait (bounded)
//! until they have been delivered every acknowledged change they judge, then stop.
//!
//! Checked (docs/watch.md: "no gap and no duplicate"): positions strictly increase across the
//! whole watch, resumes included; every delivered save was sent (not refused) before it was
//! delivered; a save acknowledged before another was sent is delivered first (commit order is
//! revision order); and every acknowledged save is delivered — unless the history it was in was
//! compacted away (a typed `COMPACTED`, recorded: the watch then continues from the oldest
//! revision kept, and only saves sent after that are required).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::{Client, Error};
use baton_statemachine::{Change, ChangeFilter, ChangeValue, Primitive};
use futures::StreamExt;
use tokio::task::JoinHandle;

use super::check::Violation;
use super::history::{Input, Op, Output, Recorder};
use super::{board_watch, effect_watch, handoff_watch, queue_watch, sink_watch};

/// The client name the checkpoint watch's events are recorded under.
pub const NAME: &str = "watcher";

/// One watch the run keeps open: the client name its events are recorded under, what it
/// follows, and what of a change it records (nothing: a change it does not judge).
struct Follow {
    name: &'static str,
    filter: ChangeFilter,
    record: fn(&Change) -> Option<Input>,
}

/// The running watches (stopped when dropped): the checkpoint watch of this module, the
/// tickets' ([`handoff_watch`]), the board's ([`board_watch`]), the side-effect gate's
/// ([`effect_watch`]), the queue's ([`queue_watch`]) and the sinks' ([`sink_watch`]).
pub struct Watcher {
    stop: Arc<AtomicBool>,
    /// Each watch's client name and task.
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Drop for Watcher {
    /// A run that ends early (a set-up or read-back error) leaves no watch behind.
    fn drop(&mut self) {
        for (_, task) in &self.tasks {
            task.abort();
        }
    }
}

impl Watcher {
    /// Starts following every checkpoint, ticket, board, side-effect, queue and sink change
    /// from revision 1.
    pub fn start(client: Client, rec: Recorder) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let follows = [
            Follow {
                name: NAME,
                filter: ChangeFilter {
                    primitive: Some(Primitive::Checkpoint),
                    ..ChangeFilter::default()
                },
                record: saved,
            },
            Follow {
                name: handoff_watch::NAME,
                filter: ChangeFilter {
                    primitive: Some(Primitive::Handoff),
                    ..ChangeFilter::default()
                },
                record: handoff_watch::recorded,
            },
            Follow {
                name: board_watch::NAME,
                filter: ChangeFilter {
                    primitive: Some(Primitive::Board),
                    ..ChangeFilter::default()
                },
                record: board_watch::recorded,
            },
            Follow {
                name: effect_watch::NAME,
                filter: ChangeFilter {
                    primitive: Some(Primitive::Effect),
                    ..ChangeFilter::default()
                },
                record: effect_watch::recorded,
            },
            Follow {
                name: queue_watch::NAME,
                filter: ChangeFilter {
                    primitive: Some(Primitive::Queue),
                    ..ChangeFilter::default()
                },
                record: queue_watch::recorded,
            },
            Follow {
                name: sink_watch::NAME,
                filter: ChangeFilter {
                    primitive: Some(Primitive::Sink),
                    ..ChangeFilter::default()
                },
                record: sink_watch::recorded,
            },
        ];
        let tasks = follows
            .into_iter()
            .map(|follow| {
                let name = follow.name;
                let task = tokio::spawn(run(follow, client.clone(), rec.clone(), stop.clone()));
                (name, task)
            })
            .collect();
        Watcher { stop, tasks }
    }

    /// Waits until every change acknowledged in `rec` so far has been delivered (or every watch
    /// ended, or `limit` passed), then stops the watches. A watch stopped by a panic (the library
    /// on an answer it could not handle) is a violation (`workload-panic`).
    pub async fn catch_up_and_stop(mut self, rec: &Recorder, limit: Duration) -> Vec<Violation> {
        let tasks = std::mem::take(&mut self.tasks);
        let deadline = tokio::time::Instant::now() + limit;
        while !tasks.iter().all(|(_, task)| task.is_finished())
            && tokio::time::Instant::now() < deadline
        {
            if rec.inspect(|history| {
                missed(history).is_empty()
                    && handoff_watch::all_delivered(history)
                    && board_watch::all_delivered(history)
                    && effect_watch::all_delivered(history)
                    && queue_watch::all_delivered(history)
                    && sink_watch::all_delivered(history)
            }) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The loops look at the flag between events and every 200 ms while none comes; one
        // still (re)opening its stream (up to the client's deadline) is aborted.
        self.stop.store(true, Ordering::Relaxed);
        let mut violations = Vec::new();
        for (name, mut task) in tasks {
            match tokio::time::timeout(Duration::from_secs(1), &mut task).await {
                Ok(Err(error)) if error.is_panic() => violations.push(Violation::new(
                    "workload-panic",
                    name,
                    format!("the watch stopped by a panic: {error}"),
                    Vec::new(),
                )),
                Ok(_) => {}
                Err(_) => task.abort(),
            }
        }
        violations
    }
}

/// A delivered checkpoint save, as recorded.
fn saved(change: &Change) -> Option<Input> {
    let ChangeValue::Checkpoint(checkpoint) = &change.value else {
        return None;
    };
    Some(Input::WatchSaved {
        run: change.key.clone(),
        seq: checkpoint.seq,
        data: String::from_utf8_lossy(&checkpoint.data).into_owned(),
    })
}

/// Follows one watch's changes until `stop`, recording what it judges of each and each
/// compaction.
async fn run(follow: Follow, client: Client, rec: Recorder, stop: Arc<AtomicBool>) {
    let Follow {
        name,
        filter,
        record,
    } = follow;
    let mut watch = client.watch(filter.clone(), Some(1)).await;
    while !stop.load(Ordering::Relaxed) {
        let next = tokio::select! {
            next = watch.next() => next,
            _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
        };
        match next {
            Some(Ok(event)) => {
                if let Some(input) = record(&event.change) {
                    rec.observe(
                        name,
                        input,
                        Output::Position {
                            revision: event.revision,
                            index: event.index,
                        },
                    );
                }
            }
            Some(Err(Error::Compacted {
                requested,
                oldest_available,
            })) if oldest_available > requested => {
                rec.observe(
                    name,
                    Input::WatchCompacted { requested },
                    Output::Position {
                        revision: oldest_available,
                        index: 0,
                    },
                );
                watch = client.watch(filter.clone(), Some(oldest_available)).await;
            }
            // The library resumes by itself through node failures; it ends a watch only when
            // it cannot go on. Start again where it stopped.
            Some(Err(Error::Unavailable { .. })) | None => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                watch = client.resume_watch(&watch).await;
            }
            // Also a `COMPACTED` it cannot go on from (the nodes belong to another cluster).
            Some(Err(error)) => {
                rec.observe(
                    name,
                    Input::WatchEnded {
                        error: error.to_string(),
                    },
                    Output::Done,
                );
                return;
            }
        }
    }
}

/// A change of a ticket or a lease `watch` delivered ([`Input::WatchLease`]).
pub(super) struct Delivery<'h> {
    pub op: &'h Op,
    pub kind: &'h str,
    pub key: &'h str,
    pub holder: &'h str,
    pub fence: u64,
}

/// The changes of leases `watch` (its client name) delivered, in order.
pub(super) fn deliveries<'h>(history: &'h [Op], watch: &str) -> Vec<Delivery<'h>> {
    history
        .iter()
        .filter(|op| op.client == watch)
        .filter_map(|op| match &op.input {
            Input::WatchLease {
                kind,
                key,
                holder,
                fence,
            } => Some(Delivery {
                op,
                kind,
                key,
                holder,
                fence: *fence,
            }),
            _ => None,
        })
        .collect()
}

/// What a lease watch met, in the order it met it ([`met`]).
pub(super) enum Met<'h> {
    /// A change delivered past every earlier delivery's position.
    Change(Delivery<'h>),
    /// A `COMPACTED`: the watch went on past changes it never delivered.
    Compacted,
}

/// `watch`'s deliveries of leases and its compactions, in the order it met them, without the
/// deliveries at or below an earlier delivery's position: those repeat a change already
/// delivered or come out of order, which `watch-order` reports, so rules that count a key's
/// changes (a second grant, a claim over a live one) must not count them again.
pub(super) fn met<'h>(history: &'h [Op], watch: &str) -> Vec<Met<'h>> {
    let mut latest: Option<(u64, u32)> = None;
    let mut met = Vec::new();
    for op in history.iter().filter(|op| op.client == watch) {
        match (&op.input, op.ok()) {
            (Input::WatchCompacted { .. }, _) => met.push(Met::Compacted),
            (
                Input::WatchLease {
                    kind,
                    key,
                    holder,
                    fence,
                },
                Some(Output::Position { revision, index }),
            ) => {
                let at = (*revision, *index);
                if latest.is_some_and(|latest| at <= latest) {
                    continue;
                }
                latest = Some(at);
                met.push(Met::Change(Delivery {
                    op,
                    kind,
                    key,
                    holder,
                    fence: *fence,
                }));
            }
            _ => {}
        }
    }
    met
}

/// What a lease watch delivered, by change `(kind, key, fence)`: the agent each delivery named.
pub(super) type Delivered<'h> = BTreeMap<(&'h str, &'h str, u64), Vec<&'h str>>;

/// `watch`'s deliveries, by change (see [`Delivered`]).
pub(super) fn delivered_by_change<'h>(history: &'h [Op], watch: &str) -> Delivered<'h> {
    let mut delivered = Delivered::new();
    for d in deliveries(history, watch) {
        delivered
            .entry((d.kind, d.key, d.fence))
            .or_default()
            .push(d.holder);
    }
    delivered
}

/// A lease watch's finding: rule, key, message, the ops that show it.
pub(super) type Finding<'h> = (&'static str, &'h str, String, Vec<usize>);

/// `rule` findings for `watch`'s deliveries of a lease `(key, fence)` other than its grant (of
/// kind `granted`) that come before the watch delivered that grant: up to the first compaction
/// it met, after which the grant may have been in the history compacted away.
pub(super) fn before_their_grant<'h>(
    history: &'h [Op],
    watch: &str,
    granted: &str,
    rule: &'static str,
) -> Vec<Finding<'h>> {
    let until = history
        .iter()
        .filter(|op| op.client == watch && matches!(op.input, Input::WatchCompacted { .. }))
        .map(|op| op.call)
        .min()
        .unwrap_or(u64::MAX);
    let mut seen: BTreeSet<(&str, u64)> = BTreeSet::new();
    let mut early = Vec::new();
    for d in deliveries(history, watch) {
        if d.op.call >= until {
            break;
        }
        if d.kind == granted {
            seen.insert((d.key, d.fence));
        } else if d.fence > 0 && !seen.contains(&(d.key, d.fence)) {
            early.push((
                rule,
                d.key,
                format!(
                    "delivered {} at fence {} before the watch delivered its {granted}",
                    d.kind, d.fence
                ),
                vec![d.op.index],
            ));
        }
    }
    early
}

/// A lease watch's verdict on its `findings`: its positions strictly increase
/// (`watch-order`); the findings, with the changes delivered before the watch delivered their
/// lease's grant (of kind `granted`, reported as `phantom`), at most [`REPORTED_PER_KEY`] per
/// rule and key; and, once the run was read back (`missed` given), the first few of what it
/// missed, as that rule.
pub(super) fn lease_verdict<'h>(
    history: &'h [Op],
    watch: &str,
    (granted, phantom): (&str, &'static str),
    mut findings: Vec<Finding<'h>>,
    missed: Option<(&str, Vec<Missed<'_>>)>,
) -> Vec<Violation> {
    let mut violations = increasing_positions(&positions(history, watch));
    findings.extend(before_their_grant(history, watch, granted, phantom));
    violations.extend(capped(findings));
    if let Some((rule, missed)) = missed {
        violations.extend(missed_changes(rule, missed));
    }
    violations
}

/// How many violations of one rule a lease watch reports per key.
const REPORTED_PER_KEY: usize = 3;

/// A lease watch's findings `(rule, key, message, ops)` as violations, at most
/// [`REPORTED_PER_KEY`] per rule and key.
pub(super) fn capped(findings: Vec<Finding<'_>>) -> Vec<Violation> {
    let mut found: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut violations = Vec::new();
    for (rule, key, message, ops) in findings {
        let seen = found.entry((rule, key)).or_default();
        *seen += 1;
        if *seen <= REPORTED_PER_KEY {
            violations.push(Violation::new(rule, key, message, ops));
        }
    }
    violations
}

/// A change a lease watch owed and did not deliver: its key, what it is, the call's op.
pub(super) type Missed<'h> = (&'h str, String, usize);

/// The first few of what a lease watch missed as `rule` violations.
pub(super) fn missed_changes(rule: &str, missed: Vec<Missed<'_>>) -> Vec<Violation> {
    let count = missed.len();
    missed
        .into_iter()
        .take(REPORTED_PER_KEY)
        .map(|(key, what, index)| {
            Violation::new(
                rule,
                key,
                format!("{what}: owed to the watch, never delivered ({count} such changes)"),
                vec![index],
            )
        })
        .collect()
}

/// When the latest compaction `watch` (its client name) met was recorded: what was sent before
/// may have been in the history compacted away, so it need not be delivered.
pub(super) fn compacted_at(history: &[Op], watch: &str) -> Option<u64> {
    history
        .iter()
        .filter(|op| op.client == watch && matches!(op.input, Input::WatchCompacted { .. }))
        .filter_map(|op| op.ret)
        .max()
}

/// `watch`'s deliveries and compactions with their positions, in the order it saw them.
pub(super) fn positions<'h>(history: &'h [Op], watch: &str) -> Vec<(&'h Op, (u64, u32))> {
    history
        .iter()
        .filter(|op| op.client == watch)
        .filter_map(|op| match op.ok() {
            Some(Output::Position { revision, index }) => Some((op, (*revision, *index))),
            _ => None,
        })
        .collect()
}

/// `watch-order`: `watch`'s positions strictly increase (a compaction's position is where the
/// watch went on from, which the first change after it may sit at).
pub(super) fn increasing_positions(events: &[(&Op, (u64, u32))]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for pair in events.windows(2) {
        let ((before, at), (after, next)) = (pair[0], pair[1]);
        let went_on = matches!(before.input, Input::WatchCompacted { .. });
        if next < at || (next == at && !went_on) {
            violations.push(Violation::new(
                "watch-order",
                &after.client,
                format!(
                    "delivered position {}.{} after {}.{} (a duplicate or out of order)",
                    next.0, next.1, at.0, at.1
                ),
                vec![before.index, after.index],
            ));
        }
    }
    violations
}

/// Every acknowledged save a watch should have delivered and did not: saved after the last
/// compaction the watch met was recorded (earlier ones may have been in the compacted history).
/// `(run, seq, op)`.
fn missed(history: &[Op]) -> Vec<(&str, u64, usize)> {
    let since = compacted_at(history, NAME);
    let delivered: BTreeSet<&str> = history
        .iter()
        .filter_map(|op| match &op.input {
            Input::WatchSaved { data, .. } => Some(data.as_str()),
            _ => None,
        })
        .collect();
    history
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (Input::SaveCheckpoint { run, seq, data }, Some(_))
                if since.is_none_or(|since| op.call > since)
                    && !delivered.contains(data.as_str()) =>
            {
                Some((run.as_str(), *seq, op.index))
            }
            _ => None,
        })
        .collect()
}

/// Every watch checker (see the module comment). `complete`: the run was read back, so every
/// acknowledged save must have been delivered.
pub fn check(history: &[Op], complete: bool) -> Vec<Violation> {
    let mut violations: Vec<Violation> = history
        .iter()
        .filter_map(|op| match &op.input {
            Input::WatchEnded { error } => Some(Violation::new(
                "watch-ended",
                &op.client,
                format!("the watch ended with an error a correct store never gives: {error}"),
                vec![op.index],
            )),
            _ => None,
        })
        .collect();
    let events = positions(history, NAME);
    violations.extend(increasing_positions(&events));
    // Every delivered save was sent, and not refused, before it was delivered.
    let mut sends: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history {
        if let Input::SaveCheckpoint { data, .. } = &op.input {
            sends.entry(data).or_default().push(op);
        }
    }
    let mut delivered_at: BTreeMap<&str, (u64, u32)> = BTreeMap::new();
    for (op, position) in &events {
        let Input::WatchSaved { run, seq, data } = &op.input else {
            continue;
        };
        if let Some(first) = delivered_at.get(data.as_str()).copied() {
            violations.push(Violation::new(
                "watch-order",
                run,
                format!(
                    "the save of seq {seq} was delivered twice (at {}.{} and {}.{})",
                    first.0, first.1, position.0, position.1
                ),
                vec![op.index],
            ));
        } else {
            delivered_at.insert(data, *position);
        }
        let sent = sends.get(data.as_str()).is_some_and(|saves| {
            saves.iter().any(|save| {
                save.refused().is_none()
                    && save.call < op.call
                    && matches!(&save.input, Input::SaveCheckpoint { run: r, seq: s, .. } if r == run && s == seq)
            })
        });
        if !sent {
            violations.push(Violation::new(
                "watch-phantom",
                run,
                format!("delivered a save of seq {seq} with data {data:?} that no client sent (or that was refused)"),
                vec![op.index],
            ));
        }
    }
    // Commit order: a save acknowledged before another was sent comes first in the watch.
    let mut acked: Vec<(u64, u64, (u64, u32), usize)> = history
        .iter()
        .filter_map(|op| match (&op.input, op.ok(), op.ret) {
            (Input::SaveCheckpoint { data, .. }, Some(_), Some(ret)) => delivered_at
                .get(data.as_str())
                .map(|position| (op.call, ret, *position, op.index)),
            _ => None,
        })
        .collect();
    acked.sort_by_key(|(_, ret, _, _)| *ret);
    // Per acknowledged save, in answer order: the latest position of any answered before it.
    let mut latest: Vec<((u64, u32), usize)> = Vec::with_capacity(acked.len());
    for (_, _, position, index) in &acked {
        let prior = latest.last().copied();
        latest.push(match prior {
            Some((at, op)) if at > *position => (at, op),
            _ => (*position, *index),
        });
    }
    let mut reported = 0;
    for (call, _, position, index) in &acked {
        let answered_before = acked.partition_point(|(_, ret, _, _)| ret < call);
        let Some((at, earlier)) = answered_before.checked_sub(1).map(|i| latest[i]) else {
            continue;
        };
        if at > *position && reported < 3 {
            reported += 1;
            violations.push(Violation::new(
                "watch-order",
                NAME,
                format!(
                    "a save acknowledged before another was sent was delivered after it \
                     (position {}.{} after {}.{})",
                    at.0, at.1, position.0, position.1
                ),
                vec![earlier, *index],
            ));
        }
    }
    if complete {
        let missed = missed(history);
        let count = missed.len();
        for (run, seq, index) in missed.into_iter().take(3) {
            violations.push(Violation::new(
                "watch-missed",
                run,
                format!(
                    "the save of seq {seq} was acknowledged but never delivered to the watch \
                     ({count} such saves)"
                ),
                vec![index],
            ));
        }
    }
    violations
}
