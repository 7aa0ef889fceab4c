//! Watch workload: one client follows every checkpoint change from the first revision for the
//! whole run — through every fault, resuming on another node as the library does — and records
//! each change it is delivered (a `saved` of a run: its seq and data) in the history, with its
//! position. After the read-back it waits (bounded) until it has been delivered every
//! acknowledged save, then stops.
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
use baton_statemachine::{ChangeFilter, ChangeValue, Primitive};
use futures::StreamExt;
use tokio::task::JoinHandle;

use super::check::Violation;
use super::history::{Input, Op, Output, Recorder};

/// The client name the watch's events are recorded under.
pub const NAME: &str = "watcher";

/// The running watch (stopped when dropped).
pub struct Watcher {
    stop: Arc<AtomicBool>,
    task: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    /// A run that ends early (a set-up or read-back error) leaves no watch behind.
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Watcher {
    /// Starts following every checkpoint change from revision 1.
    pub fn start(client: Client, rec: Recorder) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(follow(client, rec, stop.clone()));
        Watcher {
            stop,
            task: Some(task),
        }
    }

    /// Waits until every save acknowledged in `rec` so far has been delivered (or the watch
    /// ended, or `limit` passed), then stops the watch. A watch stopped by a panic (the library
    /// on an answer it could not handle) is a violation (`workload-panic`).
    pub async fn catch_up_and_stop(mut self, rec: &Recorder, limit: Duration) -> Option<Violation> {
        let mut task = self.task.take()?;
        let deadline = tokio::time::Instant::now() + limit;
        while !task.is_finished() && tokio::time::Instant::now() < deadline {
            if rec.inspect(|history| missed(history).is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The loop looks at the flag between events and every 200 ms while none comes; one
        // still (re)opening its stream (up to the client's deadline) is aborted.
        self.stop.store(true, Ordering::Relaxed);
        match tokio::time::timeout(Duration::from_secs(1), &mut task).await {
            Ok(Err(error)) if error.is_panic() => Some(Violation::new(
                "workload-panic",
                NAME,
                format!("the watch stopped by a panic: {error}"),
                Vec::new(),
            )),
            Ok(_) => None,
            Err(_) => {
                task.abort();
                None
            }
        }
    }
}

fn filter() -> ChangeFilter {
    ChangeFilter {
        primitive: Some(Primitive::Checkpoint),
        ..ChangeFilter::default()
    }
}

/// Follows the changes until `stop`, recording each delivered save and each compaction.
async fn follow(client: Client, rec: Recorder, stop: Arc<AtomicBool>) {
    let mut watch = client.watch(filter(), Some(1)).await;
    while !stop.load(Ordering::Relaxed) {
        let next = tokio::select! {
            next = watch.next() => next,
            _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
        };
        match next {
            Some(Ok(event)) => {
                if let ChangeValue::Checkpoint(checkpoint) = &event.change.value {
                    let input = Input::WatchSaved {
                        run: event.change.key.clone(),
                        seq: checkpoint.seq,
                        data: String::from_utf8_lossy(&checkpoint.data).into_owned(),
                    };
                    rec.observe(
                        NAME,
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
                    NAME,
                    Input::WatchCompacted { requested },
                    Output::Position {
                        revision: oldest_available,
                        index: 0,
                    },
                );
                watch = client.watch(filter(), Some(oldest_available)).await;
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
                    NAME,
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

/// Every acknowledged save a watch should have delivered and did not: saved after the last
/// compaction the watch met was recorded (earlier ones may have been in the compacted history).
/// `(run, seq, op)`.
fn missed(history: &[Op]) -> Vec<(&str, u64, usize)> {
    let since = history
        .iter()
        .filter(|op| matches!(op.input, Input::WatchCompacted { .. }))
        .filter_map(|op| op.ret)
        .max();
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
                "watch",
                format!("the watch ended with an error a correct store never gives: {error}"),
                vec![op.index],
            )),
            _ => None,
        })
        .collect();
    let events: Vec<(&Op, (u64, u32))> = history
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (
                Input::WatchSaved { .. } | Input::WatchCompacted { .. },
                Some(Output::Position { revision, index }),
            ) => Some((op, (*revision, *index))),
            _ => None,
        })
        .collect();
    // Positions strictly increase (a compaction's position is where the watch went on from).
    for pair in events.windows(2) {
        let ((before, at), (after, next)) = (pair[0], pair[1]);
        // The first change after a compaction may sit at the position it went on from.
        let went_on = matches!(before.input, Input::WatchCompacted { .. });
        if next < at || (next == at && !went_on) {
            violations.push(Violation::new(
                "watch-order",
                "watch",
                format!(
                    "delivered position {}.{} after {}.{} (a duplicate or out of order)",
                    next.0, next.1, at.0, at.1
                ),
                vec![before.index, after.index],
            ));
        }
    }
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
                "watch",
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
