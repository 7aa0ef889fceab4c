//! Courier workload: handoff deadlines under faults. The handoff workload's tickets live an hour
//! (its linearizability model has no clock); couriers offer short-lived tickets on fresh keys,
//! take them, and reply — mostly at once, sometimes only after the deadline, sometimes never —
//! now and then take only after the deadline, and offer a settled key again.
//!
//! The deadline is judged on the store clock, the largest leader stamp so far; every node of a
//! run shares this machine's wall clock, and a command is stamped after it was sent and applied
//! before it is answered, so the client's clock brackets it: a ticket's deadline lies between
//! its first offer's sending and its answer, plus the TTL. Checked, with [`CLOCK_SLACK_US`] for the
//! history's monotonic clock against the wall clock:
//! - the first offer of a fresh key answers generation 1, offered (`fresh-offer`);
//! - no take or reply sent after the deadline had certainly passed is acknowledged
//!   (`late-accepted`: late receipts are refused, fail-closed);
//! - nothing is refused `EXPIRED` before the deadline could have come (`premature-expiry`);
//! - an offer sent once the ticket was certainly settled (a reply acknowledged, an `EXPIRED`
//!   answered, or the deadline certainly passed) starts generation 2 (`reoffer-generation`);
//! - after recovery the ticket is `closed` if a reply was acknowledged and `expired` if no reply
//!   can have been applied (either, if one went unanswered), or the second generation's
//!   (`final-state`; judged `SWEEP_US` past the deadline: a read does not expire a ticket, the
//!   sweeper does);
//! - nothing but a take or reply is refused, and those only `EXPIRED` (`unexpected-refusal`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::Client;
use baton_statemachine::Refusal;
use rand::rngs::StdRng;
use rand::Rng;

use super::check::{by_key, Violation, CLOCK_SLACK_US};
use super::handoff::{self, TO};
use super::history::{Input, Op, Output, Recorder};

/// Prefix of the couriers' ticket keys (the handoff workload's model skips them).
pub const PREFIX: &str = "courier-";
/// Ticket TTL.
pub const TTL_MS: i64 = 1_500;
/// The same in µs, as the history counts.
const TTL_US: u64 = TTL_MS as u64 * 1_000;
/// How long a late courier waits after the offer or take answered (ms): from a little before
/// the deadline to past it, so that late calls race the sweeper (which expires a ticket within
/// about 50 ms of its deadline) and, when it lags, meet the lazy expiry of take, reply and offer.
const LATE_MS: std::ops::Range<u64> = 1_300..2_100;
/// How long after a deadline the final read may still find the ticket unexpired: the sweeper
/// runs at most 50 ms after a deadline passes, and its entry then needs a commit.
const SWEEP_US: u64 = 5_000_000;

/// One courier: a fresh key per delivery, until `stop`.
pub async fn run(
    client: Client,
    name: String,
    rec: Recorder,
    mut rng: StdRng,
    stop: Arc<AtomicBool>,
) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        // The courier's name starts with the prefix: `courier-0/17`.
        let key = format!("{name}/{n}");
        deliver(&client, &name, &rec, &key, &mut rng).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..30))).await;
    }
}

/// Sleeps [`LATE_MS`].
async fn late(rng: &mut StdRng) {
    tokio::time::sleep(Duration::from_millis(rng.random_range(LATE_MS))).await;
}

/// One ticket: offer, take (10 % late), reply (70 % at once, 20 % late, 10 % never), and, once
/// it is settled (or left to run out), 30 % offer it again.
async fn deliver(client: &Client, name: &str, rec: &Recorder, key: &str, rng: &mut StdRng) {
    if handoff::offer_for(rec, client, name, key, TTL_MS)
        .await
        .is_none()
    {
        return;
    }
    if rng.random_bool(0.1) {
        late(rng).await;
    }
    let input = Input::Take {
        key: key.to_string(),
        to: TO.into(),
    };
    let taken = rec
        .record(name, input, client.take(key, TO), handoff::handle_output)
        .await;
    let may_offer_again = match taken {
        Ok(handle) => match rng.random_range(0..10) {
            0..9 => {
                if rng.random_bool(2.0 / 9.0) {
                    late(rng).await;
                }
                let input = Input::Reply {
                    key: key.to_string(),
                    token: handle.token.clone(),
                };
                let replied = rec
                    .record(
                        name,
                        input,
                        client.reply(key, &handle.token, &handoff::receipt(key)),
                        |_| Output::Done,
                    )
                    .await;
                match replied {
                    Ok(()) => true,
                    Err(error) => error.refusal() == Some(&Refusal::Expired),
                }
            }
            // Never replied: the ticket expires.
            _ => {
                late(rng).await;
                true
            }
        },
        Err(error) => error.refusal() == Some(&Refusal::Expired),
    };
    if may_offer_again && rng.random_bool(0.3) {
        handoff::offer_for(rec, client, name, key, TTL_MS).await;
    }
}

/// Whether `key` is a courier's.
pub fn is_courier_key(key: &str) -> bool {
    key.starts_with(PREFIX)
}

/// Every courier checker. `final_from`: when the reads after recovery began (µs).
pub fn check(history: &[Op], final_from: u64) -> Vec<Violation> {
    let mut violations = Vec::new();
    let tickets = by_key(history, |input| {
        handoff::key_of(input).filter(|key| is_courier_key(key))
    });
    for (key, ops) in &tickets {
        if let Some(ticket) = Ticket::of(key, ops, final_from) {
            violations.extend(ticket.judge());
        }
    }
    violations
}

/// One courier key's operations, sorted out.
struct Ticket<'a> {
    key: &'a str,
    /// The first offer (of a fresh key: it makes generation 1).
    first: &'a Op,
    /// The offer of the key once it was settled, if one was sent.
    again: Option<&'a Op>,
    /// Takes and replies sent during the run.
    holder_calls: Vec<&'a Op>,
    /// The last read after recovery.
    read: Option<&'a Op>,
}

impl<'a> Ticket<'a> {
    fn of(key: &'a str, ops: &[&'a Op], final_from: u64) -> Option<Ticket<'a>> {
        let mut offers = ops
            .iter()
            .copied()
            .filter(|op| matches!(op.input, Input::Offer { .. }));
        let first = offers.next()?;
        Some(Ticket {
            key,
            first,
            again: offers.next(),
            holder_calls: ops
                .iter()
                .copied()
                .filter(|op| {
                    op.call < final_from
                        && matches!(op.input, Input::Take { .. } | Input::Reply { .. })
                })
                .collect(),
            read: ops
                .iter()
                .copied()
                .rfind(|op| op.call >= final_from && matches!(op.input, Input::Read { .. })),
        })
    }

    /// The latest the deadline of generation 1 can be (µs): the first offer's answer + TTL.
    fn due_by(&self) -> Option<u64> {
        self.first.ret.map(|ret| ret + TTL_US + CLOCK_SLACK_US)
    }

    /// The earliest the deadline of any generation can be (µs): the first offer's sending + TTL.
    fn due_from(&self) -> u64 {
        (self.first.call + TTL_US).saturating_sub(CLOCK_SLACK_US)
    }
}

/// Generation and state of a ticket answer.
fn ticket_of(op: &Op) -> Option<(u64, &str)> {
    match op.ok()? {
        Output::Ticket {
            generation, state, ..
        } => Some((*generation, state.as_str())),
        _ => None,
    }
}

impl Ticket<'_> {
    fn judge(&self) -> Vec<Violation> {
        let mut violations = Vec::new();
        violations.extend(self.refusals());
        violations.extend(self.fresh_offer());
        violations.extend(self.deadline_rules());
        violations.extend(self.offer_again());
        violations.extend(self.final_state());
        violations
    }

    fn violation(&self, rule: &str, detail: String, ops: Vec<usize>) -> Violation {
        Violation::new(rule, self.key, detail, ops)
    }

    /// During the run a courier's only possible refusal is `EXPIRED`, of a take or a reply: the
    /// key is its own, the take its addressee's and its first, the reply its take's. (The
    /// handoff model, which judges the other keys' refusals, skips these.)
    fn refusals(&self) -> Vec<Violation> {
        let calls = self
            .holder_calls
            .iter()
            .copied()
            .chain(std::iter::once(self.first))
            .chain(self.again);
        calls
            .filter_map(|op| {
                let code = op.refused()?;
                let allowed = matches!(op.input, Input::Take { .. } | Input::Reply { .. })
                    && code == "EXPIRED";
                (!allowed).then(|| {
                    self.violation(
                        "unexpected-refusal",
                        format!("a courier's {} was refused {code}", op.input),
                        vec![op.index],
                    )
                })
            })
            .collect()
    }

    fn fresh_offer(&self) -> Option<Violation> {
        let (generation, state) = ticket_of(self.first)?;
        ((generation, state) != (1, "offered")).then(|| {
            self.violation(
                "fresh-offer",
                format!("the first offer of a fresh key answered generation {generation}, {state}"),
                vec![self.first.index],
            )
        })
    }

    /// `late-accepted` and `premature-expiry`.
    fn deadline_rules(&self) -> Vec<Violation> {
        let mut violations = Vec::new();
        for op in &self.holder_calls {
            let what = match op.input {
                Input::Take { .. } => "take",
                _ => "reply",
            };
            if op.ok().is_some() && self.due_by().is_some_and(|due| op.call > due) {
                violations.push(self.violation(
                    "late-accepted",
                    format!("a {what} sent after the deadline had passed was acknowledged"),
                    vec![self.first.index, op.index],
                ));
            }
            if op.refused() == Some("EXPIRED") && op.ret.is_some_and(|ret| ret < self.due_from()) {
                violations.push(self.violation(
                    "premature-expiry",
                    format!("a {what} was refused EXPIRED before the deadline could have come"),
                    vec![self.first.index, op.index],
                ));
            }
        }
        violations
    }

    /// Whether the first generation was certainly settled when `op` was sent.
    fn settled_before(&self, op: &Op) -> bool {
        self.due_by().is_some_and(|due| op.call > due)
            || self.holder_calls.iter().any(|o| {
                o.precedes(op)
                    && (matches!((&o.input, o.ok()), (Input::Reply { .. }, Some(_)))
                        || o.refused() == Some("EXPIRED"))
            })
    }

    fn offer_again(&self) -> Option<Violation> {
        let again = self.again?;
        let (generation, state) = ticket_of(again)?;
        if !self.settled_before(again) || (generation, state) == (2, "offered") {
            return None;
        }
        Some(self.violation(
            "reoffer-generation",
            format!("an offer of the settled ticket answered generation {generation}, {state}, not a new generation"),
            vec![self.first.index, again.index],
        ))
    }

    /// The states the first generation can end in: `closed` only if a reply may have been
    /// applied, `expired` unless one was acknowledged.
    fn first_endings(&self) -> Vec<&'static str> {
        let replies = || {
            self.holder_calls
                .iter()
                .filter(|op| matches!(op.input, Input::Reply { .. }))
        };
        if replies().any(|op| op.ok().is_some()) {
            vec!["closed"]
        } else if replies().any(|op| op.refused().is_none()) {
            vec!["closed", "expired"]
        } else {
            vec!["expired"]
        }
    }

    fn final_state(&self) -> Option<Violation> {
        let read = self.read?;
        // Judged once the first generation's deadline has certainly passed and the sweeper has
        // had its time. A read without a ticket is `lost-ack`'s (handoff) to report.
        if self.due_by().is_none_or(|due| read.call <= due + SWEEP_US) {
            return None;
        }
        let (generation, state) = ticket_of(read)?;
        let first = generation == 1 && self.first_endings().contains(&state);
        let allowed = match self.again {
            None => first,
            Some(again) => {
                // Expired by the read if it was answered long enough before; else maybe not yet.
                let due = again
                    .ret
                    .map(|ret| ret + TTL_US + CLOCK_SLACK_US + SWEEP_US);
                let states: &[&str] = if due.is_some_and(|due| read.call > due) {
                    &["expired"]
                } else {
                    &["offered", "expired"]
                };
                let second = generation == 2 && states.contains(&state);
                match ticket_of(again) {
                    Some((2, _)) => second,
                    // A replay: generation 1 stays.
                    Some(_) => first,
                    None => first || second,
                }
            }
        };
        (!allowed).then(|| {
            let mut ops = vec![self.first.index];
            ops.extend(self.holder_calls.iter().map(|op| op.index));
            ops.extend(self.again.map(|op| op.index));
            ops.push(read.index);
            self.violation(
                "final-state",
                format!("after recovery the ticket is at generation {generation}, {state}, which its history does not allow"),
                ops,
            )
        })
    }
}
