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
//! is written before the node acts on anything. A new member refuses votes, pre-votes and
//! handovers that carry an id it has not joined: a stale node of another cluster must not win its
//! vote. While its log is empty its id is provisional ([`OwnCluster`]).
//!
//! A node that holds a log but no id (its cluster was formed before ids existed, or its
//! `cluster-id` file was lost) adopts none: it answers only requests without an id, as before
//! ids, and refuses the others.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use anyhow::{anyhow, Context};

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
        let mut bytes = [0u8; 16];
        hex::decode_to_slice(text, &mut bytes)
            .map_err(|e| anyhow!("a cluster id is 32 hex digits, not {text:?} ({e})"))?;
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
        f.write_str(&hex::encode(self.0))
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
    #[error(
        "it belongs to cluster {theirs}, and this node is initializing cluster {ours} itself (two \
         initializations at once: run one again)"
    )]
    Founding { ours: ClusterId, theirs: ClusterId },
    #[error(
        "it belongs to cluster {theirs}, and this new node is taking cluster {ours}'s entries \
         right now (two clusters invite it at once: run one initialization again)"
    )]
    Answering { ours: ClusterId, theirs: ClusterId },
}

/// Where a request's sender stands with this node, once admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Both name the same cluster.
    Member,
    /// Neither names one: a cluster from before cluster ids.
    Unnamed,
    /// This node is new (its log is empty) and the request asks it into cluster `0` (a join, or
    /// a leader's entries or snapshot): it is answered once the node has taken that id
    /// ([`OwnCluster::join`]), after the request was judged fit. (The apply rules question is
    /// admitted so too, and answered without taking the id: it changes nothing.)
    Invited(ClusterId),
}

/// The cluster this node belongs to, shared by the parts that send and answer Raft requests.
///
/// A new node's id — one it minted or was asked to join while its log is still empty — is
/// provisional: the next invitation replaces it (an initialization that failed and is run again
/// through another node mints another id, and nothing the node holds depends on the first). Once
/// the node holds a log, its id never changes, and reading it takes no lock.
#[derive(Clone, Default)]
pub struct OwnCluster {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where it is kept; `None` keeps it in memory only (tests).
    file: Option<PathBuf>,
    /// The id of a node that holds a log.
    settled: OnceLock<ClusterId>,
    /// While the log is empty: the id the node took last, if any, and whether it minted that id
    /// to initialize a cluster itself (it then joins no other meanwhile). Also held while an id
    /// is written, so that concurrent invitations leave one id, on disk as in memory.
    provisional: Mutex<Provisional>,
    /// Whether the log is still empty (the node may still take, or change, an id).
    fresh: AtomicBool,
}

/// A new node's id, whether it is founding a cluster with it, and how many invitations under
/// it are being answered.
#[derive(Default)]
struct Provisional {
    id: Option<ClusterId>,
    founding: bool,
    /// Invitations taken and not yet answered ([`Invitation`]): while any is, no other id
    /// replaces this one, so that the id on disk is the one whose entries Raft accepts.
    answering: usize,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            file: None,
            settled: OnceLock::new(),
            provisional: Mutex::default(),
            fresh: AtomicBool::new(true),
        }
    }
}

impl OwnCluster {
    /// The cluster id kept in `data_dir`, if any; `fresh` when the node's log is empty.
    pub fn open(data_dir: &Path, fresh: bool) -> anyhow::Result<Self> {
        let file = data_dir.join(FILE);
        let kept = match std::fs::read_to_string(&file) {
            Ok(text) => Some(
                ClusterId::parse(&text)
                    .with_context(|| format!("{} is damaged", file.display()))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
        };
        let settled = OnceLock::new();
        let mut provisional = Provisional::default();
        match kept {
            Some(id) if !fresh => {
                let _ = settled.set(id);
            }
            kept => provisional.id = kept,
        }
        Ok(Self {
            inner: Arc::new(Inner {
                file: Some(file),
                settled,
                provisional: Mutex::new(provisional),
                fresh: AtomicBool::new(fresh),
            }),
        })
    }

    /// The cluster of the log this node holds: `None` while its log is empty (an id it took
    /// meanwhile may still change) or when it holds a log without an id.
    pub fn settled(&self) -> Option<ClusterId> {
        self.inner.settled.get().copied()
    }

    /// The cluster this node belongs to, if it knows.
    pub fn get(&self) -> Option<ClusterId> {
        // `fresh` first: once it reads false, the settled id (set before) is seen too.
        let fresh = self.inner.fresh.load(Ordering::Acquire);
        if let Some(id) = self.inner.settled.get() {
            return Some(*id);
        }
        if fresh {
            self.provisional().id
        } else {
            None
        }
    }

    fn provisional(&self) -> MutexGuard<'_, Provisional> {
        self.inner
            .provisional
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new id (kept) for the cluster this node is about to initialize: the node joins no
    /// other while the returned [`Founding`] lasts. `None` when its log is not empty (Raft
    /// refuses to initialize it anyway). New on every attempt: an id taken from another node's
    /// attempt would put two clusters under one id. Refused while another attempt through this
    /// node is on: the two would mint two ids for one membership.
    pub fn mint(&self) -> anyhow::Result<Option<Founding<'_>>> {
        let mut provisional = self.provisional();
        if !self.inner.fresh.load(Ordering::Acquire) {
            return Ok(None);
        }
        anyhow::ensure!(
            !provisional.founding,
            "another initialization through this node is on (or one was cancelled while Raft \
             was initializing: restart the node)"
        );
        anyhow::ensure!(
            provisional.answering == 0,
            "this node is taking the entries of a cluster that invited it right now"
        );
        let id = ClusterId::random();
        self.write(id)?;
        *provisional = Provisional {
            id: Some(id),
            founding: true,
            answering: 0,
        };
        Ok(Some(Founding {
            cluster: self,
            id,
            raft_asked: false,
            ended: false,
        }))
    }

    /// Where a request from a node of cluster `theirs` (`None`: it has no id) stands, or why it
    /// is refused; `inviting`: the request may ask a new node in (a join, a leader's entries or
    /// snapshot), or is one a new node answers from a cluster it has not joined (the apply rules
    /// question).
    pub fn admit(&self, theirs: Option<ClusterId>, inviting: bool) -> Result<Standing, Foreign> {
        let fresh = self.inner.fresh.load(Ordering::Acquire);
        match (self.get(), theirs) {
            (Some(_), Some(theirs)) if fresh && inviting => Ok(Standing::Invited(theirs)),
            (Some(ours), Some(theirs)) if ours == theirs => Ok(Standing::Member),
            (Some(ours), Some(theirs)) if !fresh => Err(Foreign::OtherCluster { ours, theirs }),
            (Some(_), Some(theirs)) => Err(Foreign::NotJoined { theirs }),
            (Some(ours), None) => Err(Foreign::Unlabelled { ours }),
            (None, None) => Ok(Standing::Unnamed),
            (None, Some(theirs)) if !fresh => Err(Foreign::Unjoinable { theirs }),
            (None, Some(theirs)) if inviting => Ok(Standing::Invited(theirs)),
            (None, Some(theirs)) => Err(Foreign::NotJoined { theirs }),
        }
    }

    /// Takes cluster `id`, durably: the answer to a request that [`Self::admit`] found
    /// [`Standing::Invited`] and that is fit to act on, held until that request is answered
    /// (the returned [`Invitation`]). Refused once the node holds a log (it took its leader's
    /// id, or none, with its first entries), and while the invitation of another cluster is
    /// being answered: a leader's entries accepted under one id with another on disk would
    /// leave the node, after a crash before [`Self::settle`], a member of the wrong cluster.
    pub fn join(&self, id: ClusterId) -> Result<Invitation<'_>, AdmitError> {
        let mut provisional = self.provisional();
        let answered = |provisional: &mut Provisional| {
            provisional.answering += 1;
            Ok(Invitation { cluster: self })
        };
        if !self.inner.fresh.load(Ordering::Acquire) {
            return match self.inner.settled.get() {
                Some(ours) if *ours == id => answered(&mut provisional),
                Some(ours) => Err(AdmitError::Foreign(Foreign::OtherCluster {
                    ours: *ours,
                    theirs: id,
                })),
                None => Err(AdmitError::Foreign(Foreign::Unjoinable { theirs: id })),
            };
        }
        match provisional.id {
            Some(ours) if ours == id => answered(&mut provisional),
            Some(ours) if provisional.founding => {
                Err(AdmitError::Foreign(Foreign::Founding { ours, theirs: id }))
            }
            Some(ours) if provisional.answering > 0 => {
                Err(AdmitError::Foreign(Foreign::Answering { ours, theirs: id }))
            }
            _ => {
                self.write(id)
                    .map_err(|e| AdmitError::Unwritable(format!("{e:#}")))?;
                provisional.id = Some(id);
                answered(&mut provisional)
            }
        }
    }

    /// Notes that the node's log is no longer empty: Raft accepted entries (or a snapshot) from
    /// a leader of cluster `id` (`None`: a leader without one), or it initialized cluster `id`.
    /// That id (or the lack of one) is final from here on, whatever invitation came meanwhile.
    pub fn settle(&self, id: Option<ClusterId>) {
        self.settle_locked(&mut self.provisional(), id);
    }

    fn settle_locked(&self, provisional: &mut Provisional, id: Option<ClusterId>) {
        if !self.inner.fresh.load(Ordering::Acquire) {
            return;
        }
        if let Some(id) = id {
            if provisional.id != Some(id) {
                if let Err(e) = self.write(id) {
                    // Kept in memory; the next start reads the file as it was.
                    tracing::error!(error = %format!("{e:#}"), "cannot keep the cluster id");
                }
                provisional.id = Some(id);
            }
            let _ = self.inner.settled.set(id);
        }
        self.inner.fresh.store(false, Ordering::Release);
    }

    fn write(&self, id: ClusterId) -> anyhow::Result<()> {
        if let Some(file) = &self.inner.file {
            store(file, id)?;
        }
        tracing::info!(cluster = %id, "cluster id kept");
        Ok(())
    }
}

/// One initialization attempt's hold on the id it minted ([`OwnCluster::mint`]): while it
/// lasts the node joins no other cluster. Ended by [`Founding::found`] or
/// [`Founding::abandon`]; dropped unended (the call cancelled) it lets go, unless Raft was
/// already asked to initialize ([`Founding::raft_asked`]): the node may then hold the new
/// cluster's first entry, and keeps to the id until it restarts (which reads the log).
pub struct Founding<'a> {
    cluster: &'a OwnCluster,
    id: ClusterId,
    raft_asked: bool,
    ended: bool,
}

impl Founding<'_> {
    /// The minted id.
    pub fn id(&self) -> ClusterId {
        self.id
    }

    /// Notes that Raft is being asked to initialize the cluster.
    pub fn raft_asked(&mut self) {
        self.raft_asked = true;
    }

    /// The cluster was initialized: the node's id is the minted one, for good.
    pub fn found(mut self) {
        self.ended = true;
        let mut provisional = self.cluster.provisional();
        provisional.founding = false;
        self.cluster.settle_locked(&mut provisional, Some(self.id));
    }

    /// The cluster was not initialized: the node may join others again.
    pub fn abandon(mut self) {
        self.ended = true;
        self.cluster.provisional().founding = false;
    }
}

impl Drop for Founding<'_> {
    fn drop(&mut self) {
        if !self.ended && !self.raft_asked {
            self.cluster.provisional().founding = false;
        }
    }
}

/// An invitation being answered ([`OwnCluster::join`]): while it lasts, the node takes no
/// other cluster's id.
#[must_use = "the invitation ends when this is dropped"]
pub struct Invitation<'a> {
    cluster: &'a OwnCluster,
}

impl Drop for Invitation<'_> {
    fn drop(&mut self) {
        let mut provisional = self.cluster.provisional();
        provisional.answering = provisional.answering.saturating_sub(1);
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
    store(&data_dir.join(FILE), id)
}

/// Writes `id` to `file`, durably.
fn store(file: &Path, id: ClusterId) -> anyhow::Result<()> {
    durable_file::write(file, format!("{id}\n").as_bytes())
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
        drop(node.join(ours).unwrap());
        node.settle(Some(ours));
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
        drop(node.join(real).unwrap());
        assert_eq!(node.admit(Some(real), false), Ok(Standing::Member));
        assert_eq!(
            node.admit(Some(stale), false),
            Err(Foreign::NotJoined { theirs: stale }),
            "nor after joining another"
        );
        node.settle(Some(real));
        assert_eq!(
            node.admit(Some(stale), true),
            Err(Foreign::OtherCluster {
                ours: real,
                theirs: stale
            })
        );
    }

    #[test]
    fn while_its_log_is_empty_a_node_takes_the_latest_invitation() {
        // An initialization through node 1 failed after node 3 joined it; run again through
        // node 2, it mints another id, which node 3 takes instead.
        let dir = tempfile::tempdir().unwrap();
        let node = OwnCluster::open(dir.path(), true).unwrap();
        let (first, second) = (ClusterId::random(), ClusterId::random());
        drop(node.join(first).unwrap());
        assert_eq!(
            node.admit(Some(second), true),
            Ok(Standing::Invited(second))
        );
        drop(node.join(second).unwrap());
        assert_eq!(node.get(), Some(second));
        let restarted = OwnCluster::open(dir.path(), true).unwrap();
        assert_eq!(restarted.get(), Some(second), "kept on disk");
    }

    #[test]
    fn a_node_initializing_a_cluster_joins_no_other_meanwhile_and_settles_on_its_own() {
        let node = OwnCluster::default();
        let attempt = node.mint().unwrap().unwrap();
        let first = attempt.id();
        assert!(node.mint().is_err(), "one attempt at a time");
        let other = ClusterId::random();
        assert_eq!(
            node.join(other).err(),
            Some(AdmitError::Foreign(Foreign::Founding {
                ours: first,
                theirs: other
            }))
        );
        attempt.abandon();
        drop(node.join(other).unwrap());
        assert_eq!(node.get(), Some(other));

        // Cancelled before Raft was asked: let go. After: kept until a restart.
        drop(node.mint().unwrap().unwrap());
        let mut attempt = node.mint().unwrap().unwrap();
        let second = attempt.id();
        assert_ne!(second, first, "every attempt mints a new id");
        attempt.raft_asked();
        drop(attempt);
        assert!(node.join(other).is_err());
        assert!(node.mint().is_err());
        assert_eq!(node.get(), Some(second));
    }

    #[test]
    fn a_founded_cluster_is_the_nodes_for_good() {
        let node = OwnCluster::default();
        let mut attempt = node.mint().unwrap().unwrap();
        let mine = attempt.id();
        attempt.raft_asked();
        attempt.found();
        assert_eq!(node.get(), Some(mine));
        assert!(node.join(ClusterId::random()).is_err());
        assert!(
            node.mint().unwrap().is_none(),
            "its log holds the cluster now"
        );
    }

    #[test]
    fn a_node_settles_on_the_leader_it_followed_whatever_invitation_came_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let node = OwnCluster::open(dir.path(), true).unwrap();
        let (followed, late) = (ClusterId::random(), ClusterId::random());
        drop(node.join(followed).unwrap());
        drop(node.join(late).unwrap());
        node.settle(Some(followed));
        assert_eq!(node.get(), Some(followed));
        let restarted = OwnCluster::open(dir.path(), false).unwrap();
        assert_eq!(restarted.get(), Some(followed), "on disk too");
    }

    #[test]
    fn while_an_invitation_is_answered_no_other_cluster_replaces_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let node = OwnCluster::open(dir.path(), true).unwrap();
        let (first, second) = (ClusterId::random(), ClusterId::random());
        let answering = node.join(first).unwrap();
        let again = node.join(first).unwrap();
        assert_eq!(
            node.join(second).err(),
            Some(AdmitError::Foreign(Foreign::Answering {
                ours: first,
                theirs: second
            }))
        );
        assert!(node.mint().is_err(), "nor founds a cluster of its own");
        drop(answering);
        assert!(node.join(second).is_err(), "one of two still answered");
        // A crash here (Raft stored the first cluster's entries) finds the first id on disk.
        assert_eq!(
            OwnCluster::open(dir.path(), false).unwrap().get(),
            Some(first)
        );
        drop(again);
        drop(node.join(second).unwrap());
        assert_eq!(node.get(), Some(second));
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
        assert!(legacy.join(theirs).is_err());
        assert!(legacy.mint().unwrap().is_none(), "nor starts one");
        assert_eq!(legacy.get(), None);
        assert!(!dir.path().join(FILE).exists());
    }

    #[test]
    fn a_new_node_that_followed_a_leader_without_an_id_joins_no_cluster_later() {
        let node = OwnCluster::default();
        assert_eq!(node.admit(None, true), Ok(Standing::Unnamed));
        node.settle(None);
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
        let attempt = founder.mint().unwrap().unwrap();
        let id = attempt.id();
        attempt.found();
        assert_eq!(OwnCluster::open(dir.path(), false).unwrap().get(), Some(id));

        let joiner_dir = tempfile::tempdir().unwrap();
        let joiner = OwnCluster::open(joiner_dir.path(), true).unwrap();
        drop(joiner.join(id).unwrap());
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
