//! The handoff contract (contract.md sections 0 and 1), one rule per test, driven through the
//! public API: `apply` with hand-built stamps and origins, and the `check` judge.
#![allow(clippy::unwrap_used)]

use baton_statemachine::handoff::{
    self, check, Handle, OfferArgs, ProblemCode, Receipt, ReceiptStatus, Ticket, TicketState,
};
use baton_statemachine::limits::{
    MAX_ADDRESS_BYTES, MAX_AGENT_BYTES, MAX_KEY_BYTES, MAX_PAYLOAD_BYTES,
};
use baton_statemachine::{
    apply, Command, Envelope, Origin, Refusal, Reply, Response, Stamp, State, MAX_CLIENTS,
    SESSION_RETRY_WINDOW_MS,
};

const T0: u64 = 1_000_000;
const CLIENT: u64 = 42;

/// A store plus one client that numbers its requests 1, 2, 3, ...
struct World {
    state: State,
    seq: u64,
}

impl World {
    fn new() -> Self {
        World {
            state: State::default(),
            seq: 0,
        }
    }

    fn next_origin(&mut self) -> Origin {
        self.seq += 1;
        Origin {
            client_id: CLIENT,
            seq: self.seq,
            acked_below: 0,
        }
    }

    /// Sends a client command stamped `now_ms`, with entropy derived from the request number.
    fn send(&mut self, now_ms: u64, command: handoff::Command) -> Result<Reply, Refusal> {
        let origin = self.next_origin();
        let stamp = Stamp {
            now_ms,
            entropy: entropy_for(origin.seq),
        };
        answer(self.send_raw(stamp, Some(origin), Command::Handoff(command)))
    }

    fn send_raw(&mut self, stamp: Stamp, origin: Option<Origin>, command: Command) -> Response {
        apply(
            &mut self.state,
            &Envelope {
                stamp,
                origin,
                command,
            },
        )
    }

    fn offer(&mut self, now_ms: u64, args: OfferArgs) -> Ticket {
        match self.send(now_ms, handoff::Command::Offer(args)) {
            Ok(Reply::Ticket(ticket)) => *ticket,
            other => panic!("offer should succeed, got {other:?}"),
        }
    }

    fn take(&mut self, now_ms: u64, key: &str, to: &str) -> Result<Handle, Refusal> {
        self.send(now_ms, take(key, to)).map(|reply| match reply {
            Reply::Handle(handle) => handle,
            other => panic!("take answered {other:?}"),
        })
    }

    fn reply(
        &mut self,
        now_ms: u64,
        key: &str,
        token: &str,
        receipt: Receipt,
    ) -> Result<(), Refusal> {
        self.send(now_ms, reply(key, token, receipt))
            .map(|r| assert_eq!(r, Reply::Done))
    }

    fn cancel(&mut self, now_ms: u64, key: &str, by: &str) -> Result<(), Refusal> {
        self.send(now_ms, cancel(key, by))
            .map(|r| assert_eq!(r, Reply::Done))
    }

    fn sweep(&mut self, now_ms: u64) -> u64 {
        let stamp = Stamp { now_ms, entropy: 0 };
        match self.send_raw(stamp, None, Command::Sweep) {
            Response::Answer(Ok(Reply::Swept { expired })) => expired,
            other => panic!("sweep answered {other:?}"),
        }
    }

    fn ticket(&self, key: &str) -> Ticket {
        self.state.handoff.get(key).cloned().expect("ticket exists")
    }

    /// Sends `command` without an origin (so no session entry is written) stamped at the current
    /// store clock, expects `expected`, and expects the whole state to be unchanged.
    fn assert_refused_unchanged(&mut self, command: handoff::Command, expected: Refusal) {
        let before = self.state.clone();
        let stamp = Stamp {
            now_ms: self.state.clock_ms,
            entropy: 7,
        };
        let response = self.send_raw(stamp, None, Command::Handoff(command.clone()));
        assert_eq!(
            response,
            Response::Answer(Err(expected)),
            "command {command:?}"
        );
        assert_eq!(
            self.state,
            before,
            "a refused {} must change nothing",
            command.name()
        );
    }
}

fn answer(response: Response) -> Result<Reply, Refusal> {
    match response {
        Response::Answer(result) => result,
        other => panic!("unexpected {other:?}"),
    }
}

fn entropy_for(seq: u64) -> u128 {
    (u128::from(seq) << 64) | 0x00ab_cdef_0123_4567
}

fn args(key: &str, ttl_ms: i64) -> OfferArgs {
    OfferArgs {
        key: key.into(),
        from: "alice".into(),
        to: "bob".into(),
        payload: b"payload".to_vec(),
        reply_to: "inbox://alice".into(),
        ttl_ms,
    }
}

fn take(key: &str, to: &str) -> handoff::Command {
    handoff::Command::Take {
        key: key.into(),
        to: to.into(),
    }
}

fn reply(key: &str, token: &str, receipt: Receipt) -> handoff::Command {
    handoff::Command::Reply {
        key: key.into(),
        token: token.into(),
        receipt,
    }
}

fn cancel(key: &str, by: &str) -> handoff::Command {
    handoff::Command::Cancel {
        key: key.into(),
        by: by.into(),
    }
}

fn done() -> Receipt {
    Receipt {
        status: ReceiptStatus::Done,
        summary: "did it".into(),
        failure: String::new(),
        artifacts: vec!["s3://bucket/out".into(), "".into(), "out.txt".into()],
    }
}

fn failed(status: ReceiptStatus) -> Receipt {
    Receipt {
        status,
        summary: String::new(),
        failure: "could not".into(),
        artifacts: Vec::new(),
    }
}

fn invalid(field: &str) -> impl Fn(&Refusal) -> bool + '_ {
    move |refusal| matches!(refusal, Refusal::Invalid { field: f, rule } if f == field && !rule.is_empty())
}

/// A world holding ticket `k` offered at T0 with `ttl`.
fn offered(ttl: i64) -> World {
    let mut w = World::new();
    w.offer(T0, args("k", ttl));
    w
}

/// A world holding ticket `k` taken at T0 + 10 by bob; returns the handle too.
fn accepted(ttl: i64) -> (World, Handle) {
    let mut w = offered(ttl);
    let handle = w.take(T0 + 10, "k", "bob").expect("take succeeds");
    (w, handle)
}

// ---------------------------------------------------------------------------------------------
// offer: validation

#[test]
fn offer_with_an_invalid_field_is_refused_naming_that_field_and_changes_nothing() {
    let long = |n: usize| "x".repeat(n);
    let cases: Vec<(&str, OfferArgs, &str)> = vec![
        (
            "key",
            OfferArgs {
                key: String::new(),
                ..args("k", 100)
            },
            "empty",
        ),
        (
            "from",
            OfferArgs {
                from: String::new(),
                ..args("k", 100)
            },
            "empty",
        ),
        (
            "to",
            OfferArgs {
                to: String::new(),
                ..args("k", 100)
            },
            "empty",
        ),
        (
            "reply_to",
            OfferArgs {
                reply_to: String::new(),
                ..args("k", 100)
            },
            "empty",
        ),
        ("ttl", args("k", 0), "> 0"),
        ("ttl", args("k", -1), "> 0"),
        ("ttl", args("k", i64::MIN), "> 0"),
        (
            "key",
            OfferArgs {
                key: long(MAX_KEY_BYTES + 1),
                ..args("k", 100)
            },
            "at most",
        ),
        (
            "from",
            OfferArgs {
                from: long(MAX_AGENT_BYTES + 1),
                ..args("k", 100)
            },
            "at most",
        ),
        (
            "to",
            OfferArgs {
                to: long(MAX_AGENT_BYTES + 1),
                ..args("k", 100)
            },
            "at most",
        ),
        (
            "reply_to",
            OfferArgs {
                reply_to: long(MAX_ADDRESS_BYTES + 1),
                ..args("k", 100)
            },
            "at most",
        ),
        (
            "payload",
            OfferArgs {
                payload: vec![0; MAX_PAYLOAD_BYTES + 1],
                ..args("k", 100)
            },
            "at most",
        ),
    ];
    for (field, bad, rule_hint) in cases {
        // Against an empty store and against one that already holds other tickets.
        for mut w in [World::new(), offered(500)] {
            let before = w.state.clone();
            let stamp = Stamp {
                now_ms: w.state.clock_ms,
                entropy: 1,
            };
            let response = w.send_raw(
                stamp,
                None,
                Command::Handoff(handoff::Command::Offer(bad.clone())),
            );
            let Response::Answer(Err(refusal)) = response else {
                panic!("offer with bad {field} was not refused: {response:?}");
            };
            assert!(
                invalid(field)(&refusal),
                "expected Invalid{{field: {field}}}, got {refusal:?}"
            );
            let Refusal::Invalid { rule, .. } = &refusal else {
                unreachable!()
            };
            assert!(
                rule.contains(rule_hint),
                "rule {rule:?} should mention {rule_hint:?}"
            );
            assert_eq!(refusal.code(), "INVALID_ARGUMENT");
            assert_eq!(
                w.state, before,
                "a refused offer (bad {field}) must change nothing"
            );
        }
    }
}

#[test]
fn offer_at_the_size_limits_is_accepted() {
    let mut w = World::new();
    let at_limit = OfferArgs {
        key: "k".repeat(MAX_KEY_BYTES),
        from: "f".repeat(MAX_AGENT_BYTES),
        to: "t".repeat(MAX_AGENT_BYTES),
        payload: vec![0xff; MAX_PAYLOAD_BYTES],
        reply_to: "r".repeat(MAX_ADDRESS_BYTES),
        ttl_ms: 1,
    };
    let ticket = w.offer(T0, at_limit.clone());
    assert_eq!(ticket.key, at_limit.key);
    assert_eq!(ticket.payload, at_limit.payload);
    assert_eq!(ticket.deadline_ms, T0 + 1);
}

#[test]
fn an_invalid_offer_for_a_live_key_is_refused_not_replayed() {
    let mut w = offered(500);
    w.assert_refused_unchanged(
        handoff::Command::Offer(args("k", 0)),
        Refusal::invalid("ttl", "must be > 0"),
    );
    w.assert_refused_unchanged(
        handoff::Command::Offer(OfferArgs {
            reply_to: String::new(),
            ..args("k", 500)
        }),
        Refusal::invalid("reply_to", "must not be empty"),
    );
}

#[test]
fn a_refused_client_command_only_records_its_answer_in_the_session_table() {
    let mut w = offered(500);
    let before = w.state.clone();
    let refused = w.send(T0 + 1, handoff::Command::Offer(args("k", -5)));
    assert!(
        matches!(&refused, Err(r) if invalid("ttl")(r)),
        "{refused:?}"
    );
    assert_eq!(w.state.handoff, before.handoff, "the desk must not change");
    assert_ne!(
        w.state.sessions, before.sessions,
        "the refusal is remembered for retries"
    );
}

// ---------------------------------------------------------------------------------------------
// offer: generations, replay, deadlines

#[test]
fn offering_an_unknown_key_starts_generation_one_with_deadline_clock_plus_ttl() {
    let mut w = World::new();
    let ticket = w.offer(T0, args("k", 250));
    let expected = Ticket {
        key: "k".into(),
        from: "alice".into(),
        to: "bob".into(),
        payload: b"payload".to_vec(),
        reply_to: "inbox://alice".into(),
        ttl_ms: 250,
        generation: 1,
        deadline_ms: T0 + 250,
        state: TicketState::Offered,
        holder: None,
        receipt_at_ms: None,
        receipt: None,
    };
    assert_eq!(ticket, expected);
    assert_eq!(
        w.ticket("k"),
        expected,
        "the stored ticket is the returned one"
    );
    assert_eq!(w.state.handoff.len(), 1);
    assert_eq!(w.state.handoff.live(), 1);
}

#[test]
fn keys_are_independent_each_starting_at_generation_one() {
    let mut w = World::new();
    w.offer(T0, args("a", 100));
    w.cancel(T0, "a", "alice").expect("cancel");
    w.offer(T0, args("a", 100));
    assert_eq!(w.ticket("a").generation, 2);
    assert_eq!(w.offer(T0, args("b", 100)).generation, 1);
}

#[test]
fn offering_a_live_offered_key_replays_the_ticket_unchanged() {
    let mut w = offered(500);
    let first = w.ticket("k");
    let desk_before = w.state.handoff.clone();
    // Later, with different content: still the original ticket, same generation and deadline.
    let different = OfferArgs {
        from: "mallory".into(),
        to: "eve".into(),
        payload: b"other".to_vec(),
        ttl_ms: 9_999,
        ..args("k", 1)
    };
    let replay = w.offer(T0 + 100, different);
    assert_eq!(replay, first);
    assert_eq!(replay.generation, 1);
    assert_eq!(w.state.handoff, desk_before, "a replay changes no ticket");
}

#[test]
fn offering_a_live_accepted_key_replays_the_accepted_ticket() {
    let (mut w, _) = accepted(500);
    let current = w.ticket("k");
    assert_eq!(current.state, TicketState::Accepted);
    let desk_before = w.state.handoff.clone();
    assert_eq!(w.offer(T0 + 20, args("k", 500)), current);
    assert_eq!(w.state.handoff, desk_before);
}

fn assert_fresh_generation(w: &mut World, previous: u64, now: u64) {
    let ticket = w.offer(now, args("k", 300));
    assert_eq!(
        ticket.generation,
        previous + 1,
        "a re-offer after settlement is the next generation"
    );
    assert_eq!(ticket.state, TicketState::Offered);
    assert_eq!(ticket.deadline_ms, now + 300);
    assert_eq!(ticket.holder, None);
    assert_eq!(ticket.receipt_at_ms, None);
    assert_eq!(ticket.receipt, None);
    assert_eq!(w.ticket("k"), ticket);
}

#[test]
fn re_offer_after_closed_starts_the_next_generation() {
    let (mut w, handle) = accepted(500);
    w.reply(T0 + 20, "k", &handle.token, done()).expect("reply");
    assert_fresh_generation(&mut w, 1, T0 + 30);
}

#[test]
fn re_offer_after_withdrawn_starts_the_next_generation() {
    let mut w = offered(500);
    w.cancel(T0 + 5, "k", "alice").expect("cancel");
    assert_fresh_generation(&mut w, 1, T0 + 6);
}

#[test]
fn re_offer_after_a_materialised_expiry_starts_the_next_generation() {
    let mut w = offered(500);
    assert_eq!(w.sweep(T0 + 500), 1);
    assert_eq!(w.ticket("k").state, TicketState::Expired);
    assert_fresh_generation(&mut w, 1, T0 + 600);
}

#[test]
fn re_offer_of_a_live_ticket_past_its_deadline_is_a_new_generation_not_a_replay() {
    let (mut w, _) = accepted(500);
    // Nobody swept: the accepted ticket is overdue but still nominally accepted.
    assert_eq!(w.ticket("k").state, TicketState::Accepted);
    assert_fresh_generation(&mut w, 1, T0 + 500);
}

#[test]
fn generations_keep_counting_across_many_cycles() {
    let mut w = World::new();
    for generation in 1..=5u64 {
        let now = T0 + generation * 1000;
        let ticket = w.offer(now, args("k", 100));
        assert_eq!(ticket.generation, generation);
        match generation % 3 {
            0 => w.cancel(now, "k", "alice").expect("cancel"),
            1 => {
                let handle = w.take(now, "k", "bob").expect("take");
                assert_eq!(handle.fence, generation);
                w.reply(now, "k", &handle.token, done()).expect("reply");
            }
            _ => assert_eq!(w.sweep(now + 100), 1),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// store clock

#[test]
fn the_store_clock_never_runs_backwards_and_deadlines_use_it() {
    let mut w = World::new();
    w.sweep(T0 + 5_000);
    assert_eq!(w.state.clock_ms, T0 + 5_000);
    // A new leader whose wall clock is 3 s behind.
    let ticket = w.offer(T0 + 2_000, args("k", 100));
    assert_eq!(
        w.state.clock_ms,
        T0 + 5_000,
        "an older stamp must not move the clock back"
    );
    assert_eq!(
        ticket.deadline_ms,
        T0 + 5_100,
        "deadline = max(clock, stamp) + ttl"
    );
    w.sweep(T0 + 7_000);
    assert_eq!(
        w.state.clock_ms,
        T0 + 7_000,
        "a newer stamp moves it forward"
    );
}

#[test]
fn expiry_is_judged_against_the_store_clock_not_the_stamp() {
    let mut w = offered(100);
    w.sweep(T0 + 50); // nothing due yet
    assert_eq!(w.ticket("k").state, TicketState::Offered);
    w.offer(T0 + 200, args("other", 10_000)); // moves the clock past k's deadline
                                              // A lagging leader stamps the take before k's deadline; the store clock is past it.
    assert_eq!(w.take(T0 + 50, "k", "bob"), Err(Refusal::Expired));
    assert_eq!(w.ticket("k").state, TicketState::Expired);
}

// ---------------------------------------------------------------------------------------------
// take

#[test]
fn take_of_an_unknown_key_is_refused() {
    let mut w = offered(500);
    w.assert_refused_unchanged(take("nope", "bob"), Refusal::UnknownKey);
    assert_eq!(Refusal::UnknownKey.code(), "UNKNOWN_KEY");
}

#[test]
fn take_by_anyone_but_the_addressee_is_refused() {
    let mut w = offered(500);
    w.assert_refused_unchanged(take("k", "alice"), Refusal::NotAddressee);
    w.assert_refused_unchanged(take("k", "bobby"), Refusal::NotAddressee);
    assert_eq!(Refusal::NotAddressee.code(), "NOT_ADDRESSEE");
    // ... and bob can still take it afterwards.
    w.take(T0 + 1, "k", "bob").expect("the addressee takes it");
}

#[test]
fn take_with_empty_arguments_is_invalid() {
    let mut w = offered(500);
    w.assert_refused_unchanged(
        take("", "bob"),
        Refusal::invalid("key", "must not be empty"),
    );
    w.assert_refused_unchanged(take("k", ""), Refusal::invalid("to", "must not be empty"));
}

#[test]
fn take_just_before_the_deadline_wins() {
    let mut w = offered(500);
    let handle = w
        .take(T0 + 499, "k", "bob")
        .expect("one ms before the deadline is in time");
    assert_eq!(handle.until_ms, T0 + 500);
}

#[test]
fn take_at_or_after_the_deadline_is_expired_and_the_ticket_becomes_expired() {
    for late in [T0 + 500, T0 + 501, T0 + 100_000] {
        let mut w = offered(500);
        assert_eq!(
            w.take(late, "k", "bob"),
            Err(Refusal::Expired),
            "take at {late}"
        );
        let ticket = w.ticket("k");
        assert_eq!(ticket.state, TicketState::Expired);
        assert_eq!(ticket.holder, None);
        assert_eq!(ticket.generation, 1);
        assert_eq!(
            w.state.handoff.live(),
            0,
            "an expired ticket is no longer live"
        );
        // And it stays refused.
        assert_eq!(w.take(late + 1, "k", "bob"), Err(Refusal::Expired));
        assert_eq!(Refusal::Expired.code(), "EXPIRED");
    }
}

#[test]
fn take_of_a_swept_ticket_is_expired() {
    let mut w = offered(500);
    assert_eq!(w.sweep(T0 + 600), 1);
    w.assert_refused_unchanged(take("k", "bob"), Refusal::Expired);
}

#[test]
fn take_of_an_accepted_ticket_is_taken() {
    let (mut w, _) = accepted(500);
    // Even the winner itself, with a new request, gets TAKEN (only a retry of the same request
    // gets its handle back: see the session tests).
    w.assert_refused_unchanged(take("k", "bob"), Refusal::Taken);
    assert_eq!(w.take(T0 + 20, "k", "bob"), Err(Refusal::Taken));
    assert_eq!(Refusal::Taken.code(), "TAKEN");
}

#[test]
fn take_of_an_overdue_accepted_ticket_is_expired_not_taken_and_the_holder_is_dropped() {
    // No sweep in between: the take itself judges the deadline, before the state.
    for late in [T0 + 500, T0 + 501, T0 + 100_000] {
        let (mut w, handle) = accepted(500);
        assert_eq!(w.ticket("k").state, TicketState::Accepted);
        assert_eq!(
            w.state
                .prejudge(None, &Command::Handoff(take("k", "bob")), late),
            None,
            "an overdue take changes the ticket, so the leader must not answer it unlogged"
        );
        assert_eq!(
            w.take(late, "k", "bob"),
            Err(Refusal::Expired),
            "take at {late}"
        );
        let ticket = w.ticket("k");
        assert_eq!(ticket.state, TicketState::Expired);
        assert_eq!(ticket.holder, None, "an expired ticket has no holder");
        assert_eq!(ticket.generation, 1);
        assert_eq!(ticket.deadline_ms, T0 + 500);
        assert_eq!(w.state.handoff.live(), 0);
        assert_eq!(w.sweep(late), 0, "the expiry is already materialised");
        // The old holder's token is dead, and the ticket stays refused.
        w.assert_refused_unchanged(reply("k", &handle.token, done()), Refusal::Expired);
        w.assert_refused_unchanged(take("k", "bob"), Refusal::Expired);
    }
}

#[test]
fn take_of_a_closed_or_withdrawn_ticket_is_already_settled() {
    let (mut closed, handle) = accepted(500);
    closed
        .reply(T0 + 20, "k", &handle.token, done())
        .expect("reply");
    closed.assert_refused_unchanged(take("k", "bob"), Refusal::AlreadySettled);

    let mut withdrawn = offered(500);
    withdrawn.cancel(T0 + 1, "k", "alice").expect("cancel");
    withdrawn.assert_refused_unchanged(take("k", "bob"), Refusal::AlreadySettled);
    assert_eq!(Refusal::AlreadySettled.code(), "ALREADY_SETTLED");
}

#[test]
fn a_successful_take_hands_responsibility_to_the_addressee() {
    let mut w = World::new();
    w.offer(T0, args("k", 500));
    w.cancel(T0, "k", "alice").expect("cancel");
    let ticket = w.offer(T0 + 100, args("k", 700)); // generation 2, deadline T0 + 800
    assert_eq!(ticket.generation, 2);

    let entropy = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210_u128;
    let origin = w.next_origin();
    let response = w.send_raw(
        Stamp {
            now_ms: T0 + 200,
            entropy,
        },
        Some(origin),
        Command::Handoff(take("k", "bob")),
    );
    let expected = Handle {
        token: "0123456789abcdeffedcba9876543210".into(),
        fence: 2,
        until_ms: T0 + 800,
    };
    assert_eq!(response, Response::Answer(Ok(Reply::Handle(expected))));

    let after = w.ticket("k");
    assert_eq!(after.state, TicketState::Accepted);
    assert_eq!(after.holder.as_deref(), Some("bob"));
    assert_eq!(after.generation, 2, "taking does not mint a generation");
    assert_eq!(
        after.deadline_ms,
        T0 + 800,
        "taking does not move the deadline"
    );
    assert_eq!(after.receipt_at_ms, None);
}

#[test]
fn the_token_is_the_stamps_entropy_as_32_lowercase_hex_characters() {
    for (entropy, token) in [
        (1u128, "00000000000000000000000000000001"),
        (u128::MAX, "ffffffffffffffffffffffffffffffff"),
        (0xABCD_u128 << 112, "abcd0000000000000000000000000000"),
    ] {
        let mut w = offered(500);
        let origin = w.next_origin();
        let response = w.send_raw(
            Stamp {
                now_ms: T0 + 1,
                entropy,
            },
            Some(origin),
            Command::Handoff(take("k", "bob")),
        );
        let Response::Answer(Ok(Reply::Handle(handle))) = response else {
            panic!("take failed: {response:?}");
        };
        assert_eq!(handle.token, token);
        assert_eq!(Stamp { now_ms: 0, entropy }.token(), token);
    }
}

// ---------------------------------------------------------------------------------------------
// reply

#[test]
fn reply_to_an_unknown_key_is_refused() {
    let (mut w, handle) = accepted(500);
    w.assert_refused_unchanged(reply("nope", &handle.token, done()), Refusal::UnknownKey);
}

#[test]
fn reply_with_a_wrong_token_is_lease_lost() {
    let (mut w, handle) = accepted(500);
    let mut wrong = handle.token.clone();
    wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
    for token in [
        wrong.as_str(),
        "",
        &handle.token.to_uppercase(),
        "not-a-token",
    ] {
        w.assert_refused_unchanged(reply("k", token, done()), Refusal::LeaseLost);
    }
    assert_eq!(Refusal::LeaseLost.code(), "LEASE_LOST");
    w.reply(T0 + 20, "k", &handle.token, done())
        .expect("the real token still works");
}

#[test]
fn reply_with_an_oversized_token_is_invalid_argument() {
    // Bad input, refused before the token is compared and told as such, not `LEASE_LOST`.
    let (mut w, handle) = accepted(500);
    let huge = "0".repeat(MAX_KEY_BYTES + 1);
    w.assert_refused_unchanged(
        reply("k", &huge, done()),
        Refusal::invalid("token", format!("must be at most {MAX_KEY_BYTES} bytes")),
    );
    w.reply(T0 + 20, "k", &handle.token, done())
        .expect("the real token still works");
}

#[test]
fn reply_to_an_untaken_ticket_is_lease_lost() {
    let mut w = offered(500);
    for token in ["", "00000000000000000000000000000000", "anything"] {
        w.assert_refused_unchanged(reply("k", token, done()), Refusal::LeaseLost);
    }
}

#[test]
fn reply_with_the_previous_generations_token_is_lease_lost() {
    let (mut w, old) = accepted(500);
    assert_eq!(w.sweep(T0 + 500), 1);
    w.offer(T0 + 600, args("k", 500));
    w.assert_refused_unchanged(reply("k", &old.token, done()), Refusal::LeaseLost);
    let new = w.take(T0 + 610, "k", "bob").expect("take gen 2");
    assert_ne!(new.token, old.token);
    assert_eq!(new.fence, 2);
    w.assert_refused_unchanged(reply("k", &old.token, done()), Refusal::LeaseLost);
}

#[test]
fn reply_at_or_after_the_deadline_is_expired_and_the_ticket_becomes_expired() {
    for late in [T0 + 500, T0 + 501, T0 + 60_000] {
        let (mut w, handle) = accepted(500);
        assert_eq!(
            w.reply(late, "k", &handle.token, done()),
            Err(Refusal::Expired),
            "reply at {late}"
        );
        let ticket = w.ticket("k");
        assert_eq!(ticket.state, TicketState::Expired);
        assert_eq!(ticket.holder, None, "an expired ticket has no holder");
        assert_eq!(ticket.receipt, None, "a late receipt is not stored");
        assert_eq!(ticket.receipt_at_ms, None);
        assert_eq!(w.state.handoff.live(), 0);
        // Still refused on a retry with a new request.
        assert_eq!(
            w.reply(late + 1, "k", &handle.token, done()),
            Err(Refusal::Expired)
        );
    }
}

#[test]
fn reply_after_a_sweep_expired_the_ticket_is_expired() {
    let (mut w, handle) = accepted(500);
    assert_eq!(w.sweep(T0 + 500), 1);
    w.assert_refused_unchanged(reply("k", &handle.token, done()), Refusal::Expired);
}

#[test]
fn reply_just_before_the_deadline_closes() {
    let (mut w, handle) = accepted(500);
    w.reply(T0 + 499, "k", &handle.token, done())
        .expect("in time");
    assert_eq!(w.ticket("k").state, TicketState::Closed);
}

/// The receipt is judged last (contract §1, seed 000's `Reply`): a reply that could not settle
/// the ticket anyway is told why — unknown, not the holder's, too late, already settled —
/// whatever its receipt says.
#[test]
fn a_reply_that_cannot_settle_is_told_why_before_its_receipt_is_judged() {
    let bad = Receipt {
        summary: String::new(),
        ..done()
    };
    let (mut w, handle) = accepted(500);
    w.assert_refused_unchanged(
        reply("nope", &handle.token, bad.clone()),
        Refusal::UnknownKey,
    );
    w.assert_refused_unchanged(reply("k", "not-a-token", bad.clone()), Refusal::LeaseLost);
    assert_eq!(
        w.reply(T0 + 500, "k", &handle.token, bad.clone()),
        Err(Refusal::Expired),
        "a late reply"
    );
    assert_eq!(w.ticket("k").state, TicketState::Expired);

    let (mut w, handle) = accepted(500);
    w.reply(T0 + 20, "k", &handle.token, done())
        .expect("in time");
    w.assert_refused_unchanged(reply("k", &handle.token, bad), Refusal::AlreadySettled);
}

/// `judge_reply` (what a node asks of its state for a reply whose receipt it cannot decode)
/// gives the refusal `reply` gives before judging the receipt, and changes nothing.
#[test]
fn judging_a_reply_without_its_receipt_agrees_with_the_reply() {
    let (w, handle) = accepted(500);
    let desk = &w.state.handoff;
    let before = w.state.clone();
    assert_eq!(
        desk.judge_reply(T0 + 20, "nope", &handle.token),
        Err(Refusal::UnknownKey)
    );
    assert_eq!(
        desk.judge_reply(T0 + 20, "k", "not-a-token"),
        Err(Refusal::LeaseLost)
    );
    assert_eq!(desk.judge_reply(T0 + 20, "k", &handle.token), Ok(()));
    assert_eq!(
        desk.judge_reply(T0 + 500, "k", &handle.token),
        Err(Refusal::Expired)
    );
    assert!(matches!(
        desk.judge_reply(T0, "", &handle.token),
        Err(Refusal::Invalid { .. })
    ));
    assert_eq!(w.state, before, "judging changes nothing");

    let (mut w, handle) = accepted(500);
    w.reply(T0 + 20, "k", &handle.token, done())
        .expect("in time");
    let desk = &w.state.handoff;
    assert_eq!(
        desk.judge_reply(T0 + 30, "k", &handle.token),
        Err(Refusal::AlreadySettled)
    );

    let (mut w, handle) = accepted(500);
    assert_eq!(w.sweep(T0 + 600), 1);
    let desk = &w.state.handoff;
    assert_eq!(
        desk.judge_reply(T0 + 600, "k", &handle.token),
        Err(Refusal::Expired)
    );
}

#[test]
fn an_inconsistent_receipt_is_refused_naming_the_field_and_changes_nothing() {
    let cases = [
        (
            Receipt {
                summary: String::new(),
                ..done()
            },
            "receipt.summary",
        ),
        (
            Receipt {
                failure: "but also failed".into(),
                ..done()
            },
            "receipt.failure",
        ),
        (
            Receipt {
                failure: String::new(),
                summary: "tried".into(),
                ..failed(ReceiptStatus::Failed)
            },
            "receipt.failure",
        ),
        (
            Receipt {
                failure: String::new(),
                summary: "nope".into(),
                ..failed(ReceiptStatus::Refused)
            },
            "receipt.failure",
        ),
    ];
    for (receipt, field) in cases {
        let (mut w, handle) = accepted(500);
        let before = w.state.clone();
        let response = w.send_raw(
            Stamp {
                now_ms: w.state.clock_ms,
                entropy: 3,
            },
            None,
            Command::Handoff(reply("k", &handle.token, receipt.clone())),
        );
        let Response::Answer(Err(refusal)) = response else {
            panic!("receipt {receipt:?} was accepted: {response:?}");
        };
        assert!(
            invalid(field)(&refusal),
            "receipt {receipt:?}: expected {field}, got {refusal:?}"
        );
        assert_eq!(
            w.state, before,
            "an inconsistent receipt must change nothing"
        );
        // The holder can still settle properly.
        w.reply(T0 + 20, "k", &handle.token, done())
            .expect("a consistent receipt closes");
    }
}

#[test]
fn a_successful_reply_closes_stores_the_receipt_and_clears_the_holder() {
    for receipt in [
        done(),
        failed(ReceiptStatus::Failed),
        failed(ReceiptStatus::Refused),
    ] {
        let (mut w, handle) = accepted(500);
        w.sweep(T0 + 300); // store clock T0 + 300
                           // The reply is stamped by a lagging leader: receipt_at is the store clock, not the stamp.
        w.reply(T0 + 200, "k", &handle.token, receipt.clone())
            .expect("reply");
        let ticket = w.ticket("k");
        assert_eq!(ticket.state, TicketState::Closed);
        assert_eq!(ticket.holder, None);
        assert_eq!(ticket.receipt_at_ms, Some(T0 + 300));
        assert_eq!(
            ticket.receipt.as_ref(),
            Some(&receipt),
            "artifacts and texts carried as-is"
        );
        assert_eq!(ticket.generation, 1);
        assert_eq!(ticket.deadline_ms, T0 + 500);
        assert_eq!(w.state.handoff.live(), 0, "a closed ticket is not live");
        // A closed ticket stays closed: no later sweep expires it, no second receipt lands.
        assert_eq!(w.sweep(T0 + 10_000), 0);
        w.assert_refused_unchanged(reply("k", &handle.token, done()), Refusal::AlreadySettled);
        assert_eq!(w.ticket("k").state, TicketState::Closed);
    }
}

// ---------------------------------------------------------------------------------------------
// cancel

#[test]
fn cancel_of_an_unknown_key_is_refused() {
    let mut w = offered(500);
    w.assert_refused_unchanged(cancel("nope", "alice"), Refusal::UnknownKey);
}

#[test]
fn cancel_by_anyone_but_the_source_is_refused() {
    let mut w = offered(500);
    w.assert_refused_unchanged(cancel("k", "bob"), Refusal::NotSource);
    w.assert_refused_unchanged(cancel("k", "alic"), Refusal::NotSource);
    assert_eq!(Refusal::NotSource.code(), "NOT_SOURCE");
}

#[test]
fn cancel_with_empty_arguments_is_invalid() {
    let mut w = offered(500);
    w.assert_refused_unchanged(
        cancel("", "alice"),
        Refusal::invalid("key", "must not be empty"),
    );
    w.assert_refused_unchanged(cancel("k", ""), Refusal::invalid("by", "must not be empty"));
}

#[test]
fn cancel_of_an_accepted_ticket_is_taken() {
    let (mut w, _) = accepted(500);
    w.assert_refused_unchanged(cancel("k", "alice"), Refusal::Taken);
    assert_eq!(w.ticket("k").holder.as_deref(), Some("bob"));
}

#[test]
fn cancel_of_a_settled_ticket_is_already_settled() {
    let (mut closed, handle) = accepted(500);
    closed
        .reply(T0 + 20, "k", &handle.token, done())
        .expect("reply");
    closed.assert_refused_unchanged(cancel("k", "alice"), Refusal::AlreadySettled);

    let mut withdrawn = offered(500);
    withdrawn.cancel(T0 + 1, "k", "alice").expect("cancel");
    withdrawn.assert_refused_unchanged(cancel("k", "alice"), Refusal::AlreadySettled);

    let mut swept = offered(500);
    swept.sweep(T0 + 500);
    swept.assert_refused_unchanged(cancel("k", "alice"), Refusal::AlreadySettled);
}

#[test]
fn cancel_of_an_overdue_offered_ticket_is_already_settled_and_materialises_the_expiry() {
    let mut w = offered(500);
    assert_eq!(
        w.cancel(T0 + 500, "k", "alice"),
        Err(Refusal::AlreadySettled)
    );
    assert_eq!(
        w.ticket("k").state,
        TicketState::Expired,
        "not withdrawn: it expired first"
    );
    assert_eq!(w.state.handoff.live(), 0);
}

#[test]
fn cancel_of_an_overdue_accepted_ticket_is_already_settled_and_materialises_the_expiry() {
    // No sweep in between: the cancel judges the deadline first, so the answer is not TAKEN.
    for late in [T0 + 500, T0 + 501, T0 + 100_000] {
        let (mut w, handle) = accepted(500);
        assert_eq!(
            w.cancel(late, "k", "alice"),
            Err(Refusal::AlreadySettled),
            "cancel at {late}"
        );
        let ticket = w.ticket("k");
        assert_eq!(
            ticket.state,
            TicketState::Expired,
            "not withdrawn: it expired first"
        );
        assert_eq!(ticket.holder, None, "an expired ticket has no holder");
        assert_eq!(ticket.generation, 1);
        assert_eq!(w.state.handoff.live(), 0);
        assert_eq!(w.sweep(late), 0, "the expiry is already materialised");
        w.assert_refused_unchanged(reply("k", &handle.token, done()), Refusal::Expired);
        w.assert_refused_unchanged(cancel("k", "alice"), Refusal::AlreadySettled);
    }
}

#[test]
fn a_successful_cancel_withdraws_the_ticket() {
    let mut w = offered(500);
    w.cancel(T0 + 499, "k", "alice")
        .expect("cancel just before the deadline");
    let ticket = w.ticket("k");
    assert_eq!(ticket.state, TicketState::Withdrawn);
    assert_eq!(ticket.holder, None);
    assert_eq!(ticket.generation, 1);
    assert_eq!(w.state.handoff.live(), 0);
    assert!(
        !w.state.sweep_due(T0 + 10_000),
        "a withdrawn ticket never comes due"
    );
    assert_eq!(
        w.sweep(T0 + 10_000),
        0,
        "a withdrawn ticket is never expired later"
    );
    assert_eq!(w.ticket("k").state, TicketState::Withdrawn);
    assert_eq!(
        w.take(T0 + 10_001, "k", "bob"),
        Err(Refusal::AlreadySettled)
    );
}

// ---------------------------------------------------------------------------------------------
// sweep

#[test]
fn sweep_expires_exactly_the_overdue_live_tickets() {
    let mut w = World::new();
    w.offer(T0, args("offered-due", 100)); // deadline T0+100
    w.offer(T0, args("offered-at-deadline", 200)); // deadline T0+200
    w.offer(T0, args("offered-later", 201)); // deadline T0+201
    w.offer(T0, args("accepted-due", 150));
    let h_accepted = w.take(T0, "accepted-due", "bob").expect("take");
    w.offer(T0, args("accepted-later", 5_000));
    w.take(T0, "accepted-later", "bob").expect("take");
    w.offer(T0, args("closed", 100));
    let h_closed = w.take(T0, "closed", "bob").expect("take");
    w.reply(T0 + 1, "closed", &h_closed.token, done())
        .expect("reply");
    w.offer(T0, args("withdrawn", 100));
    w.cancel(T0 + 1, "withdrawn", "alice").expect("cancel");
    let closed_before = w.ticket("closed");
    let withdrawn_before = w.ticket("withdrawn");

    assert!(!w.state.sweep_due(T0 + 99));
    assert!(w.state.sweep_due(T0 + 100));
    assert_eq!(
        w.sweep(T0 + 99),
        0,
        "nothing is due before the first deadline"
    );
    assert_eq!(w.sweep(T0 + 200), 3);

    let state_of = |w: &World, key: &str| w.ticket(key).state;
    assert_eq!(state_of(&w, "offered-due"), TicketState::Expired);
    assert_eq!(state_of(&w, "offered-at-deadline"), TicketState::Expired);
    assert_eq!(state_of(&w, "accepted-due"), TicketState::Expired);
    assert_eq!(w.ticket("accepted-due").holder, None);
    assert_eq!(state_of(&w, "offered-later"), TicketState::Offered);
    assert_eq!(state_of(&w, "accepted-later"), TicketState::Accepted);
    assert_eq!(w.ticket("accepted-later").holder.as_deref(), Some("bob"));
    assert_eq!(w.ticket("closed"), closed_before);
    assert_eq!(w.ticket("withdrawn"), withdrawn_before);
    assert_eq!(w.state.handoff.live(), 2);

    let tickets: Vec<Ticket> = w.state.handoff.tickets().cloned().collect();
    assert_eq!(
        check(&tickets, w.state.clock_ms),
        vec![],
        "nothing overdue is left behind"
    );

    // A second sweep at the same clock finds nothing; the expired holder cannot reply.
    assert_eq!(w.sweep(T0 + 200), 0);
    assert_eq!(
        w.reply(T0 + 200, "accepted-due", &h_accepted.token, done()),
        Err(Refusal::Expired)
    );
    assert_eq!(w.sweep(T0 + 201), 1);
    assert_eq!(state_of(&w, "offered-later"), TicketState::Expired);
}

#[test]
fn a_sweep_stamped_in_the_past_uses_the_store_clock() {
    let mut w = offered(100);
    w.offer(T0 + 1_000, args("other", 10_000)); // clock T0 + 1000
    assert_eq!(
        w.sweep(T0),
        1,
        "k is overdue at the store clock even though the stamp is old"
    );
    assert_eq!(w.state.clock_ms, T0 + 1_000);
    assert_eq!(w.ticket("k").state, TicketState::Expired);
    assert_eq!(w.ticket("other").state, TicketState::Offered);
}

// ---------------------------------------------------------------------------------------------
// session table

#[test]
fn a_retried_winning_take_returns_the_same_handle_and_changes_nothing() {
    let mut w = offered(500);
    let origin = w.next_origin();
    let first = w.send_raw(
        Stamp {
            now_ms: T0 + 10,
            entropy: 0xaaaa,
        },
        Some(origin),
        Command::Handoff(take("k", "bob")),
    );
    let Response::Answer(Ok(Reply::Handle(handle))) = &first else {
        panic!("take failed: {first:?}");
    };
    assert_eq!(
        handle.token,
        Stamp {
            now_ms: 0,
            entropy: 0xaaaa
        }
        .token()
    );
    let after_first = w.state.clone();

    // The client timed out and retries the same request through a new leader: new stamp, new
    // entropy. It must learn it won, with the original token.
    for (now_ms, entropy) in [(T0 + 20, 0xbbbb), (T0 + 5, 0xcccc), (T0 + 400, 0xdddd)] {
        let retry = w.send_raw(
            Stamp { now_ms, entropy },
            Some(origin),
            Command::Handoff(take("k", "bob")),
        );
        assert_eq!(
            retry, first,
            "a retry returns the first response, never TAKEN"
        );
        assert_eq!(w.state, after_first, "a retry changes nothing");
    }
    // Even after the ticket expired and was re-offered, the retry still answers the original.
    w.sweep(T0 + 500);
    w.offer(T0 + 600, args("k", 500));
    let after_reoffer = w.state.clone();
    let retry = w.send_raw(
        Stamp {
            now_ms: T0 + 600,
            entropy: 1,
        },
        Some(origin),
        Command::Handoff(take("k", "bob")),
    );
    assert_eq!(retry, first);
    assert_eq!(w.state, after_reoffer);
    assert_eq!(
        w.ticket("k").state,
        TicketState::Offered,
        "the retry did not take generation 2"
    );
}

#[test]
fn a_retried_refusal_returns_the_first_refusal_even_if_it_would_now_succeed() {
    let mut w = World::new();
    let origin = w.next_origin();
    let stamp = Stamp {
        now_ms: T0,
        entropy: 9,
    };
    let first = w.send_raw(stamp, Some(origin), Command::Handoff(take("k", "bob")));
    assert_eq!(first, Response::Answer(Err(Refusal::UnknownKey)));
    w.offer(T0, args("k", 500));
    let before = w.state.clone();
    let retry = w.send_raw(stamp, Some(origin), Command::Handoff(take("k", "bob")));
    assert_eq!(retry, first);
    assert_eq!(w.state, before);
    assert_eq!(w.ticket("k").state, TicketState::Offered);
}

#[test]
fn a_retried_offer_does_not_mint_a_second_generation() {
    let mut w = offered(500);
    w.cancel(T0 + 1, "k", "alice").expect("cancel");
    let origin = w.next_origin();
    let stamp = Stamp {
        now_ms: T0 + 2,
        entropy: 0,
    };
    let offer = Command::Handoff(handoff::Command::Offer(args("k", 500)));
    let first = w.send_raw(stamp, Some(origin), offer.clone());
    let Response::Answer(Ok(Reply::Ticket(ticket))) = &first else {
        panic!("offer failed: {first:?}");
    };
    assert_eq!(ticket.generation, 2);
    w.cancel(T0 + 3, "k", "alice").expect("cancel gen 2");
    let before = w.state.clone();
    // Without the session table this would open generation 3.
    assert_eq!(w.send_raw(stamp, Some(origin), offer), first);
    assert_eq!(w.state, before);
    assert_eq!(w.ticket("k").generation, 2);
}

#[test]
fn the_same_seq_from_different_clients_is_not_a_retry() {
    let mut w = offered(500);
    let a = Origin {
        client_id: 1,
        seq: 1,
        acked_below: 0,
    };
    let b = Origin {
        client_id: 2,
        seq: 1,
        acked_below: 0,
    };
    let take_k = Command::Handoff(take("k", "bob"));
    let first = w.send_raw(
        Stamp {
            now_ms: T0 + 1,
            entropy: 1,
        },
        Some(a),
        take_k.clone(),
    );
    assert!(
        matches!(first, Response::Answer(Ok(Reply::Handle(_)))),
        "{first:?}"
    );
    let second = w.send_raw(
        Stamp {
            now_ms: T0 + 1,
            entropy: 2,
        },
        Some(b),
        take_k,
    );
    assert_eq!(second, Response::Answer(Err(Refusal::Taken)));
}

#[test]
fn acknowledged_requests_are_forgotten_and_answer_session_expired_without_effect() {
    let mut w = offered(500);
    let take_origin = Origin {
        client_id: 5,
        seq: 1,
        acked_below: 0,
    };
    let take_k = Command::Handoff(take("k", "bob"));
    let first = w.send_raw(
        Stamp {
            now_ms: T0 + 1,
            entropy: 1,
        },
        Some(take_origin),
        take_k.clone(),
    );
    assert!(matches!(first, Response::Answer(Ok(Reply::Handle(_)))));
    // Still remembered while unacknowledged.
    assert_eq!(
        w.send_raw(
            Stamp {
                now_ms: T0 + 2,
                entropy: 2
            },
            Some(take_origin),
            take_k.clone()
        ),
        first
    );

    // The client's next request acknowledges everything below seq 2.
    let next = Origin {
        client_id: 5,
        seq: 2,
        acked_below: 2,
    };
    w.send_raw(
        Stamp {
            now_ms: T0 + 3,
            entropy: 3,
        },
        Some(next),
        Command::Handoff(take("other", "bob")),
    );
    let before = w.state.clone();
    let late_retry = w.send_raw(
        Stamp {
            now_ms: T0 + 4,
            entropy: 4,
        },
        Some(take_origin),
        take_k,
    );
    assert_eq!(
        late_retry,
        Response::SessionExpired,
        "never TAKEN, never a re-execution"
    );
    assert_eq!(w.state, before, "a forgotten request changes nothing");
    // seq 2 itself is still remembered.
    assert_eq!(
        w.send_raw(
            Stamp {
                now_ms: T0 + 5,
                entropy: 5
            },
            Some(next),
            Command::Handoff(take("other", "bob"))
        ),
        Response::Answer(Err(Refusal::UnknownKey)),
    );
}

#[test]
fn a_client_seen_within_the_retry_window_is_never_forgotten_to_make_room() {
    // The offer at T0 made client 42 known too.
    let mut w = offered(60 * 60 * 1000);
    // Client 1 wins the take; its reply is lost.
    let winner = Origin {
        client_id: 1,
        seq: 1,
        acked_below: 0,
    };
    let take_k = Command::Handoff(take("k", "bob"));
    let at = |now_ms| Stamp {
        now_ms,
        entropy: u128::from(now_ms),
    };
    let won = w.send_raw(at(T0 + 1), Some(winner), take_k.clone());
    assert!(
        matches!(won, Response::Answer(Ok(Reply::Handle(_)))),
        "{won:?}"
    );
    // The table fills with other clients (each refused, which is remembered like any answer).
    let other = |client_id| Origin {
        client_id,
        seq: 1,
        acked_below: 0,
    };
    let unknown = Command::Handoff(take("nothing-here", "x"));
    // (Ids clear of 1 and 42: the winner and the offerer.)
    for n in 2..MAX_CLIENTS as u64 {
        let answer = w.send_raw(at(T0 + 2), Some(other(1_000 + n)), unknown.clone());
        assert_eq!(answer, Response::Answer(Err(Refusal::UnknownKey)));
    }
    assert_eq!(w.state.sessions.len(), MAX_CLIENTS);
    // Two new clients come while every known one was seen within the window. (Forgetting the
    // longest idle to make room, as the table once did, would forget 42, then the winner.)
    let before = w.state.clone();
    let crowded = at(T0 + SESSION_RETRY_WINDOW_MS - 1);
    let newcomers = [
        w.send_raw(crowded, Some(other(2_000_001)), take_k.clone()),
        w.send_raw(crowded, Some(other(2_000_002)), unknown.clone()),
    ];
    // The winner's retry still gets its win, not TAKEN...
    assert_eq!(w.send_raw(crowded, Some(winner), take_k.clone()), won);
    // ...because the new clients were turned away, with nothing done or remembered for them.
    assert_eq!(newcomers, [Response::SessionsFull, Response::SessionsFull]);
    assert_eq!(w.state, before, "a client turned away changes nothing");
    // Once the longest-idle client (42) has been idle for the window, it makes room.
    let later = at(T0 + SESSION_RETRY_WINDOW_MS);
    assert_eq!(
        w.send_raw(later, Some(other(2_000_001)), unknown.clone()),
        Response::Answer(Err(Refusal::UnknownKey))
    );
    assert_eq!(w.state.sessions.len(), MAX_CLIENTS);
    assert_eq!(w.send_raw(later, Some(winner), take_k.clone()), won);
    // The winner too, once idle that long: the documented limit of the window.
    let much_later = at(T0 + 1 + SESSION_RETRY_WINDOW_MS);
    w.send_raw(much_later, Some(other(2_000_003)), unknown);
    let retry = at(T0 + 2 + SESSION_RETRY_WINDOW_MS);
    assert_eq!(
        w.send_raw(retry, Some(winner), take_k),
        Response::Answer(Err(Refusal::Taken))
    );
}

#[test]
fn sessions_are_part_of_the_replicated_state() {
    let mut w = offered(500);
    let origin = w.next_origin();
    let take_k = Command::Handoff(take("k", "bob"));
    let stamp = Stamp {
        now_ms: T0 + 1,
        entropy: 77,
    };

    // The same command applied with and without an origin leaves the same desk, but a different
    // State: the session table is part of what is compared (and hence snapshotted).
    let mut anonymous = w.state.clone();
    apply(
        &mut anonymous,
        &Envelope {
            stamp,
            origin: None,
            command: take_k.clone(),
        },
    );
    let first = w.send_raw(stamp, Some(origin), take_k.clone());
    assert_eq!(anonymous.handoff, w.state.handoff);
    assert_ne!(
        anonymous, w.state,
        "the session table must be part of State"
    );
    assert!(!w.state.sessions.is_empty());

    // A replica restored from a copy of the state answers the retry the same way.
    let mut restored = w.state.clone();
    let retry = apply(
        &mut restored,
        &Envelope {
            stamp: Stamp {
                now_ms: T0 + 9,
                entropy: 78,
            },
            origin: Some(origin),
            command: take_k,
        },
    );
    assert_eq!(retry, first);
    assert_eq!(restored, w.state);
}

#[test]
fn the_leaders_own_commands_carry_no_session() {
    let mut w = World::new();
    w.sweep(T0);
    w.sweep(T0);
    assert!(w.state.sessions.is_empty());
}

// ---------------------------------------------------------------------------------------------
// check: one test per problem code

fn good(key: &str) -> Ticket {
    Ticket {
        key: key.into(),
        from: "alice".into(),
        to: "bob".into(),
        payload: Vec::new(),
        reply_to: "inbox://alice".into(),
        ttl_ms: 1_000,
        generation: 1,
        deadline_ms: T0 + 1_000,
        state: TicketState::Offered,
        holder: None,
        receipt_at_ms: None,
        receipt: None,
    }
}

fn accepted_ticket(key: &str) -> Ticket {
    Ticket {
        state: TicketState::Accepted,
        holder: Some("bob".into()),
        ..good(key)
    }
}

fn closed_ticket(key: &str) -> Ticket {
    Ticket {
        state: TicketState::Closed,
        receipt_at_ms: Some(T0 + 10),
        receipt: Some(done()),
        ..good(key)
    }
}

fn codes(tickets: &[Ticket], now: u64) -> Vec<(String, ProblemCode)> {
    let problems = check(tickets, now);
    for p in &problems {
        assert!(!p.text.is_empty(), "problem {p:?} has no explanation");
    }
    problems.into_iter().map(|p| (p.key, p.code)).collect()
}

fn only(key: &str, code: ProblemCode) -> Vec<(String, ProblemCode)> {
    vec![(key.to_string(), code)]
}

#[test]
fn check_passes_a_clean_snapshot() {
    let tickets = vec![
        good("a"),
        accepted_ticket("b"),
        closed_ticket("c"),
        Ticket {
            state: TicketState::Expired,
            deadline_ms: T0 - 5,
            ..good("d")
        },
        Ticket {
            state: TicketState::Withdrawn,
            ..good("e")
        },
        Ticket {
            state: TicketState::Closed,
            deadline_ms: T0 - 5,
            receipt_at_ms: Some(T0 - 6),
            ..closed_ticket("f")
        },
        Ticket {
            generation: 9,
            ..good("g")
        },
    ];
    assert_eq!(codes(&tickets, T0), vec![]);
    assert_eq!(codes(&[], T0), vec![]);
    // One millisecond before the deadline nothing is overdue yet.
    assert_eq!(codes(&[good("a"), accepted_ticket("b")], T0 + 999), vec![]);
}

#[test]
fn check_reports_empty_key() {
    assert_eq!(codes(&[good("")], T0), only("", ProblemCode::EmptyKey));
}

#[test]
fn check_reports_duplicate_key_once_per_key() {
    let tickets = [good("a"), good("b"), accepted_ticket("a")];
    assert_eq!(codes(&tickets, T0), only("a", ProblemCode::DuplicateKey));
    let three = [good("a"), good("a"), good("a")];
    assert_eq!(codes(&three, T0), only("a", ProblemCode::DuplicateKey));
}

#[test]
fn check_reports_unknown_state() {
    let t = Ticket {
        state: TicketState::parse("half-taken"),
        ..good("a")
    };
    assert_eq!(codes(&[t], T0), only("a", ProblemCode::UnknownState));
    // Even past the deadline: an unknown state is neither overdue holder nor overdue reply.
    let late = Ticket {
        state: TicketState::Unrecognized("zzz".into()),
        ..good("a")
    };
    assert_eq!(
        codes(&[late], T0 + 5_000),
        only("a", ProblemCode::UnknownState)
    );
}

#[test]
fn check_reports_no_deadline() {
    let t = Ticket {
        deadline_ms: 0,
        ..good("a")
    };
    assert_eq!(codes(&[t], T0), only("a", ProblemCode::NoDeadline));
    let accepted = Ticket {
        deadline_ms: 0,
        ..accepted_ticket("b")
    };
    assert_eq!(codes(&[accepted], T0), only("b", ProblemCode::NoDeadline));
}

#[test]
fn check_reports_holder_mismatch() {
    let accepted_without_holder = Ticket {
        holder: None,
        ..accepted_ticket("a")
    };
    assert_eq!(
        codes(&[accepted_without_holder], T0),
        only("a", ProblemCode::HolderMismatch)
    );
    for state in [
        TicketState::Offered,
        TicketState::Closed,
        TicketState::Expired,
        TicketState::Withdrawn,
    ] {
        let base = if state == TicketState::Closed {
            closed_ticket("b")
        } else {
            good("b")
        };
        let stale_holder = Ticket {
            state: state.clone(),
            holder: Some("bob".into()),
            ..base
        };
        assert_eq!(
            codes(&[stale_holder], T0),
            only("b", ProblemCode::HolderMismatch),
            "{state:?}"
        );
    }
}

#[test]
fn check_reports_missing_generation() {
    let t = Ticket {
        generation: 0,
        ..good("a")
    };
    assert_eq!(codes(&[t], T0), only("a", ProblemCode::MissingGeneration));
    let accepted = Ticket {
        generation: 0,
        ..accepted_ticket("b")
    };
    assert_eq!(
        codes(&[accepted], T0),
        only("b", ProblemCode::MissingGeneration)
    );
}

#[test]
fn check_reports_receipt_without_close() {
    let closed_without_time = Ticket {
        receipt_at_ms: None,
        ..closed_ticket("a")
    };
    assert_eq!(
        codes(&[closed_without_time], T0),
        only("a", ProblemCode::ReceiptWithoutClose)
    );
    let accepted_with_time = Ticket {
        receipt_at_ms: Some(T0),
        ..accepted_ticket("b")
    };
    assert_eq!(
        codes(&[accepted_with_time], T0),
        only("b", ProblemCode::ReceiptWithoutClose)
    );
    let withdrawn_with_time = Ticket {
        state: TicketState::Withdrawn,
        receipt_at_ms: Some(T0),
        ..good("c")
    };
    assert_eq!(
        codes(&[withdrawn_with_time], T0),
        only("c", ProblemCode::ReceiptWithoutClose)
    );
    // A receipt a client could not read arrives as none: a closed ticket without one is reported.
    let closed_without_receipt = Ticket {
        receipt: None,
        ..closed_ticket("d")
    };
    assert_eq!(
        codes(&[closed_without_receipt], T0),
        only("d", ProblemCode::ReceiptWithoutClose)
    );
    let expired_with_receipt = Ticket {
        state: TicketState::Expired,
        receipt_at_ms: None,
        ..closed_ticket("e")
    };
    assert_eq!(
        codes(&[expired_with_receipt], T0),
        only("e", ProblemCode::ReceiptWithoutClose)
    );
}

#[test]
fn check_reports_overdue_holder_for_an_offered_ticket_at_or_past_its_deadline() {
    let t = good("a"); // deadline T0 + 1000
    assert_eq!(codes(std::slice::from_ref(&t), T0 + 999), vec![]);
    assert_eq!(
        codes(std::slice::from_ref(&t), T0 + 1_000),
        only("a", ProblemCode::OverdueHolder)
    );
    assert_eq!(codes(&[t], u64::MAX), only("a", ProblemCode::OverdueHolder));
}

#[test]
fn check_reports_overdue_reply_for_an_accepted_ticket_at_or_past_its_deadline() {
    let t = accepted_ticket("a");
    assert_eq!(codes(std::slice::from_ref(&t), T0 + 999), vec![]);
    assert_eq!(
        codes(std::slice::from_ref(&t), T0 + 1_000),
        only("a", ProblemCode::OverdueReply)
    );
    assert_eq!(
        codes(&[t], T0 + 50_000),
        only("a", ProblemCode::OverdueReply)
    );
}

#[test]
fn check_does_not_report_settled_tickets_past_their_deadline() {
    let late = T0 + 50_000;
    let tickets = [
        closed_ticket("a"),
        Ticket {
            state: TicketState::Expired,
            ..good("b")
        },
        Ticket {
            state: TicketState::Withdrawn,
            ..good("c")
        },
    ];
    assert_eq!(codes(&tickets, late), vec![]);
}

#[test]
fn check_reports_ttl_non_positive() {
    for ttl in [0, -1, i64::MIN] {
        let t = Ticket {
            ttl_ms: ttl,
            ..good("a")
        };
        assert_eq!(
            codes(&[t], T0),
            only("a", ProblemCode::TtlNonPositive),
            "ttl {ttl}"
        );
    }
}

#[test]
fn problem_codes_have_the_contracts_wire_names() {
    let names = [
        (ProblemCode::EmptyKey, "empty_key"),
        (ProblemCode::DuplicateKey, "duplicate_key"),
        (ProblemCode::UnknownState, "unknown_state"),
        (ProblemCode::NoDeadline, "no_deadline"),
        (ProblemCode::HolderMismatch, "holder_mismatch"),
        (ProblemCode::MissingGeneration, "missing_generation"),
        (ProblemCode::ReceiptWithoutClose, "receipt_without_close"),
        (ProblemCode::OverdueHolder, "overdue_holder"),
        (ProblemCode::OverdueReply, "overdue_reply"),
        (ProblemCode::TtlNonPositive, "ttl_non_positive"),
    ];
    for (code, name) in names {
        assert_eq!(code.as_str(), name);
    }
    // Codes order by their wire name, the order `check` sorts by.
    let mut by_ord: Vec<ProblemCode> = names.iter().map(|(code, _)| *code).collect();
    by_ord.sort();
    let mut by_name: Vec<&str> = names.iter().map(|(_, name)| *name).collect();
    by_name.sort();
    assert_eq!(
        by_ord.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        by_name
    );
}

#[test]
fn check_sorts_problems_by_key_then_code() {
    // Keys deliberately out of order in the snapshot; "m" breaks several rules at once.
    let broken = Ticket {
        ttl_ms: 0,
        generation: 0,
        holder: None,
        receipt_at_ms: Some(T0),
        ..accepted_ticket("m")
    };
    let tickets = [
        Ticket {
            ttl_ms: -1,
            ..good("z")
        },
        broken,
        good("a"),
        Ticket {
            deadline_ms: T0 - 1,
            ..good("b")
        },
        good("b"),
        good(""),
        good(""),
        Ticket {
            state: TicketState::parse("limbo"),
            ttl_ms: 0,
            ..good("u")
        },
    ];
    let got: Vec<(String, &str)> = check(&tickets, T0)
        .into_iter()
        .map(|p| (p.key, p.code.as_str()))
        .collect();
    let mut want: Vec<(String, &str)> = vec![
        ("".into(), "empty_key"),
        ("".into(), "empty_key"),
        ("".into(), "duplicate_key"),
        ("b".into(), "duplicate_key"),
        ("b".into(), "overdue_holder"),
        ("m".into(), "holder_mismatch"),
        ("m".into(), "missing_generation"),
        ("m".into(), "receipt_without_close"),
        ("m".into(), "ttl_non_positive"),
        ("u".into(), "unknown_state"),
        ("u".into(), "ttl_non_positive"),
        ("z".into(), "ttl_non_positive"),
    ];
    // The contract's order: by key, then by the code's stable name.
    want.sort();
    assert_eq!(got, want);
    let again: Vec<(String, &str)> = check(&tickets, T0)
        .into_iter()
        .map(|p| (p.key, p.code.as_str()))
        .collect();
    assert_eq!(again, got, "check is deterministic");
}

#[test]
fn tickets_from_the_store_pass_check_when_nothing_is_overdue() {
    let mut w = World::new();
    w.offer(T0, args("a", 1_000));
    w.offer(T0, args("b", 1_000));
    w.take(T0 + 1, "b", "bob").expect("take");
    w.offer(T0, args("c", 1_000));
    let hc = w.take(T0 + 1, "c", "bob").expect("take");
    w.reply(T0 + 2, "c", &hc.token, failed(ReceiptStatus::Refused))
        .expect("reply");
    w.offer(T0, args("d", 1_000));
    w.cancel(T0 + 3, "d", "alice").expect("cancel");
    w.offer(T0, args("e", 10));
    w.take(T0 + 20, "e", "bob").expect_err("expired");
    let tickets: Vec<Ticket> = w.state.handoff.tickets().cloned().collect();
    assert_eq!(codes(&tickets, w.state.clock_ms), vec![]);
    // Without a sweep, time passing makes the live leftovers visible.
    assert_eq!(
        codes(&tickets, T0 + 1_000),
        vec![
            ("a".to_string(), ProblemCode::OverdueHolder),
            ("b".to_string(), ProblemCode::OverdueReply)
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// listings

#[test]
fn a_listing_keeps_the_tickets_it_took_while_later_commands_change_the_store() {
    let mut w = offered(60_000);
    let listed: Vec<_> = w.state.handoff.shared_tickets().cloned().collect();
    w.take(T0 + 10, "k", "bob").unwrap();
    w.sweep(T0 + 120_000);
    assert_eq!(listed[0].state, TicketState::Offered, "the listing's view");
    assert_eq!(listed[0].holder, None);
    assert_eq!(w.ticket("k").state, TicketState::Expired, "the store's");
}
