//! The newest log entries, kept decoded in memory.
//!
//! Right after an entry is appended openraft reads it back: the leader once per follower to
//! replicate it and every node once more to apply it. From sled each read is a tree walk plus a
//! decode of every command in the entry; a profile of a follower under load put those reads at
//! about 6 % of its CPU. Serving them from a copy kept at append time costs one clone instead.
//!
//! The cache holds a run of consecutive indices ending at the last appended entry, bounded in
//! count and in encoded bytes. A read it cannot serve whole goes to sled, so it never decides
//! what the log contains: it mirrors appends, truncations and purges, and forgets everything on
//! any gap.

use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};

use openraft::Entry;

use crate::types::TypeConfig;

/// Most entries kept.
const MAX_ENTRIES: usize = 4096;
/// Most encoded bytes kept (a batched entry can be up to about 1 MiB).
const MAX_BYTES: usize = 32 << 20;

/// Consecutive recent entries with their encoded sizes.
#[derive(Default)]
pub(super) struct Recent {
    entries: VecDeque<(Entry<TypeConfig>, usize)>,
    bytes: usize,
}

impl Recent {
    /// Notes an appended entry of `size` encoded bytes. An entry that does not follow the newest
    /// one starts the run afresh.
    pub(super) fn push(&mut self, entry: Entry<TypeConfig>, size: usize) {
        if self
            .next_index()
            .is_some_and(|next| next != entry.log_id.index)
        {
            self.clear();
        }
        self.entries.push_back((entry, size));
        self.bytes += size;
        while self.entries.len() > MAX_ENTRIES || (self.bytes > MAX_BYTES && self.entries.len() > 1)
        {
            self.pop_front();
        }
    }

    /// Forgets the entries at `index` and after (a truncation).
    pub(super) fn truncate(&mut self, index: u64) {
        while self
            .entries
            .back()
            .is_some_and(|(e, _)| e.log_id.index >= index)
        {
            if let Some((_, size)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets the entries up to and including `index` (a purge).
    pub(super) fn purge(&mut self, index: u64) {
        while self
            .entries
            .front()
            .is_some_and(|(e, _)| e.log_id.index <= index)
        {
            self.pop_front();
        }
    }

    /// Copies of the entries in `range`, if every one of them is here; `None` sends the read
    /// to sled. An empty range is answered here only if it lies within the run.
    pub(super) fn get(&self, range: &impl RangeBounds<u64>) -> Option<Vec<Entry<TypeConfig>>> {
        let first = self.entries.front()?.0.log_id.index;
        let next = self.next_index()?;
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.checked_add(1)?,
            Bound::Unbounded => return None,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => i.checked_add(1)?,
            Bound::Excluded(&i) => i,
            Bound::Unbounded => next,
        };
        if start < first || end > next {
            return None;
        }
        let from = usize::try_from(start - first).ok()?;
        let count = usize::try_from(end.saturating_sub(start)).ok()?;
        Some(
            self.entries
                .iter()
                .skip(from)
                .take(count)
                .map(|(e, _)| e.clone())
                .collect(),
        )
    }

    fn next_index(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.log_id.index + 1)
    }

    fn pop_front(&mut self) {
        if let Some((_, size)) = self.entries.pop_front() {
            self.bytes -= size;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    use super::*;

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn indices(entries: Option<Vec<Entry<TypeConfig>>>) -> Option<Vec<u64>> {
        entries.map(|es| es.iter().map(|e| e.log_id.index).collect())
    }

    fn run(from: u64, to: u64) -> Recent {
        let mut recent = Recent::default();
        for i in from..=to {
            recent.push(entry(i), 10);
        }
        recent
    }

    #[test]
    fn serves_only_ranges_it_holds_whole() {
        let recent = run(5, 9);
        assert_eq!(indices(recent.get(&(6..9))), Some(vec![6, 7, 8]));
        assert_eq!(indices(recent.get(&(5..=9))), Some(vec![5, 6, 7, 8, 9]));
        assert_eq!(indices(recent.get(&(7..))), Some(vec![7, 8, 9]));
        assert_eq!(indices(recent.get(&(7..7))), Some(vec![]));
        assert_eq!(indices(recent.get(&(4..7))), None, "starts before the run");
        assert_eq!(indices(recent.get(&(8..11))), None, "ends after the run");
        assert_eq!(indices(recent.get(&(..7))), None);
        assert_eq!(indices(Recent::default().get(&(1..2))), None);
    }

    #[test]
    fn follows_truncations_purges_and_gaps() {
        let mut recent = run(1, 6);
        recent.truncate(4);
        assert_eq!(indices(recent.get(&(1..4))), Some(vec![1, 2, 3]));
        assert_eq!(indices(recent.get(&(3..5))), None, "4 is gone");
        recent.push(entry(4), 10);
        assert_eq!(indices(recent.get(&(3..5))), Some(vec![3, 4]));
        recent.purge(2);
        assert_eq!(indices(recent.get(&(2..4))), None, "2 is purged");
        assert_eq!(indices(recent.get(&(3..=4))), Some(vec![3, 4]));
        // A gap (an append that does not follow) starts afresh.
        recent.push(entry(9), 10);
        assert_eq!(indices(recent.get(&(3..5))), None);
        assert_eq!(indices(recent.get(&(9..10))), Some(vec![9]));
        assert_eq!(recent.bytes, 10);
    }

    #[test]
    fn stays_within_its_bounds() {
        let recent = run(1, MAX_ENTRIES as u64 + 10);
        assert_eq!(recent.entries.len(), MAX_ENTRIES);
        assert_eq!(indices(recent.get(&(10..11))), None);
        let mut big = Recent::default();
        for i in 1..=3 {
            big.push(entry(i), MAX_BYTES / 2);
        }
        assert_eq!(indices(big.get(&(1..2))), None);
        assert_eq!(indices(big.get(&(2..4))), Some(vec![2, 3]));
        // A single entry larger than the bound is still kept (the newest is always there).
        big.push(entry(4), MAX_BYTES * 2);
        assert_eq!(indices(big.get(&(4..5))), Some(vec![4]));
    }
}
