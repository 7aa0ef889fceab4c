//! Property tests: random command sequences over a small alphabet of keys and agents, with a
//! wobbling leader clock (including stamps behind the store clock), several clients that retry
//! earlier requests, and interleaved sweeps. After every step the contract's invariants must hold.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use baton_statemachine::handoff::{
    self, check, OfferArgs, ProblemCode, Receipt, ReceiptStatus, Ticket, TicketState,
};
use baton_statemachine::{
    apply, is_overdue, Command, Envelope, Origin, Refusal, Reply, Response, Stamp, State,
};
use proptest::prelude::*;
use proptest::sample::Index;

const T0: u64 = 1_000_000;
const KEYS: [&str; 3] = ["a", "b", "c"];
/// Sources and addressees.
const AGENTS: [&str; 2] = ["p", "q"];
/// Takers and cancellers: the agents plus one stranger.
const ACTORS: [&str; 3] = ["p", "q", "r"];
const CLIENTS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Offer {
        key: usize,
        from: usize,
        to: usize,
        ttl_ms: i64,
        payload: u8,
    },
    Take {
        key: usize,
        /// `None`: the ticket's addressee; otherwise one of [`ACTORS`].
        to: Option<usize>,
    },
    Reply {
        key: usize,
        token: TokenPick,
        receipt: u8,
    },
    Cancel {
        key: usize,
        /// `None`: the ticket's source; otherwise one of [`ACTORS`].
        by: Option<usize>,
    },
    /// The leader's sweep (no origin).
    Sweep,
    /// A client retries one of its earlier requests with the same origin (new stamp).
    Retry(Index),
}

#[derive(Debug, Clone)]
enum TokenPick {
    /// The token that won the key's current generation (if any).
    Current,
    /// Any token some take returned, possibly for another key or an older generation.
    Issued(Index),
    /// A token nobody was ever given.
    Junk,
}

#[derive(Debug, Clone)]
struct Step {
    /// Leader stamp relative to the store clock; negative = a leader behind the store clock.
    dt_ms: i64,
    client: usize,
    /// When set, this request acknowledges every request of the client below `seq - n`.
    ack: Option<u8>,
    op: Op,
}

/// Mostly the party the ticket names, sometimes anyone.
fn party() -> impl Strategy<Value = Option<usize>> {
    prop_oneof![3 => Just(None), 1 => (0..ACTORS.len()).prop_map(Some)]
}

fn token_pick() -> impl Strategy<Value = TokenPick> {
    prop_oneof![
        4 => Just(TokenPick::Current),
        2 => any::<Index>().prop_map(TokenPick::Issued),
        1 => Just(TokenPick::Junk),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    prop_oneof![
        4 => (key.clone(), 0..AGENTS.len(), 0..AGENTS.len(), prop_oneof![6 => 1i64..20_000, 2 => 1i64..1_000, 1 => -3i64..=0], any::<u8>())
            .prop_map(|(key, from, to, ttl_ms, payload)| Op::Offer { key, from, to, ttl_ms, payload }),
        4 => (key.clone(), party()).prop_map(|(key, to)| Op::Take { key, to }),
        3 => (key.clone(), token_pick(), prop_oneof![6 => 0u8..3, 1 => 3u8..5])
            .prop_map(|(key, token, receipt)| Op::Reply { key, token, receipt }),
        2 => (key, party()).prop_map(|(key, by)| Op::Cancel { key, by }),
        2 => Just(Op::Sweep),
        3 => any::<Index>().prop_map(Op::Retry),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        -3_000i64..=2_000,
        0..CLIENTS,
        prop_oneof![4 => Just(None), 1 => (0u8..6).prop_map(Some)],
        op(),
    )
        .prop_map(|(dt_ms, client, ack, op)| Step {
            dt_ms,
            client,
            ack,
            op,
        })
}

fn receipt(kind: u8) -> Receipt {
    let text = |s: &str| s.to_string();
    match kind {
        0 => Receipt {
            status: ReceiptStatus::Done,
            summary: text("ok"),
            failure: String::new(),
            artifacts: vec![text("out")],
        },
        1 => Receipt {
            status: ReceiptStatus::Failed,
            summary: String::new(),
            failure: text("boom"),
            artifacts: Vec::new(),
        },
        2 => Receipt {
            status: ReceiptStatus::Refused,
            summary: text("no"),
            failure: text("not mine"),
            artifacts: Vec::new(),
        },
        3 => Receipt {
            status: ReceiptStatus::Done,
            summary: String::new(), // inconsistent: done without summary
            failure: String::new(),
            artifacts: Vec::new(),
        },
        _ => Receipt {
            status: ReceiptStatus::Failed,
            summary: text("tried"),
            failure: String::new(), // inconsistent: failed without failure text
            artifacts: Vec::new(),
        },
    }
}

fn tickets(state: &State) -> BTreeMap<String, Ticket> {
    state
        .handoff
        .tickets()
        .map(|t| (t.key.clone(), t.clone()))
        .collect()
}

fn immutable_fields(t: &Ticket) -> (&str, &str, &[u8], &str, i64, u64, u64) {
    (
        &t.from,
        &t.to,
        &t.payload,
        &t.reply_to,
        t.ttl_ms,
        t.generation,
        t.deadline_ms,
    )
}

/// Everything the run remembers to judge the next step.
#[derive(Default)]
struct Run {
    state: State,
    steps: u64,
    next_seq: [u64; CLIENTS],
    acked_below: [u64; CLIENTS],
    /// Highest `acked_below` the store has recorded per client: requests below it are forgotten.
    floor: [u64; CLIENTS],
    /// Every client request executed so far, with the response it got the first time.
    history: Vec<(Envelope, Response)>,
    /// Every token any take returned.
    tokens: Vec<String>,
    /// The winning take's token per (key, generation).
    winners: BTreeMap<(String, u64), String>,
    /// The highest generation ever seen per key.
    max_generation: BTreeMap<String, u64>,
    /// Every entry applied, in order (the replicated log), with its response.
    log: Vec<(Envelope, Response)>,
}

impl Run {
    fn stamp(&mut self, dt_ms: i64) -> Stamp {
        self.steps += 1;
        let now_ms = self.state.clock_ms.saturating_add_signed(dt_ms);
        Stamp {
            now_ms,
            // Distinct per step, so every minted token is distinct.
            entropy: u128::from(self.steps).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
        }
    }

    fn origin(&mut self, client: usize, ack: Option<u8>) -> Origin {
        self.next_seq[client] += 1;
        let seq = self.next_seq[client];
        if let Some(n) = ack {
            self.acked_below[client] =
                self.acked_below[client].max(seq.saturating_sub(u64::from(n)));
        }
        Origin {
            client_id: 100 + client as u64,
            seq,
            acked_below: self.acked_below[client],
        }
    }

    fn ticket(&self, key: usize) -> Option<&Ticket> {
        self.state.handoff.get(KEYS[key])
    }

    fn command(&self, op: &Op) -> Command {
        let s = |x: &str| x.to_string();
        match op {
            Op::Offer {
                key,
                from,
                to,
                ttl_ms,
                payload,
            } => Command::Handoff(handoff::Command::Offer(OfferArgs {
                key: s(KEYS[*key]),
                from: s(AGENTS[*from]),
                to: s(AGENTS[*to]),
                payload: vec![*payload],
                reply_to: s("inbox"),
                ttl_ms: *ttl_ms,
            })),
            Op::Take { key, to } => Command::Handoff(handoff::Command::Take {
                key: s(KEYS[*key]),
                to: match to {
                    Some(actor) => s(ACTORS[*actor]),
                    None => self.ticket(*key).map_or(s("p"), |t| t.to.clone()),
                },
            }),
            Op::Reply {
                key,
                token,
                receipt: kind,
            } => {
                let junk = s("0123456789abcdef0123456789abcdef");
                let token = match token {
                    TokenPick::Current => self
                        .ticket(*key)
                        .and_then(|t| self.winners.get(&(t.key.clone(), t.generation)))
                        .cloned()
                        .unwrap_or(junk),
                    TokenPick::Issued(index) if !self.tokens.is_empty() => {
                        index.get(&self.tokens).clone()
                    }
                    TokenPick::Issued(_) | TokenPick::Junk => junk,
                };
                Command::Handoff(handoff::Command::Reply {
                    key: s(KEYS[*key]),
                    token,
                    receipt: receipt(*kind),
                })
            }
            Op::Cancel { key, by } => Command::Handoff(handoff::Command::Cancel {
                key: s(KEYS[*key]),
                by: match by {
                    Some(actor) => s(ACTORS[*actor]),
                    None => self.ticket(*key).map_or(s("p"), |t| t.from.clone()),
                },
            }),
            Op::Sweep | Op::Retry(_) => Command::Sweep,
        }
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        if let Op::Retry(index) = &step.op {
            return self.retry(index, step.dt_ms);
        }
        let stamp = self.stamp(step.dt_ms);
        let origin = match step.op {
            Op::Sweep => None,
            _ => Some(self.origin(step.client, step.ack)),
        };
        let envelope = Envelope {
            stamp,
            origin,
            command: self.command(&step.op),
        };
        let before = self.state.clone();
        let response = apply(&mut self.state, &envelope);
        self.log.push((envelope.clone(), response.clone()));
        if let Some(origin) = origin {
            self.history.push((envelope.clone(), response.clone()));
            let client = (origin.client_id - 100) as usize;
            self.floor[client] = self.floor[client].max(origin.acked_below);
        }
        self.judge(&before, &envelope, &response)
    }

    /// A retry answers the first response (or `SessionExpired` once acknowledged) and changes
    /// nothing at all, whatever the new leader's stamp says.
    fn retry(&mut self, index: &Index, dt_ms: i64) -> Result<(), TestCaseError> {
        if self.history.is_empty() {
            return Ok(());
        }
        let (original, first) = index.get(&self.history).clone();
        let origin = original.origin.expect("client requests carry an origin");
        let envelope = Envelope {
            stamp: self.stamp(dt_ms),
            ..original
        };
        let before = self.state.clone();
        let response = apply(&mut self.state, &envelope);
        self.log.push((envelope.clone(), response.clone()));
        let client = (origin.client_id - 100) as usize;
        if origin.seq < self.floor[client] {
            prop_assert_eq!(
                &response,
                &Response::SessionExpired,
                "acknowledged request {:?}",
                origin
            );
        } else {
            prop_assert_eq!(
                &response,
                &first,
                "retry of {:?} must answer the first response",
                origin
            );
        }
        prop_assert_eq!(
            &self.state,
            &before,
            "a retry must leave the state byte-for-byte equal"
        );
        Ok(())
    }

    fn judge(
        &mut self,
        before: &State,
        envelope: &Envelope,
        response: &Response,
    ) -> Result<(), TestCaseError> {
        let clock = self.state.clock_ms;
        prop_assert_eq!(
            clock,
            before.clock_ms.max(envelope.stamp.now_ms),
            "clock = max(clock, stamp)"
        );
        let Response::Answer(result) = response else {
            return Err(TestCaseError::fail(format!(
                "a fresh request got {response:?}"
            )));
        };
        let old = tickets(before);
        let new = tickets(&self.state);

        // Structural invariants hold after every command; only overdue leftovers may show.
        let all: Vec<Ticket> = new.values().cloned().collect();
        let structural: Vec<_> = check(&all, clock)
            .into_iter()
            .filter(|p| {
                !matches!(
                    p.code,
                    ProblemCode::OverdueHolder | ProblemCode::OverdueReply
                )
            })
            .collect();
        prop_assert!(
            structural.is_empty(),
            "structural problems {:?}",
            structural
        );

        // Holder present iff accepted, and then it is the addressee.
        for t in new.values() {
            prop_assert_eq!(
                t.holder.is_some(),
                t.state == TicketState::Accepted,
                "holder vs state: {:?}",
                t
            );
            if let Some(holder) = &t.holder {
                prop_assert_eq!(holder, &t.to);
            }
        }

        // Generations: keys never vanish; per key the generation never decreases, grows by one
        // only through an offer that opens a new generation, and a generation's content is fixed.
        for (key, t_old) in &old {
            let t_new = new.get(key);
            prop_assert!(t_new.is_some(), "ticket {} vanished", key);
            let t_new = t_new.expect("checked");
            if t_new.generation == t_old.generation {
                prop_assert_eq!(
                    immutable_fields(t_new),
                    immutable_fields(t_old),
                    "generation reused for {}",
                    key
                );
            } else {
                prop_assert_eq!(
                    t_new.generation,
                    t_old.generation + 1,
                    "generation of {} jumped",
                    key
                );
            }
        }
        for (key, t) in &new {
            let max = self.max_generation.entry(key.clone()).or_insert(0);
            prop_assert!(t.generation >= *max, "generation of {} went back", key);
            *max = t.generation;
            if !old.contains_key(key) {
                prop_assert_eq!(t.generation, 1, "a new key starts at generation 1");
            }
        }

        let target = match &envelope.command {
            Command::Handoff(handoff::Command::Offer(args)) => Some(args.key.clone()),
            Command::Handoff(handoff::Command::Take { key, .. })
            | Command::Handoff(handoff::Command::Reply { key, .. })
            | Command::Handoff(handoff::Command::Cancel { key, .. }) => Some(key.clone()),
            Command::Sweep => None,
            other => {
                return Err(TestCaseError::fail(format!(
                    "only handoff commands and sweeps are generated, got {other:?}"
                )))
            }
        };
        let Some(key) = target else {
            // A sweep expires exactly the live tickets overdue at the store clock, nothing else,
            // and leaves nothing for `check` to report at that clock.
            let due: Vec<&String> = old
                .iter()
                .filter(|(_, t)| t.state.is_live() && is_overdue(t.deadline_ms, clock))
                .map(|(k, _)| k)
                .collect();
            prop_assert_eq!(
                result,
                &Ok(Reply::Swept {
                    expired: due.len() as u64
                })
            );
            for (k, t_old) in &old {
                let t_new = &new[k];
                if due.contains(&k) {
                    prop_assert_eq!(&t_new.state, &TicketState::Expired);
                    prop_assert_eq!(t_new.holder.as_ref(), None);
                    prop_assert_eq!(immutable_fields(t_new), immutable_fields(t_old));
                } else {
                    prop_assert_eq!(t_new, t_old, "a sweep touched {} which was not due", k);
                }
            }
            prop_assert_eq!(
                check(&all, clock),
                vec![],
                "check must be clean right after a sweep"
            );
            return Ok(());
        };

        // Nothing but the addressed ticket changes.
        for (k, t_old) in &old {
            if *k != key {
                prop_assert_eq!(&new[k], t_old, "{} changed by a command for {}", k, key);
            }
        }
        let t_old = old.get(&key);
        let t_new = new.get(&key);
        // The addressed ticket was live and overdue at the store clock: the command must see it
        // expired (and may materialise that).
        let was_overdue =
            t_old.is_some_and(|t| t.state.is_live() && is_overdue(t.deadline_ms, clock));

        match result {
            Err(refusal) => {
                // A refusal changes nothing, except materialising an expiry that already happened.
                match (t_old, t_new) {
                    (None, None) => {}
                    (Some(a), Some(b)) if a == b => {}
                    (Some(a), Some(b)) => {
                        prop_assert!(
                            was_overdue,
                            "refusal {:?} changed a ticket that was not overdue",
                            refusal
                        );
                        prop_assert_eq!(&b.state, &TicketState::Expired);
                        prop_assert_eq!(immutable_fields(a), immutable_fields(b));
                    }
                    _ => {
                        return Err(TestCaseError::fail(format!(
                            "refusal {refusal:?} created a ticket"
                        )))
                    }
                }
                // A refusal that judged the deadline leaves the ticket visibly expired.
                if let Some(t) = t_new {
                    if *refusal == Refusal::Expired
                        || (was_overdue && *refusal == Refusal::AlreadySettled)
                    {
                        prop_assert_eq!(
                            &t.state,
                            &TicketState::Expired,
                            "refused as expired but the ticket is {:?}",
                            t.state
                        );
                    }
                }
                match (&envelope.command, refusal) {
                    (
                        Command::Handoff(handoff::Command::Offer(args)),
                        Refusal::Invalid { field, .. },
                    ) => {
                        prop_assert!(
                            args.ttl_ms <= 0 && field == "ttl",
                            "offer refused: {:?}",
                            refusal
                        );
                    }
                    (Command::Handoff(handoff::Command::Offer(_)), _) => {
                        return Err(TestCaseError::fail(format!(
                            "a valid offer was refused: {refusal:?}"
                        )));
                    }
                    (Command::Handoff(handoff::Command::Take { to, .. }), _) => {
                        let expected = match t_old {
                            None => Refusal::UnknownKey,
                            Some(t) if &t.to != to => Refusal::NotAddressee,
                            Some(t) if t.state == TicketState::Expired || was_overdue => {
                                Refusal::Expired
                            }
                            Some(t) if t.state == TicketState::Accepted => Refusal::Taken,
                            Some(_) => Refusal::AlreadySettled,
                        };
                        prop_assert_eq!(refusal, &expected);
                    }
                    (Command::Handoff(handoff::Command::Cancel { by, .. }), _) => {
                        let expected = match t_old {
                            None => Refusal::UnknownKey,
                            Some(t) if &t.from != by => Refusal::NotSource,
                            Some(_) if was_overdue => Refusal::AlreadySettled,
                            Some(t) if t.state == TicketState::Accepted => Refusal::Taken,
                            Some(_) => Refusal::AlreadySettled,
                        };
                        prop_assert_eq!(refusal, &expected);
                    }
                    (Command::Handoff(handoff::Command::Reply { token, receipt, .. }), _) => {
                        let winner =
                            t_old.and_then(|t| self.winners.get(&(key.clone(), t.generation)));
                        let consistent = match receipt.status {
                            ReceiptStatus::Done => {
                                !receipt.summary.is_empty() && receipt.failure.is_empty()
                            }
                            _ => !receipt.failure.is_empty(),
                        };
                        // The receipt is judged last: only a reply that could settle the
                        // ticket is refused for it.
                        let expected = match t_old {
                            None => Some(Refusal::UnknownKey),
                            Some(_) if winner != Some(token) => Some(Refusal::LeaseLost),
                            Some(t) if t.state == TicketState::Expired || was_overdue => {
                                Some(Refusal::Expired)
                            }
                            Some(t) if t.state != TicketState::Accepted => {
                                Some(Refusal::AlreadySettled)
                            }
                            Some(_) => None,
                        };
                        match expected {
                            Some(expected) => prop_assert_eq!(refusal, &expected),
                            None => prop_assert!(
                                !consistent
                                    && matches!(refusal, Refusal::Invalid { field, .. } if field.starts_with("receipt.")),
                                "{:?}",
                                refusal
                            ),
                        }
                    }
                    (other, _) => unreachable!("{other:?} handled above"),
                }
            }
            Ok(Reply::Ticket(ticket)) => {
                let ticket: &Ticket = ticket;
                let Command::Handoff(handoff::Command::Offer(args)) = &envelope.command else {
                    return Err(TestCaseError::fail("only offer answers a ticket"));
                };
                prop_assert_eq!(Some(ticket), t_new, "offer returns the stored ticket");
                match t_old {
                    Some(t) if t.state.is_live() && !was_overdue => {
                        prop_assert_eq!(ticket, t, "a live key replays unchanged");
                    }
                    _ => {
                        let previous = t_old.map_or(0, |t| t.generation);
                        prop_assert_eq!(ticket.generation, previous + 1);
                        prop_assert_eq!(&ticket.state, &TicketState::Offered);
                        prop_assert_eq!(
                            ticket.deadline_ms,
                            clock + args.ttl_ms as u64,
                            "deadline = clock + ttl"
                        );
                        prop_assert_eq!(
                            (&ticket.from, &ticket.to, &ticket.payload),
                            (&args.from, &args.to, &args.payload)
                        );
                        prop_assert_eq!(
                            (
                                ticket.holder.as_ref(),
                                ticket.receipt_at_ms,
                                ticket.receipt.as_ref()
                            ),
                            (None, None, None)
                        );
                    }
                }
            }
            Ok(Reply::Handle(handle)) => {
                let t = t_new.expect("a take succeeds only on an existing ticket");
                let t_old = t_old.expect("existing");
                prop_assert_eq!(&t_old.state, &TicketState::Offered);
                prop_assert!(!was_overdue, "a take at or past the deadline won");
                prop_assert_eq!(&t.state, &TicketState::Accepted);
                prop_assert_eq!(handle.fence, t.generation);
                prop_assert_eq!(handle.until_ms, t.deadline_ms);
                prop_assert_eq!(&handle.token, &envelope.stamp.token());
                let previous = self
                    .winners
                    .insert((key.clone(), t.generation), handle.token.clone());
                prop_assert_eq!(
                    previous,
                    None,
                    "two takes won generation {} of {}",
                    t.generation,
                    key
                );
                self.tokens.push(handle.token.clone());
            }
            Ok(Reply::Done) => {
                let t = t_new.expect("reply/cancel succeed only on an existing ticket");
                let t_old = t_old.expect("existing");
                prop_assert!(
                    !was_overdue,
                    "a reply/cancel at or past the deadline succeeded"
                );
                match &envelope.command {
                    Command::Handoff(handoff::Command::Reply { token, receipt, .. }) => {
                        prop_assert_eq!(&t_old.state, &TicketState::Accepted);
                        prop_assert_eq!(
                            self.winners.get(&(key.clone(), t.generation)),
                            Some(token),
                            "reply accepted a token that did not win this generation"
                        );
                        prop_assert_eq!(&t.state, &TicketState::Closed);
                        prop_assert_eq!(t.receipt_at_ms, Some(clock));
                        prop_assert_eq!(t.receipt.as_ref(), Some(receipt));
                    }
                    Command::Handoff(handoff::Command::Cancel { by, .. }) => {
                        prop_assert_eq!(&t_old.state, &TicketState::Offered);
                        prop_assert_eq!(by, &t_old.from);
                        prop_assert_eq!(&t.state, &TicketState::Withdrawn);
                    }
                    other => return Err(TestCaseError::fail(format!("{other:?} answered Done"))),
                }
                prop_assert_eq!(immutable_fields(t), immutable_fields(t_old));
            }
            Ok(other) => return Err(TestCaseError::fail(format!("unexpected reply {other:?}"))),
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_step_keeps_the_handoff_contract(steps in prop::collection::vec(step(), 1..60)) {
        let mut run = Run { state: State { clock_ms: T0, ..State::default() }, ..Run::default() };
        for step in &steps {
            run.step(step)?;
        }
        // And at the end, a sweep at the current clock leaves check clean whatever happened.
        run.step(&Step { dt_ms: 0, client: 0, ack: None, op: Op::Sweep })?;
    }

    #[test]
    fn replicas_applying_the_same_log_reach_the_same_state(steps in prop::collection::vec(step(), 1..60)) {
        let start = State { clock_ms: T0, ..State::default() };
        let mut run = Run { state: start.clone(), ..Run::default() };
        for step in &steps {
            run.step(step)?;
        }
        // A follower applying the whole log (retries, refusals and sweeps included) answers every
        // entry the same way and ends in the same state: nothing in apply depends on anything
        // but the state and the entry.
        let mut follower = start;
        for (envelope, response) in &run.log {
            prop_assert_eq!(&apply(&mut follower, envelope), response);
        }
        prop_assert_eq!(follower, run.state);
    }
}
