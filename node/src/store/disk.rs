//! Making sled's writes survive a power loss, not only a process crash.
//!
//! sled 0.34 (built without io_uring, as here) ends each buffer write with `sync_file_range`,
//! which hands the pages to the device and waits for them, but neither flushes the device's
//! volatile cache nor the file's metadata (its length, for a growing file). Its full `fsync` runs
//! only in its background flusher, every 500 ms. So a write that sled's `flush` reports done
//! survives a `SIGKILL` of the process but not yet a power loss of the machine. Baton promises
//! the second too (an acknowledged write is on a quorum's disks), so after sled's flush it calls
//! `fdatasync` on sled's data file itself.
//!
//! Values too large for a log segment (a quarter of it, ~128 KiB: big batched entries,
//! snapshots) go to files of their own under `<path>/blobs`, which sled never syncs at all. Each
//! sync therefore also syncs every blob file it has not synced at its present length, and the
//! directory: sled's background flusher can be writing a blob (a page it rewrites) while a sync
//! lists the directory, and a blob synced half-written would otherwise never be synced again —
//! after a power loss its checksum would fail, and sled's recovery would stop at it, dropping
//! every later write.
//!
//! That flusher also moves pages while it cleans segments, into new blob files for large ones,
//! and makes its pointers to them durable with its own `fsync` at once — never the files. Under
//! load the next write's sync follows within milliseconds; on an idle node it could be a minute
//! away, and a power loss meanwhile would leave a durable pointer to a blob never written, and
//! the entries the moved page held, long acknowledged, lost. So a background thread also syncs
//! new blob files every [`IDLE_BLOB_SYNC`]. That narrows the window to about that long; it does
//! not close it (only keeping values out of blob files, or sled's flusher under our control,
//! would).
//!
//! sled writes its configuration file (`<path>/conf`) when it creates a database and syncs
//! neither it nor the directories it creates. Opening a database therefore syncs them once: a
//! file system that may record an unsynced file's new length before its data (ext4 with
//! `data=writeback`) could otherwise leave `conf` as zeros after a power loss, and sled refuses
//! to open a database whose configuration does not parse.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often new blob files are synced when no write syncs them (see the module's doc).
const IDLE_BLOB_SYNC: Duration = Duration::from_millis(100);

/// A node's sled database with a handle on the file its log-structured storage lives in.
#[derive(Clone)]
pub(super) struct Disk {
    db: sled::Db,
    /// sled's single data file (`<path>/db`); any descriptor of it syncs the same inode.
    file: Arc<File>,
    /// sled's blob directory and the blob files already synced.
    blobs: Arc<Blobs>,
}

struct Blobs {
    dir: PathBuf,
    /// Each blob file synced, with its length when it was.
    synced: Mutex<HashMap<OsString, u64>>,
    /// The first sync that failed, for good: after a failed `fsync` Linux may mark the pages
    /// clean, and a later one on the same file reports success for data never written. So a
    /// failure on the idle thread fails the next write's sync too, which stops Raft.
    failed: Mutex<Option<String>>,
}

impl Disk {
    /// Wraps `db`, opened at `path`, and makes what sled created there durable.
    pub(super) fn new(db: sled::Db, path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().write(true).open(path.join("db"))?;
        File::open(path.join("conf"))?.sync_all()?;
        sync_dir(path)?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        let disk = Self::without_idle_sync(db, file, path);
        Blobs::sync_while_open(Arc::downgrade(&disk.blobs))?;
        Ok(disk)
    }

    /// [`Disk::new`] without the thread that syncs new blob files while no write does (tests
    /// of what a write's sync does).
    fn without_idle_sync(db: sled::Db, file: File, path: &Path) -> Self {
        Self {
            db,
            file: Arc::new(file),
            blobs: Arc::new(Blobs {
                dir: path.join("blobs"),
                synced: Mutex::default(),
                failed: Mutex::default(),
            }),
        }
    }

    /// [`Disk::new`] without the idle blob sync.
    #[cfg(test)]
    pub(super) fn new_without_idle_sync(db: sled::Db, path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().write(true).open(path.join("db"))?;
        Ok(Self::without_idle_sync(db, file, path))
    }

    pub(super) fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Writes everything sled holds in memory and makes it durable. Blocks the calling thread
    /// (one sled flush plus one `fdatasync`); async code calls [`Disk::sync`], except the log's
    /// append, which blocks on purpose (`LogStore::append`).
    pub(super) fn sync_blocking(&self) -> io::Result<()> {
        self.db.flush().map_err(io::Error::other)?;
        self.blobs.sync_new()?;
        self.file.sync_data()
    }

    /// How many blob files were synced (tests).
    #[cfg(test)]
    pub(super) fn synced_blobs(&self) -> usize {
        self.blobs
            .synced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// [`Disk::sync_blocking`] on tokio's blocking pool.
    pub(super) async fn sync(&self) -> io::Result<()> {
        let disk = self.clone();
        tokio::task::spawn_blocking(move || disk.sync_blocking())
            .await
            .map_err(io::Error::other)?
    }
}

/// Makes the names in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Blobs {
    /// Syncs new blob files every [`IDLE_BLOB_SYNC`] on a thread of its own, until the store
    /// is dropped.
    fn sync_while_open(blobs: Weak<Blobs>) -> io::Result<()> {
        std::thread::Builder::new()
            .name("baton-blob-sync".into())
            .spawn(move || loop {
                std::thread::sleep(IDLE_BLOB_SYNC);
                let Some(blobs) = blobs.upgrade() else {
                    return;
                };
                // Not fatal here: the failure is kept, and the next write's sync returns it.
                if let Err(error) = blobs.sync_new() {
                    tracing::error!(%error, "could not sync sled's blob files");
                    return;
                }
            })?;
        Ok(())
    }

    /// Syncs the blob files written to since the last call (new ones, and ones whose length
    /// changed: still being written then), then their directory entries. Blobs sled has since
    /// removed are forgotten.
    fn sync_new(&self) -> io::Result<()> {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(error) = failed.as_ref() {
            return Err(io::Error::other(format!(
                "an earlier sync of sled's blob files failed: {error}"
            )));
        }
        let synced = self.sync_unsynced();
        if let Err(error) = &synced {
            *failed = Some(error.to_string());
        }
        synced
    }

    /// [`Blobs::sync_new`]'s work.
    fn sync_unsynced(&self) -> io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        let mut present = HashMap::with_capacity(synced.len());
        let mut new = false;
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let path = self.dir.join(&name);
            // Taken before the sync: a write after it changes the length, and the next call
            // syncs the file again.
            let len = match std::fs::metadata(&path) {
                Ok(metadata) => metadata.len(),
                // Removed by sled since it was listed: nothing to make durable.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if synced.get(&name) != Some(&len) {
                match File::open(&path) {
                    Ok(file) => file.sync_data()?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                new = true;
            }
            present.insert(name, len);
        }
        if new {
            sync_dir(&self.dir)?;
        }
        *synced = present;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn syncs_the_file_sled_writes_to() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let disk = Disk::new(db.clone(), dir.path()).unwrap();
        db.insert(b"k", vec![7u8; 1_000]).unwrap();
        disk.sync_blocking().unwrap();
        // The descriptor is sled's data file, and the flushed value is in it.
        let on_disk = std::fs::read(dir.path().join("db")).unwrap();
        assert!(on_disk.windows(64).any(|w| w.iter().all(|&b| b == 7)));
    }

    #[test]
    fn remembers_the_blobs_it_synced_and_forgets_removed_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let disk = Disk::new(db.clone(), dir.path()).unwrap();
        // Larger than a quarter of a segment: sled writes it to a blob file.
        db.insert(b"big", vec![9u8; 1 << 20]).unwrap();
        disk.sync_blocking().unwrap();
        let blobs = |disk: &Disk| disk.blobs.synced.lock().unwrap().len();
        assert_eq!(blobs(&disk), 1, "the large value's blob file was synced");
        db.remove(b"big").unwrap();
        db.insert(b"big2", vec![8u8; 1 << 20]).unwrap();
        disk.sync_blocking().unwrap();
        let on_disk = std::fs::read_dir(dir.path().join("blobs")).unwrap().count();
        assert_eq!(blobs(&disk), on_disk);
    }

    /// A blob file still being written when it was synced (sled's flusher rewriting a page
    /// meanwhile) is synced again once its length changed.
    #[test]
    fn a_blob_that_grew_after_its_sync_is_synced_again() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let disk = Disk::new(db, dir.path()).unwrap();
        let blob = dir.path().join("blobs").join("999");
        std::fs::write(&blob, [1u8; 100]).unwrap();
        disk.sync_blocking().unwrap();
        let synced = |disk: &Disk| {
            disk.blobs
                .synced
                .lock()
                .unwrap()
                .get(OsString::from("999").as_os_str())
                .copied()
        };
        assert_eq!(synced(&disk), Some(100));
        let mut rest = OpenOptions::new().append(true).open(&blob).unwrap();
        rest.write_all(&[2u8; 50]).unwrap();
        disk.sync_blocking().unwrap();
        assert_eq!(synced(&disk), Some(150), "synced again at its new length");
    }

    /// sled removes blob files from its own threads; one gone between the listing and the
    /// opening (here: a name that leads nowhere) is not an error.
    #[test]
    fn a_blob_removed_while_syncing_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let disk = Disk::new(db.clone(), dir.path()).unwrap();
        db.insert(b"big", vec![9u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("nowhere"),
            dir.path().join("blobs").join("999"),
        )
        .unwrap();
        disk.sync_blocking().unwrap();
    }

    /// A blob file no write of ours syncs (one sled's flusher wrote while moving a page) is
    /// synced all the same, soon.
    #[test]
    fn a_blob_written_while_idle_is_synced_soon() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let disk = Disk::new(db, dir.path()).unwrap();
        std::fs::write(dir.path().join("blobs").join("999"), [1u8; 100]).unwrap();
        let synced = || disk.synced_blobs();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while synced() == 0 {
            assert!(std::time::Instant::now() < deadline, "never synced");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(synced(), 1);
    }

    /// A failed sync is not forgotten: a later `fsync` of the same file may report success for
    /// data the failure lost.
    #[test]
    fn a_failed_blob_sync_fails_every_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let disk = Disk::new_without_idle_sync(db, dir.path()).unwrap();
        let blobs = dir.path().join("blobs");
        std::fs::rename(&blobs, dir.path().join("moved")).unwrap();
        assert!(disk.sync_blocking().is_err(), "the blob directory is gone");
        std::fs::rename(dir.path().join("moved"), &blobs).unwrap();
        let again = disk.sync_blocking().unwrap_err().to_string();
        assert!(again.contains("an earlier sync"), "{again}");
    }

    #[test]
    fn a_directory_without_sled_data_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        assert!(Disk::new(db, dir.path()).is_err());
    }
}
