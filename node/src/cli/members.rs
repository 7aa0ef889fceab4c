//! `baton members ...`: membership administration through the leader.

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
    /// Make a learner a voter.
    Promote {
        /// The learner's id.
        #[arg(long)]
        id: u64,
    },
    /// Remove a member (voter or learner) from the cluster.
    Remove {
        /// The member's id.
        #[arg(long)]
        id: u64,
    },
}

pub async fn run(command: MembersCommand, client: &Client) -> u8 {
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
        MembersCommand::Promote { id } => {
            if !current.iter().any(|m| m.id == id) {
                eprintln!("baton: node {id} is not a member; add it as a learner first");
                return exit::USAGE;
            }
            let mut next = voters.clone();
            if !next.contains(&id) {
                next.push(id);
            }
            client.change_membership(&next).await
        }
        MembersCommand::Remove { id } => {
            // The store answers a removal of a stranger with success (a retry must succeed);
            // a typo on the command line deserves better.
            if !current.iter().any(|m| m.id == id) {
                eprintln!("baton: node {id} is not a member; `baton members list` shows them");
                return exit::USAGE;
            }
            client.remove_member(id).await
        }
    };
    match result {
        Ok(MembershipResponse { members, log_index }) => {
            print_members(&members, false);
            println!("membership committed at log index {log_index}");
            exit::OK
        }
        Err(error) => exit::report(&error),
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
        println!("{}", serde_json::Value::Array(list));
        return;
    }
    println!("{:<4} {:<22} ROLE", "ID", "ADDR");
    for m in members {
        let role = if m.voter { "voter" } else { "learner" };
        println!("{:<4} {:<22} {role}", m.id, m.addr);
    }
}
