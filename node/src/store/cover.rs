//! What the durable snapshot covers, shared by the two stores so that the log never purges an
//! entry that only a snapshot not yet on disk covers.
//!
//! openraft 0.9 hands a snapshot received from the leader to the state machine worker and, in
//! the same step, purges the log up to the snapshot's last entry without waiting for the
//! install. The install (decode, write of the image, sync) can take seconds for a large state. A
//! node killed in that window restarted with its old snapshot, a purge point past it, and the
//! entries in between gone: openraft could not re-apply them and the node could not start. So a
//! purge waits until the durable snapshot reaches the purge point (once a snapshot has streamed in
//! at all: the log store alone purges only what a snapshot on disk covers).
//!
//! The purge waits rather than being put off: openraft runs the log's commands in order on its
//! core, so while the purge waits nothing is appended after the snapshot's last entry either. A
//! deferred purge would let such appends land first, and a crash before the install was stored
//! would leave a hole between the old log and the new entries. The core stands still for the
//! install meanwhile, which a follower receiving a snapshot can afford.
//!
//! Every other purge is up to a snapshot already on disk (openraft only purges what its latest
//! snapshot covers, and a build writes its image before openraft sees it), so it never waits.

use std::time::Duration;

use tokio::sync::watch;

use crate::types::LogId;

/// The longest a purge waits for a snapshot install. An install of a large state on a slow disk
/// can take minutes (a fresh learner took in a snapshot of a million live leases, transfer
/// included, in 3.6–5.0 s; docs/benchmarks.md), and a purge given up stops Raft: the restarted
/// node receives the same snapshot again and, were the limit shorter than the install, never
/// catches up. Only a state machine worker that is gone (a panic) never ends the wait; then Raft
/// stops, so that the node exits and its supervisor restarts it.
const INSTALL_LIMIT: Duration = Duration::from_secs(30 * 60);

/// How often a purge that still waits for a snapshot install says so.
const INSTALL_WARN_EVERY: Duration = Duration::from_secs(30);

/// How far the durable snapshot reaches, and what became of the snapshots streamed in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Covered {
    /// The last entry of the snapshot stored on disk, if any.
    durable: Option<LogId>,
    /// Whether a snapshot from a leader has begun streaming in since the store opened: only
    /// an install's purge can outrun what is on disk, so until then no purge waits.
    streamed: bool,
    /// The last entry of the newest snapshot whose install failed, and why it failed.
    abandoned: Option<(LogId, String)>,
}

/// The shared record; clones share it.
#[derive(Debug, Clone)]
pub(crate) struct Cover(watch::Sender<Covered>);

impl Cover {
    /// A record of a store whose durable snapshot ends at `durable`.
    pub(crate) fn new(durable: Option<LogId>) -> Self {
        Self(watch::Sender::new(Covered {
            durable,
            streamed: false,
            abandoned: None,
        }))
    }

    /// The last entry of the snapshot stored on disk.
    pub(crate) fn durable(&self) -> Option<LogId> {
        self.0.borrow().durable
    }

    /// A snapshot from the leader starts streaming in.
    pub(crate) fn receiving(&self) {
        self.0.send_modify(|c| c.streamed = true);
    }

    /// A snapshot image ending at `last` is on disk (synced): a build's, or an install's before
    /// the install is done. It says nothing about what streams in.
    pub(crate) fn on_disk(&self, last: Option<LogId>) {
        self.0.send_modify(|c| c.durable = c.durable.max(last));
    }

    /// The snapshot that streamed in, ending at `last`, is on disk (or one as new already was).
    pub(crate) fn installed(&self, last: Option<LogId>) {
        self.0.send_modify(|c| c.durable = c.durable.max(last));
    }

    /// The snapshot that streamed in, ending at `last`, will not be stored: its install failed
    /// for reason `why` (said again by the purge it was to cover, which is what stops Raft).
    pub(crate) fn abandoned(&self, last: Option<LogId>, why: &dyn std::fmt::Display) {
        let Some(last) = last else { return };
        self.0.send_modify(|c| {
            if c.abandoned
                .as_ref()
                .is_none_or(|(newest, _)| *newest < last)
            {
                c.abandoned = Some((last, why.to_string()));
            }
        });
    }

    /// Waits until purging up to `upto` is safe: the durable snapshot reaches it (or no
    /// snapshot ever streamed in). Errs when the snapshot that was to cover it was abandoned
    /// (purging then would leave a hole no restart can fill).
    ///
    /// The purge waits for its own snapshot, not for "no stream in flight": a new leader's
    /// stream can begin before an older leader's snapshot, received whole, is installed, and
    /// that install ended the wait of the newer one's purge, which then went ahead while
    /// nothing on disk covered it.
    pub(crate) async fn purge_allowed(&self, upto: LogId) -> Result<(), String> {
        let mut seen = self.0.subscribe();
        let covered = |c: &Covered| c.durable >= Some(upto);
        let settled =
            |c: &Covered| covered(c) || c.abandoned.as_ref().is_some_and(|(last, _)| *last >= upto);
        if covered(&seen.borrow()) || !seen.borrow().streamed {
            return Ok(());
        }
        let started = tokio::time::Instant::now();
        let settled = loop {
            let waited = tokio::time::timeout(INSTALL_WARN_EVERY, seen.wait_for(settled)).await;
            match waited {
                Ok(settled) => {
                    break settled
                        .map_err(|_| "the snapshot store is gone".to_string())?
                        .clone()
                }
                Err(_) if started.elapsed() >= INSTALL_LIMIT => {
                    return Err(format!(
                        "the snapshot streaming in was not stored within {INSTALL_LIMIT:?}; not \
                         purging up to {upto}, which only it covers"
                    ))
                }
                Err(_) => tracing::warn!(
                    waited = ?started.elapsed(),
                    "the log waits for the snapshot streaming in to be stored before it purges up \
                     to {upto}; the node takes no new entries meanwhile"
                ),
            }
        };
        if !covered(&settled) {
            let why = settled.abandoned.map(|(_, why)| why).unwrap_or_default();
            return Err(format!(
                "no snapshot on disk covers the purge up to {upto}: the one streaming in was \
                 not stored ({why})"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use openraft::CommittedLeaderId;

    use super::*;

    fn id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    #[tokio::test]
    async fn a_purge_waits_for_the_snapshot_streaming_in_to_be_stored() {
        let cover = Cover::new(Some(id(10)));
        cover.purge_allowed(id(10)).await.unwrap();
        cover.purge_allowed(id(50)).await.unwrap();

        cover.receiving();
        cover.purge_allowed(id(5)).await.unwrap();
        let purge = tokio::spawn({
            let cover = cover.clone();
            async move { cover.purge_allowed(id(50)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!purge.is_finished(), "purged past the durable snapshot");
        // A build finishing meanwhile, short of the purge point, does not end the wait.
        cover.on_disk(Some(id(20)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!purge.is_finished(), "a build released the purge");
        cover.installed(Some(id(50)));
        purge.await.unwrap().unwrap();
        assert_eq!(cover.durable(), Some(id(50)));
    }

    /// A purge given up after two minutes stopped Raft, and the restarted node received the
    /// same snapshot again: an install that slow could never finish.
    #[tokio::test(start_paused = true)]
    async fn a_purge_waits_as_long_as_the_install_takes() {
        let cover = Cover::new(Some(id(10)));
        cover.receiving();
        let purge = tokio::spawn({
            let cover = cover.clone();
            async move { cover.purge_allowed(id(50)).await }
        });
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!purge.is_finished(), "the purge gave up on a slow install");
        cover.installed(Some(id(50)));
        purge.await.unwrap().unwrap();
    }

    /// An install that never ends (its worker gone) fails the purge in the end, so that Raft
    /// stops and the node exits rather than hang unnoticed.
    #[tokio::test(start_paused = true)]
    async fn a_purge_gives_up_on_an_install_that_never_ends() {
        let cover = Cover::new(Some(id(10)));
        cover.receiving();
        let purge = tokio::spawn({
            let cover = cover.clone();
            async move { cover.purge_allowed(id(50)).await }
        });
        tokio::time::sleep(INSTALL_LIMIT + INSTALL_WARN_EVERY * 2).await;
        assert!(purge.is_finished(), "the purge waits for good");
        assert!(purge.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn an_abandoned_install_fails_the_purge_it_was_to_cover() {
        let cover = Cover::new(Some(id(10)));
        cover.receiving();
        let purge = tokio::spawn({
            let cover = cover.clone();
            async move { cover.purge_allowed(id(50)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // An older stream's failed install is not this purge's.
        cover.abandoned(Some(id(30)), &"an older one");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !purge.is_finished(),
            "another snapshot's failure ended the wait"
        );
        cover.abandoned(Some(id(50)), &"No space left on device");
        let refused = purge.await.unwrap().unwrap_err();
        assert!(
            refused.contains("No space left on device"),
            "the purge says why the install failed: {refused}"
        );
    }

    /// A new leader's snapshot can begin streaming in before an older leader's, received
    /// whole, is installed: that install ended the wait of the newer one's purge, which went
    /// ahead while nothing on disk covered it.
    #[tokio::test]
    async fn an_older_stream_s_install_does_not_release_a_newer_one_s_purge() {
        let cover = Cover::new(Some(id(10)));
        cover.receiving();
        cover.receiving();
        cover.installed(Some(id(30)));
        let purge = tokio::spawn({
            let cover = cover.clone();
            async move { cover.purge_allowed(id(50)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!purge.is_finished(), "purged past the durable snapshot");
        cover.installed(Some(id(50)));
        purge.await.unwrap().unwrap();
    }

    #[test]
    fn an_older_snapshot_never_lowers_what_is_covered() {
        let cover = Cover::new(Some(id(50)));
        cover.on_disk(Some(id(20)));
        cover.installed(Some(id(30)));
        assert_eq!(cover.durable(), Some(id(50)));
    }
}
