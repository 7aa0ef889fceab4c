//! The change history a node serves watches from: the changes of the entries it applied most
//! recently, in memory, in commit order.
//!
//! Every applied entry appends its changes at positions `(revision, index)`: the entry's log index
//! and the change's place in the entry. The history is bounded by a number of changes and a
//! rough number of bytes; when it is full the oldest changes go, a whole revision at a time, and
//! [`History::oldest`] moves past them. A watch may start at any revision from `oldest` on (even
//! one not applied yet); an older start would miss changes, so it is refused (`COMPACTED`).
//!
//! The history is not persisted. On start-up it begins right after the snapshot the node loaded,
//! and openraft then re-applies the committed log suffix, so a restarted node regains the changes
//! of that suffix. Installing a snapshot from the leader jumps the state over changes this node
//! never applied: the history restarts right after the snapshot.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use baton_rpc::WatchPosition;
use baton_statemachine::Change;
use tokio::sync::watch;

/// How much history a node keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Most changes kept.
    pub events: usize,
    /// Most bytes (as [`Change::approx_bytes`] counts them) kept.
    pub bytes: usize,
}

impl Default for HistoryLimits {
    /// 100,000 changes and 64 MiB: minutes of history at typical rates.
    fn default() -> Self {
        Self {
            events: 100_000,
            bytes: 64 << 20,
        }
    }
}

/// The changes of one applied entry, held together: one allocation per entry rather than one
/// per change (a sweep entry carries tens of thousands; docs/benchmarks.md, "State scale").
#[derive(Debug)]
struct Revision {
    revision: u64,
    changes: Vec<Change>,
    bytes: usize,
    /// How many changes the history recorded before this entry's first (counts only grow), so
    /// the number held after any position is a subtraction.
    seq: u64,
    /// The same for bytes.
    byte_seq: u64,
    /// The bytes of this entry's changes before each change, so the bytes owed from a position
    /// inside the entry are found without walking it (under the history's lock, on every head
    /// change a blocked stream sees).
    offsets: Vec<u64>,
}

/// One change at its position (a handle on its entry's changes).
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Its position.
    pub position: WatchPosition,
    revision: Arc<Revision>,
}

impl Recorded {
    /// The change.
    pub fn change(&self) -> &Change {
        &self.revision.changes[self.position.index as usize]
    }
}

/// Changes read from the history.
#[derive(Debug)]
pub struct Batch {
    /// Consecutive changes from the position asked for.
    pub events: Vec<Recorded>,
    /// Whether the batch reaches the newest change (nothing more to read right now).
    pub caught_up: bool,
    /// The last applied revision when the batch was read; when caught up, every change up to
    /// it has been read.
    pub head: u64,
}

/// What a stream still owes: the changes held at or after its position, and their size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Changes.
    pub changes: usize,
    /// Bytes (as the history counts them; a position inside an entry counts the whole entry).
    pub bytes: usize,
}

/// What the history holds right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryStats {
    /// The oldest revision a watch can start at.
    pub oldest: u64,
    /// The last applied revision.
    pub head: u64,
    /// Changes held.
    pub events: usize,
    /// Bytes held (approximately).
    pub bytes: usize,
    /// Watch streams open.
    pub streams: usize,
}

#[derive(Debug)]
struct Ring {
    /// The held entries with changes, oldest first.
    revisions: VecDeque<Arc<Revision>>,
    /// Changes held.
    events: usize,
    bytes: usize,
    /// Changes recorded since the history began (held or evicted).
    recorded: u64,
    /// Their bytes.
    recorded_bytes: u64,
    /// Every change of a revision at or above this is held (or not applied yet).
    oldest: u64,
    /// The last applied revision.
    head: u64,
    /// The newest evicted revision and how many changes it had: a position right after its last
    /// change is still served (nothing at or after it is missing), though the revision is gone.
    last_evicted: Option<(u64, usize)>,
}

impl Ring {
    /// Whether something at or after `from` is no longer held.
    fn lost(&self, from: WatchPosition) -> bool {
        let right_after_evicted = self.last_evicted.is_some_and(|(revision, len)| {
            revision == from.revision && from.index as usize >= len && revision + 1 == self.oldest
        });
        from.revision < self.oldest && !right_after_evicted
    }
}

/// The bounded in-memory change history; clones are cheap handles to the same history.
#[derive(Debug, Clone)]
pub struct History {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    ring: Mutex<Ring>,
    /// The last applied revision, for streams to wait on.
    head: watch::Sender<u64>,
    limits: HistoryLimits,
    streams: AtomicUsize,
}

/// Counts an open stream for as long as it lives.
#[derive(Debug)]
pub struct StreamGuard {
    inner: Arc<Shared>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.inner.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl History {
    /// An empty history of a node whose state is at `applied` (0 for none).
    pub fn new(limits: HistoryLimits, applied: u64) -> Self {
        History {
            inner: Arc::new(Shared {
                ring: Mutex::new(Ring {
                    revisions: VecDeque::new(),
                    events: 0,
                    bytes: 0,
                    recorded: 0,
                    recorded_bytes: 0,
                    oldest: applied + 1,
                    head: applied,
                    last_evicted: None,
                }),
                head: watch::Sender::new(applied),
                limits,
                streams: AtomicUsize::new(0),
            }),
        }
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        self.inner
            .ring
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends the changes of applied entries (`(revision, changes)` in log order) and moves the
    /// head to `applied`, the last index applied (entries without changes move it too).
    ///
    /// Entries whose changes the limits would evict at once (a long run of sweeps applied in one
    /// go, or one entry bigger than the history) are never stored: the outcome is exactly that of
    /// storing them and evicting, the oldest available revision moves past them, but no change of
    /// theirs is wrapped or counted, and they are dropped after the history is unlocked.
    pub fn record(&self, mut entries: Vec<(u64, Vec<Change>)>, applied: u64) {
        let (first_kept, mut sizes) = self.first_kept(&entries);
        let kept = entries.split_off(first_kept);
        let mut evicted = VecDeque::new();
        {
            let mut ring = self.ring();
            if let Some((skipped, changes)) = entries.last() {
                // Together with everything held: a whole-revision suffix that holds a revision of
                // the history would also hold every skipped entry, and so exceed the limits.
                evicted = std::mem::take(&mut ring.revisions);
                ring.events = 0;
                ring.bytes = 0;
                ring.oldest = ring.oldest.max(skipped + 1);
                ring.last_evicted = Some((*skipped, changes.len()));
            }
            for (revision, changes) in kept {
                let (bytes, offsets) = sizes.pop().unwrap_or_default();
                if changes.is_empty() {
                    continue;
                }
                let (seq, byte_seq) = (ring.recorded, ring.recorded_bytes);
                ring.recorded += changes.len() as u64;
                ring.recorded_bytes += bytes as u64;
                ring.events += changes.len();
                ring.bytes += bytes;
                ring.revisions.push_back(Arc::new(Revision {
                    revision,
                    changes,
                    bytes,
                    seq,
                    byte_seq,
                    offsets,
                }));
            }
            ring.head = ring.head.max(applied);
            evicted.extend(self.evict(&mut ring));
        }
        self.inner.head.send_replace(applied);
        // Freeing tens of thousands of changes takes a while: not under the lock.
        drop(evicted);
        drop(entries);
    }

    /// The first of `entries` whose changes survive eviction: every later entry's too. Eviction
    /// keeps the longest run of newest whole revisions that fits the limits, so walking back
    /// from the newest entry, the first that does not fit is evicted with everything before it.
    /// Also returns the byte size of each kept entry and the bytes before each of its changes
    /// ([`Revision::offsets`]), newest first: each change's size is computed once, before the
    /// history is locked.
    fn first_kept(&self, entries: &[(u64, Vec<Change>)]) -> (usize, Vec<(usize, Vec<u64>)>) {
        let limits = self.inner.limits;
        let mut sizes = Vec::with_capacity(entries.len());
        let (mut events, mut bytes) = (0usize, 0usize);
        for (at, (_, changes)) in entries.iter().enumerate().rev() {
            let mut size = 0usize;
            let offsets: Vec<u64> = changes
                .iter()
                .map(|change| {
                    let before = size as u64;
                    size += change.approx_bytes();
                    before
                })
                .collect();
            events += changes.len();
            bytes += size;
            if events > limits.events || bytes > limits.bytes {
                return (at + 1, sizes);
            }
            sizes.push((size, offsets));
        }
        (0, sizes)
    }

    /// Forgets everything: the state jumped to `applied` (a snapshot was installed), so the
    /// changes before it are unknown here.
    pub fn reset(&self, applied: u64) {
        {
            let mut ring = self.ring();
            ring.revisions.clear();
            ring.events = 0;
            ring.bytes = 0;
            ring.oldest = applied + 1;
            ring.head = applied;
            ring.last_evicted = None;
        }
        self.inner.head.send_replace(applied);
    }

    /// Takes out the oldest revisions until the limits hold; the caller frees them unlocked.
    fn evict(&self, ring: &mut Ring) -> Vec<Arc<Revision>> {
        let limits = self.inner.limits;
        let mut evicted = Vec::new();
        while ring.events > limits.events || ring.bytes > limits.bytes {
            let Some(first) = ring.revisions.pop_front() else {
                break;
            };
            ring.events -= first.changes.len();
            ring.bytes -= first.bytes;
            ring.oldest = ring.oldest.max(first.revision + 1);
            ring.last_evicted = Some((first.revision, first.changes.len()));
            evicted.push(first);
        }
        evicted
    }

    /// The index of the first held revision at or after `from`'s, and the position's change
    /// and byte sequence numbers (`recorded`, `recorded_bytes` when nothing held is at or after
    /// it).
    fn locate(ring: &Ring, from: WatchPosition) -> (usize, u64, u64) {
        let at = ring
            .revisions
            .partition_point(|r| r.revision < from.revision);
        let (seq, byte_seq) = match ring.revisions.get(at) {
            Some(r) if r.revision == from.revision && from.index as usize >= r.changes.len() => {
                (r.seq + r.changes.len() as u64, r.byte_seq + r.bytes as u64)
            }
            // Inside an entry: its changes before the position are not owed (an entry larger
            // than half the history must not count as a backlog for as long as a stream reads it).
            Some(r) if r.revision == from.revision => (
                r.seq + from.index as u64,
                r.byte_seq + r.offsets[from.index as usize],
            ),
            Some(r) => (r.seq, r.byte_seq),
            None => (ring.recorded, ring.recorded_bytes),
        };
        (at, seq, byte_seq)
    }

    /// Up to `max` changes from `from` on, or `Err(oldest)` when `from` is older than the history
    /// holds.
    pub fn read(&self, from: WatchPosition, max: usize) -> Result<Batch, u64> {
        let ring = self.ring();
        if ring.lost(from) {
            return Err(ring.oldest);
        }
        let (at, _, _) = Self::locate(&ring, from);
        let mut events = Vec::new();
        let mut caught_up = true;
        'revisions: for revision in ring.revisions.range(at..) {
            let first = if revision.revision == from.revision {
                from.index as usize
            } else {
                0
            };
            for index in first..revision.changes.len() {
                if events.len() == max {
                    caught_up = false;
                    break 'revisions;
                }
                events.push(Recorded {
                    position: WatchPosition {
                        revision: revision.revision,
                        index: u32::try_from(index).unwrap_or(u32::MAX),
                    },
                    revision: revision.clone(),
                });
            }
        }
        Ok(Batch {
            events,
            caught_up,
            head: ring.head,
        })
    }

    /// What is held at or after `from`, or `None` when `from` is no longer held.
    pub fn backlog(&self, from: WatchPosition) -> Option<Backlog> {
        let ring = self.ring();
        if ring.lost(from) {
            return None;
        }
        let (_, seq, byte_seq) = Self::locate(&ring, from);
        Some(Backlog {
            changes: (ring.recorded - seq) as usize,
            bytes: (ring.recorded_bytes - byte_seq) as usize,
        })
    }

    /// Whether a watch may start at `from`: `Err(oldest)` when it is older than the history holds.
    pub fn check_start(&self, from: WatchPosition) -> Result<(), u64> {
        let ring = self.ring();
        if ring.lost(from) {
            return Err(ring.oldest);
        }
        Ok(())
    }

    /// The last applied revision.
    pub fn head(&self) -> u64 {
        self.ring().head
    }

    /// The oldest revision a watch can start at.
    pub fn oldest(&self) -> u64 {
        self.ring().oldest
    }

    /// Wakes up whenever the head moves (or the history is reset).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.head.subscribe()
    }

    /// Counts a stream until the guard is dropped; `None` when `max` are open already.
    pub fn open_stream(&self, max: usize) -> Option<StreamGuard> {
        self.inner
            .streams
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
                (open < max).then_some(open + 1)
            })
            .ok()?;
        Some(StreamGuard {
            inner: self.inner.clone(),
        })
    }

    /// What the history holds.
    pub fn stats(&self) -> HistoryStats {
        let ring = self.ring();
        HistoryStats {
            oldest: ring.oldest,
            head: ring.head,
            events: ring.events,
            bytes: ring.bytes,
            streams: self.inner.streams.load(Ordering::Relaxed),
        }
    }

    /// The limits it keeps to.
    pub fn limits(&self) -> HistoryLimits {
        self.inner.limits
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use baton_statemachine::sink::SinkValue;
    use baton_statemachine::{ChangeKind, ChangeValue, Primitive};

    use super::*;

    fn change(key: &str) -> Change {
        Change {
            primitive: Primitive::Sink,
            key: key.into(),
            kind: ChangeKind::Written,
            holder: String::new(),
            fence: 1,
            value: ChangeValue::Sink(SinkValue {
                seen_fence: 1,
                value: vec![],
                writes: 1,
            }),
        }
    }

    fn at(revision: u64, index: u32) -> WatchPosition {
        WatchPosition { revision, index }
    }

    fn positions(batch: &Batch) -> Vec<(u64, u32)> {
        batch
            .events
            .iter()
            .map(|e| (e.position.revision, e.position.index))
            .collect()
    }

    #[test]
    fn reads_resume_mid_entry_and_report_when_caught_up() {
        let history = History::new(HistoryLimits::default(), 0);
        history.record(
            vec![(2, vec![change("a"), change("b")]), (4, vec![change("c")])],
            5,
        );
        let batch = history.read(at(1, 0), 10).unwrap();
        assert_eq!(positions(&batch), vec![(2, 0), (2, 1), (4, 0)]);
        assert!(batch.caught_up);
        assert_eq!(batch.head, 5);
        let batch = history.read(at(2, 1), 1).unwrap();
        assert_eq!(positions(&batch), vec![(2, 1)]);
        assert!(!batch.caught_up);
        assert!(history.read(at(9, 0), 10).unwrap().events.is_empty());
        assert_eq!(history.backlog(at(2, 1)).map(|b| b.changes), Some(2));
    }

    #[test]
    fn eviction_drops_whole_revisions_and_moves_the_oldest() {
        let limits = HistoryLimits {
            events: 3,
            bytes: usize::MAX,
        };
        let history = History::new(limits, 0);
        history.record(vec![(1, vec![change("a"), change("b")])], 1);
        history.record(vec![(2, vec![change("c"), change("d")])], 2);
        let stats = history.stats();
        assert_eq!(stats.events, 2, "revision 1 went as a whole");
        assert_eq!(stats.oldest, 2);
        assert_eq!(history.read(at(1, 1), 10).unwrap_err(), 2);
        assert_eq!(
            positions(&history.read(at(2, 0), 10).unwrap()),
            vec![(2, 0), (2, 1)]
        );
        assert_eq!(history.backlog(at(1, 0)), None);
    }

    /// A position right after the last change of the newest evicted revision is still served:
    /// nothing at or after it is missing. A position inside it, or after an older one, is not.
    #[test]
    fn a_position_right_after_the_newest_evicted_revision_is_still_held() {
        let limits = HistoryLimits {
            events: 2,
            bytes: usize::MAX,
        };
        let history = History::new(limits, 0);
        history.record(vec![(1, vec![change("a"), change("b")])], 1);
        history.record(vec![(2, vec![change("c"), change("d")])], 2);
        assert_eq!(history.oldest(), 2);
        assert_eq!(history.check_start(at(1, 2)), Ok(()));
        assert_eq!(
            positions(&history.read(at(1, 2), 10).unwrap()),
            vec![(2, 0), (2, 1)]
        );
        assert_eq!(history.backlog(at(1, 2)).map(|b| b.changes), Some(2));
        assert_eq!(
            history.check_start(at(1, 1)),
            Err(2),
            "change (1, 1) is gone"
        );
        history.record(vec![(3, vec![change("e"), change("f")])], 3);
        assert_eq!(
            history.check_start(at(1, 2)),
            Err(3),
            "revision 2 is gone too"
        );
        assert_eq!(history.check_start(at(2, 2)), Ok(()));
        // After a reset nothing is known of the revision before the new start.
        history.reset(9);
        assert_eq!(history.check_start(at(9, 0)), Err(10));
    }

    /// The bytes owed from inside an entry are those of its changes from the position on: an
    /// entry larger than half the history must not look like a backlog for as long as a stream
    /// reads through it.
    #[test]
    fn the_backlog_inside_an_entry_counts_only_what_is_left_of_it() {
        let one = change("k").approx_bytes();
        let limits = HistoryLimits {
            events: 1_000,
            bytes: one * 100,
        };
        let history = History::new(limits, 0);
        history.record(vec![(1, (0..60).map(|_| change("k")).collect())], 1);
        let backlog = history.backlog(at(1, 59)).unwrap();
        assert_eq!((backlog.changes, backlog.bytes), (1, one));
        let backlog = history.backlog(at(1, 0)).unwrap();
        assert_eq!((backlog.changes, backlog.bytes), (60, 60 * one));
        let backlog = history.backlog(at(1, 60)).unwrap();
        assert_eq!((backlog.changes, backlog.bytes), (0, 0));
    }

    #[test]
    fn the_byte_limit_bounds_the_history_too() {
        let one = change("k").approx_bytes();
        let limits = HistoryLimits {
            events: 1_000,
            bytes: one * 10,
        };
        let history = History::new(limits, 0);
        for revision in 1..=100 {
            history.record(vec![(revision, vec![change("k")])], revision);
        }
        let stats = history.stats();
        assert!(stats.bytes <= one * 10, "{stats:?}");
        assert_eq!(stats.events, 10);
        assert_eq!(stats.oldest, 91);
    }

    #[test]
    fn entries_the_limits_would_evict_at_once_are_never_stored() {
        let limits = HistoryLimits {
            events: 5,
            bytes: usize::MAX,
        };
        let history = History::new(limits, 0);
        history.record(vec![(1, vec![change("held")])], 1);
        // Revisions 3 and 4 fit (5 changes); 2 would be evicted at once, and revision 1 with it.
        let entries = vec![
            (2, vec![change("a"), change("b")]),
            (3, vec![change("c"), change("d"), change("e")]),
            (4, vec![change("f"), change("g")]),
        ];
        history.record(entries, 4);
        assert_eq!(history.oldest(), 3);
        assert_eq!(history.read(at(2, 1), 10).unwrap_err(), 3);
        assert_eq!(history.check_start(at(2, 0)).unwrap_err(), 3);
        assert_eq!(
            positions(&history.read(at(3, 0), 10).unwrap()),
            vec![(3, 0), (3, 1), (3, 2), (4, 0), (4, 1)]
        );
        // One entry bigger than the whole history: nothing of it (or before it) stays.
        history.record(vec![(6, (0..6).map(|_| change("x")).collect())], 7);
        let stats = history.stats();
        assert_eq!((stats.oldest, stats.events, stats.bytes), (7, 0, 0));
        assert_eq!(history.read(at(6, 5), 10).unwrap_err(), 7);
        let batch = history.read(at(7, 0), 10).unwrap();
        assert!(batch.events.is_empty() && batch.caught_up && batch.head == 7);
    }

    /// The history as it was before entries could be skipped: store every change, then evict a
    /// change at a time, finishing the revision of the last one evicted.
    struct Model {
        held: VecDeque<(u64, u32, usize)>,
        bytes: usize,
        oldest: u64,
    }

    impl Model {
        fn record(&mut self, entries: &[(u64, Vec<Change>)], limits: HistoryLimits) {
            for (revision, changes) in entries {
                for (index, change) in changes.iter().enumerate() {
                    let bytes = change.approx_bytes();
                    self.bytes += bytes;
                    self.held.push_back((*revision, index as u32, bytes));
                }
            }
            while self.held.len() > limits.events || self.bytes > limits.bytes {
                let (revision, _, bytes) = self.held.pop_front().unwrap();
                self.bytes -= bytes;
                self.oldest = self.oldest.max(revision + 1);
                while self.held.front().is_some_and(|e| e.0 < self.oldest) {
                    self.bytes -= self.held.pop_front().unwrap().2;
                }
            }
        }
    }

    #[test]
    fn skipping_entries_keeps_exactly_what_storing_and_evicting_them_kept() {
        let one = change("k").approx_bytes();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for round in 0..200 {
            let limits = HistoryLimits {
                events: 1 + next(12) as usize,
                bytes: if round % 2 == 0 {
                    usize::MAX
                } else {
                    one * (1 + next(15) as usize)
                },
            };
            let history = History::new(limits, 0);
            let mut model = Model {
                held: VecDeque::new(),
                bytes: 0,
                oldest: 1,
            };
            let mut revision = 0;
            for _ in 0..30 {
                let entries: Vec<(u64, Vec<Change>)> = (0..next(5))
                    .map(|_| {
                        revision += 1 + next(2);
                        let key = "k".repeat(1 + next(3) as usize);
                        (revision, (0..1 + next(8)).map(|_| change(&key)).collect())
                    })
                    .collect();
                revision += next(2);
                model.record(&entries, limits);
                history.record(entries, revision);
                let stats = history.stats();
                let context = format!("round {round}, limits {limits:?}");
                assert_eq!(stats.oldest, model.oldest, "{context}");
                assert_eq!(stats.bytes, model.bytes, "{context}");
                let held = history.read(at(model.oldest, 0), usize::MAX).unwrap();
                let expected: Vec<(u64, u32)> =
                    model.held.iter().map(|(r, i, _)| (*r, *i)).collect();
                assert_eq!(positions(&held), expected, "{context}");
                for (i, (r, index, _)) in model.held.iter().enumerate() {
                    let bytes = model.held.iter().skip(i).map(|e| e.2).sum();
                    let backlog = Backlog {
                        changes: model.held.len() - i,
                        bytes,
                    };
                    assert_eq!(history.backlog(at(*r, *index)), Some(backlog), "{context}");
                }
                let none = Backlog {
                    changes: 0,
                    bytes: 0,
                };
                assert_eq!(
                    history.backlog(at(revision + 1, 0)),
                    Some(none),
                    "{context}"
                );
                if model.oldest > 1 {
                    assert_eq!(
                        history.check_start(at(model.oldest - 1, 0)),
                        Err(model.oldest),
                        "{context}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_reset_starts_the_history_after_the_snapshot() {
        let history = History::new(HistoryLimits::default(), 0);
        history.record(vec![(1, vec![change("a")])], 1);
        history.reset(50);
        assert_eq!(history.read(at(1, 0), 10).unwrap_err(), 51);
        assert!(history.check_start(at(51, 0)).is_ok());
        assert_eq!(history.head(), 50);
        history.record(vec![(51, vec![change("b")])], 51);
        assert_eq!(
            positions(&history.read(at(51, 0), 10).unwrap()),
            vec![(51, 0)]
        );
    }
}
