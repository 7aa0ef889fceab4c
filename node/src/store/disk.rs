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
//! sync therefore also syncs every blob file it has not synced before, and the directory.
//!
//! sled writes its configuration file (`<path>/conf`) when it creates a database and syncs
//! neither it nor the directories it creates. Opening a database therefore syncs them once: a
//! file system that may record an unsynced file's new length before its data (ext4 with
//! `data=writeback`) could otherwise leave `conf` as zeros after a power loss, and sled refuses
//! to open a database whose configuration does not parse.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A node's sled database with a handle on the file its log-structured storage lives in.
#[derive(Clone)]
pub(super) struct Disk {
    db: sled::Db,
    /// sled's single data file (`<path>/db`); any descriptor of it syncs the same inode.
    file: Arc<File>,
    /// sled's blob directory and the blob files already synced (sled never rewrites one).
    blobs: Arc<Blobs>,
}

struct Blobs {
    dir: PathBuf,
    synced: Mutex<HashSet<OsString>>,
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
        Ok(Self {
            db,
            file: Arc::new(file),
            blobs: Arc::new(Blobs {
                dir: path.join("blobs"),
                synced: Mutex::default(),
            }),
        })
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

    /// [`Disk::sync_blocking`] on tokio's blocking pool.
    pub(super) async fn sync(&self) -> io::Result<()> {
        let disk = self.clone();
        tokio::task::spawn_blocking(move || disk.sync_blocking())
            .await
            .map_err(io::Error::other)?
    }
}

/// Makes the names in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Blobs {
    /// Syncs the blob files written since the last call, then their directory entries. Blobs
    /// sled has since removed are forgotten.
    fn sync_new(&self) -> io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
        let mut present = HashSet::with_capacity(synced.len());
        let mut new = false;
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            if !synced.contains(&name) {
                match File::open(self.dir.join(&name)) {
                    Ok(file) => file.sync_data()?,
                    // Removed by sled since it was listed (it never rewrites one): nothing to
                    // make durable.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                new = true;
            }
            present.insert(name);
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

    #[test]
    fn a_directory_without_sled_data_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        assert!(Disk::new(db, dir.path()).is_err());
    }
}
