//! Which cluster a node belongs to, and the check that keeps the nodes of different clusters
//! apart.
//!
//! Raft compares terms and log positions, never where a log came from. A node started on another
//! cluster's data dir (a stale disk put back, a mix-up in a deploy, an earlier cluster on the
//! same hosts, members restored from different backups) looks to its peers like a member that
//! was away: its higher term unseats their leader, and with a newer last entry it can win the
//! election that follows and overwrite entries they had committed. So every cluster has an id,
//! minted when it is initialized (a restore uses its fingerprint instead), kept in each member's
//! data dir (`cluster-id`) and carried in every Raft request; a node refuses the requests of
//! another cluster, and those of a node that has no id while it has one. A new member — one whose
//! log is empty — has none until it joins: the node initializing the cluster asks every member
//! to join before the first election ([`crate::raft_wire::Kind::Join`]), and a member added
//! later joins with the first entries or snapshot its leader sends that Raft would accept. The id
//! is written before the node acts on anything. Until it joins, a new member refuses votes,
//! pre-votes and handovers that carry an id: a stale node of another cluster must not win its
//! vote.
//!
//! A node that holds a log but no id (its cluster was formed before ids existed, or its
//! `cluster-id` file was lost) adopts none: it answers only requests without an id, as before
//! ids, and refuses the others.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{ensure, Context};

use crate::durable_file;

/// The file in a data dir that holds the cluster id.
const FILE: &str = "cluster-id";

/// A cluster's id: 16 bytes, shown as 32 hex digits. All zeros is not an id (it stands for
/// "none" on the wire).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterId([u8; 16]);

impl ClusterId {
    /// On the wire, for a node that has none.
    pub const NONE: [u8; 16] = [0; 16];

    /// A fresh random id.
    pub fn random() -> Self {
        loop {
            let bytes: [u8; 16] = rand::random();
            if bytes != Self::NONE {
                return Self(bytes);
            }
        }
    }

    /// The id in `bytes` as carried on the wire (`None` for [`Self::NONE`]).
    pub fn from_wire(bytes: [u8; 16]) -> Option<Self> {
        (bytes != Self::NONE).then_some(Self(bytes))
    }

    /// The bytes carried on the wire for `id`.
    pub fn to_wire(id: Option<Self>) -> [u8; 16] {
        id.map_or(Self::NONE, |id| id.0)
    }

    /// The id written as `text` (32 hex digits, as [`fmt::Display`] writes it).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let text = text.trim();
        ensure!(
            text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()),
            "a cluster id is 32 hex digits, not {text:?}"
        );
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)?;
        }
        Self::from_wire(bytes).context("a cluster id is not all zeros")
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({self})")
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

/// Why a peer's request was refused: it comes from another cluster.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Foreign {
    #[error("it belongs to cluster {theirs}, this node to cluster {ours}")]
    OtherCluster { ours: ClusterId, theirs: ClusterId },
    #[error(
        "it has no cluster id and this node belongs to cluster {ours} (a node that lost its \
         `cluster-id` file, or one from a cluster older than cluster ids)"
    )]
    Unlabelled { ours: ClusterId },
    #[error(
        "it belongs to cluster {theirs}, and this node holds a log without a cluster id (from a \
         cluster older than cluster ids, or its `cluster-id` file was lost): it joins no cluster"
    )]
    Unjoinable { theirs: ClusterId },
    #[error(
        "it belongs to cluster {theirs}, which this new node has not joined (it joins when the \
         cluster is initialized, or with its leader's first entries)"
    )]
    NotJoined { theirs: ClusterId },
}

/// Where a request's sender stands with this node, once admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Both name the same cluster.
    Member,
    /// Neither names one: a cluster from before cluster ids.
    Unnamed,
    /// This node is new and the request asks it into cluster `0` (a join, or a leader's entries
    /// or snapshot): it is answered once the node has joined ([`OwnCluster::join`]), after the
    /// request was judged fit.
    Invited(ClusterId),
}

/// The cluster this node belongs to, shared by the parts that send and answer Raft requests.
/// Once known it never changes, so reading it takes no lock.
#[derive(Clone, Default)]
pub struct OwnCluster {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where it is kept; `None` keeps it in memory only (tests).
    file: Option<PathBuf>,
    id: OnceLock<ClusterId>,
    /// Whether the node may still take an id: it had an empty log when it started and has not
    /// since followed a leader without one.
    fresh: AtomicBool,
    /// Held while an id is written, so that two first requests adopt one id.
    writing: Mutex<()>,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            file: None,
            id: OnceLock::new(),
            fresh: AtomicBool::new(true),
            writing: Mutex::new(()),
        }
    }
}

impl OwnCluster {
    /// The cluster id kept in `data_dir`, if any; `fresh` when the node's log is empty (it may
    /// still take an id).
    pub fn open(data_dir: &Path, fresh: bool) -> anyhow::Result<Self> {
        let file = data_dir.join(FILE);
        let id = OnceLock::new();
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                let read = ClusterId::parse(&text)
                    .with_context(|| format!("{} is damaged", file.display()))?;
                let _ = id.set(read);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
        }
        Ok(Self {
            inner: Arc::new(Inner {
                file: Some(file),
                id,
                fresh: AtomicBool::new(fresh),
                writing: Mutex::new(()),
            }),
        })
    }

    /// The cluster this node belongs to, if it knows.
    pub fn get(&self) -> Option<ClusterId> {
        self.inner.id.get().copied()
    }

    /// This node's cluster id when it is about to initialize a cluster: the one it has, or a new
    /// one (kept) if its log is empty; `None` for a node that holds a log without one (its
    /// initialization is refused anyway).
    pub fn mint(&self) -> anyhow::Result<Option<ClusterId>> {
        if self.get().is_none() && !self.inner.fresh.load(Ordering::Acquire) {
            return Ok(None);
        }
        self.set_if_unknown(ClusterId::random).map(Some)
    }

    /// Where a request from a node of cluster `theirs` (`None`: it has no id) stands, or why it
    /// is refused; `inviting`: the request may ask a new node in (a join, a leader's entries or
    /// snapshot).
    pub fn admit(&self, theirs: Option<ClusterId>, inviting: bool) -> Result<Standing, Foreign> {
        match (self.get(), theirs) {
            (Some(ours), Some(theirs)) if ours != theirs => {
                Err(Foreign::OtherCluster { ours, theirs })
            }
            (Some(_), Some(_)) => Ok(Standing::Member),
            (Some(ours), None) => Err(Foreign::Unlabelled { ours }),
            (None, None) => Ok(Standing::Unnamed),
            (None, Some(theirs)) if !self.inner.fresh.load(Ordering::Acquire) => {
                Err(Foreign::Unjoinable { theirs })
            }
            (None, Some(theirs)) if inviting => Ok(Standing::Invited(theirs)),
            (None, Some(theirs)) => Err(Foreign::NotJoined { theirs }),
        }
    }

    /// Joins cluster `id`, durably: the answer to a request that [`Self::admit`] found
    /// [`Standing::Invited`] and that is fit to act on.
    pub fn join(&self, id: ClusterId) -> Result<(), AdmitError> {
        let kept = self
            .set_if_unknown(|| id)
            .map_err(|e| AdmitError::Unwritable(format!("{e:#}")))?;
        // Another request had this node join first.
        if kept != id {
            return Err(AdmitError::Foreign(Foreign::OtherCluster {
                ours: kept,
                theirs: id,
            }));
        }
        Ok(())
    }

    /// Notes that this node, having no id, followed a leader without one: its log is that
    /// cluster's now, and it joins no other.
    pub fn settle_unnamed(&self) {
        self.inner.fresh.store(false, Ordering::Release);
    }

    /// The id, set to `new()` (written first) if there is none yet.
    fn set_if_unknown(&self, new: impl FnOnce() -> ClusterId) -> anyhow::Result<ClusterId> {
        let _writing = self
            .inner
            .writing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(id) = self.get() {
            return Ok(id);
        }
        let id = new();
        if let Some(file) = &self.inner.file {
            durable_file::write(file, format!("{id}\n").as_bytes())
                .with_context(|| format!("cannot write the cluster id to {}", file.display()))?;
        }
        tracing::info!(cluster = %id, "this node belongs to cluster {id}");
        Ok(*self.inner.id.get_or_init(|| id))
    }
}

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdmitError {
    #[error("refused: {0}")]
    Foreign(Foreign),
    #[error("cannot adopt its cluster id: {0}")]
    Unwritable(String),
}

/// Writes `id` as the cluster id of `data_dir` (a restore seeding it).
pub fn record(data_dir: &Path, id: ClusterId) -> anyhow::Result<()> {
    let file = data_dir.join(FILE);
    durable_file::write(&file, format!("{id}\n").as_bytes())
        .with_context(|| format!("cannot write the cluster id to {}", file.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_id_reads_back_as_it_is_written() {
        let id = ClusterId::random();
        assert_eq!(ClusterId::parse(&format!("{id}\n")).unwrap(), id);
        assert_eq!(ClusterId::from_wire(ClusterId::to_wire(Some(id))), Some(id));
        assert_eq!(ClusterId::from_wire(ClusterId::to_wire(None)), None);
        assert!(ClusterId::parse("00000000000000000000000000000000").is_err());
        assert!(ClusterId::parse("0123").is_err());
        assert!(ClusterId::parse("zz23456789abcdef0123456789abcdef").is_err());
    }

    #[test]
    fn a_node_with_an_id_refuses_other_clusters_and_nodes_without_one() {
        let ours = ClusterId::random();
        let theirs = ClusterId::random();
        let node = OwnCluster::default();
        node.join(ours).unwrap();
        assert_eq!(node.get(), Some(ours));
        for inviting in [false, true] {
            assert_eq!(node.admit(Some(ours), inviting), Ok(Standing::Member));
            assert_eq!(
                node.admit(Some(theirs), inviting),
                Err(Foreign::OtherCluster { ours, theirs })
            );
            assert_eq!(
                node.admit(None, inviting),
                Err(Foreign::Unlabelled { ours })
            );
        }
        assert!(node.join(theirs).is_err(), "nor joins another");
        assert_eq!(node.get(), Some(ours), "a refusal changes nothing");
    }

    #[test]
    fn a_new_node_is_invited_only_by_a_join_or_a_leader_and_refuses_votes_until_then() {
        let (stale, real) = (ClusterId::random(), ClusterId::random());
        let node = OwnCluster::default();
        // A stale node of another cluster asks for a vote first: refused, nothing taken.
        assert_eq!(
            node.admit(Some(stale), false),
            Err(Foreign::NotJoined { theirs: stale })
        );
        assert_eq!(node.admit(Some(real), true), Ok(Standing::Invited(real)));
        assert_eq!(node.get(), None, "an invitation alone takes nothing");
        node.join(real).unwrap();
        assert_eq!(node.admit(Some(real), false), Ok(Standing::Member));
        assert!(node.admit(Some(stale), true).is_err());
    }

    #[test]
    fn a_node_with_a_log_and_no_id_joins_no_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = OwnCluster::open(dir.path(), false).unwrap();
        let theirs = ClusterId::random();
        for inviting in [false, true] {
            assert_eq!(
                legacy.admit(Some(theirs), inviting),
                Err(Foreign::Unjoinable { theirs })
            );
            assert_eq!(legacy.admit(None, inviting), Ok(Standing::Unnamed));
        }
        assert_eq!(legacy.mint().unwrap(), None, "nor starts one");
        assert_eq!(legacy.get(), None);
        assert!(!dir.path().join(FILE).exists());
    }

    #[test]
    fn a_new_node_that_followed_a_leader_without_an_id_joins_no_cluster_later() {
        let node = OwnCluster::default();
        assert_eq!(node.admit(None, true), Ok(Standing::Unnamed));
        node.settle_unnamed();
        let theirs = ClusterId::random();
        assert_eq!(
            node.admit(Some(theirs), true),
            Err(Foreign::Unjoinable { theirs })
        );
    }

    #[test]
    fn a_minted_id_is_kept_and_a_joined_one_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let founder = OwnCluster::open(dir.path(), true).unwrap();
        assert_eq!(founder.get(), None);
        let id = founder.mint().unwrap().unwrap();
        assert_eq!(
            founder.mint().unwrap(),
            Some(id),
            "minting again keeps the id"
        );
        assert_eq!(OwnCluster::open(dir.path(), false).unwrap().get(), Some(id));

        let joiner_dir = tempfile::tempdir().unwrap();
        let joiner = OwnCluster::open(joiner_dir.path(), true).unwrap();
        joiner.join(id).unwrap();
        let reopened = OwnCluster::open(joiner_dir.path(), false).unwrap();
        assert_eq!(reopened.get(), Some(id), "joined durably");
        assert!(reopened.admit(Some(ClusterId::random()), true).is_err());
    }

    #[test]
    fn a_damaged_file_stops_the_node() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "not an id").unwrap();
        let error = OwnCluster::open(dir.path(), true).err().unwrap();
        assert!(format!("{error:#}").contains("damaged"), "{error:#}");
    }
}
