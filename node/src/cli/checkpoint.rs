//! `baton checkpoint ...`: checkpoint compare-and-set.

use baton_rpc::Client;
use baton_statemachine::checkpoint::Checkpoint;
use clap::Subcommand;
use serde_json::json;

use super::{exit, rfc3339};

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
    /// Print RUN's latest saved data (refused NOT_FOUND when nothing was saved): as saved,
    /// followed by a newline when it is UTF-8 text, other bytes unaltered.
    Load {
        #[arg(long)]
        run: String,
        /// Print one JSON object: run, seq, saved_at, and data (text) or data_base64.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(command: CheckpointCommand, client: &Client) -> u8 {
    let result = match command {
        CheckpointCommand::Save { run, seq, data } => client
            .save_if_newer(&run, seq, data.as_bytes())
            .await
            .map(|()| out!("saved {run} seq={seq}")),
        CheckpointCommand::Load { run, json } => client.load(&run).await.map(|saved| match json {
            true => out!("{}", as_json(&run, &saved)),
            false => print_data(&saved.data),
        }),
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}

/// A checkpoint as a JSON object, its data as text when UTF-8, else in `data_base64`.
fn as_json(run: &str, saved: &Checkpoint) -> serde_json::Value {
    let mut value = json!({
        "run": run,
        "seq": saved.seq,
        "saved_at": rfc3339(saved.saved_at_ms),
        "saved_at_ms": saved.saved_at_ms,
    });
    super::put_bytes(&mut value, "data", &saved.data);
    value
}

/// Writes checkpoint data to stdout as it was saved: text with a newline after it, other bytes
/// unaltered (`> file` gets them back exactly; they were printed lossily before).
fn print_data(data: &[u8]) {
    match std::str::from_utf8(data) {
        Ok(text) => out!("{text}"),
        Err(_) => super::write_out(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_carries_text_as_text_and_other_bytes_in_base64() {
        let saved = |data: &[u8]| Checkpoint {
            seq: 7,
            data: data.to_vec(),
            saved_at_ms: 0,
        };
        let text = as_json("r", &saved(b"offset=1200"));
        assert_eq!(text["data"], "offset=1200");
        assert_eq!(text["seq"], 7);
        assert!(text.get("data_base64").is_none(), "{text}");
        let binary = as_json("r", &saved(&[0xff, 0x00, 0xfe]));
        assert!(binary["data"].is_null(), "{binary}");
        assert_eq!(binary["data_base64"], "/wD+");
    }
}
