//! The sinks' watch: a sixth watch ([`super::watcher`] runs it) follows every fenced-sink change
//! from the first revision for the whole run and records each accepted write it is delivered
//! (`written`: the resource, the write's fence, and the resource after it: its seen fence, its
//! count of accepted writes, its value), with its position.
//!
//! A `written` is what a consumer downstream of a fenced resource acts on (a cache, a replica of
//! the resource, an audit trail): one missed leaves it behind for good, one invented makes it
//! act on a value nobody wrote. The sink's own rules look only at the answers and the value read
//! back.
//!
//! A resource counts its accepted writes, and each accepted write is one change, so the count
//! numbers a resource's changes with no gap; a stale write is refused and changes nothing, so an
//! accepted write's fence is the resource's seen fence after it.
//!
//! Checked, on every sink the run writes (the side-effect and queue workloads'):
//! - `watch-sink-order`: per resource, the delivered writes are numbered 1, 2, 3, ... with no gap
//!   and no repeat (across a compaction the watch met, a resource's next may skip ahead, and one
//!   written before it need not start at 1), each with its fence as the seen fence after it,
//!   fences never going back; and the watch's positions strictly increase (`watch-order`);
//! - `watch-sink-phantom`: every delivered write names a write of that value with that fence to
//!   that resource, sent (and not refused) before it was delivered;
//! - `watch-sink-missed` (once the run was read back): every acknowledged write was delivered as
//!   the write its answer numbered, with its fence and value, and so was the latest write any
//!   read showed (an unanswered write may be a resource's last, which no later delivery would
//!   show missing) — except what can have been in the history a compaction the watch met took
//!   away: a write sent before the latest one, or a write a read showed, unless a write to its
//!   resource acknowledged after that compaction came no later.

use std::collections::BTreeMap;

use baton_statemachine::{Change, ChangeValue};

use super::check::Violation;
use super::history::{Input, Op, Output};
use super::watcher::{self, Finding, Missed};

/// The client name the sink watch's changes are recorded under.
pub const NAME: &str = "sink-watcher";

/// What the watch records of `change`: an accepted sink write.
pub(super) fn recorded(change: &Change) -> Option<Input> {
    let ChangeValue::Sink(sink) = &change.value else {
        return None;
    };
    Some(Input::WatchSinkWritten {
        resource: change.key.clone(),
        fence: change.fence,
        seen_fence: sink.seen_fence,
        writes: sink.writes,
        value: String::from_utf8_lossy(&sink.value).into_owned(),
    })
}

/// A delivered write: its fence and value.
struct Written<'h> {
    fence: u64,
    value: &'h str,
}

/// The watch's deliveries by `(resource, writes)`, the first of each.
fn delivered(history: &[Op]) -> BTreeMap<(&str, u64), Written<'_>> {
    let mut delivered = BTreeMap::new();
    for op in history.iter().filter(|op| op.client == NAME) {
        if let Input::WatchSinkWritten {
            resource,
            fence,
            writes,
            value,
            ..
        } = &op.input
        {
            delivered
                .entry((resource.as_str(), *writes))
                .or_insert(Written {
                    fence: *fence,
                    value,
                });
        }
    }
    delivered
}

/// A write the watch owes: its fence and value, how the run knows of it, and the op that shows
/// it.
struct Owed<'h> {
    fence: u64,
    value: &'h str,
    shown_by: &'static str,
    op: usize,
}

/// Every write the watch owed and did not deliver as such (see the module comment).
fn missed(history: &[Op]) -> Vec<Missed<'_>> {
    let since = watcher::compacted_at(history, NAME);
    let after = |op: &Op| since.is_none_or(|since| op.call > since);
    let mut owed: BTreeMap<(&str, u64), Owed<'_>> = BTreeMap::new();
    // Per resource, the lowest count an acknowledged write sent after the compaction was
    // answered with: its change, and every later one, came after the compaction.
    let mut fresh_from: BTreeMap<&str, u64> = BTreeMap::new();
    for op in history {
        if let (
            Input::SinkWrite {
                resource,
                fence,
                value,
            },
            Some(Output::Sink { writes, .. }),
        ) = (&op.input, op.ok())
        {
            if after(op) {
                owed.entry((resource.as_str(), *writes)).or_insert(Owed {
                    fence: *fence,
                    value,
                    shown_by: "acknowledged",
                    op: op.index,
                });
                let from = fresh_from.entry(resource.as_str()).or_insert(*writes);
                *from = (*from).min(*writes);
            }
        }
    }
    // The latest write each resource's reads showed.
    let mut shown: BTreeMap<&str, (u64, &Op)> = BTreeMap::new();
    for op in history {
        if let (Input::SinkRead { resource }, Some(Output::Sink { writes, .. })) =
            (&op.input, op.ok())
        {
            let latest = shown.entry(resource.as_str()).or_insert((*writes, op));
            if *writes > latest.0 {
                *latest = (*writes, op);
            }
        }
    }
    for (resource, (writes, read)) in shown {
        let Some(Output::Sink {
            seen_fence, value, ..
        }) = read.ok()
        else {
            continue;
        };
        let after_compaction =
            since.is_none() || fresh_from.get(resource).is_some_and(|from| *from <= writes);
        if writes > 0 && after_compaction {
            owed.entry((resource, writes)).or_insert(Owed {
                fence: *seen_fence,
                value,
                shown_by: "shown by a read",
                op: read.index,
            });
        }
    }
    let delivered = delivered(history);
    owed.into_iter()
        .filter_map(|((resource, writes), owed)| {
            let Owed {
                fence,
                value,
                shown_by,
                op,
            } = owed;
            let what = match delivered.get(&(resource, writes)) {
                Some(d) if d.fence == fence && d.value == value => return None,
                Some(d) => format!(
                    "write {writes} ({shown_by}: fence {fence}, value {value:?}) was delivered \
                     with fence {} and value {:?}",
                    d.fence, d.value
                ),
                None => format!("write {writes} ({shown_by}: fence {fence}, value {value:?})"),
            };
            Some((resource, what, op))
        })
        .collect()
}

/// Whether the watch has delivered every acknowledged write it owes so far.
pub fn all_delivered(history: &[Op]) -> bool {
    missed(history).is_empty()
}

/// The watch's `watch-sink-order` and `watch-sink-phantom` findings, in delivery order.
fn findings(history: &[Op]) -> Vec<Finding<'_>> {
    // When each resource was first written to, and each write (resource, fence, value) first
    // sent without being refused.
    let mut first_write: BTreeMap<&str, u64> = BTreeMap::new();
    let mut first_sent: BTreeMap<(&str, u64, &str), u64> = BTreeMap::new();
    for op in history {
        if let Input::SinkWrite {
            resource,
            fence,
            value,
        } = &op.input
        {
            let first = first_write.entry(resource).or_insert(op.call);
            *first = (*first).min(op.call);
            if op.refused().is_none() {
                let first = first_sent
                    .entry((resource, *fence, value))
                    .or_insert(op.call);
                *first = (*first).min(op.call);
            }
        }
    }
    let mut found = Vec::new();
    // Per resource, the last write delivered: its count, its fence, and how many compactions
    // the watch had met by then. And when the watch met its latest compaction.
    let mut last: BTreeMap<&str, (u64, u64, usize)> = BTreeMap::new();
    let mut compactions = 0;
    let mut compacted_at = None;
    for op in history.iter().filter(|op| op.client == NAME) {
        let Input::WatchSinkWritten {
            resource,
            fence,
            seen_fence,
            writes,
            value,
        } = &op.input
        else {
            if matches!(op.input, Input::WatchCompacted { .. }) {
                compactions += 1;
                compacted_at = Some(op.call);
            }
            continue;
        };
        // Written before the latest compaction: its first changes may have been taken away.
        let written_before = compacted_at.is_some_and(|at| {
            first_write
                .get(resource.as_str())
                .is_some_and(|first| *first < at)
        });
        let mut order = |message: String| {
            found.push((
                "watch-sink-order",
                resource.as_str(),
                message,
                vec![op.index],
            ));
        };
        match last.get(resource.as_str()) {
            Some((before, _, met)) if *met == compactions && *writes != before + 1 => {
                order(format!(
                    "delivered write {writes} after write {before} (a change skipped or repeated)"
                ))
            }
            Some((before, _, _)) if writes <= before => order(format!(
                "delivered write {writes} after write {before}, across a compaction (a change \
                 repeated)"
            )),
            None if !written_before && *writes != 1 => order(format!(
                "the first write delivered is write {writes}, not write 1"
            )),
            _ => {}
        }
        if seen_fence != fence {
            order(format!(
                "write {writes} with fence {fence} left the seen fence at {seen_fence}"
            ));
        }
        if let Some((_, before, _)) = last.get(resource.as_str()).filter(|(_, f, _)| f > fence) {
            order(format!(
                "write {writes} has fence {fence}, below the fence {before} of the write before it"
            ));
        }
        last.insert(resource, (*writes, *fence, compactions));
        let explained = first_sent
            .get(&(resource.as_str(), *fence, value.as_str()))
            .is_some_and(|first| *first < op.call);
        if !explained {
            found.push((
                "watch-sink-phantom",
                resource.as_str(),
                format!(
                    "delivered write {writes} with fence {fence} and value {value:?}, which no \
                     write sent before it (and not refused) explains"
                ),
                vec![op.index],
            ));
        }
    }
    found
}

/// Every sink watch checker (see the module comment). `complete`: the run was read back, so
/// every acknowledged write must have been delivered.
pub fn check(history: &[Op], complete: bool) -> Vec<Violation> {
    let mut violations = watcher::increasing_positions(&watcher::positions(history, NAME));
    violations.extend(watcher::capped(findings(history)));
    if complete {
        violations.extend(watcher::missed_changes(
            "watch-sink-missed",
            missed(history),
        ));
    }
    violations
}
