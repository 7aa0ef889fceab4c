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
/// How long a shutdown gives the leadership handover (it usually takes under a second; the
/// admin call's own limit is longer, but a stopping node has systemd's clock running).
pub const HANDOVER_LIMIT: Duration = Duration::from_secs(8);
/// How long the gRPC server may take to close its connections once a shutdown has drained.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(5);
/// How long the background tasks told to stop may take, together, before they are stopped by
/// force.
pub const STOP_LIMIT: Duration = Duration::from_secs(5);
/// How long Raft may take to stop (its storage flushing, its tasks ending).
pub const RAFT_STOP_LIMIT: Duration = Duration::from_secs(5);
/// How long the process's exit waits for work left on blocking threads (a disk sync that
/// hangs, say) once everything else has stopped.
pub const EXIT_GRACE: Duration = Duration::from_secs(1);
/// The longest a node takes from SIGTERM to its exit: every step above at its limit. What runs
/// it must wait longer before it kills (systemd's `TimeoutStopSec` in deploy/baton.service,
/// Compose's `stop_grace_period`), or a node is killed mid-handover.
pub const LONGEST_STOP: Duration = DRAIN_LIMIT
    .saturating_add(HANDOVER_LIMIT)
    .saturating_add(CLOSE_LIMIT)
    .saturating_add(STOP_LIMIT)
    .saturating_add(RAFT_STOP_LIMIT)
    .saturating_add(EXIT_GRACE);

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
    let handed = tokio::time::timeout(
        HANDOVER_LIMIT,
        handover::hand_over(node, admission, network, None, Duration::ZERO),
    )
    .await
    .unwrap_or_else(|_| {
        Err(handover::HandoverError::Failed(format!(
            "not done within {HANDOVER_LIMIT:?}"
        )))
    });
    match handed {
        Ok(done) => tracing::info!(
            leader = done.leader,
            term = done.term,
            took = ?done.took,
            "leadership handed over before shutdown"
        ),
        Err(error) => tracing::warn!(%error, "could not hand leadership over before shutdown"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seconds `key=` (systemd) or `key:` (Compose) sets in `text`.
    fn seconds(text: &str, key: &str) -> u64 {
        let line = text
            .lines()
            .map(str::trim)
            .find(|line| line.starts_with(key))
            .unwrap_or_else(|| panic!("no {key}"));
        let value = line[key.len()..].trim_start_matches([':', '=', ' ']).trim();
        humantime::parse_duration(value)
            .unwrap_or_else(|e| panic!("{line}: {e}"))
            .as_secs()
    }

    /// Whatever stops a node must wait out its longest graceful stop, or it kills the node
    /// mid-handover (the cluster then waits an election timeout for a new leader).
    #[test]
    fn the_shipped_stop_timeouts_outlast_the_longest_stop() {
        let systemd = seconds(include_str!("../../deploy/baton.service"), "TimeoutStopSec");
        let compose = seconds(
            include_str!("../../deploy/docker-compose.yml"),
            "stop_grace_period",
        );
        for (what, allowed) in [("TimeoutStopSec", systemd), ("stop_grace_period", compose)] {
            assert!(
                allowed > LONGEST_STOP.as_secs(),
                "{what} {allowed}s does not outlast the longest stop ({LONGEST_STOP:?})"
            );
        }
    }
}
