//! Which waiting tasks a lease has to look at.
//!
//! A lease hands out the oldest waiting tasks of the queues it names, passing over tasks whose
//! concurrency key is held (no head-of-line blocking). Walking every waiting task would make a
//! backlog behind one busy key cost every lease, and every idle worker's poll, a walk over the
//! whole backlog — inside the apply, on every replica. Yet of a key's waiting tasks in one queue
//! only the oldest can ever be the next one leased, and none while the key is held. So this index
//! keeps, per queue, the waiting tasks without a key and, for each key without a holder, its
//! oldest waiting task there: a lease stops after at most `limit` tasks plus one per key it has
//! already taken.
//!
//! It is derived state: never written into snapshots, rebuilt from the tasks and permits when a
//! queue is read back (see [`Leasable::insert`] for the rule that keeps it equal to a rebuild).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use super::types::Task;

/// `(namespace, concurrency key)`: what a permit is for.
pub(crate) type PermitKey = (String, String);

/// The queues a lease draws from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Queues {
    /// Every queue: only those with waiting tasks are looked at, so a lease's cost does not
    /// grow with the number of idle queues.
    All,
    /// These queues, sorted and without repeats.
    Named(Vec<String>),
}

impl Queues {
    /// Whether `queue` is one of them.
    pub(crate) fn contains(&self, queue: &str) -> bool {
        match self {
            Queues::All => true,
            Queues::Named(names) => names
                .binary_search_by(|name| name.as_str().cmp(queue))
                .is_ok(),
        }
    }
}

/// The waiting tasks a lease considers, per queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Leasable {
    /// Per queue: the waiting tasks without a concurrency key.
    unkeyed: BTreeMap<String, BTreeSet<u64>>,
    /// Per queue: for each concurrency key without a holder, its oldest waiting task there.
    heads: BTreeMap<String, BTreeSet<u64>>,
    /// Every waiting task with a concurrency key: per key, per queue.
    by_key: BTreeMap<PermitKey, BTreeMap<String, BTreeSet<u64>>>,
}

impl Leasable {
    /// `task` is now waiting; `free` says its key (if it has one) has no holder. The index
    /// equals a rebuild as long as `free` is always the permit's state at the call, and
    /// [`Leasable::close`] / [`Leasable::open`] follow every change of a holder.
    pub(crate) fn insert(&mut self, task: &Task, free: bool) {
        let queue = &task.spec.queue;
        let Some(key) = permit_key(task) else {
            self.unkeyed
                .entry(queue.clone())
                .or_default()
                .insert(task.id);
            return;
        };
        let waiting = self
            .by_key
            .entry(key)
            .or_default()
            .entry(queue.clone())
            .or_default();
        let old_head = waiting.first().copied();
        waiting.insert(task.id);
        if free && old_head.is_none_or(|head| task.id < head) {
            let heads = self.heads.entry(queue.clone()).or_default();
            if let Some(head) = old_head {
                heads.remove(&head);
            }
            heads.insert(task.id);
        }
    }

    /// `task` is no longer waiting; `free` as for [`Leasable::insert`].
    pub(crate) fn remove(&mut self, task: &Task, free: bool) {
        let queue = &task.spec.queue;
        let Some(key) = permit_key(task) else {
            remove_from(&mut self.unkeyed, queue, task.id);
            return;
        };
        let Some(queues) = self.by_key.get_mut(&key) else {
            return;
        };
        let Some(waiting) = queues.get_mut(queue) else {
            return;
        };
        let was_head = waiting.first() == Some(&task.id);
        waiting.remove(&task.id);
        let next = waiting.first().copied();
        if waiting.is_empty() {
            queues.remove(queue);
            if queues.is_empty() {
                self.by_key.remove(&key);
            }
        }
        if free && was_head {
            remove_from(&mut self.heads, queue, task.id);
            if let Some(next) = next {
                self.heads.entry(queue.clone()).or_default().insert(next);
            }
        }
    }

    /// `key`'s permit was taken: none of its tasks can be leased until it is released.
    pub(crate) fn close(&mut self, key: &PermitKey) {
        let Some(queues) = self.by_key.get(key) else {
            return;
        };
        for (queue, waiting) in queues {
            if let Some(head) = waiting.first() {
                remove_from(&mut self.heads, queue, *head);
            }
        }
    }

    /// `key`'s permit was released: its oldest waiting task in each queue can be leased.
    pub(crate) fn open(&mut self, key: &PermitKey) {
        let Some(queues) = self.by_key.get(key) else {
            return;
        };
        for (queue, waiting) in queues {
            if let Some(head) = waiting.first() {
                self.heads.entry(queue.clone()).or_default().insert(*head);
            }
        }
    }

    /// The tasks a lease on `queues` considers, oldest first across the queues: the unkeyed
    /// ones, and with `keyed` the oldest waiting task of each key without a holder. A heap
    /// merges the queues, so each task costs a logarithm of their number (a linear scan per
    /// task made a lease over many queues, each with a head of one key, quadratic).
    pub(crate) fn candidates<'a>(
        &'a self,
        queues: &Queues,
        keyed: bool,
    ) -> impl Iterator<Item = u64> + use<'a> {
        let sets = |index: &'a BTreeMap<String, BTreeSet<u64>>| -> Vec<&'a BTreeSet<u64>> {
            match queues {
                Queues::All => index.values().collect(),
                Queues::Named(names) => names.iter().filter_map(|queue| index.get(queue)).collect(),
            }
        };
        let mut sources = sets(&self.unkeyed);
        if keyed {
            sources.extend(sets(&self.heads));
        }
        let mut sources: Vec<_> = sources.into_iter().map(|set| set.iter().copied()).collect();
        // Each task is in one set only (its queue's unkeyed tasks, or its key's head there), so
        // the heap never holds one id twice.
        let mut next: BinaryHeap<Reverse<(u64, usize)>> = sources
            .iter_mut()
            .enumerate()
            .filter_map(|(source, ids)| ids.next().map(|id| Reverse((id, source))))
            .collect();
        std::iter::from_fn(move || {
            let Reverse((id, source)) = next.pop()?;
            if let Some(after) = sources.get_mut(source).and_then(Iterator::next) {
                next.push(Reverse((after, source)));
            }
            Some(id)
        })
    }

    /// Every waiting task of `key` in `queue`, oldest first.
    pub(crate) fn waiting_on<'a>(
        &'a self,
        key: &PermitKey,
        queue: &str,
    ) -> impl Iterator<Item = u64> + 'a {
        self.by_key
            .get(key)
            .and_then(|queues| queues.get(queue))
            .into_iter()
            .flatten()
            .copied()
    }
}

/// The permit `task` needs, if it has a concurrency key.
pub(crate) fn permit_key(task: &Task) -> Option<PermitKey> {
    let key = &task.spec.concurrency_key;
    (!key.is_empty()).then(|| (task.namespace.clone(), key.clone()))
}

fn remove_from(sets: &mut BTreeMap<String, BTreeSet<u64>>, queue: &str, id: u64) {
    if let Some(set) = sets.get_mut(queue) {
        set.remove(&id);
        if set.is_empty() {
            sets.remove(queue);
        }
    }
}
