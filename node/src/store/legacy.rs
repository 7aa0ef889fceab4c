//! Data dirs written by older versions: their snapshot is moved into the image file
//! ([`super::image`]) when the store opens.
//!
//! Two older layouts exist. The oldest kept the snapshot's meta and data in the log's database
//! (tree `snapshot`); the next kept it in a sled database of its own at `<path>/snapshot-store`,
//! first under the keys `meta` and `data`, later packed under `image` (the meta's length, 8 bytes
//! little endian, the meta, the data). Each move writes the image file durably before it drops
//! the old copy, so a crash in between leaves both, and the next start moves again or keeps the
//! newer of the two (a node rolled back to the previous version and upgraded again has a newer
//! snapshot in the store than in the file, and its log is purged up to the newer one). The
//! snapshot store is renamed before it is deleted, so a deletion that a crash cut short is
//! finished at the next start instead of opening a half-deleted sled database.

use std::io;
use std::path::Path;

use openraft::{BasicNode, SnapshotMeta};

use super::disk::{sync_dir, Disk};
use super::image::ImageFile;
use crate::codec;
use crate::types::NodeId;

/// The sled database in which the previous version kept the snapshot.
pub const SNAPSHOT_STORE: &str = "snapshot-store";

/// What the snapshot store is renamed to while it is deleted.
const REMOVING: &str = "snapshot-store.removing";

/// The tree in which the oldest versions kept the snapshot, in the log's database.
const SNAPSHOT_TREE: &[u8] = b"snapshot";

/// Moves a snapshot kept in an older layout under `path` (the log's database `log`) into
/// `image`.
pub(super) fn move_snapshot(path: &Path, log: &Disk, image: &ImageFile) -> io::Result<()> {
    let removing = path.join(REMOVING);
    if removing.try_exists()? {
        std::fs::remove_dir_all(&removing)?;
        sync_dir(path)?;
    }
    move_snapshot_store(path, image)?;
    move_snapshot_tree(log, image)
}

/// The previous version's snapshot store, into `image` unless the image is as new; then the
/// store is removed.
fn move_snapshot_store(path: &Path, image: &ImageFile) -> io::Result<()> {
    let dir = path.join(SNAPSHOT_STORE);
    if !dir.try_exists()? {
        return Ok(());
    }
    let db = sled::Config::new()
        .path(&dir)
        .open()
        .map_err(io::Error::other)?;
    let packed = db.get(b"image").map_err(io::Error::other)?;
    let parts = match &packed {
        Some(packed) => Some(unpack(packed)?),
        None => match (
            db.get(b"meta").map_err(io::Error::other)?,
            db.get(b"data").map_err(io::Error::other)?,
        ) {
            (Some(meta), Some(data)) => Some((meta, data)),
            _ => None,
        },
    };
    if let Some((meta, data)) = parts {
        if newer_than_image(&meta, image)? {
            image.write(&meta, &data)?;
            tracing::info!("moved the snapshot from the snapshot store to its image file");
        }
    }
    drop(db);
    std::fs::rename(&dir, path.join(REMOVING))?;
    sync_dir(path)?;
    std::fs::remove_dir_all(path.join(REMOVING))?;
    sync_dir(path)
}

/// Whether a snapshot whose encoded meta is `meta` is newer than the stored image (or there is
/// none).
fn newer_than_image(meta: &[u8], image: &ImageFile) -> io::Result<bool> {
    let Some((stored, _)) = image.read()? else {
        return Ok(true);
    };
    let last = |meta: &[u8]| {
        codec::decode::<SnapshotMeta<NodeId, BasicNode>>(meta)
            .map(|meta| meta.last_log_id)
            .map_err(io::Error::other)
    };
    Ok(last(meta)? > last(&stored)?)
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
    if let (Some(meta), Some(data)) = (meta, data) {
        // An image may be there and older: this build ran, then the oldest one again (which
        // snapshots into the tree and purges the log past the image).
        if newer_than_image(&meta, image)? {
            image.write(&meta, &data)?;
            tracing::info!("moved the snapshot from the log's database to its image file");
        }
    }
    db.drop_tree(SNAPSHOT_TREE).map_err(io::Error::other)?;
    log.sync_blocking()
}

/// The meta and the data of a value packed by the previous version (slices of `packed`).
fn unpack(packed: &sled::IVec) -> io::Result<(sled::IVec, sled::IVec)> {
    let short = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the snapshot store's image is shorter than its header says",
        )
    };
    let (len, _) = packed.split_first_chunk::<8>().ok_or_else(short)?;
    let meta_end = usize::try_from(u64::from_le_bytes(*len))
        .ok()
        .and_then(|len| len.checked_add(8))
        .filter(|end| *end <= packed.len())
        .ok_or_else(short)?;
    Ok((
        packed.subslice(8, meta_end - 8),
        packed.subslice(meta_end, packed.len() - meta_end),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_value_unpacks_to_its_meta_and_data_and_a_short_one_is_refused() {
        let mut packed = 10u64.to_le_bytes().to_vec();
        packed.extend_from_slice(b"meta-bytesthe data");
        let (meta, data) = unpack(&sled::IVec::from(packed.clone())).expect("unpacks");
        assert_eq!(
            (&meta[..], &data[..]),
            (&b"meta-bytes"[..], &b"the data"[..])
        );
        assert!(unpack(&sled::IVec::from(&packed[..17])).is_err());
        assert!(unpack(&sled::IVec::from(&packed[..7])).is_err());
        assert!(unpack(&sled::IVec::from(&u64::MAX.to_le_bytes()[..])).is_err());
    }
}
