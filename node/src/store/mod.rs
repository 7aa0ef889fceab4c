//! Durable storage on sled: the Raft log and vote ([`LogStore`]) and the state machine with its
//! snapshots ([`StateMachineStore`]).
//!
//! One sled database per node, at `path`, holds the trees `log` (entries by index) and `meta`
//! (vote, committed, last purged). The latest snapshot is a plain file beside them
//! (`path/raft-snapshot`, `image`): replaced whole, it needs no database, and in sled a value
//! that large stalled the log (in the log's database: a ~100 MB image held sled's database-wide
//! batch lock and a writer on its IO buffer, so every append and sync waited for the whole
//! write; docs/benchmarks.md, "State scale") or was never freed (in a database of its own).
//! The state machine itself lives in memory; its durable image is the latest snapshot plus the
//! log suffix, which openraft re-applies on start-up up to the saved committed index.

mod cover;
mod disk;
mod image;
mod legacy;
mod log;
mod recent;
mod sled_leftovers;
mod state_machine;
mod unwind;

pub use image::FILE_NAME as SNAPSHOT_FILE;
pub use legacy::SNAPSHOT_STORE;

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
    sled_leftovers::remove(path)
        .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Delete, e))?;
    let log = open_disk(sled::Config::new().path(path), path)?;
    // Under sled's lock on `path`: no other process writes an image here.
    let removed = crate::durable_file::remove_leftovers(path).map_err(|e| {
        io_error(
            ErrorSubject::Store,
            ErrorVerb::Delete,
            std::io::Error::other(e),
        )
    })?;
    if removed > 0 {
        tracing::info!(
            removed,
            "removed files of snapshot writes a crash interrupted"
        );
    }
    let state_machine = StateMachineStore::new(path, &log, limits)?;
    let log = LogStore::new(&log, state_machine.cover())?;
    Ok((log, state_machine))
}

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
