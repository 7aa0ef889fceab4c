//! The latest snapshot, in a plain file of its own (`<path>/raft-snapshot`).
//!
//! A snapshot is replaced whole every time one is built or installed, and nothing else reads or
//! writes it, so a file written beside its final name, synced and renamed over it is all the
//! storage it needs ([`durable_file`]): a crash leaves the old image or the new one, and the old
//! one's space is freed by the rename. sled, which kept it before, stores a value this large in a
//! blob file and frees a replaced blob only once its log segment fills up — a database that
//! holds one key fills none, so every image ever saved stayed on disk (and, after a restart, was
//! forgotten by sled altogether), and reading the key back could load several of them at once.
//!
//! Layout: [`MAGIC`], the encoded meta's length (8 bytes, little endian), the meta, the data,
//! and a CRC-32 of every byte before it (4 bytes, little endian), so that a damaged file stops
//! the node with a clear error instead of restoring a state that was never applied.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::durable_file;

/// The file's name in the store's directory (sled's own snapshot files start with `snap.`).
pub const FILE_NAME: &str = "raft-snapshot";

/// The first bytes of every image file.
const MAGIC: &[u8; 8] = b"BATONIMG";

/// The bytes before the meta: the magic and the meta's length.
const HEADER: usize = MAGIC.len() + 8;

/// The bytes of the checksum at the end.
const CHECKSUM: usize = 4;

/// The image file of a store directory.
#[derive(Clone, Debug)]
pub(super) struct ImageFile {
    path: PathBuf,
}

impl ImageFile {
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(FILE_NAME),
        }
    }

    /// Makes `meta` and `data` the stored image, durably (blocking).
    pub(super) fn write(&self, meta: &[u8], data: &[u8]) -> io::Result<()> {
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        for part in [&header[..], meta, data] {
            crc.update(part);
        }
        let checksum = crc.finalize().to_le_bytes();
        durable_file::write_parts(&self.path, &[&header, meta, data, &checksum])
            .map_err(io::Error::other)
    }

    /// The stored meta and data; None if no image was ever stored (blocking).
    pub(super) fn read(&self) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let len = usize::try_from(file.metadata()?.len()).map_err(io::Error::other)?;
        let mut bytes = Vec::with_capacity(len);
        file.read_to_end(&mut bytes)?;
        self.parse(bytes).map(Some)
    }

    fn parse(&self, mut bytes: Vec<u8>) -> io::Result<(Vec<u8>, Vec<u8>)> {
        let damaged = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the snapshot image {} is damaged: {what}",
                    self.path.display()
                ),
            )
        };
        if bytes.len() < HEADER + CHECKSUM || !bytes.starts_with(MAGIC) {
            return Err(damaged("it does not start like an image"));
        }
        let body = bytes.len() - CHECKSUM;
        let stored = u32::from_le_bytes(bytes[body..].try_into().map_err(io::Error::other)?);
        if crc32fast::hash(&bytes[..body]) != stored {
            return Err(damaged("its checksum does not match its contents"));
        }
        let meta_len = bytes[MAGIC.len()..HEADER]
            .try_into()
            .map(u64::from_le_bytes)
            .map_err(io::Error::other)?;
        let meta_end = usize::try_from(meta_len)
            .ok()
            .and_then(|len| HEADER.checked_add(len))
            .filter(|end| *end <= body)
            .ok_or_else(|| damaged("its meta is longer than the file"))?;
        let meta = bytes[HEADER..meta_end].to_vec();
        // The data moves to the front of the buffer it was read into: no second copy of it.
        bytes.truncate(body);
        bytes.drain(..meta_end);
        Ok((meta, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(meta: &[u8], data: &[u8]) -> (tempfile::TempDir, ImageFile) {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = ImageFile::new(dir.path());
        image.write(meta, data).expect("write");
        (dir, image)
    }

    #[test]
    fn an_image_reads_back_as_written_and_replaces_the_one_before() {
        let (dir, image) = stored(b"meta-1", b"data-1");
        assert_eq!(
            image.read().expect("read"),
            Some((b"meta-1".to_vec(), b"data-1".to_vec()))
        );
        image.write(b"", b"").expect("second write");
        assert_eq!(image.read().expect("read"), Some((vec![], vec![])));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE_NAME)]);
    }

    #[test]
    fn no_file_is_no_image() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = ImageFile::new(dir.path());
        assert_eq!(image.read().expect("read"), None);
    }

    #[test]
    fn a_damaged_or_truncated_image_is_refused() {
        let (_dir, image) = stored(b"meta-bytes", b"the data");
        let good = std::fs::read(&image.path).expect("read");
        let mut flipped = good.clone();
        flipped[HEADER + 3] ^= 1;
        let mut long_meta = good.clone();
        long_meta[MAGIC.len()..HEADER].copy_from_slice(&u64::MAX.to_le_bytes());
        let body = long_meta.len() - CHECKSUM;
        let checksum = crc32fast::hash(&long_meta[..body]).to_le_bytes();
        long_meta[body..].copy_from_slice(&checksum);
        let cases: [(&str, Vec<u8>); 5] = [
            ("a flipped bit", flipped),
            ("cut short", good[..good.len() - 1].to_vec()),
            ("empty", Vec::new()),
            ("no magic", b"NOTANIMAGE-AT-ALL-0000".to_vec()),
            ("meta length past the end", long_meta),
        ];
        for (case, bytes) in cases {
            std::fs::write(&image.path, &bytes).expect("write");
            let error = image.read().expect_err(case);
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{case}: {error}");
        }
    }
}
