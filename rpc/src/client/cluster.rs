//! Membership administration (leader only; followers redirect like any write).

use tonic::transport::Channel;

use super::Client;
use crate::error::Error;
use crate::proto::cluster_client::ClusterClient;
use crate::proto::{self, MembershipResponse};

impl Client {
    /// Adds node `id` at `addr` as a learner and waits until it has caught up with the log.
    /// Adding a learner that is already a member is harmless.
    pub async fn add_learner(&self, id: u64, addr: &str) -> Result<MembershipResponse, Error> {
        self.call(|channel: Channel| {
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
        self.call(|channel: Channel| {
            let request = proto::ChangeMembershipRequest {
                voters: voters.to_vec(),
            };
            async move { ClusterClient::new(channel).change_membership(request).await }
        })
        .await
    }
}
