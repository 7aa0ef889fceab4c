//! Data dirs written by older versions: their snapshot is moved into the image file
//! ([`super::image`]) when the store opens.
//!
//! Two older layouts exist. The oldest kept the snapshot's meta and data in the log's database
//! (tree `snapshot`); the next kept it in a sled database of its own at `<path>/snapshot-store`,
//! first under the keys `meta` and `data`, later packed under `image` (the meta's length, 8 bytes
//! little endian, the meta, the data). Each move writes the image file durably before it drops
//! the old copy, so a crash in between leaves both, and the next start keeps the file. The file
//! is always the newest: a version that wrote it never wrote the older places again.

use std::io;
use std::path::Path;

use super::disk::{sync_dir, Disk};
use super::image::ImageFile;

/// The sled database in which the previous version kept the snapshot.
pub const SNAPSHOT_STORE: &str = "snapshot-store";

/// The tree in which the oldest versions kept the snapshot, in the log's database.
const SNAPSHOT_TREE: &[u8] = b"snapshot";

/// Moves a snapshot kept in an older layout under `path` (the log's database `log`) into
/// `image`.
pub(super) fn move_snapshot(path: &Path, log: &Disk, image: &ImageFile) -> io::Result<()> {
    move_snapshot_store(&path.join(SNAPSHOT_STORE), image)?;
    move_snapshot_tree(log, image)
}

/// The previous version's snapshot store, into `image`; then the store is removed.
fn move_snapshot_store(dir: &Path, image: &ImageFile) -> io::Result<()> {
    if !dir.try_exists()? {
        return Ok(());
    }
    if !image.exists()? {
        let db = sled::Config::new()
            .path(dir)
            .open()
            .map_err(io::Error::other)?;
        let packed = db.get(b"image").map_err(io::Error::other)?;
        let parts = match packed {
            Some(packed) => Some(unpack(&packed)?),
            None => match (
                db.get(b"meta").map_err(io::Error::other)?,
                db.get(b"data").map_err(io::Error::other)?,
            ) {
                (Some(meta), Some(data)) => Some((meta.to_vec(), data.to_vec())),
                _ => None,
            },
        };
        drop(db);
        if let Some((meta, data)) = parts {
            image.write(&meta, &data)?;
            tracing::info!("moved the snapshot from the snapshot store to its image file");
        }
    }
    std::fs::remove_dir_all(dir)?;
    sync_dir(dir.parent().unwrap_or(Path::new(".")))
}

/// The oldest versions' snapshot tree in the log's database, into `image` unless a newer
/// snapshot is there; then the tree is dropped.
fn move_snapshot_tree(log: &Disk, image: &ImageFile) -> io::Result<()> {
    let db = log.db();
    if !db
        .tree_names()
        .iter()
        .any(|name| name.as_ref() == SNAPSHOT_TREE)
    {
        return Ok(());
    }
    let tree = db.open_tree(SNAPSHOT_TREE).map_err(io::Error::other)?;
    let meta = tree.get(b"meta").map_err(io::Error::other)?;
    let data = tree.get(b"data").map_err(io::Error::other)?;
    if let (Some(meta), Some(data), false) = (meta, data, image.exists()?) {
        image.write(&meta, &data)?;
        tracing::info!("moved the snapshot from the log's database to its image file");
    }
    db.drop_tree(SNAPSHOT_TREE).map_err(io::Error::other)?;
    log.sync_blocking()
}

/// The meta and the data of a value packed by the previous version.
fn unpack(packed: &[u8]) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let short = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the snapshot store's image is shorter than its header says",
        )
    };
    let (len, rest) = packed.split_first_chunk::<8>().ok_or_else(short)?;
    let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| short())?;
    if len > rest.len() {
        return Err(short());
    }
    let (meta, data) = rest.split_at(len);
    Ok((meta.to_vec(), data.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_value_unpacks_to_its_meta_and_data_and_a_short_one_is_refused() {
        let mut packed = 10u64.to_le_bytes().to_vec();
        packed.extend_from_slice(b"meta-bytesthe data");
        assert_eq!(
            unpack(&packed).expect("unpacks"),
            (b"meta-bytes".to_vec(), b"the data".to_vec())
        );
        assert!(unpack(&packed[..17]).is_err());
        assert!(unpack(&packed[..7]).is_err());
        assert!(unpack(&u64::MAX.to_le_bytes()).is_err());
    }
}
