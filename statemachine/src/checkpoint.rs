//! Checkpoint compare-and-set: a run's progress snapshot only moves forward.
//!
//! `save_if_newer` stores `data` for `run` only when `seq` is above the stored one; concurrent
//! savers therefore keep the highest seq, whatever order they arrive in. `seq = 0` is refused: it
//! is not a real commit, and accepting it would hand it the only write that could land on an empty
//! run. `load` of a run never saved is `NOT_FOUND`, never an empty value, so "never ran" is not
//! mistaken for "ran and saved nothing".

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::Refusal;
use crate::limits::{MAX_KEY_BYTES, MAX_PAYLOAD_BYTES};
use crate::validate;

/// A saved checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The run's sequence number at this save.
    pub seq: u64,
    /// The saved bytes.
    pub data: Vec<u8>,
    /// Store time of the save (Unix ms).
    pub saved_at_ms: u64,
}

/// A checkpoint command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Save `data` for `run` if `seq` is newer than the stored one.
    SaveIfNewer {
        /// The run.
        run: String,
        /// Its sequence number (> 0).
        seq: u64,
        /// The data.
        data: Vec<u8>,
    },
}

impl Command {
    /// The command's name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        "checkpoint.save"
    }
}

/// Every run's latest checkpoint. Each is shared (`Arc`, written into snapshots as the checkpoint
/// itself), so a copy of the state, which a snapshot build takes under the state lock, does not
/// copy the data.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoints {
    runs: BTreeMap<String, Arc<Checkpoint>>,
}

impl Checkpoints {
    /// Stores the checkpoint if `seq` is above the stored seq.
    pub fn save_if_newer(
        &mut self,
        clock_ms: u64,
        run: &str,
        seq: u64,
        data: Vec<u8>,
    ) -> Result<(), Refusal> {
        validate::required("run", run, MAX_KEY_BYTES)?;
        validate::bounded_bytes("data", &data, MAX_PAYLOAD_BYTES)?;
        if seq == 0 {
            return Err(Refusal::invalid("seq", "must be > 0"));
        }
        if self.runs.get(run).is_some_and(|saved| seq <= saved.seq) {
            return Err(Refusal::StaleSeq);
        }
        self.runs.insert(
            run.to_string(),
            Arc::new(Checkpoint {
                seq,
                data,
                saved_at_ms: clock_ms,
            }),
        );
        Ok(())
    }

    /// The latest checkpoint of `run`.
    pub fn load(&self, run: &str) -> Option<&Checkpoint> {
        self.runs.get(run).map(|saved| &**saved)
    }
}
