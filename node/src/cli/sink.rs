//! `baton sink ...`: the fenced sink.

use baton_rpc::Client;
use clap::Subcommand;

use super::exit;

/// `baton sink ...`
#[derive(Subcommand, Debug)]
pub enum SinkCommand {
    /// Write VALUE to RESOURCE presenting FENCE (refused FENCE_STALE below the highest seen).
    Write {
        #[arg(long)]
        resource: String,
        #[arg(long)]
        fence: u64,
        #[arg(long)]
        value: String,
    },
    /// Read a resource (linearizable): its highest seen fence and latest value.
    Read {
        #[arg(long)]
        resource: String,
    },
}

pub async fn run(command: SinkCommand, client: &Client) -> u8 {
    let result = match command {
        SinkCommand::Write {
            resource,
            fence,
            value,
        } => client
            .write_fenced(&resource, fence, value.as_bytes())
            .await
            .map(|written| println!("fence={} writes={}", written.seen_fence, written.writes)),
        SinkCommand::Read { resource } => client.read_sink(&resource).await.map(|value| {
            println!(
                "fence={} value={}",
                value.seen_fence,
                String::from_utf8_lossy(&value.value)
            )
        }),
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}
