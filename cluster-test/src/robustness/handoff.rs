//! Handoff workload: clients race offers, takes, replies, cancels and reads on a few ticket keys;
//! the history of each key must be linearizable against [`TicketModel`], takes must be exclusive
//! per generation with increasing fences, and nothing acknowledged may be missing after recovery.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_rpc::Client;
use baton_statemachine::handoff::{Handle, OfferArgs, Receipt, ReceiptStatus, Ticket};
use rand::rngs::StdRng;
use rand::Rng;

use super::check::{
    by_key, increasing_fences, linearizable, operation, unique_grants, unique_tokens, Grant,
    Violation,
};
use super::courier;
use super::history::{Input, Op, Outcome, Output, Recorder};
use crate::linearizability::{Operation, TicketInput, TicketModel, TicketOutput};

/// The source of every ticket.
pub const FROM: &str = "src";
/// The addressee of every ticket.
pub const TO: &str = "dst";
/// Ticket TTL: far longer than any run, so nothing expires (the model has no expiry).
pub const TTL_MS: i64 = 60 * 60 * 1000;
/// Token presented when no take's token is known (always `LEASE_LOST`).
const NO_TOKEN: &str = "00000000000000000000000000000000";
/// Most search steps the linearizability check of one key may take.
const MAX_STEPS: u64 = 20_000_000;

/// The latest token any client got from a take, per key: shared so replies race each other and
/// present stale tokens.
pub type Tokens = Arc<Mutex<BTreeMap<String, String>>>;

/// The ticket keys the clients work on, shared. A key whose take went unanswered is retired for
/// a fresh one: that take may have won, and then nobody has the token to reply, so for the
/// ticket's hour-long TTL every later call on the key would be a replay or a refusal — takes,
/// replies and new generations would go untested under the faults that follow. (Retired keys
/// stay in the history and are read back and judged like the others.)
#[derive(Clone)]
pub struct Keys {
    live: Arc<Mutex<Vec<String>>>,
    retired: Arc<std::sync::atomic::AtomicU64>,
}

impl Keys {
    /// Clients start on `keys`.
    pub fn new(keys: &[String]) -> Self {
        Keys {
            live: Arc::new(Mutex::new(keys.to_vec())),
            retired: Arc::default(),
        }
    }

    fn pick(&self, rng: &mut StdRng) -> String {
        let live = lock(&self.live);
        live[rng.random_range(0..live.len())].clone()
    }

    /// Replaces `key` (if still live) by a fresh one.
    fn retire(&self, key: &str) {
        let mut live = lock(&self.live);
        if let Some(slot) = live.iter_mut().find(|k| *k == key) {
            let n = self.retired.fetch_add(1, Ordering::Relaxed) + 1;
            let base = key.split('~').next().unwrap_or(key);
            *slot = format!("{base}~{n}");
        }
    }
}

fn ticket_output(ticket: &Ticket) -> Output {
    Output::Ticket {
        generation: ticket.generation,
        state: ticket.state.as_str().to_string(),
        holder: ticket.holder.clone(),
    }
}

/// A take's answer as the history records it.
pub fn handle_output(handle: &Handle) -> Output {
    Output::Handle {
        fence: handle.fence,
        token: handle.token.clone(),
    }
}

/// The receipt every reply carries.
pub fn receipt(key: &str) -> Receipt {
    Receipt {
        status: ReceiptStatus::Done,
        summary: format!("done {key}"),
        failure: String::new(),
        artifacts: Vec::new(),
    }
}

/// Offers `key` from [`FROM`] to [`TO`], recorded.
pub async fn offer(rec: &Recorder, client: &Client, name: &str, key: &str) -> Option<Ticket> {
    offer_for(rec, client, name, key, TTL_MS).await
}

/// Offers `key` from [`FROM`] to [`TO`] for `ttl_ms`, recorded.
pub async fn offer_for(
    rec: &Recorder,
    client: &Client,
    name: &str,
    key: &str,
    ttl_ms: i64,
) -> Option<Ticket> {
    let args = OfferArgs {
        key: key.to_string(),
        from: FROM.into(),
        to: TO.into(),
        payload: key.as_bytes().to_vec(),
        reply_to: FROM.into(),
        ttl_ms,
    };
    let input = Input::Offer {
        key: key.to_string(),
        from: FROM.into(),
        to: TO.into(),
    };
    rec.record(name, input, client.offer(args), ticket_output)
        .await
        .ok()
}

/// Reads `key`, recorded.
pub async fn read(rec: &Recorder, client: &Client, name: &str, key: &str) {
    let input = Input::Read {
        key: key.to_string(),
    };
    let _ = rec
        .record(name, input, client.ticket(key), ticket_output)
        .await;
}

/// One client: random operations on random keys until `stop`.
pub async fn run(
    client: Client,
    name: String,
    rec: Recorder,
    keys: Keys,
    tokens: Tokens,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let key = keys.pick(&mut rng);
        match rng.random_range(0..100) {
            0..25 => {
                offer(&rec, &client, &name, &key).await;
            }
            25..50 => {
                let to = if rng.random_bool(0.9) { TO } else { "intruder" };
                let input = Input::Take {
                    key: key.clone(),
                    to: to.into(),
                };
                match rec
                    .record(&name, input, client.take(&key, to), handle_output)
                    .await
                {
                    Ok(handle) => {
                        lock(&tokens).insert(key.clone(), handle.token);
                    }
                    Err(error) if error.outcome_unknown() => keys.retire(&key),
                    Err(_) => {}
                }
            }
            50..70 => {
                let token = lock(&tokens)
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| NO_TOKEN.to_string());
                let input = Input::Reply {
                    key: key.clone(),
                    token: token.clone(),
                };
                let _ = rec
                    .record(
                        &name,
                        input,
                        client.reply(&key, &token, &receipt(&key)),
                        |_| Output::Done,
                    )
                    .await;
            }
            70..80 => {
                let by = if rng.random_bool(0.9) { FROM } else { TO };
                let input = Input::Cancel {
                    key: key.clone(),
                    by: by.into(),
                };
                let _ = rec
                    .record(&name, input, client.cancel(&key, by), |_| Output::Done)
                    .await;
            }
            _ => read(&rec, &client, &name, &key).await,
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..15))).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The ticket key an operation is about, if it is a handoff operation.
pub fn key_of(input: &Input) -> Option<&str> {
    match input {
        Input::Offer { key, .. }
        | Input::Take { key, .. }
        | Input::Reply { key, .. }
        | Input::Cancel { key, .. }
        | Input::Read { key } => Some(key),
        _ => None,
    }
}

/// The model's view of one recorded operation.
fn to_model(op: &Op) -> Option<Operation<TicketInput, TicketOutput>> {
    let input = match &op.input {
        Input::Offer { from, to, .. } => TicketInput::Offer {
            from: from.clone(),
            to: to.clone(),
        },
        Input::Take { to, .. } => TicketInput::Take { to: to.clone() },
        Input::Reply { token, .. } => TicketInput::Reply {
            token: token.clone(),
        },
        Input::Cancel { by, .. } => TicketInput::Cancel { by: by.clone() },
        Input::Read { .. } => TicketInput::Read,
        _ => return None,
    };
    let output = match &op.outcome {
        Outcome::Ok(Output::Ticket {
            generation,
            state,
            holder,
        }) => Some(match input {
            TicketInput::Read => TicketOutput::Read {
                generation: *generation,
                state: state.clone(),
                holder: holder.clone(),
            },
            _ => TicketOutput::Offered {
                generation: *generation,
                state: state.clone(),
            },
        }),
        Outcome::Ok(Output::Handle { fence, token }) => Some(TicketOutput::Taken {
            fence: *fence,
            token: token.clone(),
        }),
        Outcome::Ok(_) => Some(TicketOutput::Done),
        Outcome::Refused(code) => Some(TicketOutput::Refused(code.clone())),
        Outcome::Ambiguous(_) | Outcome::Unexpected(_) | Outcome::Pending => None,
    };
    Some(operation(op, input, output))
}

/// Every handoff checker over the finished history. `final_from` is the time (µs) from which
/// operations are the reads made after recovery.
pub fn check(history: &[Op], final_from: u64) -> Vec<Violation> {
    let by_key = by_key(history, key_of);
    let mut violations = Vec::new();
    let mut grants = Vec::new();
    for (key, ops) in &by_key {
        // The model has no clock: couriers' short-lived tickets are judged by their own rules.
        if !courier::is_courier_key(key) {
            violations.extend(linearizable(
                &TicketModel,
                "ticket",
                key,
                ops,
                to_model,
                MAX_STEPS,
            ));
        }
        for op in ops {
            if let (Input::Take { .. }, Some(Output::Handle { fence, .. })) = (&op.input, op.ok()) {
                grants.push(Grant {
                    key: key.to_string(),
                    fence: *fence,
                    op: op.index,
                    until_ms: None,
                    renewed_until_ms: None,
                });
            }
        }
        violations.extend(durable(key, ops, final_from));
    }
    violations.extend(unique_grants("take", &grants, history));
    violations.extend(unique_tokens(
        "take",
        &grants,
        |output| match output {
            Output::Handle { token, .. } => Some(token.as_str()),
            _ => None,
        },
        history,
    ));
    violations.extend(increasing_fences("take", &grants, history));
    violations
}

/// After recovery, the ticket holds at least the highest generation anyone was acknowledged.
fn durable(key: &str, ops: &[&Op], final_from: u64) -> Vec<Violation> {
    let acked = ops
        .iter()
        .filter_map(|op| {
            let generation = match op.ok()? {
                Output::Ticket { generation, .. } => *generation,
                Output::Handle { fence, .. } => *fence,
                _ => return None,
            };
            Some((generation, op.index))
        })
        .max();
    let Some((generation, acked_op)) = acked else {
        return Vec::new();
    };
    let last_read = ops
        .iter()
        .rfind(|op| op.call >= final_from && matches!(op.input, Input::Read { .. }));
    let Some(read) = last_read else {
        return vec![Violation::new(
            "lost-ack",
            key,
            "no read was made after recovery",
            vec![acked_op],
        )];
    };
    match read.ok() {
        Some(Output::Ticket {
            generation: now, ..
        }) if *now >= generation => Vec::new(),
        Some(Output::Ticket { generation: now, .. }) => vec![Violation::new(
            "lost-ack",
            key,
            format!("generation {generation} was acknowledged, after recovery the ticket is at generation {now}"),
            vec![acked_op, read.index],
        )],
        _ => vec![Violation::new(
            "lost-ack",
            key,
            format!("generation {generation} was acknowledged, after recovery the ticket cannot be read"),
            vec![acked_op, read.index],
        )],
    }
}
