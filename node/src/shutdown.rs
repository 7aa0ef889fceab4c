//! Leaving gracefully: what a node does between SIGTERM and stopping Raft.
//!
//! 1. Stop standing for election ([`crate::pre_vote::Contact::leave`]: no timer, no
//!    stand-at-once, no handover target; this node still answers votes and pre-votes), and close
//!    the admission gate: new client requests are refused `SHUTTING_DOWN` (clients retry on
//!    another node), Raft traffic goes on.
//! 2. Let the admitted client requests finish, for at most [`DRAIN_LIMIT`].
//! 3. If this node leads, hand leadership to a caught-up voter
//!    ([`crate::handover`]), so the cluster has a leader again after one election round trip
//!    instead of an election timeout. Skipped when the whole cluster is stopping together
//!    (`NodeConfig::hand_over_on_shutdown`, off in `baton dev`): the voters would be stopping too.
//!
//! The caller then stops serving and shuts Raft down.

use std::time::Duration;

use openraft::ServerState;

use crate::admission::{Admission, Closed};
use crate::handover;
use crate::network::Network;
use crate::node::Node;
use crate::pre_vote::Contact;

/// How long a shutdown waits for admitted client requests to finish.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Runs steps 1–3; failures are logged, never fatal: the node stops either way.
pub async fn leave(
    node: &Node,
    admission: &Admission,
    network: &Network,
    contact: &Contact,
    hand_over: bool,
) {
    tracing::info!(id = node.id, "shutting down: refusing new client requests");
    contact.leave();
    admission.close(Closed::ShuttingDown);
    let still_running = admission.drain(DRAIN_LIMIT).await;
    if still_running > 0 {
        tracing::warn!(
            still_running,
            "client requests still running after {DRAIN_LIMIT:?}; stopping anyway"
        );
    }
    let leading = node.raft.metrics().borrow().state == ServerState::Leader;
    if !leading || !hand_over {
        return;
    }
    match handover::hand_over(node, admission, network, None, Duration::ZERO).await {
        Ok(done) => tracing::info!(
            leader = done.leader,
            term = done.term,
            took = ?done.took,
            "leadership handed over before shutdown"
        ),
        Err(error) => tracing::warn!(%error, "could not hand leadership over before shutdown"),
    }
}
