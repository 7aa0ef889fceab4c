//! A client workload of offer / take / reply chains that records every acknowledgement.
//!
//! Each task owns its keys (`{prefix}-c{task}-{n}`, offered from `source-{task}` to
//! `worker-{task}`), so no contract refusal is ever legitimate: the only possible outcomes are
//! an acknowledgement or an infrastructure failure. Chain `n` stops after the offer, the take or
//! the reply (`n % 3`), so the final snapshot holds tickets in every live and settled state.
//! After an infrastructure failure the chain is abandoned (its state is unknown) and the task
//! moves to a fresh key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_rpc::{Client, Error};
use baton_statemachine::handoff::{OfferArgs, Receipt, ReceiptStatus};

use crate::history::{lock, Ack, SharedHistory};

/// Bounds of one workload task.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Key prefix (unique per test).
    pub prefix: String,
    /// Stop after this many chains.
    pub max_chains: usize,
    /// Stop after this long, whatever happens.
    pub max_time: Duration,
    /// Ticket TTL: long enough that nothing expires during the test.
    pub ttl_ms: i64,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            prefix: "w".into(),
            max_chains: 10_000,
            max_time: Duration::from_secs(30),
            ttl_ms: 10 * 60 * 1000,
        }
    }
}

/// The receipt a workload sends for `key`.
pub fn receipt_for(key: &str) -> Receipt {
    Receipt {
        status: ReceiptStatus::Done,
        summary: format!("done {key}"),
        failure: String::new(),
        artifacts: vec![format!("artifact://{key}")],
    }
}

/// Runs task number `task` until `stop` is set or a bound is reached; returns chains started.
pub async fn run(
    client: Client,
    task: usize,
    workload: Workload,
    history: SharedHistory,
    stop: Arc<AtomicBool>,
) -> usize {
    let started = Instant::now();
    let mut chains = 0;
    while chains < workload.max_chains
        && !stop.load(Ordering::Relaxed)
        && started.elapsed() < workload.max_time
    {
        let key = format!("{}-c{task}-{chains}", workload.prefix);
        let steps = chains % 3;
        chains += 1;
        chain(&client, task, &key, steps, &workload, &history).await;
    }
    chains
}

/// One chain on a fresh key: offer, then (steps >= 1) take, then (steps >= 2) reply.
async fn chain(
    client: &Client,
    task: usize,
    key: &str,
    steps: usize,
    workload: &Workload,
    history: &SharedHistory,
) {
    let to = format!("worker-{task}");
    let offered = client
        .offer(OfferArgs {
            key: key.to_string(),
            from: format!("source-{task}"),
            to: to.clone(),
            payload: key.as_bytes().to_vec(),
            reply_to: format!("source-{task}"),
            ttl_ms: workload.ttl_ms,
        })
        .await;
    let Some(ticket) = settle(history, key, "offer", offered) else {
        return;
    };
    lock(history).ack(Ack::Offer {
        key: key.to_string(),
        generation: ticket.generation,
        steps,
    });
    if steps < 1 {
        return;
    }
    let Some(handle) = settle(history, key, "take", client.take(key, &to).await) else {
        return;
    };
    lock(history).ack(Ack::Take {
        key: key.to_string(),
        holder: to,
        handle: handle.clone(),
    });
    if steps < 2 {
        return;
    }
    let receipt = receipt_for(key);
    if settle(
        history,
        key,
        "reply",
        client.reply(key, &handle.token, &receipt).await,
    )
    .is_some()
    {
        lock(history).ack(Ack::Reply {
            key: key.to_string(),
            receipt,
        });
    }
}

/// The value of a successful call; failures are recorded as ambiguous or unexpected.
fn settle<T>(history: &SharedHistory, key: &str, op: &str, result: Result<T, Error>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(Error::Refused(refusal)) => {
            lock(history)
                .unexpected_refusals
                .push(format!("{op} {key}: {}", refusal.code()));
            None
        }
        Err(error) => {
            lock(history).ambiguous.push(format!("{op} {key}: {error}"));
            None
        }
    }
}
