//! Small files that must survive a power loss whole: written beside their final name, synced,
//! renamed over it, and the directory synced. A crash or power cut at any point leaves either
//! the old file (or none) or the whole new one, never an empty or partial file.
//!
//! `std::fs::write` alone is not enough: its bytes may sit in the page cache when the power goes,
//! and a file created just before is then found empty after the restart.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// How the temporary files of writes in progress are named.
const TEMP_PREFIX: &str = ".baton-";

/// Whether a directory entry's name is a write's temporary file (see [`remove_leftovers`]).
pub fn is_temporary(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with(TEMP_PREFIX)
}

/// Removes the temporary files in `dir` that writes interrupted by a crash left behind (a
/// snapshot image's is as large as the image); returns how many. Call it only while nothing
/// writes in `dir`.
pub fn remove_leftovers(dir: &Path) -> anyhow::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        if is_temporary(&entry.file_name()) && entry.path().is_file() {
            std::fs::remove_file(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Writes `bytes` to `path` atomically and durably.
pub fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_parts(path, &[bytes])
}

/// Writes `parts`, one after the other, to `path` atomically and durably, without first
/// gathering them in one buffer (a snapshot image is ~120 MB per million leases).
pub fn write_parts(path: &Path, parts: &[&[u8]]) -> anyhow::Result<()> {
    let dir = parent(path);
    let mut temp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let mut out = std::io::BufWriter::new(temp.as_file_mut());
    parts
        .iter()
        .try_for_each(|part| out.write_all(part))
        .and_then(|()| out.flush())
        .with_context(|| format!("cannot write a temporary file in {}", dir.display()))?;
    drop(out);
    temp.as_file()
        .sync_all()
        .with_context(|| format!("cannot write a temporary file in {}", dir.display()))?;
    temp.persist(path)
        .with_context(|| format!("cannot rename a temporary file to {}", path.display()))?;
    sync_dir(dir)
}

/// Removes `path` durably: once this returns, a power cut does not bring it back.
pub fn remove(path: &Path) -> anyhow::Result<()> {
    std::fs::remove_file(path).with_context(|| format!("cannot remove {}", path.display()))?;
    sync_dir(parent(path))
}

/// Creates `dir` and its missing parents durably: each new directory's name is synced in its
/// parent, so that a power cut soon after a node's first start (or a restore) does not take the
/// whole data dir, vote and log with it, on a file system that commits a new name only when its
/// directory is synced.
pub fn create_dir_all(dir: &Path) -> anyhow::Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
        .collect();
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    missing
        .iter()
        .rev()
        .try_for_each(|created| sync_dir(parent(created)))
}

/// The directory `path` is named in.
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Makes the names created, renamed or removed in `dir` durable.
fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_of_interrupted_writes_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(&dir.path().join("node-id"), b"1\n").expect("write");
        let leftover = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(dir.path())
            .expect("temp");
        let (_, leftover) = leftover.keep().expect("keep");
        assert_eq!(remove_leftovers(dir.path()).expect("remove"), 1);
        assert!(!leftover.exists());
        assert_eq!(
            std::fs::read(dir.path().join("node-id")).expect("read"),
            b"1\n"
        );
        assert_eq!(remove_leftovers(dir.path()).expect("remove"), 0);
    }

    #[test]
    fn creates_missing_directories_and_accepts_existing_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let nested = dir.path().join("a/b/c");
        create_dir_all(&nested).expect("create");
        assert!(nested.is_dir());
        create_dir_all(&nested).expect("create again");
    }

    #[test]
    fn replaces_the_whole_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node-id");
        write(&path, b"1\n").expect("first write");
        write(&path, b"22\n").expect("second write");
        assert_eq!(std::fs::read(&path).expect("read"), b"22\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("node-id")]);
    }
}
