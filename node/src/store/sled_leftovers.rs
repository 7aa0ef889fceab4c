//! sled 0.34 writes an index of its log (its "snapshot") while it opens a database: to
//! `snap.<lsn>.generating`, synced, then renamed to `snap.<lsn>`. When it reads one back, it takes
//! the last file by name, and a `.generating` file sorts after the finished one of its `lsn`. So a
//! write cut short — the disk filled while the node was starting (a supervisor restarting it every
//! few seconds on a full disk does this), or the node was killed mid-write — leaves a file that
//! fails every later open with "Read corrupted data", after space was freed too, though nothing
//! the node stored was lost (sled rebuilds the index from its log). Upstream: spacejam/sled#1527.
//!
//! A `.generating` file is never needed: sled removes older indexes only after the rename, so
//! one that was never renamed has the finished one it would have replaced beside it (or none, and
//! sled scans its whole log). It is removed before the open, while holding the lock sled takes on
//! its database file, so that a database another process has open is not touched.

use std::path::Path;

use fs2::FileExt;

/// What sled calls the file it locks, and the name its unfinished index files end with.
const LOCKED_FILE: &str = "db";
const UNFINISHED: &str = ".generating";

/// Removes the unfinished index files of the sled database at `path`; returns how many. Nothing
/// is removed (and no error returned) when another process holds the database's lock: sled's
/// own open then says so.
pub fn remove(path: &Path) -> std::io::Result<usize> {
    // A look without the lock first, so that the usual start takes none.
    if unfinished(path)?.is_empty() {
        return Ok(0);
    }
    let locked = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path.join(LOCKED_FILE))
    {
        Ok(locked) => locked,
        // No database file, so no lock to take: left to sled, which says what it finds.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    if locked.try_lock_exclusive().is_err() {
        return Ok(0);
    }
    let mut removed = 0;
    for file in unfinished(path)? {
        match std::fs::remove_file(&file) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        tracing::warn!(
            file = %file.display(),
            "removed an index file sled left unfinished (a start on a full disk, or a crash)"
        );
    }
    // Dropping the file lets go of the lock, for sled to take.
    Ok(removed)
}

/// The `snap.*.generating` files in `path` (none when `path` does not exist yet).
fn unfinished(path: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(UNFINISHED) {
            found.push(entry.path());
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The file a start on a full disk leaves, as sled names it: an empty index one past the
    /// finished one.
    fn leave_unfinished(path: &Path) -> std::path::PathBuf {
        let file = path.join(format!("snap.{:016X}{UNFINISHED}", u64::MAX >> 8));
        std::fs::write(&file, b"").unwrap();
        file
    }

    /// A database whose open a full disk cut short opens again, with what it held.
    #[test]
    fn a_database_left_with_an_unfinished_index_opens_with_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let db = sled::open(&path).unwrap();
            db.insert(b"kept", b"yes").unwrap();
            db.flush().unwrap();
        }
        let file = leave_unfinished(&path);
        let refused = sled::open(&path).err();
        assert!(
            refused.is_some(),
            "sled itself refuses such a database (else this test shows nothing)"
        );
        assert_eq!(remove(&path).unwrap(), 1);
        assert!(!file.exists());
        let db = sled::open(&path).unwrap();
        assert_eq!(db.get(b"kept").unwrap().as_deref(), Some(&b"yes"[..]));
    }

    /// A database another process has open is left alone; one that does not exist yet is no
    /// error.
    #[test]
    fn an_open_database_and_a_missing_one_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        assert_eq!(remove(&path).unwrap(), 0);
        let db = sled::open(&path).unwrap();
        let file = leave_unfinished(&path);
        assert_eq!(remove(&path).unwrap(), 0);
        assert!(file.exists(), "the open database's files are not touched");
        drop(db);
    }
}
