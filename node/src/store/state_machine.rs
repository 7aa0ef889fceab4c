//! The state machine adapter: runs `baton_statemachine::apply` on committed entries and keeps
//! the latest snapshot durable in its image file.
//!
//! The state lives in memory behind a lock that is never held across an `.await`. A snapshot is
//! the bincode image of [`State`]; building one persists it, and on start-up the store resumes
//! from it (openraft then re-applies the committed log suffix).
//!
//! Every apply batch and every installed snapshot bumps a [`watch`] of the applied log index, so
//! a handler that waits for the state to change (the queue's long-poll lease) sleeps until it
//! does instead of polling. Every applied entry also appends the changes it made to the
//! [`History`] that watch streams read; installing a snapshot restarts the history after it.

use std::io::Cursor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use baton_statemachine::rules;
use baton_statemachine::{apply_with_changes, Command, State};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, SnapshotMeta,
    StoredMembership,
};

use tokio::sync::watch;

use super::cover::Cover;
use super::disk::Disk;
use super::image::ImageFile;
use super::io_error;
use super::legacy;
use super::unwind::AbortOnUnwind;
use crate::codec;
use crate::history::{History, HistoryLimits};
use crate::types::{Batch, LogId, NodeId, Responses, StorageError, TypeConfig};

/// How often an apply waiting for a snapshot's copy of the state checks the lock.
const COPY_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// One copy of the state in progress, counted while it lasts (however it ends): copies may
/// overlap (a snapshot build and a backup), and the first to end must not tell applies that
/// nothing is copying any more.
struct Copying<'a>(&'a AtomicUsize);

impl<'a> Copying<'a> {
    fn start(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count)
    }
}

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The applied state and the Raft pointers that describe it.
#[derive(Debug, Default)]
pub struct Applied {
    /// The coordination state.
    pub state: State,
    /// The last log entry applied to `state`.
    pub last_applied: Option<LogId>,
    /// The last membership applied.
    pub membership: StoredMembership<NodeId, BasicNode>,
}

/// The state machine store; clones share the same state.
#[derive(Clone)]
pub struct StateMachineStore {
    applied: Arc<RwLock<Applied>>,
    /// Set while a snapshot build copies the state under the read lock.
    copying: Arc<AtomicUsize>,
    /// The last applied log index (0 before anything), bumped after every apply batch and every
    /// snapshot install.
    applied_index: Arc<watch::Sender<u64>>,
    /// The changes of the most recently applied entries, for watches.
    history: History,
    /// The latest snapshot's file.
    image: ImageFile,
    /// What the image on disk covers, shared with the log store (see `cover`).
    cover: Cover,
    /// Held while an image is checked against the stored one and written, so that a build that
    /// finishes after a newer snapshot was installed cannot write its older image over it.
    saving: Arc<tokio::sync::Mutex<()>>,
    /// The size of the snapshot the store resumed from when it was opened, if any.
    opened_from: Option<usize>,
}

impl StateMachineStore {
    /// The store whose snapshot is kept in `path` beside the log's database (`log`), first
    /// moving a snapshot that an older version kept elsewhere there.
    pub(super) fn new(
        path: &std::path::Path,
        log: &Disk,
        limits: HistoryLimits,
    ) -> Result<Self, StorageError> {
        let image = ImageFile::new(path);
        legacy::move_snapshot(path, log, &image)
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?;
        let mut store = Self {
            applied: Arc::default(),
            copying: Arc::default(),
            applied_index: Arc::new(watch::Sender::new(0)),
            history: History::new(limits, 0),
            image,
            cover: Cover::new(None),
            saving: Arc::default(),
            opened_from: None,
        };
        if let Some(snapshot) = store.load_snapshot()? {
            store.restore(&snapshot.meta, snapshot.snapshot.get_ref())?;
            store.cover.on_disk(snapshot.meta.last_log_id);
            store.opened_from = Some(snapshot.snapshot.get_ref().len());
        }
        Ok(store)
    }

    /// The size in bytes of the snapshot the store resumed from when it was opened, if any.
    pub fn opened_from_snapshot(&self) -> Option<usize> {
        self.opened_from
    }

    /// What the image on disk covers, for the log store.
    pub(super) fn cover(&self) -> Cover {
        self.cover.clone()
    }

    /// Read access to the applied state (never hold the guard across an `.await`).
    pub fn read(&self) -> RwLockReadGuard<'_, Applied> {
        self.applied
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Watches the applied log index: the receiver sees a change after every apply batch and
    /// every snapshot install, i.e. whenever the state may have changed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied_index.subscribe()
    }

    /// The change history watch streams read.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Tells the watchers that the state changed (call with no lock held).
    fn bump(&self, last_applied: Option<LogId>) {
        let index = last_applied.map_or(0, |id| id.index);
        // `send_replace` also stores the value when nobody watches right now.
        self.applied_index.send_replace(index);
    }

    fn write(&self) -> RwLockWriteGuard<'_, Applied> {
        self.applied
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The write lock for an apply, waited for without blocking a runtime worker while a
    /// snapshot build copies the state under the read lock. A blocked `write()` there held one
    /// of the node's two workers for as long, and every reader arriving meanwhile queued behind
    /// the waiting writer on the other: when builds encoded under the lock (up to ~1 s), the node
    /// froze, its heartbeats stopped, and a follower stood for election against a healthy leader
    /// (docs/benchmarks.md, "State scale").
    async fn write_for_apply(&self) -> RwLockWriteGuard<'_, Applied> {
        loop {
            if self.copying.load(Ordering::Acquire) == 0 {
                return self.write();
            }
            match self.applied.try_write() {
                Ok(guard) => return guard,
                Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => {}
            }
            tokio::time::sleep(COPY_POLL).await;
        }
    }

    /// Runs `copy` on the applied state under the read lock, telling applies meanwhile to wait
    /// for the lock without blocking a runtime worker (`Self::write_for_apply`). For reads
    /// that take long because they copy much of the state: a snapshot build, a backup.
    pub fn copy<T>(&self, copy: impl FnOnce(&Applied) -> T) -> T {
        let _copying = Copying::start(&self.copying);
        copy(&self.read())
    }

    /// Replaces the in-memory state with a snapshot's.
    fn restore(
        &self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        data: &[u8],
    ) -> Result<(), StorageError> {
        let state: State = codec::decode_state(data).map_err(|e| {
            io_error(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Read,
                e,
            )
        })?;
        {
            let mut applied = self.write();
            applied.state = state;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
        }
        self.history
            .reset(meta.last_log_id.map_or(0, |id| id.index));
        self.bump(meta.last_log_id);
        Ok(())
    }

    /// The applied state's snapshot image and its meta.
    ///
    /// The state is copied under the read lock and encoded after the lock is released, so
    /// applies wait only for the copy, which shares the tasks, tickets and keys with the live
    /// state (they sit behind `Arc`s) and copies the trees' nodes: ~0.15 s per million live
    /// leases, against 0.3–1.1 s for the encode that applies used to wait for
    /// (docs/benchmarks.md, "State scale").
    fn encode_snapshot(&self) -> Result<(Vec<u8>, SnapshotMeta<NodeId, BasicNode>), StorageError> {
        let (state, last_applied, last_membership) = self.copy(|applied| {
            (
                applied.state.clone(),
                applied.last_applied,
                applied.membership.clone(),
            )
        });
        let data = codec::encode_state(&state)
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))?;
        let snapshot_id = match last_applied {
            Some(id) => format!(
                "{}-{}-{:016x}",
                id.leader_id.term,
                id.index,
                rand::random::<u64>()
            ),
            None => format!("empty-{:016x}", rand::random::<u64>()),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership,
            snapshot_id,
        };
        Ok((data, meta))
    }

    /// Makes `meta` and `data` the durable snapshot, unless the stored one is as new already
    /// (a build that copied the state before a newer snapshot was installed); returns whether
    /// it wrote, and `data` back.
    async fn save_snapshot(
        &self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        data: Vec<u8>,
    ) -> Result<(bool, Vec<u8>), StorageError> {
        let _saving = self.saving.lock().await;
        let stored = self.cover.durable();
        if stored.is_some() && stored >= meta.last_log_id {
            return Ok((false, data));
        }
        let subject = || ErrorSubject::Snapshot(Some(meta.signature()));
        let meta_bytes =
            codec::encode(meta).map_err(|e| io_error(subject(), ErrorVerb::Write, e))?;
        // Writing and syncing ~120 MB per million leases: not on a runtime worker.
        let image = self.image.clone();
        let data =
            tokio::task::spawn_blocking(move || image.write(&meta_bytes, &data).map(|()| data))
                .await
                .map_err(|e| io_error(subject(), ErrorVerb::Write, e))?
                .map_err(|e| io_error(subject(), ErrorVerb::Write, e))?;
        self.cover.on_disk(meta.last_log_id);
        Ok((true, data))
    }

    fn load_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let read_error = |e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, e);
        let Some((meta, data)) = self.image.read().map_err(read_error)? else {
            return Ok(None);
        };
        let meta: SnapshotMeta<NodeId, BasicNode> = codec::decode(&meta)
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // Copying and encoding a large state take a while (~0.15 s and ~0.3 s per million
        // leases): on a blocking thread, not on one of the runtime's two workers
        // (docs/benchmarks.md, "State scale").
        let store = self.clone();
        let (data, meta) = tokio::task::spawn_blocking(move || store.encode_snapshot())
            .await
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, e))??;
        let (saved, data) = self.save_snapshot(&meta, data).await?;
        if saved {
            tracing::info!(snapshot = %meta.snapshot_id, bytes = data.len(), "built snapshot");
        } else {
            tracing::info!(
                snapshot = %meta.snapshot_id,
                "built snapshot not stored: a newer one is on disk"
            );
        }
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, BasicNode>), StorageError> {
        let applied = self.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Responses>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut applied = self.write_for_apply().await;
        let unwinding = AbortOnUnwind("an apply");
        let mut responses = Vec::new();
        let mut changed = Vec::new();
        let before = applied.last_applied;
        let mut unknown_rules = None;
        for entry in entries {
            if let Some(why) = unknown_rules_adopted(&entry) {
                unknown_rules = Some((entry.log_id, why));
                break;
            }
            applied.last_applied = Some(entry.log_id);
            let answers = match entry.payload {
                EntryPayload::Normal(Batch(envelopes)) => {
                    let mut answers = Vec::with_capacity(envelopes.len());
                    let mut entry_changes = Vec::new();
                    for envelope in &envelopes {
                        let (response, changes) = apply_with_changes(&mut applied.state, envelope);
                        if entry_changes.is_empty() {
                            // A lone sweep's changes move as they are, uncopied.
                            entry_changes = changes;
                        } else {
                            entry_changes.extend(changes);
                        }
                        answers.push(response);
                    }
                    tracing::trace!(
                        index = entry.log_id.index,
                        commands = envelopes.len(),
                        changes = entry_changes.len(),
                        "applied"
                    );
                    if !entry_changes.is_empty() {
                        changed.push((entry.log_id.index, entry_changes));
                    }
                    answers
                }
                EntryPayload::Membership(membership) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Vec::new()
                }
                EntryPayload::Blank => Vec::new(),
            };
            responses.push(Responses(answers));
        }
        let after = applied.last_applied;
        drop(unwinding);
        drop(applied);
        if after != before {
            self.history.record(changed, after.map_or(0, |id| id.index));
            self.bump(after);
        }
        if let Some((log_id, why)) = unknown_rules {
            // Raft stops on this error and the node exits saying why: applying the entry, or any
            // after it, by older rules would leave this replica different from the others.
            return Err(io_error(
                ErrorSubject::Apply(log_id),
                ErrorVerb::Write,
                std::io::Error::other(format!(
                    "entry {} adopts new apply rules, and {why}",
                    log_id.index
                )),
            ));
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        self.cover.receiving();
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let len = data.len();
        // openraft installs only a snapshot past what is committed. Were one older than the state
        // to arrive anyway, installing it would move the state back, and re-applying from it
        // would apply entries twice: stop instead.
        let applied = self.read().last_applied;
        if applied.is_some() && applied > meta.last_log_id {
            let error = io_error(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Write,
                std::io::Error::other(format!(
                    "a snapshot ending at {:?} is older than the state, applied to {applied:?}",
                    meta.last_log_id
                )),
            );
            self.cover.abandoned(meta.last_log_id, &error);
            return Err(error);
        }
        let installed = async {
            // Decoding a large state takes a while (~0.3–1 s per million leases), and the
            // write lock may wait for a backup's copy: on a blocking thread, not on one of the
            // runtime's two workers.
            let (store, meta_copy) = (self.clone(), meta.clone());
            let data = tokio::task::spawn_blocking(move || {
                store.restore(&meta_copy, &data).map(|()| data)
            })
            .await
            .map_err(|e| {
                io_error(
                    ErrorSubject::Snapshot(Some(meta.signature())),
                    ErrorVerb::Read,
                    e,
                )
            })??;
            self.save_snapshot(meta, data).await
        };
        if let Err(error) = installed.await {
            self.cover.abandoned(meta.last_log_id, &error);
            return Err(error);
        }
        // Stored now, or a snapshot as new was already: either way the stream has landed.
        self.cover.installed(meta.last_log_id);
        tracing::info!(snapshot = %meta.snapshot_id, bytes = len, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        // openraft asks for it on its state machine task whenever it sends a snapshot to a
        // follower: reading and copying a large image there would hold up applies and block a
        // runtime worker meanwhile.
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.load_snapshot())
            .await
            .map_err(|e| io_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))?
    }
}

/// Why this build cannot apply `entry`: it adopts apply rules the build does not know
/// ([`rules::known`]).
fn unknown_rules_adopted(entry: &Entry<TypeConfig>) -> Option<String> {
    let EntryPayload::Normal(Batch(envelopes)) = &entry.payload else {
        return None;
    };
    envelopes
        .iter()
        .find_map(|envelope| match envelope.command {
            Command::AdoptRules { rules } => rules::known(rules).err(),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use openraft::{CommittedLeaderId, LogId};

    use super::*;

    /// An apply that waits for a snapshot's copy of the state leaves the runtime's thread free:
    /// on a single-threaded runtime, another task keeps running meanwhile (a blocking `write()`
    /// would stop it for the whole copy).
    #[tokio::test(flavor = "current_thread")]
    async fn an_apply_waiting_for_a_snapshot_copy_does_not_block_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, mut sm) = crate::store::open(dir.path()).unwrap();

        // A long copy on another thread, overlapping a short one that ends first. It lasts until
        // the runtime has ticked 10 times, which it can only do while the apply below waits for
        // the copy (the test's task does not yield before): a blocked runtime never ticks, and
        // the copy gives up after 30 s.
        let ticks = Arc::new(AtomicUsize::new(0));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let copier = {
            let (sm, ticks) = (sm.clone(), ticks.clone());
            std::thread::spawn(move || {
                sm.copy(|_| {
                    held_tx.send(()).unwrap();
                    let started = std::time::Instant::now();
                    while ticks.load(Ordering::Relaxed) < 10
                        && started.elapsed() < Duration::from_secs(30)
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                })
            })
        };
        held_rx.recv().unwrap();
        sm.copy(|_| ());

        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let blank = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
            payload: EntryPayload::Blank,
        };
        sm.apply(vec![blank]).await.unwrap();
        ticker.abort();
        copier.join().unwrap();

        assert_eq!(sm.read().last_applied.map(|id| id.index), Some(1));
        let ticked = ticks.load(Ordering::Relaxed);
        assert!(
            ticked >= 10,
            "the runtime ran only {ticked} ticks while the apply waited"
        );
    }

    /// An entry adopting apply rules this build does not know stops the apply before it (Raft
    /// then stops the node), with the entries before it applied; rules it knows are adopted.
    #[tokio::test]
    async fn an_entry_adopting_unknown_rules_is_not_applied() {
        use baton_statemachine::rules::RULES;
        use baton_statemachine::{Envelope, Stamp};

        let dir = tempfile::tempdir().unwrap();
        let (_log, mut sm) = crate::store::open(dir.path()).unwrap();
        let adopt = |index, rules| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Batch(vec![Envelope {
                stamp: Stamp {
                    now_ms: 1,
                    entropy: 0,
                },
                origin: None,
                command: Command::AdoptRules { rules },
            }])),
        };
        sm.apply(vec![adopt(1, RULES)]).await.unwrap();
        assert_eq!(sm.read().state.rules, RULES);

        let refused = sm
            .apply(vec![adopt(2, RULES), adopt(3, RULES + 1), adopt(4, RULES)])
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("run a newer build"),
            "{refused}"
        );
        let applied = sm.read();
        assert_eq!(applied.last_applied.map(|id| id.index), Some(2));
        assert_eq!(applied.state.rules, RULES);
    }
}
