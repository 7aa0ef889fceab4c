//! Durable storage on sled: the Raft log and vote ([`LogStore`]) and the state machine with its
//! snapshots ([`StateMachineStore`]).
//!
//! Two sled databases per node. The log's (at `path`) holds the trees `log` (entries by index)
//! and `meta` (vote, committed, last purged). The snapshot store's (at `path/snapshot-store`)
//! holds the latest snapshot's meta and bytes: writing a snapshot image of ~100 MB takes sled's
//! database-wide batch lock and holds a writer on its current IO buffer while the image goes to
//! a blob file, so in the log's database it stalled every log append and sync of that node for
//! the whole write (docs/benchmarks.md, "State scale"). The state machine itself lives in memory;
//! its durable image is the latest snapshot plus the log suffix, which openraft re-applies on
//! start-up up to the saved committed index.

mod cover;
mod disk;
mod log;
mod recent;
mod state_machine;

pub use log::LogStore;
pub use state_machine::{Applied, StateMachineStore};

use openraft::{ErrorSubject, ErrorVerb};

use crate::history::HistoryLimits;
use crate::types::StorageError;

/// Opens (or creates) a node's sled database and returns both stores over it, with the default
/// watch history.
pub fn open(path: &std::path::Path) -> Result<(LogStore, StateMachineStore), StorageError> {
    open_with(path, HistoryLimits::default())
}

/// [`open`] keeping a watch history of `limits`.
pub fn open_with(
    path: &std::path::Path,
    limits: HistoryLimits,
) -> Result<(LogStore, StateMachineStore), StorageError> {
    let log = open_disk(sled::Config::new().path(path), path)?;
    let images_path = path.join(SNAPSHOT_STORE);
    // Snapshot images are read once at start-up and written whole: no cache worth the memory.
    let images = open_disk(
        sled::Config::new()
            .path(&images_path)
            .cache_capacity(SNAPSHOT_STORE_CACHE),
        &images_path,
    )?;
    let state_machine = StateMachineStore::new(&log, &images, limits)?;
    let log = LogStore::new(&log, state_machine.cover())?;
    Ok((log, state_machine))
}

/// The snapshot store's sled directory inside the log's (sled ignores entries it does not know;
/// its own snapshot files start with `snap.`).
pub const SNAPSHOT_STORE: &str = "snapshot-store";

/// sled's page cache for the snapshot store (bytes).
const SNAPSHOT_STORE_CACHE: u64 = 16 << 20;

fn open_disk(config: sled::Config, path: &std::path::Path) -> Result<disk::Disk, StorageError> {
    let db = config
        .open()
        .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Read, e))?;
    disk::Disk::new(db, path).map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Read, e))
}

/// Wraps any storage failure as openraft's storage error.
pub(crate) fn io_error(
    subject: ErrorSubject<crate::types::NodeId>,
    verb: ErrorVerb,
    err: impl std::error::Error + Send + Sync + 'static,
) -> StorageError {
    StorageError::from_io_error(subject, verb, std::io::Error::other(err))
}
