//! `baton members ...`: membership administration through the leader.

use std::time::Duration;

use baton_rpc::proto::{Member, MembershipResponse};
use baton_rpc::Client;
use clap::Subcommand;
use serde_json::json;

use super::exit;

/// `baton members ...`
#[derive(Subcommand, Debug)]
pub enum MembersCommand {
    /// List the members (voters and learners) as the leader sees them.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add a running, uninitialised node as a learner; returns once it has caught up.
    Add {
        /// The new node's id.
        #[arg(long)]
        id: u64,
        /// The address the cluster reaches it at.
        #[arg(long)]
        addr: String,
    },
    /// Make a learner a voter. Refused unless most of the resulting voters answer, and (by the
    /// leader) unless the learner has stored the latest membership entry (which lists it).
    Promote {
        /// The learner's id.
        #[arg(long)]
        id: u64,
        /// Change the voters even when most of them do not answer (the change then cannot
        /// commit until they do, and the cluster takes no writes meanwhile). A learner that has
        /// stored nothing is still refused.
        #[arg(long)]
        force: bool,
    },
    /// Remove a member (voter or learner) from the cluster. Refused unless most of the
    /// remaining voters answer.
    Remove {
        /// The member's id.
        #[arg(long)]
        id: u64,
        /// Change the voters even when most of them do not answer.
        #[arg(long)]
        force: bool,
    },
}

/// Runs `command`; each node asked whether it answers waits at most `within` (`--timeout`).
pub async fn run(command: MembersCommand, client: &Client, within: Duration) -> u8 {
    let current = match current_members(client).await {
        Ok(members) => members,
        Err(code) => return code,
    };
    let voters: Vec<u64> = current.iter().filter(|m| m.voter).map(|m| m.id).collect();
    let result = match command {
        MembersCommand::List { json } => {
            print_members(&current, json);
            return exit::OK;
        }
        MembersCommand::Add { id, addr } => client.add_learner(id, &addr).await,
        MembersCommand::Promote { id, force } => {
            if !current.iter().any(|m| m.id == id) {
                eprintln!("baton: node {id} is not a member; add it as a learner first");
                return exit::USAGE;
            }
            let mut next = voters.clone();
            if !next.contains(&id) {
                next.push(id);
            }
            if !force && !quorum_answers(client, &current, &next, within).await {
                return exit::USAGE;
            }
            // Most voters answering is not enough: a voter nobody reaches leaves the cluster
            // one failure short of stopping (3 of 4 answer; one more down and writes stop).
            if !force && !answers(client, &current, id, within).await {
                eprintln!(
                    "baton: node {id} does not answer: promoted, it would be a voter the cluster \
                     cannot reach, and one more failure would stop its writes. Start it (or fix \
                     its address) first, or pass --force"
                );
                return exit::USAGE;
            }
            client.promote_member(id).await
        }
        MembersCommand::Remove { id, force } => {
            // The store answers a removal of a stranger with success (a retry must succeed);
            // a typo on the command line deserves better.
            if !current.iter().any(|m| m.id == id) {
                eprintln!("baton: node {id} is not a member; `baton members list` shows them");
                return exit::USAGE;
            }
            let next: Vec<u64> = voters.iter().copied().filter(|v| *v != id).collect();
            if next.is_empty() {
                eprintln!("baton: node {id} is the last voter; a cluster cannot do without one");
                return exit::USAGE;
            }
            if !force && next != voters && !quorum_answers(client, &current, &next, within).await {
                return exit::USAGE;
            }
            client.remove_member(id).await
        }
    };
    match result {
        Ok(MembershipResponse {
            members,
            log_index,
            unasked,
        }) => {
            print_members(&members, false);
            out!("membership committed at log index {log_index}");
            if !unasked.is_empty() {
                eprintln!(
                    "baton: note: the new node could not be asked whether its build applies the \
                     cluster's apply rules ({unasked}); is it started, at that address? `baton \
                     status` shows it once it answers"
                );
            }
            warn_if_fragile(members.iter().filter(|m| m.voter).count());
            exit::OK
        }
        Err(error) => {
            let code = exit::report(&error);
            if code == exit::UNREACHABLE {
                // No answer is not no change: an addition waits for the learner to catch up
                // (longer than --timeout with a large state or a wrong address), and any change
                // may have committed with its answer lost.
                eprintln!(
                    "baton: the change may have been made all the same: `baton members list` \
                     shows whether it was, `baton status` how far each member has caught up"
                );
            }
            code
        }
    }
}

/// Says so (stderr) when `voters` is below three: with one or two voters a majority is all of
/// them, so the cluster stops writing when any one fails.
pub(super) fn warn_if_fragile(voters: usize) {
    if voters < 3 {
        eprintln!(
            "baton: warning: {voters} voter(s): a majority is all of them, so the cluster stops \
             if any one fails; three voters survive one failure, five survive two (`baton \
             members add` and `promote`)"
        );
    }
}

/// Whether most of the voters in `next` answer (NodeInfo), as a change of the voters to `next`
/// needs to commit; says why not on stderr. A change that cannot commit holds the cluster's
/// writes until it does — a learner added at a wrong address and promoted, a removal that
/// leaves a dead node among too few voters — so it is refused before it is made.
async fn quorum_answers(
    client: &Client,
    members: &[Member],
    next: &[u64],
    within: Duration,
) -> bool {
    // Asked all at once: frozen nodes cost one attempt's timeout, not one each.
    let answered =
        futures::future::join_all(next.iter().map(|id| answers(client, members, *id, within)))
            .await;
    let silent: Vec<u64> = next
        .iter()
        .zip(answered)
        .filter(|(_, answered)| !answered)
        .map(|(id, _)| *id)
        .collect();
    let answering = next.len() - silent.len();
    if answering * 2 > next.len() {
        return true;
    }
    eprintln!(
        "baton: the voters would be {next:?}, and {silent:?} do not answer: the change needs most \
         of them to commit, and until it does the cluster takes no writes. Start those nodes (or \
         fix their addresses) first, or pass --force"
    );
    false
}

/// Whether member `id` answers (NodeInfo) at its address.
async fn answers(client: &Client, members: &[Member], id: u64, within: Duration) -> bool {
    match members.iter().find(|m| m.id == id) {
        Some(member) => super::probe(client, &member.addr, within).await.is_ok(),
        None => false,
    }
}

async fn current_members(client: &Client) -> Result<Vec<Member>, u8> {
    let leader = client
        .discover_leader()
        .await
        .map_err(|e| exit::report(&e))?;
    let info = client
        .node_info(&leader)
        .await
        .map_err(|e| exit::report(&e))?;
    Ok(info.members)
}

fn print_members(members: &[Member], as_json: bool) {
    if as_json {
        let list: Vec<_> = members
            .iter()
            .map(|m| json!({ "id": m.id, "addr": m.addr, "voter": m.voter }))
            .collect();
        out!("{}", serde_json::Value::Array(list));
        return;
    }
    out!("{:<4} {:<22} ROLE", "ID", "ADDR");
    for m in members {
        let role = if m.voter { "voter" } else { "learner" };
        out!("{:<4} {:<22} {role}", m.id, m.addr);
    }
}
