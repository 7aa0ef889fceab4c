//! Durable storage on sled: the Raft log and vote ([`LogStore`]) and the state machine with its
//! snapshots ([`StateMachineStore`]).
//!
//! One sled database per node holds three trees: `log` (entries by index), `meta` (vote,
//! committed, last purged) and `snapshot` (the latest snapshot's meta and bytes). The state
//! machine itself lives in memory; its durable image is the latest snapshot plus the log suffix,
//! which openraft re-applies on start-up up to the saved committed index.

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
    let db = sled::Config::new()
        .path(path)
        .open()
        .map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Read, e))?;
    let disk =
        disk::Disk::new(db, path).map_err(|e| io_error(ErrorSubject::Store, ErrorVerb::Read, e))?;
    Ok((
        LogStore::new(&disk)?,
        StateMachineStore::new(&disk, limits)?,
    ))
}

/// Wraps any storage failure as openraft's storage error.
pub(crate) fn io_error(
    subject: ErrorSubject<crate::types::NodeId>,
    verb: ErrorVerb,
    err: impl std::error::Error + Send + Sync + 'static,
) -> StorageError {
    StorageError::from_io_error(subject, verb, std::io::Error::other(err))
}
