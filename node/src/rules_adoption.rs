//! The cluster adopts this build's apply rules ([`baton_statemachine::rules`]) once every member
//! runs a build that applies them.
//!
//! In a node-by-node upgrade old and new builds run side by side, and until the last member runs
//! the new one every entry must be applied by rules all members know. So the leader asks each
//! member, voters and learners, over the Raft connections ([`Kind::Rules`]) whether its build
//! applies this build's rules, and proposes [`Command::AdoptRules`] once all say yes. A build
//! from before versioned rules does not know the question and answers it as an unknown request,
//! which counts as no; so does a member that does not answer. The leader asks again every
//! [`ASK_EVERY`] while it leads and the cluster's rules are older than its build's. Once they are
//! not, on any node, the task ends.
//!
//! Adding a member asks it the same question first, about the rules in force, and again about
//! newer ones adopted while it was being added (`crate::service::cluster`); a membership that
//! changed while the leader asked is asked again before the adoption. A member that could not be
//! asked and runs an older build, or one added in the moment between the leader's last look and
//! the adoption's commit, stops (or, from before versioned rules, falls behind) at the adopting
//! entry or at a snapshot under the new rules, which it cannot read, rather than apply entries by
//! other rules than the rest.
//!
//! [`Kind::Rules`]: crate::raft_wire::Kind::Rules

use std::time::Duration;

use baton_statemachine::rules::RULES;
use baton_statemachine::Command;
use futures::future::join_all;
use tokio::sync::watch;

use crate::admission::Admission;
use crate::network::Network;
use crate::node::NodeRef;
use crate::types::NodeId;

/// How often a leader asks the members again while one of them cannot apply the new rules. (A
/// build from before the question closes the connection it came on: one dial more each time.)
pub const ASK_EVERY: Duration = Duration::from_secs(5);

/// How long a member has to answer.
const ASK_LIMIT: Duration = Duration::from_secs(1);

/// Has the cluster adopt [`RULES`] while this node leads, until the applied state is under them
/// or `stop` turns true.
pub async fn run(
    node: NodeRef,
    network: Network,
    admission: Admission,
    mut stop: watch::Receiver<bool>,
) {
    let mut server = node.raft.server_metrics();
    // The members that last held the adoption back, said once per change.
    let mut holding_back = Vec::new();
    loop {
        let adopted = node.state_machine.read().state.rules;
        if adopted >= RULES {
            return;
        }
        let leading = server.borrow_and_update().current_leader == Some(node.id);
        // A leader handing over or shutting down must not propose.
        if leading && !admission.is_closed() {
            let asked = membership_entry(&node);
            let refusals = tokio::select! {
                refusals = refusals(&node, &network) => refusals,
                _ = stop.changed() => return,
            };
            // A member added meanwhile was not asked: ask again, it included.
            if refusals.is_empty() && membership_entry(&node) != asked {
                continue;
            }
            if refusals.is_empty() {
                let adopt = Command::AdoptRules { rules: RULES };
                let proposed = tokio::select! {
                    proposed = node.propose(None, adopt) => proposed,
                    _ = stop.changed() => return,
                };
                match proposed {
                    Ok(_) => {
                        tracing::info!(from = adopted, to = RULES, "apply rules adopted");
                        continue;
                    }
                    Err(status) => tracing::debug!(%status, "apply rules not adopted"),
                }
            } else {
                let ids: Vec<NodeId> = refusals.iter().map(|(id, _)| *id).collect();
                if ids != holding_back {
                    let why: Vec<String> = refusals
                        .iter()
                        .map(|(id, why)| format!("node {id}: {why}"))
                        .collect();
                    tracing::info!(
                        rules = RULES,
                        in_force = adopted,
                        why = why.join("; "),
                        "new apply rules wait until every member's build applies them"
                    );
                    holding_back = ids;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(ASK_EVERY) => {}
            changed = server.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// The log entry of the membership this node goes by (the latest it holds, committed or not).
fn membership_entry(node: &NodeRef) -> Option<crate::types::LogId> {
    *node.raft.metrics().borrow().membership_config.log_id()
}

/// Why the cluster cannot adopt [`RULES`] now: the members (other than this node) that did not
/// say their build applies them, with their answers; none when all did.
async fn refusals(node: &NodeRef, network: &Network) -> Vec<(NodeId, String)> {
    let members: Vec<(NodeId, String)> = {
        let metrics = node.raft.metrics();
        let metrics = metrics.borrow();
        metrics
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != node.id)
            .map(|(id, member)| (*id, member.addr.clone()))
            .collect()
    };
    let answers = join_all(members.iter().map(|(id, addr)| async move {
        (
            *id,
            network.applies_rules(*id, addr, RULES, ASK_LIMIT).await,
        )
    }))
    .await;
    answers
        .into_iter()
        .filter_map(|(id, answer)| {
            // A failure to reach the member names it already; a refusal in words does not.
            let why = answer.err()?.to_string();
            let why = why.strip_prefix(&format!("node {id}: ")).unwrap_or(&why);
            Some((id, why.to_string()))
        })
        .collect()
}
