//! The stores as Raft sees them, with metrics: each wrapper forwards every call to the store it
//! wraps and notes what it saw — the commit index, apply batches and their time, snapshot sizes
//! and build times — so observing a node needs no change in its storage.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, LogState, RaftLogReader, RaftSnapshotBuilder, RaftTypeConfig, SnapshotMeta,
    StoredMembership, Vote,
};

use crate::metrics::{metrics, StoreStats};
use crate::store::{LogStore, StateMachineStore};
use crate::types::{LogId, NodeId, StorageError, TypeConfig};

/// [`LogStore`] noting the commit index openraft saves.
#[derive(Clone)]
pub struct MeteredLog {
    inner: LogStore,
    stats: Arc<StoreStats>,
}

impl MeteredLog {
    /// Wraps `inner`, reporting into `stats`.
    pub fn new(inner: LogStore, stats: Arc<StoreStats>) -> Self {
        Self { inner, stats }
    }
}

impl RaftLogReader<TypeConfig> for MeteredLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        self.inner.try_get_log_entries(range).await
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        self.inner.limited_get_log_entries(start, end).await
    }
}

impl RaftLogStorage<TypeConfig> for MeteredLog {
    type LogReader = <LogStore as RaftLogStorage<TypeConfig>>::LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        self.inner.get_log_state().await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.inner.get_log_reader().await
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.inner.save_vote(vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.inner.read_vote().await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.inner.save_committed(committed).await?;
        if let Some(committed) = committed {
            self.stats
                .committed
                .fetch_max(committed.index, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed = self.inner.read_committed().await?;
        if let Some(committed) = committed {
            self.stats
                .committed
                .fetch_max(committed.index, Ordering::Relaxed);
        }
        Ok(committed)
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
        self.inner.append(entries, callback).await
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.inner.truncate(log_id).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.inner.purge(log_id).await
    }
}

/// [`StateMachineStore`] timing apply batches and snapshot builds.
#[derive(Clone)]
pub struct MeteredStateMachine {
    inner: StateMachineStore,
}

impl MeteredStateMachine {
    /// Wraps `inner`.
    pub fn new(inner: StateMachineStore) -> Self {
        Self { inner }
    }
}

/// The snapshot builder of [`MeteredStateMachine`].
pub struct MeteredSnapshotBuilder<B> {
    inner: B,
}

impl<B: RaftSnapshotBuilder<TypeConfig>> RaftSnapshotBuilder<TypeConfig>
    for MeteredSnapshotBuilder<B>
{
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let started = Instant::now();
        let snapshot = self.inner.build_snapshot().await?;
        metrics().snapshot_built(snapshot.snapshot.get_ref().len(), started.elapsed());
        Ok(snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for MeteredStateMachine {
    type SnapshotBuilder = MeteredSnapshotBuilder<
        <StateMachineStore as RaftStateMachine<TypeConfig>>::SnapshotBuilder,
    >;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, BasicNode>), StorageError> {
        self.inner.applied_state().await
    }

    async fn apply<I>(
        &mut self,
        entries: I,
    ) -> Result<Vec<<TypeConfig as RaftTypeConfig>::R>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        let count = entries.len();
        let started = Instant::now();
        let responses = self.inner.apply(entries).await?;
        metrics().observe_apply(count, started.elapsed());
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        MeteredSnapshotBuilder {
            inner: self.inner.get_snapshot_builder().await,
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<std::io::Cursor<Vec<u8>>>, StorageError> {
        self.inner.begin_receiving_snapshot().await
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<std::io::Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.get_ref().len();
        self.inner.install_snapshot(meta, snapshot).await?;
        metrics().snapshot_installed(bytes);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        self.inner.get_current_snapshot().await
    }
}
