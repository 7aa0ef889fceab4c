//! A linearizability checker (Wing & Gong's search with Lowe's memoisation, the algorithm behind
//! Porcupine and Knossos) and a model of one handoff ticket to check histories against.
//!
//! A history is a set of operations, each with its invocation time, its completion time and what
//! it returned. An operation whose outcome is unknown (the client timed out or lost the
//! connection) is *ambiguous*: it may have taken effect at any point after its invocation, or
//! never, and whatever it would have returned is accepted. It is modelled with no completion time
//! and no output — never dropped. The history is linearizable when some total order of the
//! operations respects real time (an operation that completed before another was invoked comes
//! first) and, replayed against the sequential model, produces every recorded output.
//!
//! Linearizability is compositional, so histories are checked one key at a time.

use std::collections::HashSet;
use std::hash::Hash;

/// A sequential specification.
pub trait Model {
    /// The model's state; hashed for memoisation.
    type State: Clone + Eq + Hash + std::fmt::Debug;
    /// An operation's input.
    type Input: std::fmt::Debug;
    /// An operation's output.
    type Output: std::fmt::Debug;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// Applies `input` to `state`. With `Some(output)`, returns the next state only if the model
    /// would have produced exactly that output; with `None` (an ambiguous operation), returns the
    /// next state whatever the output.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: Option<&Self::Output>,
    ) -> Option<Self::State>;
}

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct Operation<I, O> {
    /// Which client ran it (for messages only).
    pub client: usize,
    /// What was asked.
    pub input: I,
    /// What came back; `None` when the outcome is unknown.
    pub output: Option<O>,
    /// Invocation time (any monotonic unit).
    pub call: u64,
    /// Completion time; `None` when the outcome is unknown.
    pub ret: Option<u64>,
}

/// The checker's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Some order explains the history.
    Linearizable,
    /// No order does. `longest` holds the indexes (into the history) of the longest prefix the
    /// search could linearize, in that order; the operation that could not follow it is among the
    /// ones invoked before the next completion.
    Violation {
        /// Indexes of the longest linearizable prefix found.
        longest: Vec<usize>,
    },
    /// The search gave up after this many steps without an answer (see [`check_bounded`]).
    Inconclusive {
        /// Steps taken.
        steps: u64,
    },
}

#[derive(Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
    /// The index of the matching return (for calls).
    partner: usize,
    prev: usize,
    next: usize,
}

const NIL: usize = usize::MAX;

/// Checks whether `history` is linearizable with respect to `model`.
pub fn check<M: Model>(model: &M, history: &[Operation<M::Input, M::Output>]) -> Verdict {
    check_bounded(model, history, u64::MAX)
}

/// [`check`], giving up with [`Verdict::Inconclusive`] after `max_steps` search steps (the
/// problem is NP-complete; a history with many concurrent ambiguous operations can take long).
pub fn check_bounded<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    max_steps: u64,
) -> Verdict {
    if history.is_empty() {
        return Verdict::Linearizable;
    }
    // Events sorted by time; at equal times calls come before returns (they may overlap).
    // Ambiguous operations complete after everything else.
    let mut order: Vec<(u64, u8, usize, bool)> = Vec::with_capacity(history.len() * 2);
    for (i, op) in history.iter().enumerate() {
        order.push((op.call, 0, i, true));
        order.push((op.ret.unwrap_or(u64::MAX), 1, i, false));
    }
    order.sort();
    let head = order.len();
    let mut events: Vec<Event> = order
        .iter()
        .map(|&(_, _, op, is_call)| Event {
            op,
            is_call,
            partner: NIL,
            prev: NIL,
            next: NIL,
        })
        .collect();
    let mut ret_of = vec![NIL; history.len()];
    for (i, e) in events.iter().enumerate() {
        if !e.is_call {
            ret_of[e.op] = i;
        }
    }
    for i in 0..events.len() {
        if events[i].is_call {
            events[i].partner = ret_of[events[i].op];
        }
        events[i].prev = if i == 0 { head } else { i - 1 };
        events[i].next = if i + 1 == events.len() { NIL } else { i + 1 };
    }
    // A sentinel head node at index `head`.
    events.push(Event {
        op: NIL,
        is_call: false,
        partner: NIL,
        prev: NIL,
        next: 0,
    });

    let words = history.len().div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, M::State)> = HashSet::new();
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut state = model.init();
    let mut longest: Vec<usize> = Vec::new();
    let mut cur = events[head].next;
    let mut steps: u64 = 0;

    let lift = |events: &mut Vec<Event>, call: usize| {
        let ret = events[call].partner;
        for i in [call, ret] {
            let (p, n) = (events[i].prev, events[i].next);
            events[p].next = n;
            if n != NIL {
                events[n].prev = p;
            }
        }
    };
    let unlift = |events: &mut Vec<Event>, call: usize| {
        let ret = events[call].partner;
        for i in [ret, call] {
            let (p, n) = (events[i].prev, events[i].next);
            events[p].next = i;
            if n != NIL {
                events[n].prev = i;
            }
        }
    };

    loop {
        if events[head].next == NIL {
            return Verdict::Linearizable;
        }
        steps += 1;
        if steps > max_steps {
            return Verdict::Inconclusive { steps };
        }
        if cur == NIL {
            // Only reachable if every remaining call failed and no return blocks: treat as stuck.
            return Verdict::Violation { longest };
        }
        let event = events[cur];
        if event.is_call {
            let op = &history[event.op];
            let next = model.step(&state, &op.input, op.output.as_ref());
            let mut advanced = false;
            if let Some(next) = next {
                let mut bits = linearized.clone();
                bits[event.op / 64] |= 1 << (event.op % 64);
                if cache.insert((bits.clone(), next.clone())) {
                    stack.push((cur, state.clone()));
                    state = next;
                    linearized = bits;
                    lift(&mut events, cur);
                    if stack.len() > longest.len() {
                        longest = stack.iter().map(|(e, _)| events[*e].op).collect();
                    }
                    cur = events[head].next;
                    advanced = true;
                }
            }
            if !advanced {
                cur = events[cur].next;
            }
        } else {
            let Some((call, previous)) = stack.pop() else {
                return Verdict::Violation { longest };
            };
            state = previous;
            let op = events[call].op;
            linearized[op / 64] &= !(1 << (op % 64));
            unlift(&mut events, call);
            cur = events[call].next;
        }
    }
}

/// Operations on one handoff ticket key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketInput {
    /// `offer(key, from, to)` with a TTL long enough never to expire during the test.
    Offer {
        /// Source.
        from: String,
        /// Addressee.
        to: String,
    },
    /// `take(key, to)`.
    Take {
        /// Taker.
        to: String,
    },
    /// `reply(key, token, done)`.
    Reply {
        /// The token presented.
        token: String,
    },
    /// `cancel(key, by)`.
    Cancel {
        /// Canceller.
        by: String,
    },
    /// A linearizable read of the ticket.
    Read,
}

/// What an operation on one ticket returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketOutput {
    /// Offer succeeded: the ticket's generation and state.
    Offered {
        /// Generation.
        generation: u64,
        /// State name.
        state: String,
    },
    /// Take succeeded.
    Taken {
        /// Fence (= generation).
        fence: u64,
        /// Token minted.
        token: String,
    },
    /// Reply or cancel succeeded.
    Done,
    /// Read succeeded.
    Read {
        /// Generation.
        generation: u64,
        /// State name.
        state: String,
        /// Holder, if any.
        holder: Option<String>,
    },
    /// A contract refusal, by code.
    Refused(String),
}

/// The sequential specification of one ticket without expiry (contract §1).
#[derive(Debug, Clone, Default)]
pub struct TicketModel;

/// The model's state of one ticket.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TicketState {
    generation: u64,
    /// `""` (no ticket), offered, accepted, closed, withdrawn.
    state: &'static str,
    from: String,
    to: String,
    holder: Option<String>,
    /// The current take's token; `Some("")` when a take happened whose token nobody saw.
    token: Option<String>,
}

impl Model for TicketModel {
    type State = TicketState;
    type Input = TicketInput;
    type Output = TicketOutput;

    fn init(&self) -> TicketState {
        TicketState::default()
    }

    fn step(
        &self,
        s: &TicketState,
        input: &TicketInput,
        output: Option<&TicketOutput>,
    ) -> Option<TicketState> {
        let refuse = |code: &str| match output {
            None => Some(s.clone()),
            Some(TicketOutput::Refused(got)) if got == code => Some(s.clone()),
            Some(_) => None,
        };
        let live = matches!(s.state, "offered" | "accepted");
        match input {
            TicketInput::Offer { from, to } => {
                let mut next = s.clone();
                if !live {
                    next = TicketState {
                        generation: s.generation + 1,
                        state: "offered",
                        from: from.clone(),
                        to: to.clone(),
                        holder: None,
                        token: None,
                    };
                }
                let expected = TicketOutput::Offered {
                    generation: next.generation,
                    state: next.state.to_string(),
                };
                accept(output, &expected, next)
            }
            TicketInput::Take { to } => {
                if s.state.is_empty() {
                    return refuse("UNKNOWN_KEY");
                }
                if &s.to != to {
                    return refuse("NOT_ADDRESSEE");
                }
                match s.state {
                    "accepted" => return refuse("TAKEN"),
                    "closed" | "withdrawn" => return refuse("ALREADY_SETTLED"),
                    _ => {}
                }
                let token = match output {
                    Some(TicketOutput::Taken { fence, token }) if *fence == s.generation => {
                        token.clone()
                    }
                    Some(_) => return None,
                    None => String::new(),
                };
                Some(TicketState {
                    state: "accepted",
                    holder: Some(to.clone()),
                    token: Some(token),
                    ..s.clone()
                })
            }
            TicketInput::Reply { token } => {
                if s.state.is_empty() {
                    return refuse("UNKNOWN_KEY");
                }
                let matches = match &s.token {
                    // A take nobody saw the token of: no reply can present it. Clients reply only
                    // with tokens acknowledged takes gave them (or one no take has), and tokens
                    // are unique, so a reply matching this take would be a stale or forged token
                    // accepted. (An ambiguous reply used to be let through here.)
                    Some(current) if current.is_empty() => false,
                    Some(current) => current == token,
                    None => false,
                };
                if !matches {
                    return refuse("LEASE_LOST");
                }
                match s.state {
                    "accepted" => accept(
                        output,
                        &TicketOutput::Done,
                        TicketState {
                            state: "closed",
                            holder: None,
                            ..s.clone()
                        },
                    ),
                    _ => refuse("ALREADY_SETTLED"),
                }
            }
            TicketInput::Cancel { by } => {
                if s.state.is_empty() {
                    return refuse("UNKNOWN_KEY");
                }
                if &s.from != by {
                    return refuse("NOT_SOURCE");
                }
                match s.state {
                    "offered" => accept(
                        output,
                        &TicketOutput::Done,
                        TicketState {
                            state: "withdrawn",
                            ..s.clone()
                        },
                    ),
                    "accepted" => refuse("TAKEN"),
                    _ => refuse("ALREADY_SETTLED"),
                }
            }
            TicketInput::Read => {
                if s.state.is_empty() {
                    return refuse("UNKNOWN_KEY");
                }
                let expected = TicketOutput::Read {
                    generation: s.generation,
                    state: s.state.to_string(),
                    holder: s.holder.clone(),
                };
                accept(output, &expected, s.clone())
            }
        }
    }
}

fn accept(
    output: Option<&TicketOutput>,
    expected: &TicketOutput,
    next: TicketState,
) -> Option<TicketState> {
    match output {
        None => Some(next),
        Some(got) if got == expected => Some(next),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(
        client: usize,
        input: TicketInput,
        output: Option<TicketOutput>,
        call: u64,
        ret: Option<u64>,
    ) -> Operation<TicketInput, TicketOutput> {
        Operation {
            client,
            input,
            output,
            call,
            ret,
        }
    }

    fn offer() -> TicketInput {
        TicketInput::Offer {
            from: "a".into(),
            to: "b".into(),
        }
    }

    fn offered(generation: u64) -> Option<TicketOutput> {
        Some(TicketOutput::Offered {
            generation,
            state: "offered".into(),
        })
    }

    fn take() -> TicketInput {
        TicketInput::Take { to: "b".into() }
    }

    fn taken(token: &str) -> Option<TicketOutput> {
        Some(TicketOutput::Taken {
            fence: 1,
            token: token.into(),
        })
    }

    fn refused(code: &str) -> Option<TicketOutput> {
        Some(TicketOutput::Refused(code.into()))
    }

    #[test]
    fn concurrent_takes_with_one_winner_are_linearizable() {
        let history = vec![
            op(0, offer(), offered(1), 0, Some(10)),
            op(1, take(), taken("t1"), 20, Some(40)),
            op(2, take(), refused("TAKEN"), 21, Some(30)),
            op(3, take(), refused("TAKEN"), 22, Some(45)),
        ];
        assert_eq!(check(&TicketModel, &history), Verdict::Linearizable);
    }

    #[test]
    fn two_winners_are_a_violation() {
        let history = vec![
            op(0, offer(), offered(1), 0, Some(10)),
            op(1, take(), taken("t1"), 20, Some(40)),
            op(2, take(), taken("t2"), 21, Some(30)),
        ];
        assert!(matches!(
            check(&TicketModel, &history),
            Verdict::Violation { .. }
        ));
    }

    #[test]
    fn a_loser_before_any_winner_is_a_violation() {
        // The TAKEN refusal completed before the only successful take was even invoked.
        let history = vec![
            op(0, offer(), offered(1), 0, Some(10)),
            op(2, take(), refused("TAKEN"), 11, Some(12)),
            op(1, take(), taken("t1"), 20, Some(40)),
        ];
        assert!(matches!(
            check(&TicketModel, &history),
            Verdict::Violation { .. }
        ));
    }

    #[test]
    fn a_stale_read_is_a_violation() {
        let history = vec![
            op(0, offer(), offered(1), 0, Some(10)),
            op(1, take(), taken("t1"), 20, Some(30)),
            op(
                2,
                TicketInput::Read,
                Some(TicketOutput::Read {
                    generation: 1,
                    state: "offered".into(),
                    holder: None,
                }),
                31,
                Some(35),
            ),
        ];
        assert!(matches!(
            check(&TicketModel, &history),
            Verdict::Violation { .. }
        ));
    }

    #[test]
    fn an_ambiguous_take_may_have_won() {
        // Client 1 timed out; client 2 was refused TAKEN afterwards: only explicable if the
        // ambiguous take happened.
        let history = vec![
            op(0, offer(), offered(1), 0, Some(10)),
            op(1, take(), None, 20, None),
            op(2, take(), refused("TAKEN"), 30, Some(35)),
        ];
        assert_eq!(check(&TicketModel, &history), Verdict::Linearizable);
    }

    #[test]
    fn an_ambiguous_take_may_also_never_have_happened() {
        let history = vec![
            op(0, offer(), offered(1), 0, Some(10)),
            op(1, take(), None, 20, None),
            op(2, take(), taken("t2"), 30, Some(35)),
        ];
        assert_eq!(check(&TicketModel, &history), Verdict::Linearizable);
    }

    #[test]
    fn reoffer_after_close_is_a_new_generation() {
        let history = vec![
            op(0, offer(), offered(1), 0, Some(1)),
            op(1, take(), taken("t1"), 2, Some(3)),
            op(
                1,
                TicketInput::Reply { token: "t1".into() },
                Some(TicketOutput::Done),
                4,
                Some(5),
            ),
            op(0, offer(), offered(2), 6, Some(7)),
            op(0, offer(), offered(3), 8, Some(9)),
        ];
        // The second re-offer of a live ticket must replay generation 2, not mint 3.
        assert!(matches!(
            check(&TicketModel, &history),
            Verdict::Violation { .. }
        ));
    }
}
