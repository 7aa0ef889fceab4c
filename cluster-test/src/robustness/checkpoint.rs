//! Checkpoint workload: clients race `save_if_newer` on a few runs, each offering a seq around the
//! highest any of them has sent (so saves collide, overtake each other and go stale), and read
//! the runs back with `load`.
//!
//! Checked (contract §4): each run's history is linearizable against [`CheckpointModel`] — a save
//! is stored only when its seq is above the stored one, `STALE_SEQ` otherwise with nothing
//! written, and `load` of a run never saved is `NOT_FOUND` — and after recovery every run still
//! holds at least the highest seq whose save was acknowledged. Every save carries data no other
//! save carries, so a load also shows *which* save it returns.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::Client;
use baton_statemachine::checkpoint::Checkpoint;
use rand::rngs::StdRng;
use rand::Rng;

use super::check::{by_key, linearizable, operation, Violation};
use super::history::{Input, Op, Outcome, Output, Recorder};
use crate::linearizability::{Model, Operation};

/// Most search steps the linearizability check of one run may take.
const MAX_STEPS: u64 = 20_000_000;

/// The runs a workload saves to.
pub fn run_ids(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("run-{i}")).collect()
}

/// The highest seq any client has sent, per run (by position in the run list): shared so that
/// the clients' saves race each other around it.
pub type Highest = Arc<Vec<AtomicU64>>;

/// A [`Highest`] for `runs` runs.
pub fn highest(runs: usize) -> Highest {
    Arc::new((0..runs).map(|_| AtomicU64::new(0)).collect())
}

fn checkpoint_output(checkpoint: &Checkpoint) -> Output {
    Output::Checkpoint {
        seq: checkpoint.seq,
        data: String::from_utf8_lossy(&checkpoint.data).into_owned(),
    }
}

/// Loads `run`, recorded.
pub async fn load(rec: &Recorder, client: &Client, name: &str, run: &str) {
    let input = Input::LoadCheckpoint {
        run: run.to_string(),
    };
    let _ = rec
        .record(name, input, client.load(run), checkpoint_output)
        .await;
}

/// One client: random saves and loads on random runs until `stop`.
pub async fn run(
    client: Client,
    name: String,
    rec: Recorder,
    runs: Arc<Vec<String>>,
    highest: Highest,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    let mut saves = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let i = rng.random_range(0..runs.len());
        let run = &runs[i];
        if rng.random_bool(0.7) {
            saves += 1;
            // One below to three above the highest sent: mostly a race to store a new seq,
            // sometimes one that can only be stale (unless the save it trails was lost).
            let top = highest[i].load(Ordering::Relaxed);
            let seq = (top + rng.random_range(0..=4)).saturating_sub(1).max(1);
            highest[i].fetch_max(seq, Ordering::Relaxed);
            let data = format!("{name}-{saves}");
            let input = Input::SaveCheckpoint {
                run: run.clone(),
                seq,
                data: data.clone(),
            };
            let _ = rec
                .record(
                    &name,
                    input,
                    client.save_if_newer(run, seq, data.as_bytes()),
                    |_| Output::Done,
                )
                .await;
        } else {
            load(&rec, &client, &name, run).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..15))).await;
    }
}

/// The run an operation is about, if it is a checkpoint operation.
pub fn run_of(input: &Input) -> Option<&str> {
    match input {
        Input::SaveCheckpoint { run, .. } | Input::LoadCheckpoint { run } => Some(run),
        _ => None,
    }
}

/// Operations on one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointInput {
    /// `save_if_newer(run, seq, data)`.
    Save {
        /// Seq offered.
        seq: u64,
        /// Data offered.
        data: String,
    },
    /// `load(run)`.
    Load,
}

/// What an operation on one run returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointOutput {
    /// The save was stored.
    Saved,
    /// What a load found.
    Loaded {
        /// Seq.
        seq: u64,
        /// Data.
        data: String,
    },
    /// A contract refusal, by code.
    Refused(String),
}

/// The sequential specification of one run's checkpoint (contract §4); its state is the stored
/// `(seq, data)`, if any.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckpointModel;

impl Model for CheckpointModel {
    type State = Option<(u64, String)>;
    type Input = CheckpointInput;
    type Output = CheckpointOutput;

    fn init(&self) -> Self::State {
        None
    }

    fn step(
        &self,
        stored: &Self::State,
        input: &CheckpointInput,
        output: Option<&CheckpointOutput>,
    ) -> Option<Self::State> {
        let (expected, next) = match (input, stored) {
            (CheckpointInput::Save { seq, .. }, Some((stored_seq, _))) if seq <= stored_seq => (
                CheckpointOutput::Refused("STALE_SEQ".into()),
                stored.clone(),
            ),
            (CheckpointInput::Save { seq, data }, _) => {
                (CheckpointOutput::Saved, Some((*seq, data.clone())))
            }
            (CheckpointInput::Load, None) => (
                CheckpointOutput::Refused("NOT_FOUND".into()),
                stored.clone(),
            ),
            (CheckpointInput::Load, Some((seq, data))) => (
                CheckpointOutput::Loaded {
                    seq: *seq,
                    data: data.clone(),
                },
                stored.clone(),
            ),
        };
        match output {
            Some(got) if *got != expected => None,
            _ => Some(next),
        }
    }
}

/// The model's view of one recorded operation.
fn to_model(op: &Op) -> Option<Operation<CheckpointInput, CheckpointOutput>> {
    let input = match &op.input {
        Input::SaveCheckpoint { seq, data, .. } => CheckpointInput::Save {
            seq: *seq,
            data: data.clone(),
        },
        Input::LoadCheckpoint { .. } => CheckpointInput::Load,
        _ => return None,
    };
    let output = match &op.outcome {
        Outcome::Ok(Output::Checkpoint { seq, data }) => Some(CheckpointOutput::Loaded {
            seq: *seq,
            data: data.clone(),
        }),
        Outcome::Ok(_) => Some(CheckpointOutput::Saved),
        Outcome::Refused(code) => Some(CheckpointOutput::Refused(code.clone())),
        Outcome::Ambiguous(_) | Outcome::Unexpected(_) | Outcome::Pending => None,
    };
    Some(operation(op, input, output))
}

/// Every checkpoint checker over the finished history. `final_from` is the time (µs) from which
/// operations are the reads made after recovery.
pub fn check(history: &[Op], final_from: u64) -> Vec<Violation> {
    let by_run = by_key(history, run_of);
    let mut violations = Vec::new();
    for (run, ops) in &by_run {
        violations.extend(linearizable(
            &CheckpointModel,
            "checkpoint run",
            run,
            ops,
            to_model,
            MAX_STEPS,
        ));
        violations.extend(durable(run, ops, final_from));
    }
    violations
}

/// After recovery, the run holds at least the highest seq whose save was acknowledged.
fn durable(run: &str, ops: &[&Op], final_from: u64) -> Vec<Violation> {
    let acked = ops
        .iter()
        .filter_map(|op| match (&op.input, op.ok()) {
            (Input::SaveCheckpoint { seq, .. }, Some(_)) => Some((*seq, op.index)),
            _ => None,
        })
        .max();
    let Some((seq, acked_op)) = acked else {
        return Vec::new();
    };
    let last_load = ops
        .iter()
        .rfind(|op| op.call >= final_from && matches!(op.input, Input::LoadCheckpoint { .. }));
    let Some(load) = last_load else {
        return vec![Violation::new(
            "lost-ack",
            run,
            "no load was made after recovery",
            vec![acked_op],
        )];
    };
    match load.ok() {
        Some(Output::Checkpoint { seq: now, .. }) if *now >= seq => Vec::new(),
        Some(Output::Checkpoint { seq: now, .. }) => vec![Violation::new(
            "lost-ack",
            run,
            format!("seq {seq} was acknowledged, after recovery the run holds seq {now}"),
            vec![acked_op, load.index],
        )],
        _ => vec![Violation::new(
            "lost-ack",
            run,
            format!("seq {seq} was acknowledged, after recovery the run cannot be loaded"),
            vec![acked_op, load.index],
        )],
    }
}
