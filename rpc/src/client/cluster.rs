//! Cluster administration: membership changes, leadership handover and backups (leader only;
//! followers redirect like any write).

use std::time::{Duration, Instant};

use futures::StreamExt;

use super::{final_error, normalize, Client, Conn, MAX_ANSWER_BYTES};
use crate::error::{detail_of, infra, Error};
use crate::proto::cluster_client::ClusterClient;
use crate::proto::{self, snapshot_part, MembershipResponse, SnapshotMeta, TransferLeaderResponse};

/// How long the client waits for a leadership handover: draining admitted requests, the
/// followers' lease running out, up to three elections. The leader gives up on its own after
/// 25 s, so its answer normally arrives before this.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(30);

/// A snapshot of the state as the leader served it.
#[derive(Debug, Clone)]
pub struct SavedSnapshot {
    /// What the snapshot holds (log position, membership, size, format).
    pub meta: SnapshotMeta,
    /// The encoded state.
    pub state: Vec<u8>,
}

impl Client {
    /// Adds node `id` at `addr` as a learner and waits until it has caught up with the log.
    /// Adding a learner again at its own address is harmless (a retry); a voter's id is refused
    /// (`MEMBERSHIP`), as is a member's id at another address or its address under another id,
    /// and a node whose build says it does not apply the cluster's apply rules.
    pub async fn add_learner(&self, id: u64, addr: &str) -> Result<MembershipResponse, Error> {
        self.call_patiently(|channel: Conn| {
            let request = proto::AddLearnerRequest {
                id,
                addr: addr.to_string(),
            };
            async move { ClusterClient::new(channel).add_learner(request).await }
        })
        .await
    }

    /// Makes `voters` the cluster's voter set (joint consensus). Every new voter must already be
    /// a learner; members left out are removed from the cluster.
    pub async fn change_membership(&self, voters: &[u64]) -> Result<MembershipResponse, Error> {
        self.call_patiently(|channel: Conn| {
            let request = proto::ChangeMembershipRequest {
                voters: voters.to_vec(),
            };
            async move { ClusterClient::new(channel).change_membership(request).await }
        })
        .await
    }

    /// Makes learner `id` a voter (joint consensus), added to the voters the cluster has when
    /// the change is made, so that promotions (and removals) made at once by others stand.
    /// Refused (`INVALID_ARGUMENT`) for a node that is not a member, and (`MEMBERSHIP`) for a
    /// learner that has not caught up with the membership; a voter changes nothing and answers
    /// the current membership, so that a retry of a promotion that went through succeeds.
    pub async fn promote_member(&self, id: u64) -> Result<MembershipResponse, Error> {
        self.call_patiently(|channel: Conn| {
            let request = proto::PromoteMemberRequest { id };
            async move { ClusterClient::new(channel).promote_member(request).await }
        })
        .await
    }

    /// Removes member `id`, voter or learner, from the cluster. Refused (`INVALID_ARGUMENT`) for
    /// the last voter; for a node that is not a member (any more) it changes nothing and answers
    /// the current membership, so that a retry of a removal that went through succeeds.
    pub async fn remove_member(&self, id: u64) -> Result<MembershipResponse, Error> {
        self.call_patiently(|channel: Conn| {
            let request = proto::RemoveMemberRequest { id };
            async move { ClusterClient::new(channel).remove_member(request).await }
        })
        .await
    }

    /// Asks the leader to hand leadership to voter `to` (or to the most caught-up other voter)
    /// and returns the new leader once it is elected.
    ///
    /// Not retried: a handover that timed out may still have happened, and repeating it would
    /// move leadership again. Only redirects to the leader are followed. A handover to `to` that
    /// another voter won (its own election timer fired first, or `to` could not stand) is
    /// `Error::Server` `HANDOVER_FAILED` naming the new leader: leadership moved, but not where
    /// it was asked to. It is not asked again of the new leader, which could move leadership
    /// back and forth while `to` cannot win.
    pub async fn transfer_leader(&self, to: Option<u64>) -> Result<TransferLeaderResponse, Error> {
        let mut addr = self.discover_leader().await?;
        for _ in 0..3 {
            let channel = self.channel(&addr)?;
            let call = async move {
                ClusterClient::new(channel)
                    .transfer_leader(proto::TransferLeaderRequest { to })
                    .await
            };
            let status = match tokio::time::timeout(HANDOVER_WAIT, call).await {
                Ok(Ok(reply)) => {
                    let done = reply.into_inner();
                    return match to {
                        Some(to) if done.leader_id != to => Err(Error::Server {
                            code: infra::HANDOVER_FAILED.into(),
                            message: format!(
                                "node {}{} was elected (term {}) instead of node {to}; ask \
                                 it again to hand over to node {to}",
                                done.leader_id,
                                Some(&done.leader_addr)
                                    .filter(|addr| !addr.is_empty())
                                    .map(|addr| format!(" at {addr}"))
                                    .unwrap_or_default(),
                                done.term
                            ),
                        }),
                        _ => Ok(done),
                    };
                }
                Ok(Err(status)) => status,
                Err(_) => {
                    return Err(Error::OutcomeUnknown(format!(
                        "the leader at {addr} did not answer within {HANDOVER_WAIT:?}; \
                         check `baton status` before trying again"
                    )))
                }
            };
            match detail_of(&status) {
                Some(detail)
                    if detail.code == infra::NOT_LEADER && !detail.leader_addr.is_empty() =>
                {
                    addr = normalize(&detail.leader_addr);
                }
                _ => return Err(final_error(&status)),
            }
        }
        Err(Error::Unavailable {
            endpoints: vec![addr],
            waited: Duration::ZERO,
            last: "leadership kept moving while the handover was being asked for".into(),
        })
    }

    /// Fetches a snapshot of the state at a linearizable point from the leader (streamed), for
    /// a backup.
    pub async fn save_snapshot(&self) -> Result<SavedSnapshot, Error> {
        let started = Instant::now();
        let mut stream = self
            .call_patiently(|channel: Conn| async move {
                ClusterClient::new(channel)
                    .save_snapshot(proto::SaveSnapshotRequest {})
                    .await
            })
            .await?;
        // One deadline for the whole download: what the leader took to start is spent.
        let limit = self.inner.config.deadline;
        let left = limit.saturating_sub(started.elapsed());
        let received = tokio::time::timeout(left, async {
            let mut meta: Option<SnapshotMeta> = None;
            let mut state = Vec::new();
            while let Some(part) = stream.next().await {
                let part = part.map_err(|status| final_error(&status))?;
                match (part.part, &meta) {
                    (Some(snapshot_part::Part::Meta(m)), None) => {
                        // A hint only: a size past what the client decodes would not fit.
                        let announced = usize::try_from(m.state_bytes).unwrap_or(usize::MAX);
                        state.reserve(announced.min(MAX_ANSWER_BYTES));
                        meta = Some(m);
                    }
                    (Some(snapshot_part::Part::Chunk(chunk)), Some(m)) => {
                        // Never held beyond what was announced, whatever the stream carries.
                        if (state.len() + chunk.len()) as u64 > m.state_bytes {
                            return Err(Error::Protocol(format!(
                                "the snapshot stream carried more than the {} bytes of state \
                                 announced",
                                m.state_bytes
                            )));
                        }
                        state.extend_from_slice(&chunk)
                    }
                    _ => {
                        return Err(Error::Protocol(
                            "the snapshot stream is out of order".into(),
                        ))
                    }
                }
            }
            let meta = meta.ok_or_else(|| {
                Error::Protocol("the snapshot stream ended before its description".into())
            })?;
            if state.len() as u64 != meta.state_bytes {
                return Err(Error::Protocol(format!(
                    "the snapshot stream carried {} bytes of state, {} announced",
                    state.len(),
                    meta.state_bytes
                )));
            }
            Ok(SavedSnapshot { meta, state })
        })
        .await;
        received.unwrap_or_else(|_| {
            Err(Error::Unavailable {
                endpoints: vec![],
                waited: limit,
                last: "the snapshot did not arrive in time (raise --timeout)".into(),
            })
        })
    }
}
