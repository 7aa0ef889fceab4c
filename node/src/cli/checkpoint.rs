//! `baton checkpoint ...`: checkpoint compare-and-set.

use baton_rpc::Client;
use clap::Subcommand;

use super::exit;

/// `baton checkpoint ...`
#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Save DATA for RUN if SEQ is above the stored seq (refused STALE_SEQ otherwise).
    Save {
        #[arg(long)]
        run: String,
        #[arg(long)]
        seq: u64,
        #[arg(long)]
        data: String,
    },
    /// Print RUN's latest saved data (refused NOT_FOUND when nothing was saved).
    Load {
        #[arg(long)]
        run: String,
    },
}

pub async fn run(command: CheckpointCommand, client: &Client) -> u8 {
    let result = match command {
        CheckpointCommand::Save { run, seq, data } => client
            .save_if_newer(&run, seq, data.as_bytes())
            .await
            .map(|()| println!("saved {run} seq={seq}")),
        CheckpointCommand::Load { run } => client
            .load(&run)
            .await
            .map(|saved| println!("{}", String::from_utf8_lossy(&saved.data))),
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}
