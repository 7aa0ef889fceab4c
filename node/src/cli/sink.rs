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
            .map(|written| out!("fence={} writes={}", written.seen_fence, written.writes)),
        SinkCommand::Read { resource } => client
            .read_sink(&resource)
            .await
            .map(|value| out!("fence={} {}", value.seen_fence, value_field(&value.value))),
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}

/// A value for a `key=value` line, never altered.
fn value_field(value: &[u8]) -> String {
    super::bytes_field("value", value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_printed_unaltered() {
        assert_eq!(value_field(b"charged 42.00"), "value=charged 42.00");
        assert_eq!(value_field(&[0xff, 0x00, 0xfe]), "value_base64=/wD+");
    }
}
