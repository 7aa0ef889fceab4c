//! The Raft log and vote on sled.
//!
//! Durability rule: openraft is told that a vote or an entry is stored only after it is on disk
//! (sled flushed, then fdatasync: see [`super::disk`]). An append inserts its entries, syncs, and
//! only then completes its callback. openraft 0.9 awaits each append's callback before it runs
//! its next command (`RaftCore::append_to_log`), so appends never overlap and a leader replicates
//! an entry only once its own copy is synced; what makes one sync cover many client commands
//! (group commit) is the proposer packing them into one entry (`crate::proposer`) and openraft
//! appending a follower's received entries together. Votes, truncations and purge points sync
//! too. Nothing here uses a `sled::Batch` (see [`LogStore::remove_range`]).

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{Entry, ErrorSubject, ErrorVerb, LogState, RaftLogReader, Vote};

use super::cover::Cover;
use super::disk::Disk;
use super::io_error;
use super::recent::Recent;
use crate::codec;
use crate::types::{LogId, NodeId, StorageError, TypeConfig};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

/// The log store: entries in the `log` tree keyed by big-endian index, pointers in `meta`.
#[derive(Clone)]
pub struct LogStore {
    disk: Disk,
    /// What the durable snapshot covers: a purge never goes past it while one streams in.
    cover: Cover,
    log: sled::Tree,
    meta: sled::Tree,
    /// The newest entries, decoded, for the reads that follow an append.
    recent: Arc<Mutex<Recent>>,
}

impl LogStore {
    pub(super) fn new(disk: &Disk, cover: Cover) -> Result<Self, StorageError> {
        let open = |name: &str| {
            disk.db()
                .open_tree(name)
                .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Read, e))
        };
        let store = Self {
            disk: disk.clone(),
            cover,
            log: open("log")?,
            meta: open("meta")?,
            recent: Arc::default(),
        };
        store.drop_entries_after_a_hole()?;
        // What sled read back may be what a killed process left in the page cache, never
        // synced: an entry it was appending, a vote it was saving. openraft trusts both (an
        // entry the leader sends again is found there and not appended, so not synced; a
        // candidate asking again for a vote granted is granted without a save), and would
        // answer on them before anything syncs them: a power loss then would take an entry
        // the leader counted as stored, or a vote granted. So everything is made durable once,
        // before Raft reads any of it.
        disk.sync_blocking()
            .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Write, e))?;
        Ok(store)
    }

    /// Makes the log contiguous again after a power loss that left a hole in it.
    ///
    /// sled keeps an entry too large for its log segments (a big batch) in a file of its own
    /// and recovers, after a crash, the record that points to that file even when the file
    /// itself did not reach the disk: it then skips the entry and keeps the later ones. Its
    /// background flusher can make such a record durable before the append's own sync has
    /// synced the file. An entry after a hole was appended no earlier than the lost one, so no
    /// append that holds it has been reported stored (each reports only after syncing every
    /// file it wrote): the entries from the hole on are dropped, as a crash before the sync
    /// would have.
    ///
    /// The committed pointer is saved only after its entries were synced (openraft 0.9 awaits
    /// each append's callback before its next command), and the durable snapshot covers only
    /// committed entries, so a hole at or below either means that entries reported stored are
    /// gone — a damaged disk, a deleted file, a data dir copied while its node ran. (The
    /// pointer is saved lazily, and not at all when a snapshot is installed: the snapshot's
    /// end may be the further of the two.) Such a node must not go on: it could vote for a
    /// candidate that lacks committed entries. It refuses to start instead, saying so.
    fn drop_entries_after_a_hole(&self) -> Result<(), StorageError> {
        let error = |e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e);
        let last_purged: Option<LogId> = self.read_meta(LAST_PURGED, ErrorSubject::Logs)?;
        let mut expected = last_purged.map(|id| id.index + 1);
        let mut hole_at = None;
        for key in self.log.range(index_key(expected.unwrap_or(0))..).keys() {
            let key = key.map_err(error)?;
            let index = key
                .as_ref()
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| {
                    io_error(
                        ErrorSubject::Logs,
                        ErrorVerb::Read,
                        std::io::Error::other("a log key is not 8 bytes"),
                    )
                })?;
            if expected.is_some_and(|expected| index != expected) {
                hole_at = expected;
                break;
            }
            expected = Some(index + 1);
        }
        let Some(missing) = hole_at else {
            return Ok(());
        };
        let committed: Option<LogId> = self
            .read_meta::<Option<LogId>>(COMMITTED, ErrorSubject::Store)?
            .flatten()
            .max(self.cover.durable());
        if let Some(committed) = committed.filter(|committed| committed.index >= missing) {
            return Err(io_error(
                ErrorSubject::Logs,
                ErrorVerb::Read,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "the Raft log lost entry {missing}, which was stored and committed \
                 (entries up to {} were committed): this data dir is damaged; replace the node \
                 as a dead one (docs/operations.md, \"Replacing a dead node\")",
                        committed.index
                    ),
                ),
            ));
        }
        tracing::warn!(
            missing,
            "the log lost entry {missing} in a crash but kept later ones; dropping them (never \
             reported stored)"
        );
        // Made durable with the rest of what was opened (`LogStore::new`).
        self.remove_range(index_key(missing).., Removal::NewestFirst)
    }

    fn recent(&self) -> MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        subject: ErrorSubject<NodeId>,
    ) -> Result<Option<T>, StorageError> {
        let Some(bytes) = self
            .meta
            .get(key)
            .map_err(|e| io_error(subject.clone(), ErrorVerb::Read, e))?
        else {
            return Ok(None);
        };
        codec::decode(&bytes)
            .map(Some)
            .map_err(|e| io_error(subject, ErrorVerb::Read, e))
    }

    async fn write_meta<T: serde::Serialize>(
        &self,
        key: &[u8],
        value: &T,
        subject: ErrorSubject<NodeId>,
    ) -> Result<(), StorageError> {
        let bytes =
            codec::encode(value).map_err(|e| io_error(subject.clone(), ErrorVerb::Write, e))?;
        self.meta
            .insert(key, bytes)
            .map_err(|e| io_error(subject.clone(), ErrorVerb::Write, e))?;
        self.flush(subject).await
    }

    async fn flush(&self, subject: ErrorSubject<NodeId>) -> Result<(), StorageError> {
        self.disk
            .sync()
            .await
            .map_err(|e| io_error(subject, ErrorVerb::Write, e))
    }

    fn decode_entry(bytes: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
        codec::decode(bytes).map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))
    }

    fn last_entry(&self) -> Result<Option<Entry<TypeConfig>>, StorageError> {
        match self
            .log
            .last()
            .map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?
        {
            Some((_, bytes)) => Self::decode_entry(&bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Removes every entry with an index in `range`, one plain remove at a time, in `order`.
    ///
    /// Not a `sled::Batch`: sled 0.34 runs every batch under a lock shared by all its databases
    /// in the process, and from the first batch on every other sled call (every append, every
    /// read for replication) waits on that lock too (docs/design.md, "Storage").
    /// Atomicity is not needed: sled recovers a prefix of its writes in order, so removing from
    /// the right end leaves a contiguous log after any crash.
    fn remove_range(
        &self,
        range: impl RangeBounds<[u8; 8]>,
        order: Removal,
    ) -> Result<(), StorageError> {
        let error = |e| io_error(ErrorSubject::Logs, ErrorVerb::Delete, e);
        let keys = self.log.range(range).keys();
        let keys: Box<dyn Iterator<Item = sled::Result<sled::IVec>>> = match order {
            Removal::OldestFirst => Box::new(keys),
            Removal::NewestFirst => Box::new(keys.rev()),
        };
        for key in keys {
            self.log.remove(key.map_err(error)?).map_err(error)?;
        }
        Ok(())
    }
}

/// The end of the log a removal starts from, so that it never leaves a hole.
#[derive(Clone, Copy)]
enum Removal {
    /// A purge: the log's head goes first.
    OldestFirst,
    /// A truncation: the log's tail goes first.
    NewestFirst,
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn encode_bound(bound: std::ops::Bound<&u64>) -> std::ops::Bound<[u8; 8]> {
    match bound {
        std::ops::Bound::Included(i) => std::ops::Bound::Included(index_key(*i)),
        std::ops::Bound::Excluded(i) => std::ops::Bound::Excluded(index_key(*i)),
        std::ops::Bound::Unbounded => std::ops::Bound::Unbounded,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        if let Some(entries) = self.recent().get(&range) {
            return Ok(entries);
        }
        let range = (
            encode_bound(range.start_bound()),
            encode_bound(range.end_bound()),
        );
        self.log
            .range(range)
            .values()
            .map(|bytes| {
                let bytes = bytes.map_err(|e| io_error(ErrorSubject::Logs, ErrorVerb::Read, e))?;
                Self::decode_entry(&bytes)
            })
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.read_meta(LAST_PURGED, ErrorSubject::Logs)?;
        // Entries below the purge point may outlive it on disk (the point is synced first, the
        // removals after it), but the log never ends before the point. Compared by index, not
        // as log ids (ordered by term first): such an entry may carry a later term than the
        // point, as a deposed leader's uncommitted entry does when a snapshot of an older
        // term's entries is installed over it; openraft would then look for the entries between
        // the two and refuse to start.
        let last = match (self.last_entry()?.map(|entry| entry.log_id), last_purged) {
            (Some(entry), Some(purged)) if entry.index <= purged.index => Some(purged),
            (entry, purged) => entry.or(purged),
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write_meta(VOTE, vote, ErrorSubject::Vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(VOTE, ErrorSubject::Vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not flushed on its own: losing the latest committed pointer in a crash only means
        // re-applying a little less on restart; the entries themselves are durable.
        let bytes = codec::encode(&committed)
            .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Write, e))?;
        self.meta
            .insert(COMMITTED, bytes)
            .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Write, e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self
            .read_meta::<Option<LogId>>(COMMITTED, ErrorSubject::Store)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        // Plain inserts, not a `sled::Batch`: sled writes out its IO buffer before and after a
        // batch's manifest (two extra disk writes, each through its thread pool, per append),
        // and atomicity is not needed here. sled recovers a prefix of its writes in order (but
        // for large entries' files: see `drop_entries_after_a_hole`), and nothing is reported
        // durable before the sync below, so a crash can only lose a suffix of unacknowledged
        // entries, which Raft allows.
        let mut recent = self.recent();
        for entry in entries {
            let bytes = codec::encode(&entry)
                .map_err(|e| io_error(ErrorSubject::Log(entry.log_id), ErrorVerb::Write, e))?;
            let size = bytes.len();
            self.log
                .insert(index_key(entry.log_id.index), bytes)
                .map_err(|e| io_error(ErrorSubject::Log(entry.log_id), ErrorVerb::Write, e))?;
            recent.push(entry, size);
        }
        drop(recent);
        // Synced right here, blocking this worker thread for one sled flush and one fdatasync.
        // openraft 0.9's core awaits the callback before its next command anyway, so it would
        // sit parked that long. The rest of the process goes on on other workers: `baton` gives
        // its runtime at least one worker per node plus one (`cli/runtime.rs`). A sync thread of
        // its own cost two thread hand-offs per append (see docs/benchmarks.md).
        let synced = self.disk.sync_blocking();
        callback.log_io_completed(synced);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.recent().truncate(log_id.index);
        self.remove_range(index_key(log_id.index).., Removal::NewestFirst)?;
        self.flush(ErrorSubject::Logs).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Not past a snapshot still on its way to disk (see `cover`).
        self.cover.purge_allowed(log_id).await.map_err(|why| {
            io_error(
                ErrorSubject::Logs,
                ErrorVerb::Delete,
                std::io::Error::other(why),
            )
        })?;
        // Record the purge point first: a crash in between leaves extra entries, never a hole.
        self.write_meta(LAST_PURGED, &log_id, ErrorSubject::Logs)
            .await?;
        self.recent().purge(log_id.index);
        self.remove_range(..=index_key(log_id.index), Removal::OldestFirst)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// A crash between recording a purge point and removing the entries below it leaves entries
    /// that end before the point (a snapshot installed past the log's end, say): the log is
    /// reported to end at the point, never before it, as openraft requires.
    #[tokio::test]
    async fn the_log_never_ends_before_its_purge_point() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _state_machine) = super::super::open(dir.path()).unwrap();
        let entries = (1..=5).map(|index| Entry {
            log_id: log_id(index),
            payload: EntryPayload::Blank,
        });
        log.blocking_append(entries).await.unwrap();
        // The purge point recorded, the removals not yet made.
        log.write_meta(LAST_PURGED, &log_id(9), ErrorSubject::Logs)
            .await
            .unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(9)));
        assert_eq!(state.last_log_id, Some(log_id(9)));
    }

    /// The same when the entry left below the point carries a later term than the point: a
    /// deposed leader's uncommitted entries, over which a snapshot of an older term's entries
    /// was installed (its purge point recorded, the removals not yet synced, then a crash).
    #[tokio::test]
    async fn an_entry_of_a_later_term_left_below_the_purge_point_does_not_end_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _state_machine) = super::super::open(dir.path()).unwrap();
        let deposed = |index| LogId::new(CommittedLeaderId::new(5, 2), index);
        let entries = (1..=5).map(|index| Entry {
            log_id: deposed(index),
            payload: EntryPayload::Blank,
        });
        log.blocking_append(entries).await.unwrap();
        let snapshot_end = LogId::new(CommittedLeaderId::new(4, 1), 9);
        log.write_meta(LAST_PURGED, &snapshot_end, ErrorSubject::Logs)
            .await
            .unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(snapshot_end));
        assert_eq!(state.last_log_id, Some(snapshot_end));
    }

    /// What a killed process wrote but never synced is read back from the page cache when the
    /// node starts again; opening the log makes it durable before Raft can act on it.
    #[test]
    fn opening_the_log_makes_what_sled_read_back_durable() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let disk = Disk::new_without_idle_sync(db.clone(), dir.path()).unwrap();
        // An entry large enough for a blob file of its own, flushed by sled (which never syncs
        // blob files) and not synced: as a process killed inside an append leaves it.
        db.open_tree("log")
            .unwrap()
            .insert(1u64.to_be_bytes(), vec![7u8; 1 << 20])
            .unwrap();
        db.flush().unwrap();
        assert_eq!(disk.synced_blobs(), 0);
        LogStore::new(&disk, Cover::new(None)).unwrap();
        assert_eq!(
            disk.synced_blobs(),
            1,
            "the entry's blob file was not synced"
        );
    }
}
