//! Backup files: a snapshot of the state written by `baton snapshot save`, verified and turned
//! into fresh data dirs by `baton snapshot restore`.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! "BATONSNP"            8 bytes, identifies the file
//! format                u32, FILE_FORMAT
//! header length H       u32
//! header                H bytes of JSON (SnapshotHeader)
//! state                 header.state_bytes bytes: the encoded state machine (STATE_FORMAT)
//! checksum              32 bytes: SHA-256 of every byte before it
//! ```
//!
//! Restoring seeds each new member's data dir as if it had just installed the snapshot from a
//! leader: the state machine holds the saved state, the log is empty and purged up to the saved
//! entry, and the membership is the new cluster's, recorded at that entry. The new nodes then
//! elect a leader among themselves (no `cluster init`), in a term above the saved one, so every
//! new entry, token and fence follows the saved ones.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Cursor, Read};
use std::path::Path;

use anyhow::{bail, ensure, Context};
use baton_statemachine::State;
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{BasicNode, CommittedLeaderId, Membership, SnapshotMeta, StoredMembership, Vote};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cluster_id::{self, ClusterId};
use crate::codec;
use crate::durable_file;
use crate::store;
use crate::types::{LogId, NodeId};

/// The first bytes of every backup file.
const MAGIC: &[u8; 8] = b"BATONSNP";
/// The version of this file layout.
pub const FILE_FORMAT: u32 = 1;
/// The version of the state's encoding (bincode of `baton_statemachine::State`).
pub const STATE_FORMAT: u32 = 1;
/// Bytes of the checksum at the end of the file.
const CHECKSUM_BYTES: usize = 32;
/// A header larger than this is not one we wrote.
const MAX_HEADER_BYTES: u32 = 1 << 20;

/// A member of the cluster a snapshot was taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedMember {
    /// Its id.
    pub id: NodeId,
    /// Its address.
    pub addr: String,
    /// Whether it voted.
    pub voter: bool,
}

/// What a backup file says about its contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// The layout version ([`FILE_FORMAT`]).
    pub format: u32,
    /// The state encoding's version ([`STATE_FORMAT`]).
    pub state_format: u32,
    /// The Baton version that wrote the file.
    pub baton_version: String,
    /// The last log entry the state includes: its index...
    pub last_log_index: u64,
    /// ...its term...
    pub last_log_term: u64,
    /// ...and the node that led that term.
    pub last_log_leader: NodeId,
    /// The source cluster's membership. (Its cluster id is not recorded: a restore takes the
    /// backup's fingerprint as the new cluster's id.)
    pub members: Vec<SavedMember>,
    /// The leader that served the snapshot.
    pub served_by: NodeId,
    /// When the leader served it (Unix ms, the leader's clock).
    pub saved_at_ms: u64,
    /// Bytes of encoded state that follow the header.
    pub state_bytes: u64,
}

/// A verified backup: its header and the encoded state.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    /// The header.
    pub header: SnapshotHeader,
    /// The encoded state ([`STATE_FORMAT`]).
    pub state: Vec<u8>,
}

impl SnapshotFile {
    /// The file's bytes, checksum included.
    pub fn to_bytes(&self) -> anyhow::Result<Vec<u8>> {
        let header = serde_json::to_vec(&self.header).context("cannot encode the header")?;
        let header_len = u32::try_from(header.len()).context("header too large")?;
        let mut bytes = Vec::with_capacity(16 + header.len() + self.state.len() + CHECKSUM_BYTES);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&FILE_FORMAT.to_le_bytes());
        bytes.extend_from_slice(&header_len.to_le_bytes());
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&self.state);
        let checksum = Sha256::digest(&bytes);
        bytes.extend_from_slice(&checksum);
        Ok(bytes)
    }

    /// Parses and verifies a file's bytes: magic, format, lengths, checksum, and that the state
    /// decodes. Every refusal says what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> anyhow::Result<Self> {
        Self::parse(bytes).map(|(file, _)| file)
    }

    /// [`Self::from_bytes`], and the state it decoded.
    fn parse(bytes: &[u8]) -> anyhow::Result<(Self, State)> {
        let header_len = check_prefix(bytes)?;
        ensure!(
            bytes.len() >= 16 + CHECKSUM_BYTES,
            "corrupt snapshot file: {} bytes, too short for a snapshot",
            bytes.len()
        );
        let body_end = bytes.len() - CHECKSUM_BYTES;
        let checksum = Sha256::digest(&bytes[..body_end]);
        ensure!(
            checksum.as_slice() == &bytes[body_end..],
            "corrupt snapshot file: the SHA-256 checksum does not match its contents \
             (truncated or damaged; expected {}, computed {})",
            hex::encode(&bytes[body_end..]),
            hex::encode(checksum)
        );
        let header_end = 16 + header_len as usize;
        ensure!(
            header_end <= body_end,
            "corrupt snapshot file: header longer than the file"
        );
        let header: SnapshotHeader = serde_json::from_slice(&bytes[16..header_end])
            .context("corrupt snapshot file: unreadable header")?;
        ensure!(
            header.state_format == STATE_FORMAT,
            "the snapshot's state format {} is not supported (this baton reads format {STATE_FORMAT})",
            header.state_format
        );
        // A log position no cluster reaches (the next append would overflow it) is a made-up
        // file, refused before it seeds a data dir.
        let position = 1..1 << 63;
        ensure!(
            position.contains(&header.last_log_index) && position.contains(&header.last_log_term),
            "corrupt snapshot file: log position {} in term {} (want 1 to 2^63 - 1)",
            header.last_log_index,
            header.last_log_term
        );
        let state = bytes[header_end..body_end].to_vec();
        ensure!(
            state.len() as u64 == header.state_bytes,
            "corrupt snapshot file: {} bytes of state, the header says {}",
            state.len(),
            header.state_bytes
        );
        let decoded =
            codec::decode_state(&state).context("the snapshot's state does not decode")?;
        Ok((Self { header, state }, decoded))
    }

    /// Reads and verifies a backup file.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        Self::read_decoded(path).map(|(file, _)| file)
    }

    /// [`Self::read`], and the state the file holds, decoded (`snapshot inspect` shows some of
    /// it).
    pub fn read_decoded(path: &Path) -> anyhow::Result<(Self, State)> {
        read_bounded(path)
            .and_then(|bytes| Self::parse(&bytes))
            .with_context(|| format!("{} was refused", path.display()))
    }

    /// Writes the file atomically: to a temporary file beside `path`, synced, then renamed over
    /// `path` (and the directory synced), so a crash leaves either no file or the whole file.
    ///
    /// The bytes are read back first with every check `restore` makes (the state decodes, its
    /// length is the header's): a backup that could not be restored is refused when it is
    /// taken, not discovered on the day it is needed.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let bytes = self.to_bytes()?;
        Self::from_bytes(&bytes).context("the snapshot is not one restore would accept")?;
        durable_file::write(path, &bytes)
            .with_context(|| format!("cannot save the snapshot to {}", path.display()))
    }

    /// The saved last log entry.
    pub fn last_log_id(&self) -> LogId {
        LogId::new(
            CommittedLeaderId::new(self.header.last_log_term, self.header.last_log_leader),
            self.header.last_log_index,
        )
    }
}

/// Checks the fixed start of a file (signature, layout version, header length) and returns the
/// header length. Needs only those 16 bytes, so a wrong file is refused before it is read on.
fn check_prefix(bytes: &[u8]) -> anyhow::Result<u32> {
    ensure!(
        bytes.len() >= 16 && &bytes[..8] == MAGIC,
        "not a Baton snapshot file (no BATONSNP signature)"
    );
    let format = u32::from_le_bytes(word(bytes, 8));
    ensure!(
        format == FILE_FORMAT,
        "snapshot file format {format} is not supported (this baton reads format {FILE_FORMAT})"
    );
    let header_len = u32::from_le_bytes(word(bytes, 12));
    ensure!(
        header_len <= MAX_HEADER_BYTES,
        "corrupt snapshot file: header length {header_len}"
    );
    Ok(header_len)
}

/// Reads a file no further than its header says it reaches, one byte past to see that it ends
/// there: a wrong path (a device such as /dev/zero, a pipe that never ends, a large unrelated
/// file) is refused after its first bytes instead of being read whole into memory.
fn read_bounded(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path).context("cannot open it")?;
    // Room up front for a regular file's bytes, never for what a (possibly corrupt) header claims.
    let on_disk = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::new();
    let mut read_up_to = |bytes: &mut Vec<u8>, more: u64| {
        (&mut file)
            .take(more)
            .read_to_end(bytes)
            .context("cannot read it")
    };
    read_up_to(&mut bytes, 16)?;
    let header_len = check_prefix(&bytes)?;
    read_up_to(&mut bytes, header_len.into())?;
    let Ok(header) = serde_json::from_slice::<SnapshotHeader>(&bytes[16..]) else {
        // A damaged header gives no bound: take what a regular file holds (nothing more from
        // anything else), and let the checksum name the damage.
        let rest = on_disk.saturating_sub(bytes.len() as u64);
        read_up_to(&mut bytes, rest)?;
        return Ok(bytes);
    };
    let expected = (bytes.len() as u64)
        .saturating_add(header.state_bytes)
        .saturating_add(CHECKSUM_BYTES as u64);
    let room = expected.min(on_disk).saturating_sub(bytes.len() as u64);
    bytes.reserve(usize::try_from(room).unwrap_or(0));
    let rest = expected.saturating_sub(bytes.len() as u64);
    read_up_to(&mut bytes, rest.saturating_add(1))?;
    ensure!(
        bytes.len() as u64 <= expected,
        "corrupt snapshot file: it goes on past the {expected} bytes its header gives it"
    );
    Ok(bytes)
}

fn word(bytes: &[u8], at: usize) -> [u8; 4] {
    [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]
}

/// Seeds `data_dir` as member `id` of a new cluster of `members` (every one a voter) holding the
/// snapshot's state, with every fence raised by `raise_fences` (the same on every member, or
/// their states differ). Refuses a data dir that already has content. Returns the restore's
/// `fingerprint`, also kept in the data dir ([`restored_from`]).
pub async fn restore(
    snapshot: &SnapshotFile,
    data_dir: &Path,
    id: NodeId,
    members: &BTreeMap<NodeId, String>,
    raise_fences: u64,
) -> anyhow::Result<String> {
    ensure!(
        members.contains_key(&id),
        "the new members must include this node (id {id})"
    );
    ensure!(
        raise_fences <= baton_statemachine::MAX_FENCE_RAISE,
        "fences can be raised by at most {}",
        baton_statemachine::MAX_FENCE_RAISE
    );
    prepare_restore_dir(data_dir)?;
    // Marked first and unmarked last: a node refuses to start a half-restored dir, and running
    // the same restore again starts over.
    durable_file::write(
        &data_dir.join(UNFINISHED_RESTORE),
        format!(
            "restoring node {id} from index {}\n",
            snapshot.header.last_log_index
        )
        .as_bytes(),
    )?;
    let (mut log, mut state_machine) = store::open(&data_dir.join("db"))
        .with_context(|| format!("cannot create storage in {}", data_dir.display()))?;

    let last = snapshot.last_log_id();
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let nodes: BTreeMap<NodeId, BasicNode> = members
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    let membership = Membership::new(vec![voters], nodes);
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(last), membership),
        snapshot_id: format!("restored-{}-{}", last.leader_id.term, last.index),
    };
    // The log: nothing after the saved entry, everything up to it covered by the snapshot.
    log.save_committed(Some(last)).await?;
    log.purge(last).await?;
    // Having voted for itself in the saved term, the node's first election is in the next one.
    log.save_vote(&Vote::new(last.leader_id.term, id)).await?;
    let state = if raise_fences == 0 {
        snapshot.state.clone()
    } else {
        let mut state: State =
            codec::decode_state(&snapshot.state).context("the snapshot's state does not decode")?;
        state.raise_fences(raise_fences);
        codec::encode_state(&state).context("cannot encode the restored state")?
    };
    let fingerprint = fingerprint(&state, &last, members);
    state_machine
        .install_snapshot(&meta, Box::new(Cursor::new(state)))
        .await?;
    drop((log, state_machine));
    crate::server::record_identity(data_dir, id)?;
    let record = format!(
        "fingerprint {fingerprint}\nindex {}\nterm {}\nraise_fences {raise_fences}\n",
        last.index, last.leader_id.term
    );
    durable_file::write(&data_dir.join(RESTORED_FROM), record.as_bytes())?;
    // The restored cluster is a new one: members restored alike share its id, and neither a
    // member restored otherwise nor a node of the saved cluster is answered by them.
    cluster_id::record(data_dir, ClusterId::parse(&fingerprint)?)?;
    durable_file::remove(&data_dir.join(UNFINISHED_RESTORE))?;
    Ok(fingerprint)
}

/// The file in a restored data dir that names what it was restored from.
const RESTORED_FROM: &str = "restored-from";

/// What one restore seeded, in 32 hex digits: SHA-256 over the state as restored (fences
/// raised), the saved entry's log id and the new members. Every member restored from one file
/// with the same `--members` and `--raise-fences` gets the same; members restored otherwise hold
/// different states (or memberships) at the same log position, which Raft cannot see — it would
/// let them diverge silently. `baton status` compares the members' fingerprints.
fn fingerprint(state: &[u8], last: &LogId, members: &BTreeMap<NodeId, String>) -> String {
    let mut hash = Sha256::new();
    hash.update(state);
    hash.update(last.leader_id.term.to_le_bytes());
    hash.update(last.index.to_le_bytes());
    for (id, addr) in members {
        hash.update(id.to_le_bytes());
        hash.update(addr.as_bytes());
        hash.update([0]);
    }
    hex::encode(&hash.finalize()[..16])
}

/// The fingerprint of the restore that seeded `data_dir` ([`restore`]); empty when it was not
/// seeded by a restore.
pub fn restored_from(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join(RESTORED_FROM);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text
            .lines()
            .find_map(|line| line.strip_prefix("fingerprint "))
            .unwrap_or_default()
            .trim()
            .to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// How much a restore raises every fence, ticket generation and permit token by default
/// ([`baton_statemachine::State::raise_fences`]): more grants than any one key gets between a
/// backup and its restore, and still room for billions of restores before a counter runs out.
pub const RESTORE_FENCE_RAISE: u64 = 1_000_000_000;

/// The file that marks a data dir whose restore has not finished.
const UNFINISHED_RESTORE: &str = "restore-unfinished";

/// Makes `data_dir` an empty dir to restore into: a new or empty one, or one an earlier restore
/// left unfinished (its contents are then removed). Anything else holds data and is refused.
fn prepare_restore_dir(data_dir: &Path) -> anyhow::Result<()> {
    if data_dir.exists() {
        let unfinished = data_dir.join(UNFINISHED_RESTORE).exists();
        let entries: Vec<_> = std::fs::read_dir(data_dir)
            .and_then(|entries| entries.collect::<Result<_, _>>())
            .with_context(|| format!("cannot read {}", data_dir.display()))?;
        // A write's temporary file alone is what a first restore that crashed before its
        // marker was written leaves: the dir holds nothing else, and may be restored into.
        let used = entries
            .iter()
            .any(|entry| !durable_file::is_temporary(&entry.file_name()));
        if used && !unfinished {
            bail!(
                "{} is not empty: restore only into a new data dir",
                data_dir.display()
            );
        }
        // The mark stays until the restore is done: cleared half way, it would leave an
        // unmarked half-restored dir.
        for entry in entries {
            if entry.file_name() == UNFINISHED_RESTORE {
                continue;
            }
            let path = entry.path();
            let removed = if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.with_context(|| format!("cannot remove {}", path.display()))?;
        }
    }
    durable_file::create_dir_all(data_dir)
}

/// Refuses to start a node on a data dir whose restore did not finish (its log may already be
/// purged while its state machine is still empty).
pub fn refuse_unfinished_restore(data_dir: &Path) -> anyhow::Result<()> {
    ensure!(
        !data_dir.join(UNFINISHED_RESTORE).exists(),
        "a `baton snapshot restore` into {} did not finish; run it again (it starts over)",
        data_dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SnapshotFile {
        let state = codec::encode(&State::default()).expect("encodes");
        SnapshotFile {
            header: SnapshotHeader {
                format: FILE_FORMAT,
                state_format: STATE_FORMAT,
                baton_version: "test".into(),
                last_log_index: 42,
                last_log_term: 3,
                last_log_leader: 2,
                members: vec![SavedMember {
                    id: 2,
                    addr: "127.0.0.1:1".into(),
                    voter: true,
                }],
                served_by: 2,
                saved_at_ms: 1,
                state_bytes: state.len() as u64,
            },
            state,
        }
    }

    #[test]
    fn a_written_file_reads_back_identical() {
        let file = sample();
        let read = SnapshotFile::from_bytes(&file.to_bytes().expect("bytes")).expect("valid");
        assert_eq!(read.header, file.header);
        assert_eq!(read.state, file.state);
    }

    #[test]
    fn a_snapshot_restore_would_refuse_is_never_written() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("backup.baton");
        let mut bad = sample();
        bad.state = vec![0xff; 9];
        bad.header.state_bytes = 9;
        let error = bad.write(&path).expect_err("refused");
        assert!(
            format!("{error:#}").contains("does not decode"),
            "{error:#}"
        );
        assert!(!path.exists());
        sample().write(&path).expect("a good one is written");
        SnapshotFile::read(&path).expect("and reads back");
    }

    #[test]
    fn a_file_is_read_no_further_than_its_header_says_it_reaches() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("backup.baton");
        let mut bytes = sample().to_bytes().expect("bytes");
        bytes.extend_from_slice(b"appended by a careless cat");
        std::fs::write(&path, &bytes).expect("written");
        let error = SnapshotFile::read(&path).expect_err("trailing bytes");
        assert!(format!("{error:#}").contains("goes on past"), "{error:#}");
        // A device that never ends is refused after its first 16 bytes.
        let error = SnapshotFile::read(Path::new("/dev/zero")).expect_err("not a snapshot");
        assert!(
            format!("{error:#}").contains("not a Baton snapshot"),
            "{error:#}"
        );
    }

    #[test]
    fn damaged_truncated_or_foreign_files_are_refused_with_the_reason() {
        let bytes = sample().to_bytes().expect("bytes");
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        let error = SnapshotFile::from_bytes(&flipped).expect_err("a flipped bit");
        assert!(format!("{error:#}").contains("checksum"), "{error:#}");
        let error = SnapshotFile::from_bytes(&bytes[..bytes.len() - 1]).expect_err("truncated");
        assert!(format!("{error:#}").contains("checksum"), "{error:#}");
        let error = SnapshotFile::from_bytes(b"hello, this is not a snapshot at all, not one bit")
            .expect_err("foreign");
        assert!(
            format!("{error:#}").contains("not a Baton snapshot"),
            "{error:#}"
        );
        for (index, term) in [(0, 3), (42, 0), (u64::MAX, 3), (42, 1 << 63)] {
            let mut made_up = sample();
            made_up.header.last_log_index = index;
            made_up.header.last_log_term = term;
            let error = SnapshotFile::from_bytes(&made_up.to_bytes().expect("bytes"))
                .expect_err("a log position no cluster reaches");
            assert!(format!("{error:#}").contains("log position"), "{error:#}");
        }
        let mut future = bytes.clone();
        future[8] = 9;
        let error = SnapshotFile::from_bytes(&future).expect_err("newer format");
        assert!(format!("{error:#}").contains("format 9"), "{error:#}");
    }

    #[tokio::test]
    async fn restore_refuses_a_used_data_dir_and_a_node_outside_the_members() {
        let dir = tempfile::tempdir().expect("tempdir");
        let members = BTreeMap::from([(1, "127.0.0.1:1".to_string())]);
        let error = restore(&sample(), &dir.path().join("a"), 2, &members, 0)
            .await
            .expect_err("id 2 is not a member");
        assert!(format!("{error:#}").contains("include this node"));
        std::fs::write(dir.path().join("junk"), b"x").expect("write");
        let error = restore(&sample(), dir.path(), 1, &members, 0)
            .await
            .expect_err("not empty");
        assert!(format!("{error:#}").contains("not empty"));
        restore(&sample(), &dir.path().join("b"), 1, &members, 0)
            .await
            .expect("a fresh dir is seeded");
        // A first restore that crashed while writing its marker left only a temporary file.
        let crashed = dir.path().join("c");
        std::fs::create_dir(&crashed).expect("mkdir");
        std::fs::write(crashed.join(".baton-marker"), b"").expect("write");
        restore(&sample(), &crashed, 1, &members, 0)
            .await
            .expect("a dir holding only a write's temporary file is seeded");
    }

    #[tokio::test]
    async fn a_restore_that_stopped_half_way_blocks_the_node_and_runs_again_from_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data_dir = dir.path().join("node");
        let members = BTreeMap::from([(1, "127.0.0.1:1".to_string())]);
        // A state that does not decode stops the restore after the log was purged.
        let mut broken = sample();
        broken.state = vec![0xff; 16];
        restore(&broken, &data_dir, 1, &members, 0)
            .await
            .expect_err("the state does not decode");
        let error = refuse_unfinished_restore(&data_dir).expect_err("half restored");
        assert!(format!("{error:#}").contains("did not finish"), "{error:#}");

        restore(&sample(), &data_dir, 1, &members, 0)
            .await
            .expect("the same restore runs again");
        refuse_unfinished_restore(&data_dir).expect("finished");
        let (_log, mut state_machine) = store::open(&data_dir.join("db")).expect("opens");
        let (applied, _) = state_machine.applied_state().await.expect("applied");
        assert_eq!(applied, Some(sample().last_log_id()));
    }
}
