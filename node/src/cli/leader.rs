//! `baton leader transfer`: hand leadership to another voter.

use baton_rpc::Client;
use clap::Subcommand;

use super::exit;

/// `baton leader ...`
#[derive(Subcommand, Debug)]
pub enum LeaderCommand {
    /// Hand leadership to another voter and wait until it is elected (prints the new leader).
    ///
    /// The leader stops taking requests (clients retry), lets the admitted ones finish, waits
    /// until the target has its whole log, and asks it to start an election, which it wins.
    Transfer {
        /// The voter to hand over to [default: the most caught-up other voter].
        #[arg(long)]
        to: Option<u64>,
    },
}

pub async fn run(command: LeaderCommand, client: &Client) -> u8 {
    match command {
        LeaderCommand::Transfer { to } => match client.transfer_leader(to).await {
            Ok(done) => {
                out!(
                    "leader: node {} at {} (term {}); handover took {} ms",
                    done.leader_id,
                    done.leader_addr,
                    done.term,
                    done.took_ms
                );
                exit::OK
            }
            Err(error) => exit::report(&error),
        },
    }
}
