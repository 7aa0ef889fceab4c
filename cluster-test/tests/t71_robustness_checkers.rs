//! Claim: the robustness checkers are not vacuous. Each rule of `t70` is fed a small hand-made
//! history that breaks it — and one that merely looks suspicious but is legal because of an
//! ambiguous operation — and must flag exactly the former, naming the operations that show it.
//! No cluster runs here.
#![allow(clippy::unwrap_used)]

use baton_cluster_test::robustness::check::{self, Violation};
use baton_cluster_test::robustness::history::{
    AttemptEnd, AttemptRecord, Clock, Input, LeasedTask, Op, Outcome, Output, Recorder,
};
use baton_cluster_test::robustness::test_history::{rules, H};
use baton_cluster_test::robustness::{
    self, available_again, board, board_watch, chain, checkpoint, courier, effect, effect_watch,
    handoff, handoff_watch, progress, queue, queue_watch, reconcile, sink_watch, watcher,
};
use baton_rpc::proto::StateDigestResponse;
use baton_rpc::replicas::SeenDigests;
use baton_rpc::Error;
use std::time::Duration;

/// Asserts whether `violations` include one of `rule`, showing them all when not as expected.
fn assert_reported(violations: &[Violation], rule: &str, expected: bool) {
    assert_eq!(
        rules(violations).contains(&rule),
        expected,
        "{rule}: {violations:?}"
    );
}

fn offer(key: &str) -> Input {
    Input::Offer {
        key: key.into(),
        from: handoff::FROM.into(),
        to: handoff::TO.into(),
    }
}

fn take(key: &str) -> Input {
    Input::Take {
        key: key.into(),
        to: handoff::TO.into(),
    }
}

fn read(key: &str) -> Input {
    Input::Read { key: key.into() }
}

fn ticket(generation: u64, state: &str, holder: Option<&str>) -> Output {
    Output::Ticket {
        generation,
        state: state.into(),
        holder: holder.map(String::from),
    }
}

fn handle(fence: u64, token: &str) -> Output {
    Output::Handle {
        fence,
        token: token.into(),
    }
}

/// A legal handoff history: one winner, one loser, a final read that agrees.
fn legal_handoff() -> H {
    let mut h = H::default();
    h.ok("c0", offer("k"), 0, 10, ticket(1, "offered", None));
    h.ok("c1", take("k"), 20, 40, handle(1, "t1"));
    h.refused("c2", take("k"), 21, 30, "TAKEN");
    h.ok(
        "final",
        read("k"),
        100,
        110,
        ticket(1, "accepted", Some("dst")),
    );
    h
}

/// A lease's answer handing out one task (attempt 1).
fn leased(task: u64, key: &str, token: Option<u64>, until_ms: Option<u64>) -> Output {
    Output::Leased(vec![LeasedTask {
        task,
        attempt: 1,
        key: key.into(),
        token,
        until_ms,
    }])
}

#[test]
fn t71_a_legal_handoff_history_passes() {
    let h = legal_handoff();
    let violations = handoff::check(&h.ops, 100_000);
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn t71_two_winners_of_one_generation_break_uniqueness_and_linearizability() {
    let mut h = legal_handoff();
    h.ok("c3", take("k"), 22, 35, handle(1, "t2"));
    let violations = handoff::check(&h.ops, 100_000);
    assert_eq!(
        rules(&violations),
        ["linearizable", "unique-grant"],
        "{violations:?}"
    );
    let unique = violations
        .iter()
        .find(|v| v.rule == "unique-grant")
        .unwrap();
    assert_eq!(unique.ops, vec![1, 4]);
}

#[test]
fn t71_a_stale_read_is_not_linearizable_and_the_slice_shows_it() {
    let mut h = legal_handoff();
    // Invoked after the take was acknowledged, yet it saw the ticket still offered.
    h.ok("c4", read("k"), 50, 60, ticket(1, "offered", None));
    let violations = handoff::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["linearizable"], "{violations:?}");
    let violation = &violations[0];
    assert!(violation.stuck.contains(&4), "{violation:?}");
    let text = violation.render(&h.ops, false);
    assert!(text.contains("longest linearizable prefix"), "{text}");
    assert!(text.contains("could not follow it"), "{text}");
    assert!(text.contains("read k"), "{text}");
}

#[test]
fn t71_an_ambiguous_take_explains_a_later_taken() {
    let mut h = H::default();
    h.ok("c0", offer("k"), 0, 10, ticket(1, "offered", None));
    h.ambiguous("c1", take("k"), 20);
    h.refused("c2", take("k"), 30, 35, "TAKEN");
    h.ok(
        "final",
        read("k"),
        100,
        110,
        ticket(1, "accepted", Some("dst")),
    );
    let violations = handoff::check(&h.ops, 100_000);
    assert!(violations.is_empty(), "{violations:?}");
    // Without the ambiguous take the refusal is unexplained.
    h.ops.remove(1);
    for (i, op) in h.ops.iter_mut().enumerate() {
        op.index = i;
    }
    let violations = handoff::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["linearizable"], "{violations:?}");
}

#[test]
fn t71_a_lost_acknowledged_offer_is_reported() {
    let mut h = H::default();
    h.ok("c0", offer("k"), 0, 10, ticket(1, "offered", None));
    h.refused("final", read("k"), 100, 110, "UNKNOWN_KEY");
    let violations = handoff::check(&h.ops, 100_000);
    assert_eq!(
        rules(&violations),
        ["linearizable", "lost-ack"],
        "{violations:?}"
    );
}

#[test]
fn t71_fences_going_backwards_across_a_failover_are_reported() {
    let mut h = H::default();
    let claim = |agent: &str| Input::Claim {
        task: "task-0".into(),
        agent: agent.into(),
    };
    let lease = |fence: u64, token: &str| Output::Lease {
        fence,
        token: token.into(),
        until_ms: None,
    };
    let release = |fence: u64, token: &str| Input::ReleaseTask {
        task: "task-0".into(),
        token: token.into(),
        fence,
    };
    h.ok("a0", claim("a0"), 0, 10, lease(5, "x"));
    h.ok("a0", release(5, "x"), 20, 30, Output::Done);
    h.ok("a1", claim("a1"), 40, 50, lease(4, "y"));
    h.ok(
        "final",
        Input::ListTasks,
        100,
        110,
        Output::Tasks(vec![("task-0".into(), "open".into(), 5)]),
    );
    let violations = board::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["increasing-fence"], "{violations:?}");
    assert_eq!(violations[0].ops, vec![0, 2]);
}

#[test]
fn t71_a_release_with_a_superseded_claim_and_a_lost_fence_are_reported() {
    let mut h = H::default();
    let claim = |agent: &str| Input::Claim {
        task: "task-0".into(),
        agent: agent.into(),
    };
    let lease = |fence: u64, token: &str| Output::Lease {
        fence,
        token: token.into(),
        until_ms: None,
    };
    h.ok("a0", claim("a0"), 0, 10, lease(1, "x"));
    h.ok("a1", claim("a1"), 20, 30, lease(2, "y"));
    h.ok(
        "a0",
        Input::ReleaseTask {
            task: "task-0".into(),
            token: "x".into(),
            fence: 1,
        },
        40,
        50,
        Output::Done,
    );
    h.ok(
        "final",
        Input::ListTasks,
        100,
        110,
        Output::Tasks(vec![("task-0".into(), "open".into(), 1)]),
    );
    let violations = board::check(&h.ops, 100_000);
    assert_eq!(
        rules(&violations),
        ["exclusive-hold", "lost-ack", "stale-holder"],
        "{violations:?}"
    );
}

/// A claim granted while another agent's was certainly live (claimed 20 ms before, TTL 4 s, no
/// release sent) is two holders at once, even with rising fences and the first holder's later
/// release correctly refused — which every fence rule accepts. An ambiguous release sent before
/// the second claim, or a second claim after the TTL, explains it.
#[test]
fn t71_two_holders_at_once_are_reported_even_with_rising_fences() {
    let release = release_of_first();
    let history = |second_claim_at: u64, release_before: bool| {
        let mut h = H::default();
        h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
        if release_before {
            h.ambiguous("a0", release.clone(), 15);
        }
        let at = second_claim_at;
        h.ok("a1", claim_of("a1"), at, at + 10, lease_of(2));
        if !release_before {
            h.refused("a0", release.clone(), at + 20, at + 30, "LEASE_LOST");
        }
        let end = at + 100;
        h.ok(
            "final",
            Input::ListTasks,
            end,
            end + 10,
            Output::Tasks(vec![("task-0".into(), "open".into(), 2)]),
        );
        board::check(&h.ops, end * 1000)
    };
    let violations = history(20, false);
    assert_eq!(rules(&violations), ["exclusive-hold"], "{violations:?}");
    assert_eq!(violations[0].ops, vec![0, 1]);
    let ttl = board::TTL_MS as u64;
    for (at, release_before) in [(20, true), (ttl + 100, false)] {
        let violations = history(at, release_before);
        assert!(
            violations.is_empty(),
            "{at} {release_before}: {violations:?}"
        );
    }
    // The same rule guards side-effect holds and queue permits.
    let mut h = H::default();
    h.ok("h0", acquire("h0/1"), 0, 10, granted(1));
    h.ok("h1", acquire("h1/1"), 20, 30, granted(2));
    let violations = effect::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["exclusive-hold"], "{violations:?}");
    let mut h = H::default();
    let lease = |worker: &str| Input::Lease {
        worker: worker.into(),
    };
    h.ok("w0", lease("w0"), 10, 20, leased(1, "key-0", Some(7), None));
    h.ok("w1", lease("w1"), 30, 40, leased(2, "key-0", Some(8), None));
    let violations = queue::check(&h.ops, 100_000);
    assert_reported(&violations, "exclusive-hold", true);
    // Both to one worker (its start failed, it leased again while its own permit was live):
    // held twice all the same.
    let mut h = H::default();
    for (call, task, token) in [(10, 1, 7), (30, 2, 8)] {
        h.ok(
            "w0",
            lease("w0"),
            call,
            call + 10,
            leased(task, "key-0", Some(token), None),
        );
    }
    let violations = queue::check(&h.ops, 100_000);
    assert!(
        rules(&violations).contains(&"exclusive-hold"),
        "one worker: {violations:?}"
    );
}

/// A claim applied long after it was sent (a retry across a failover) holds from its apply: with
/// the deadlines the answers carry, a later grant before that lease's store deadline is two
/// holders at once, though counted from the first claim's sending its TTL had run out (which
/// the client-clock rule alone let pass). A renewal's deadline counts too; past the deadline, or
/// after a release sent before, the later grant is legal.
#[test]
fn t71_two_holders_are_judged_on_the_store_clock_when_answers_carry_deadlines() {
    let ttl = board::TTL_MS as u64;
    let claimed = |fence: u64, until_ms: u64| Output::Lease {
        fence,
        token: format!("t{fence}"),
        until_ms: Some(until_ms),
    };
    // The first claim, sent at 0 and answered at 3,050 ms; applied at store time 13,000 (so
    // live until 13,000 + TTL). The second is sent at 5,000, past TTL after the first's sending.
    let history = |second_applied_at: u64, renewed_until: Option<u64>, released: bool| {
        let mut h = H::default();
        h.ok("a0", claim_of("a0"), 0, 3_050, claimed(1, 13_000 + ttl));
        if let Some(until) = renewed_until {
            h.ok(
                "a0",
                Input::RenewTask {
                    task: "task-0".into(),
                    token: "t1".into(),
                    fence: 1,
                },
                3_100,
                3_110,
                claimed(1, until),
            );
        }
        if released {
            h.ambiguous("a0", release_of_first(), 4_000);
        }
        h.ok(
            "a1",
            claim_of("a1"),
            ttl + 1_000,
            ttl + 1_010,
            claimed(2, second_applied_at + ttl),
        );
        h.ok(
            "final",
            Input::ListTasks,
            20_000,
            20_010,
            Output::Tasks(vec![("task-0".into(), "open".into(), 2)]),
        );
        board::check(&h.ops, 20_000_000)
    };
    // Applied at store time 15,000, within the first lease (13,000 + TTL).
    let violations = history(15_000, None, false);
    assert_eq!(rules(&violations), ["exclusive-hold"], "{violations:?}");
    assert_eq!(violations[0].ops, vec![0, 1]);
    // At or past the first lease's store deadline: legal.
    assert!(history(13_000 + ttl, None, false).is_empty());
    // A renewal that moved the first lease past the second's apply makes that a violation.
    let renewed = history(13_000 + ttl + 500, Some(13_000 + ttl + 1_000), false);
    assert_eq!(rules(&renewed), ["exclusive-hold"], "{renewed:?}");
    // A release sent before explains it.
    assert!(history(15_000, None, true).is_empty());
    // The later grant's own renewal says nothing of when it was granted: still two holders.
    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 3_050, claimed(1, 13_000 + ttl));
    h.ok("a1", claim_of("a1"), 5_000, 5_010, claimed(2, 15_000 + ttl));
    h.ok(
        "a1",
        Input::RenewTask {
            task: "task-0".into(),
            token: "t2".into(),
            fence: 2,
        },
        7_000,
        7_010,
        claimed(2, 30_000 + ttl),
    );
    h.ok(
        "final",
        Input::ListTasks,
        20_000,
        20_010,
        Output::Tasks(vec![("task-0".into(), "claimed".into(), 2)]),
    );
    let violations = board::check(&h.ops, 20_000_000);
    assert_eq!(rules(&violations), ["exclusive-hold"], "{violations:?}");
}

/// A queue permit is judged on the store clock too: a lease applied long after it was sent (a
/// retry across a failover) holds from its apply, so another worker's lease of the same key
/// before that lease's store deadline is two holders at once, though counted from the first
/// lease's sending its TTL had run out (which the client-clock rule alone let pass).
#[test]
fn t71_queue_permits_are_judged_on_the_store_clock() {
    let ttl = queue::LEASE_TTL_MS as u64;
    let lease = |worker: &str| Input::Lease {
        worker: worker.into(),
    };
    let history = |deadlines: bool, second_applied_at: u64| {
        let until = |applied_at: u64| deadlines.then_some(applied_at + ttl);
        let mut h = H::default();
        // Sent at 0, applied at store time 5,000, answered at 5,010.
        h.ok(
            "w0",
            lease("w0"),
            0,
            5_010,
            leased(1, "key-0", Some(7), until(5_000)),
        );
        h.ok(
            "w1",
            lease("w1"),
            5_100,
            5_200,
            leased(2, "key-0", Some(8), until(second_applied_at)),
        );
        queue::check(&h.ops, 100_000_000)
    };
    let holds = |violations: Vec<Violation>| {
        violations
            .iter()
            .filter(|v| v.rule == "exclusive-hold")
            .map(|v| v.ops.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(holds(history(true, 5_150)), [vec![0, 1]]);
    assert!(holds(history(true, 5_000 + ttl)).is_empty());
    // Without the deadlines, the same history passes.
    assert!(holds(history(false, 5_150)).is_empty());
}

/// Replicas agree: members seen at one applied index with different state digests are
/// reported, naming them; members seen only at different indexes, or agreeing, are not.
#[test]
fn t71_members_with_different_states_at_one_index_are_reported() {
    let seen = |answers: &[(u64, u64, &str)]| {
        let mut seen = SeenDigests::default();
        for (index, node, digest) in answers {
            let answer = StateDigestResponse {
                applied_index: *index,
                digest: digest.to_string(),
            };
            seen.record(*node, &answer);
        }
        robustness::digests_disagree(&seen)
    };
    let differ = seen(&[(7, 1, "aa"), (7, 2, "aa"), (7, 3, "bb"), (8, 1, "cc")]);
    assert_eq!(rules(&differ), ["replicas-agree"], "{differ:?}");
    assert!(differ[0].detail.contains("index 7"), "{differ:?}");
    assert!(differ[0].detail.contains("node 3: bb"), "{differ:?}");
    assert!(seen(&[(7, 1, "aa"), (7, 2, "aa"), (7, 3, "aa")]).is_empty());
    assert!(seen(&[(7, 1, "aa"), (8, 2, "bb"), (9, 3, "cc")]).is_empty());
}

/// A token handed out twice — for another generation of one ticket, or a claim of another
/// task — is reported: the older holder could act as the newer (a reply with it would close the
/// new generation, which the ticket model accepts as the token matches). Distinct tokens pass.
#[test]
fn t71_a_token_handed_out_for_two_grants_is_reported() {
    let takes = |second_token: &str| {
        let mut h = H::default();
        h.ok("c0", offer("k"), 0, 10, ticket(1, "offered", None));
        h.ok("c1", take("k"), 20, 30, handle(1, "tok-a"));
        h.ok(
            "c1",
            Input::Reply {
                key: "k".into(),
                token: "tok-a".into(),
            },
            40,
            50,
            Output::Done,
        );
        h.ok("c0", offer("k"), 60, 70, ticket(2, "offered", None));
        h.ok("c1", take("k"), 80, 90, handle(2, second_token));
        h.ok(
            "final",
            read("k"),
            100,
            110,
            ticket(2, "accepted", Some("dst")),
        );
        handoff::check(&h.ops, 100_000)
    };
    let violations = takes("tok-a");
    assert_eq!(rules(&violations), ["unique-token"], "{violations:?}");
    assert_eq!(violations[0].ops, vec![1, 4]);
    assert!(takes("tok-b").is_empty(), "{:?}", takes("tok-b"));

    let claims = |second_token: &str| {
        let mut h = H::default();
        let lease = |fence: u64, token: &str| Output::Lease {
            fence,
            token: token.into(),
            until_ms: None,
        };
        h.ok("a0", claim_of("a0"), 0, 10, lease(1, "tok-a"));
        let other = Input::Claim {
            task: "task-1".into(),
            agent: "a1".into(),
        };
        h.ok("a1", other, 20, 30, lease(1, second_token));
        h.ok(
            "final",
            Input::ListTasks,
            100,
            110,
            Output::Tasks(vec![
                ("task-0".into(), "claimed".into(), 1),
                ("task-1".into(), "claimed".into(), 1),
            ]),
        );
        board::check(&h.ops, 100_000)
    };
    assert_eq!(rules(&claims("tok-a")), ["unique-token"]);
    assert!(claims("tok-b").is_empty(), "{:?}", claims("tok-b"));
}

/// Two claims racing (their calls overlap) both granted is two holders at once: fences are minted
/// in apply order, so the lower-fence grant was applied first and was live when the other was.
/// (Before, a pair was judged only when the first grant returned before the second was sent.)
#[test]
fn t71_two_overlapping_grants_are_two_holders_at_once() {
    let race = |second_fence: u64| {
        let mut h = H::default();
        h.ok("a0", claim_of("a0"), 0, 30, lease_of(1));
        h.ok("a1", claim_of("a1"), 10, 20, lease_of(second_fence));
        h.ok(
            "final",
            Input::ListTasks,
            100,
            110,
            Output::Tasks(vec![("task-0".into(), "open".into(), 2)]),
        );
        board::check(&h.ops, 100_000)
    };
    let violations = race(2);
    assert_reported(&violations, "exclusive-hold", true);
    let exclusive: Vec<_> = violations
        .iter()
        .filter(|v| v.rule == "exclusive-hold")
        .collect();
    assert_eq!(exclusive[0].ops, vec![0, 1]);
    // The second call answered first but with the lower fence: it was applied first, and the
    // other grant came while it was live.
    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 30, lease_of(2));
    h.ok("a1", claim_of("a1"), 10, 20, lease_of(1));
    let violations = board::check(&h.ops, 100_000);
    let exclusive: Vec<_> = violations
        .iter()
        .filter(|v| v.rule == "exclusive-hold")
        .collect();
    assert_eq!(exclusive.len(), 1, "{violations:?}");
    assert_eq!(exclusive[0].ops, vec![1, 0]);
    // A release of the first grant sent before the second returned explains the pair.
    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 5, lease_of(1));
    h.ambiguous("a0", release_of_first(), 8);
    h.ok("a1", claim_of("a1"), 3, 20, lease_of(2));
    let violations = board::check(&h.ops, 100_000);
    assert_reported(&violations, "exclusive-hold", false);
}

/// An error no fault explains is a violation by itself (its effect stays unknown to the other
/// rules); a timeout is not.
#[test]
fn t71_an_error_no_fault_explains_is_reported() {
    let mut h = H::default();
    h.ambiguous("a0", claim_of("a0"), 0);
    assert!(check::unexpected_errors(&h.ops).is_empty());
    h.op(
        "a1",
        claim_of("a1"),
        10,
        None,
        Outcome::Unexpected("server error SEQ_REUSED: another request's answer".into()),
    );
    let violations = check::unexpected_errors(&h.ops);
    assert_eq!(rules(&violations), ["unexpected-error"], "{violations:?}");
    assert_eq!(violations[0].ops, vec![1]);
    assert!(
        violations[0].detail.contains("SEQ_REUSED"),
        "{violations:?}"
    );
    // Unknown in effect for the other rules: the unexpected claim may hold the task.
    assert!(h.ops[1].is_ambiguous());
}

/// The recorder tells a fault's errors (no answer, a forgotten session) from the rest.
#[tokio::test]
async fn t71_the_recorder_records_only_a_fault_s_errors_as_ambiguous() {
    let rec = Recorder::new(Clock::start());
    let errors = [
        Error::Unavailable {
            endpoints: vec!["127.0.0.1:1".into()],
            waited: Duration::from_secs(1),
            last: "connection refused".into(),
        },
        Error::OutcomeUnknown("seq 3 is older than the session remembers".into()),
        Error::Server {
            code: "SEQ_REUSED".into(),
            message: "another request's answer".into(),
        },
        Error::Protocol("undecodable answer".into()),
    ];
    for error in errors {
        let _ = rec
            .record("a0", claim_of("a0"), async { Err::<(), _>(error) }, |_| {
                Output::Done
            })
            .await;
    }
    let kinds: Vec<&str> = rec
        .finish()
        .iter()
        .map(|op| match op.outcome {
            Outcome::Ambiguous(_) => "ambiguous",
            Outcome::Unexpected(_) => "unexpected",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["ambiguous", "ambiguous", "unexpected", "unexpected"]
    );
}

/// A new recorder holding the operations of `rec` that `keep` keeps, recorded after the moment
/// it returns with it.
fn recorded_again(rec: &Recorder, keep: impl Fn(&Op) -> bool) -> (Recorder, u64) {
    let again = Recorder::new(Clock::start());
    let since = again.clock().now();
    for op in rec.finish().into_iter().filter(|op| keep(op)) {
        let index = again.invoke("c", op.input);
        again.complete(index, op.outcome);
    }
    (again, since)
}

/// After recovery every workload but handoff must get a grant again: prompt refusals alone (every
/// acquire `contended`, as from a store that stopped freeing holds) are reported for that
/// workload. The queue needs a lease on each concurrency key: one key's leases do not hide the
/// other's permit never freed.
#[tokio::test]
async fn t71_recovery_needs_a_grant_not_just_answers() {
    let rec = Recorder::new(Clock::start());
    let since = rec.clock().now();
    let acquire = || Input::Acquire {
        key: "h0/1".into(),
        resource: "res-0".into(),
    };
    let mut all = vec![
        (claim_of("a0"), Outcome::Ok(lease_of(1))),
        (
            Input::Take {
                key: "ticket-0".into(),
                to: "B".into(),
            },
            // Handoff needs only an answer: a ticket whose take's answer was lost stays taken.
            Outcome::Refused("TAKEN".into()),
        ),
        (
            Input::Lease {
                worker: "w0".into(),
            },
            Outcome::Ok(leased(1, "key-0", Some(1), None)),
        ),
        (
            Input::Lease {
                worker: "w1".into(),
            },
            Outcome::Ok(leased(2, "key-1", Some(1), None)),
        ),
        (
            Input::SaveCheckpoint {
                run: "run-0".into(),
                seq: 1,
                data: "d".into(),
            },
            Outcome::Ok(Output::Done),
        ),
    ];
    all.push((
        acquire(),
        Outcome::Ok(Output::NotGranted("contended".into())),
    ));
    for (input, outcome) in all {
        let index = rec.invoke("c", input);
        rec.complete(index, outcome);
    }
    let limit = Duration::from_millis(100);
    let violations = available_again(&rec, since, limit).await;
    assert_eq!(
        rules(&violations),
        ["available-after-recovery"],
        "{violations:?}"
    );
    assert_eq!(violations[0].key, "effect+sink");
    let index = rec.invoke("c", acquire());
    rec.complete(
        index,
        Outcome::Ok(Output::Granted {
            fence: 1,
            holder: "h0/1".into(),
            until_ms: None,
        }),
    );
    assert!(available_again(&rec, since, limit).await.is_empty());

    // Without the lease on key-1, that key alone is reported.
    let (one_key, since_one) = recorded_again(&rec, |op| !queue::leased_on(op, "key-1"));
    let violations = available_again(&one_key, since_one, limit).await;
    assert_eq!(
        rules(&violations),
        ["available-after-recovery"],
        "{violations:?}"
    );
    assert_eq!(violations[0].key, "queue key-1");
    // Without any lease, the queue is reported once, not once more per key.
    let (no_queue, since_none) =
        recorded_again(&rec, |op| !matches!(op.input, Input::Lease { .. }));
    let violations = available_again(&no_queue, since_none, limit).await;
    let keys: Vec<&str> = violations.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys, ["queue"], "{violations:?}");

    // A change the handoff watch delivered is not an answer: it may have been made before the
    // faults.
    let (watched, since) = recorded_again(&rec, |op| !matches!(op.input, Input::Take { .. }));
    watched.observe(
        handoff_watch::NAME,
        ticket_change("offered", "ticket-0", "", 1),
        Output::Position {
            revision: 1,
            index: 0,
        },
    );
    let violations = available_again(&watched, since, limit).await;
    assert_eq!(
        rules(&violations),
        ["available-after-recovery"],
        "{violations:?}"
    );
    assert_eq!(violations[0].key, "handoff");
}

/// A refused release ended nothing: a grant given while the refused one's holder still held it
/// is two holders at once. (Before, any release counted as an end, refused or not.)
#[test]
fn t71_a_refused_release_does_not_end_a_hold() {
    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
    h.refused("a0", release_of_first(), 15, 18, "LEASE_LOST");
    h.ok("a1", claim_of("a1"), 20, 30, lease_of(2));
    h.ok(
        "final",
        Input::ListTasks,
        100,
        110,
        Output::Tasks(vec![("task-0".into(), "open".into(), 2)]),
    );
    let violations = board::check(&h.ops, 100_000);
    assert_reported(&violations, "exclusive-hold", true);
}

/// An effect's completion keeps its resource held (only a release or the TTL frees it): a grant
/// to another holder between a completion and its release is two holders at once.
#[test]
fn t71_an_effect_completion_does_not_end_its_hold() {
    let ending = |release: bool| {
        let (key, resource, fence) = ("h0/1".to_string(), "res-0".to_string(), 1);
        if release {
            Input::ReleaseEffect {
                key,
                resource,
                fence,
            }
        } else {
            Input::CompleteEffect {
                key,
                resource,
                fence,
            }
        }
    };
    for release in [false, true] {
        let mut h = H::default();
        h.ok("h0", acquire("h0/1"), 0, 10, granted(1));
        h.ok("h0", ending(release), 12, 15, Output::Done);
        h.ok("h1", acquire("h1/1"), 20, 30, granted(2));
        let violations = effect::check(&h.ops, 100_000);
        assert_reported(&violations, "exclusive-hold", !release);
    }
}

/// A refusal a correct store never gives the call (an unknown seeded task, a mismatched resource
/// on a fresh key, an unknown registered worker) is reported; the refusals the workloads expect
/// are not, and the workloads whose models judge every refusal are left to them.
#[test]
fn t71_a_refusal_no_correct_store_gives_is_reported() {
    let mut h = H::default();
    h.refused("a0", claim_of("a0"), 0, 10, "TAKEN");
    h.refused("a0", release_of_first(), 10, 20, "LEASE_LOST");
    h.refused(
        "h0",
        write("sink-effect-res-0", 1, "h0/1"),
        20,
        30,
        "FENCE_STALE",
    );
    h.refused("c0", take("ticket-0"), 30, 40, "EXPIRED");
    assert!(check::unexpected_refusals(&h.ops).is_empty());
    h.refused("a1", claim_of("a1"), 40, 50, "UNKNOWN_TASK");
    h.refused("a1", claim_of("a1"), 50, 60, "UNKNOWN_TASK");
    h.refused("a1", claim_of("a1"), 60, 70, "UNKNOWN_TASK");
    h.refused(
        "h1",
        Input::Acquire {
            key: "h1/1".into(),
            resource: "res-0".into(),
        },
        70,
        80,
        "RESOURCE_MISMATCH",
    );
    h.refused(
        "w0",
        Input::Lease {
            worker: "w0".into(),
        },
        80,
        90,
        "UNKNOWN_WORKER",
    );
    let violations = check::unexpected_refusals(&h.ops);
    let ops: Vec<Vec<usize>> = violations.iter().map(|v| v.ops.clone()).collect();
    // Two shown of the three UNKNOWN_TASK, with the count.
    assert_eq!(ops, [vec![7], vec![4], vec![5], vec![8]], "{violations:?}");
    assert!(violations[1].detail.contains("3 such"), "{violations:?}");
    assert_eq!(rules(&violations), ["unexpected-refusal"]);
}

fn sink_read(resource: &str) -> Input {
    Input::SinkRead {
        resource: resource.into(),
    }
}

fn write(resource: &str, fence: u64, value: &str) -> Input {
    Input::SinkWrite {
        resource: resource.into(),
        fence,
        value: value.into(),
    }
}

fn sink(seen_fence: u64, writes: u64, value: &str) -> Output {
    Output::Sink {
        seen_fence,
        writes,
        value: value.into(),
    }
}

#[test]
fn t71_a_stale_fence_write_applied_is_reported() {
    let r = effect::sink_of("res-0");
    let mut h = H::default();
    h.ok("h0", write(&r, 2, "b"), 0, 10, sink(2, 1, ""));
    h.ok("h1", write(&r, 1, "a"), 20, 30, sink(1, 2, ""));
    h.ok("final", sink_read(&r), 100, 110, sink(1, 2, "a"));
    let violations = effect::check(&h.ops, 100_000);
    assert_eq!(
        rules(&violations),
        ["lost-ack", "stale-write-applied"],
        "{violations:?}"
    );
}

#[test]
fn t71_sink_refusals_counts_and_final_values_are_judged() {
    let r = effect::sink_of("res-0");
    let mut h = H::default();
    h.ok("h0", write(&r, 1, "a"), 0, 10, sink(1, 1, ""));
    // Refused although nobody presented a higher fence.
    h.refused("h1", write(&r, 1, "b"), 20, 30, "FENCE_STALE");
    h.ambiguous("h2", write(&r, 3, "c"), 40);
    // A value nobody wrote, and more writes than the history allows.
    h.ok("final", sink_read(&r), 100, 110, sink(3, 5, "z"));
    let violations = effect::check(&h.ops, 100_000);
    assert_eq!(
        rules(&violations),
        [
            "sink-final-value",
            "sink-write-count",
            "unexplained-fence-stale"
        ],
        "{violations:?}"
    );
    // The ambiguous write at fence 3 is a legal final state.
    let last = h.ops.len() - 1;
    h.ops[last].outcome = Outcome::Ok(sink(3, 2, "c"));
    h.ops[1].outcome = Outcome::Ok(sink(1, 2, ""));
    let violations = effect::check(&h.ops, 100_000);
    assert!(violations.is_empty(), "{violations:?}");
}

/// A `FENCE_STALE` refusal proves the sink held a higher fence, also when the write that raised
/// it went unanswered: a lower write accepted after the refusal, and a final fence no higher
/// than the refused one, are reported (only acknowledged writes were compared before, so this
/// history passed).
#[test]
fn t71_a_refusal_is_evidence_of_the_unanswered_write_that_explains_it() {
    let r = effect::sink_of("res-0");
    let history = |late_fence: u64| {
        let mut h = H::default();
        h.ambiguous("h0", write(&r, 5, "e"), 0);
        h.refused("h1", write(&r, 4, "d"), 12, 13, "FENCE_STALE");
        h.ok(
            "h2",
            write(&r, late_fence, "x"),
            14,
            15,
            sink(late_fence, 2, ""),
        );
        h.ok("final", sink_read(&r), 100, 110, sink(late_fence, 2, "x"));
        effect::check(&h.ops, 100_000)
    };
    let violations = history(3);
    assert_eq!(
        rules(&violations),
        ["lost-ack", "stale-write-applied"],
        "{violations:?}"
    );
    assert!(
        violations.iter().all(|v| v.ops.contains(&1)),
        "{violations:?}"
    );
    // A higher fence after the refusal is what a correct store accepts.
    let legal = history(6);
    assert!(legal.is_empty(), "{legal:?}");
}

/// An acknowledged sink write whose answer names another fence than the one it presented: the
/// write and "highest seen = presented" were not one step. Reported.
#[test]
fn t71_a_sink_write_answering_another_seen_fence_is_reported() {
    let r = effect::sink_of("res-0");
    let history = |seen: u64| {
        let mut h = H::default();
        h.ok("h0", write(&r, 2, "a"), 0, 10, sink(seen, 1, ""));
        h.ok("final", sink_read(&r), 100, 110, sink(2, 1, "a"));
        effect::check(&h.ops, 100_000)
    };
    assert!(history(2).is_empty(), "{:?}", history(2));
    let violations = history(5);
    assert_eq!(rules(&violations), ["sink-seen-fence"], "{violations:?}");
    assert_eq!(violations[0].ops, vec![0]);
}

/// A resource nobody wrote that holds a value after recovery: a write from nowhere. Reported;
/// not found is what it must answer.
#[test]
fn t71_a_value_in_a_sink_nobody_wrote_is_reported() {
    let r = effect::sink_of("res-1");
    let read = sink_read(&r);
    let mut h = H::default();
    h.ok("final", read.clone(), 100, 110, sink(5, 1, "ghost"));
    let violations = effect::check(&h.ops, 100_000);
    assert_reported(&violations, "sink-final-value", true);
    let mut h = H::default();
    h.refused("final", read, 100, 110, "NOT_FOUND");
    assert!(effect::check(&h.ops, 100_000).is_empty());
}

#[test]
fn t71_an_acquire_applied_twice_and_a_lost_completion_are_reported() {
    let mut h = H::default();
    let acquire = Input::Acquire {
        key: "holder-0/1".into(),
        resource: "res-0".into(),
    };
    h.ok(
        "h0",
        acquire,
        0,
        10,
        Output::NotGranted("in_progress".into()),
    );
    h.ok(
        "h1",
        Input::CompleteEffect {
            key: "holder-1/1".into(),
            resource: "res-1".into(),
            fence: 1,
        },
        20,
        30,
        Output::Result("holder-1/1".into()),
    );
    h.ok(
        "final",
        Input::ShowAction {
            key: "holder-1/1".into(),
        },
        100,
        110,
        Output::Action {
            status: "in_progress".into(),
            fence: 1,
            result: None,
        },
    );
    let violations = effect::check(&h.ops, 100_000);
    assert_eq!(
        rules(&violations),
        ["fresh-key-acquire", "lost-ack"],
        "{violations:?}"
    );
}

/// A store that recorded (and echoed) a result nobody submitted is caught on the answer itself
/// (`wrong-result`, also in a run that did not recover); one that answered the submitted result
/// and then lost it, after recovery (`lost-ack`).
#[test]
fn t71_a_completion_recorded_with_another_result_is_reported() {
    let complete = Input::CompleteEffect {
        key: "holder-1/1".into(),
        resource: "res-1".into(),
        fence: 1,
    };
    let shown = |result: &str| Output::Action {
        status: "completed".into(),
        fence: 1,
        result: Some(result.into()),
    };
    let show = Input::ShowAction {
        key: "holder-1/1".into(),
    };
    for (answered, recorded, wrong) in [
        ("holder-1/1", "holder-1/1", None),
        ("garbage", "garbage", Some("wrong-result")),
        ("holder-1/1", "garbage", Some("lost-ack")),
    ] {
        let mut h = H::default();
        h.ok(
            "h1",
            complete.clone(),
            20,
            30,
            Output::Result(answered.into()),
        );
        h.ok("final", show.clone(), 100, 110, shown(recorded));
        let violations = effect::check(&h.ops, 100_000);
        assert_eq!(
            rules(&violations),
            Vec::from_iter(wrong),
            "{answered} {recorded}: {violations:?}"
        );
    }
}

#[test]
fn t71_an_unresolved_intent_granted_afresh_or_still_in_progress_late_is_reported() {
    let mut h = H::default();
    let acquire = |key: &str, resource: &str| Input::Acquire {
        key: key.into(),
        resource: resource.into(),
    };
    let complete = |key: &str, resource: &str| Input::CompleteEffect {
        key: key.into(),
        resource: resource.into(),
        fence: 1,
    };
    // No holder identities: the store mints one per grant, and one shared by these grants
    // would be unique-token's to report.
    let granted = || Output::Granted {
        fence: 1,
        holder: String::new(),
        until_ms: None,
    };
    // a/1: its completion refused; a/2: never completed; a/3: its completion unanswered (it may
    // have been applied); a/4: granted just before the workloads stopped. All four unresolved.
    h.ok("h0", acquire("a/1", "res-0"), 0, 10, granted());
    h.refused("h0", complete("a/1", "res-0"), 20, 30, "FENCE_STALE");
    h.ok("h0", acquire("a/2", "res-1"), 40, 50, granted());
    h.ok("h0", acquire("a/3", "res-2"), 60, 70, granted());
    h.ambiguous("h0", complete("a/3", "res-2"), 80);
    h.ok("h0", acquire("a/4", "res-3"), 90, 95, granted());
    let unresolved: Vec<String> = effect::unresolved_keys(&h.ops)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(unresolved, ["a/1", "a/2", "a/3", "a/4"]);

    // After recovery (from 100 ms): a/4 still in progress at once is legal, so is a/2 uncertain;
    // a/1 granted afresh and a/2 in progress long after its intent ran out are not.
    let not = |outcome: &str| Output::NotGranted(outcome.into());
    h.ok(
        "final",
        acquire("a/4", "res-3"),
        100,
        105,
        not("in_progress"),
    );
    h.ok(
        "final",
        acquire("a/2", "res-1"),
        5_000,
        5_010,
        not("uncertain"),
    );
    h.ok(
        "final",
        acquire("a/1", "res-0"),
        5_000,
        5_010,
        Output::Granted {
            fence: 2,
            holder: "h2".into(),
            until_ms: None,
        },
    );
    h.ok(
        "final",
        acquire("a/2", "res-1"),
        9_000,
        9_010,
        not("in_progress"),
    );
    // a/3's unanswered completion may have been applied: completed is legal for it alone.
    h.ok(
        "final",
        acquire("a/3", "res-2"),
        9_000,
        9_010,
        Output::Result("a/3".into()),
    );
    h.ok(
        "final",
        acquire("a/1", "res-0"),
        9_100,
        9_110,
        Output::Result("a/1".into()),
    );
    let violations = effect::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["intent-expiry"], "{violations:?}");
    let keys: Vec<&str> = violations.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys, ["a/1", "a/1", "a/2"], "{violations:?}");
    assert!(violations[0].ops.contains(&0) && violations[0].ops.contains(&8));

    // Nothing answered after recovery: nothing was checked, and that is reported.
    let mut h = H::default();
    h.ok("h0", acquire("a/1", "res-0"), 0, 10, granted());
    h.ambiguous("final", acquire("a/1", "res-0"), 5_000);
    let violations = effect::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["intent-expiry"], "{violations:?}");
    assert!(
        violations[0].detail.contains("nothing was checked"),
        "{violations:?}"
    );
}

#[test]
fn t71_a_permit_token_granted_twice_and_a_lost_submission_are_reported() {
    let mut h = H::default();
    let lease = |worker: &str| Input::Lease {
        worker: worker.into(),
    };
    h.ok(
        "s",
        Input::Submit {
            idempotency_key: "s-1".into(),
            concurrency_key: "key-0".into(),
        },
        0,
        5,
        Output::Submitted {
            task: 1,
            replayed: false,
        },
    );
    h.ok("w0", lease("w0"), 10, 20, leased(1, "key-0", Some(7), None));
    h.ok("w1", lease("w1"), 30, 40, leased(2, "key-0", Some(7), None));
    h.ok(
        "final",
        Input::Attempts { task: 2 },
        100,
        110,
        Output::AttemptList {
            state: "LEASED".into(),
            attempts: vec![AttemptRecord {
                number: 1,
                worker: "w1".into(),
                token: Some(7),
                outcome: "ACTIVE".into(),
            }],
        },
    );
    let violations = queue::check(&h.ops, 100_000);
    assert_eq!(
        rules(&violations),
        ["increasing-fence", "lost-ack", "unique-grant"],
        "{violations:?}"
    );
}

/// After recovery, two tasks of one concurrency key both with an active attempt is two holders
/// of the key's permit: reported, whatever their tokens. One active and one ended is fine.
#[test]
fn t71_two_active_attempts_on_one_key_after_recovery_are_reported() {
    let attempts = |second_outcome: &str| {
        let mut h = H::default();
        for (task, token, outcome) in [(1, 7, "ACTIVE"), (2, 8, second_outcome)] {
            h.ok(
                "s",
                Input::Submit {
                    idempotency_key: format!("s-{task}"),
                    concurrency_key: "key-0".into(),
                },
                0,
                5,
                Output::Submitted {
                    task,
                    replayed: false,
                },
            );
            h.ok(
                "final",
                Input::Attempts { task },
                100,
                110,
                Output::AttemptList {
                    state: "RUNNING".into(),
                    attempts: vec![AttemptRecord {
                        number: 1,
                        worker: format!("w{task}"),
                        token: Some(token),
                        outcome: outcome.into(),
                    }],
                },
            );
        }
        queue::check(&h.ops, 100_000)
    };
    let violations = attempts("ACTIVE");
    assert_eq!(rules(&violations), ["one-active-attempt"], "{violations:?}");
    assert_eq!(violations[0].key, "key-0");
    let violations = attempts("FAILED");
    assert_reported(&violations, "one-active-attempt", false);
}

/// A run proves nothing when no fault was injected or a workload never got a grant: a store that
/// answered every claim TAKEN passes every exclusivity rule. Both are reported.
#[test]
fn t71_a_run_without_faults_or_grants_is_reported() {
    let mut h = H::default();
    h.refused("a0", claim_of("a0"), 0, 10, "TAKEN");
    h.refused("a1", claim_of("a1"), 20, 30, "TAKEN");
    let violations = progress(&h.ops, 0);
    let keys: Vec<&str> = violations.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys, ["nemesis", "board"], "{violations:?}");
    assert_eq!(rules(&violations), ["progress"]);
    h.ok("a2", claim_of("a2"), 40, 50, lease_of(1));
    assert!(progress(&h.ops, 1).is_empty());
}

/// A keyed lease without its permit token (or with token 0, or an unkeyed one with a token), and a
/// renewal that answers another token, are reported: the fence rules never see them.
#[test]
fn t71_a_lease_without_its_permit_and_a_renewal_changing_the_token_are_reported() {
    let mut h = H::default();
    for (worker, task, key, token) in [
        ("w0", 1, "key-0", None),
        ("w1", 2, "key-1", Some(0)),
        ("w2", 3, "", Some(4)),
    ] {
        h.ok(
            worker,
            Input::Lease {
                worker: worker.into(),
            },
            10 * task,
            10 * task + 5,
            leased(task, key, token, None),
        );
    }
    let violations = queue::check(&h.ops, 100_000);
    let flagged: Vec<&str> = violations
        .iter()
        .filter(|v| v.rule == "permit-token")
        .map(|v| v.key.as_str())
        .collect();
    assert_eq!(flagged, ["key-0", "key-1", ""], "{violations:?}");

    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
    h.ok(
        "a0",
        Input::RenewTask {
            task: "task-0".into(),
            token: "t1".into(),
            fence: 1,
        },
        20,
        30,
        Output::Lease {
            fence: 1,
            token: "z".into(),
            until_ms: None,
        },
    );
    h.ok(
        "final",
        Input::ListTasks,
        100,
        110,
        Output::Tasks(vec![("task-0".into(), "claimed".into(), 1)]),
    );
    let violations = board::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["renew-keeps-fence"], "{violations:?}");
}

/// A take nobody saw the token of cannot be replied to: every reply presents a token an
/// acknowledged take gave out (or none). A ticket closed after an ambiguous take and an
/// ambiguous reply with another token means a wrong token was accepted.
#[test]
fn t71_a_reply_cannot_match_a_take_whose_token_nobody_saw() {
    let mut h = H::default();
    h.ok("c0", offer("k"), 0, 10, ticket(1, "offered", None));
    h.ambiguous("c1", take("k"), 20);
    h.ambiguous(
        "c2",
        Input::Reply {
            key: "k".into(),
            token: "t0-stale".into(),
        },
        30,
    );
    h.ok("final", read("k"), 100, 110, ticket(1, "closed", None));
    let violations = handoff::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["linearizable"], "{violations:?}");
    // Left accepted, the same history is legal.
    h.ops[3].outcome = Outcome::Ok(ticket(1, "accepted", Some("dst")));
    let violations = handoff::check(&h.ops, 100_000);
    assert!(violations.is_empty(), "{violations:?}");
}

/// An acquire of `key` on the resource `res-0`.
fn acquire(key: &str) -> Input {
    Input::Acquire {
        key: key.into(),
        resource: "res-0".into(),
    }
}

/// An acquire's grant at `fence`.
fn granted(fence: u64) -> Output {
    Output::Granted {
        fence,
        holder: String::new(),
        until_ms: None,
    }
}

/// The release of the first claim of `task-0` (fence 1, token `t1`).
fn release_of_first() -> Input {
    Input::ReleaseTask {
        task: "task-0".into(),
        token: "t1".into(),
        fence: 1,
    }
}

fn claim_of(agent: &str) -> Input {
    Input::Claim {
        task: "task-0".into(),
        agent: agent.into(),
    }
}

fn lease_of(fence: u64) -> Output {
    Output::Lease {
        fence,
        token: format!("t{fence}"),
        until_ms: None,
    }
}

/// The rules `board::check` reports for `h`, with the final listing (after `end` ms) showing
/// `fence` so the durability rule is satisfied.
fn board_rules(mut h: H, end: u64, fence: u64) -> Vec<String> {
    h.ok(
        "final",
        Input::ListTasks,
        end,
        end + 10,
        Output::Tasks(vec![("task-0".into(), "open".into(), fence)]),
    );
    let violations = board::check(&h.ops, end * 1000);
    let mut rules: Vec<String> = violations.iter().map(|v| v.rule.clone()).collect();
    rules.sort();
    rules.dedup();
    rules
}

/// `TAKEN` needs a claim that may have held the task meanwhile: one acknowledged and not yet
/// released or expired, or one whose outcome is unknown that may have won a fence the final
/// listing counts and held it then. A store that answers `TAKEN` for a free task (a stale
/// judgement made without a log entry) passes every grant rule.
#[test]
fn t71_taken_for_a_free_task_is_reported() {
    let ttl = board::TTL_MS as u64;
    // Nobody ever claimed it.
    let mut h = H::default();
    h.refused("a0", claim_of("a0"), 0, 10, "TAKEN");
    assert_eq!(board_rules(h, 100, 0), ["unexplained-taken"]);
    // Held by a1: explained.
    let mut h = H::default();
    h.ok("a1", claim_of("a1"), 0, 5, lease_of(1));
    h.refused("a0", claim_of("a0"), 10, 20, "TAKEN");
    assert!(board_rules(h, 100, 1).is_empty());
    // Released (acknowledged) before the refused claim was sent.
    let mut h = H::default();
    h.ok("a1", claim_of("a1"), 0, 5, lease_of(1));
    h.ok("a1", release_of_first(), 6, 8, Output::Done);
    h.refused("a0", claim_of("a0"), 10, 20, "TAKEN");
    assert_eq!(board_rules(h, 100, 1), ["unexplained-taken"]);
    // Expired long before.
    let mut h = H::default();
    h.ok("a1", claim_of("a1"), 0, 5, lease_of(1));
    h.refused("a0", claim_of("a0"), ttl + 1_000, ttl + 1_010, "TAKEN");
    assert_eq!(board_rules(h, ttl + 2_000, 1), ["unexplained-taken"]);
    // A claim whose answer was lost may hold it: explained.
    let mut h = H::default();
    h.ambiguous("a1", claim_of("a1"), 0);
    h.refused("a0", claim_of("a0"), ttl + 1_000, ttl + 1_010, "TAKEN");
    assert!(board_rules(h, ttl + 2_000, 1).is_empty());
    // ... but only if it may have won: the final listing counts no fence it could hold.
    let mut h = H::default();
    h.ambiguous("a1", claim_of("a1"), 0);
    h.refused("a0", claim_of("a0"), ttl + 1_000, ttl + 1_010, "TAKEN");
    assert_eq!(board_rules(h, ttl + 2_000, 0), ["unexplained-taken"]);
    // ... and only while it may have held it: a fence it won lies below an acknowledged one,
    // applied after it, so it held the task until that claim's answer plus the TTL at most.
    let mut h = H::default();
    h.ambiguous("a1", claim_of("a1"), 0);
    h.ok("a2", claim_of("a2"), ttl + 100, ttl + 110, lease_of(2));
    h.ok(
        "a2",
        Input::ReleaseTask {
            task: "task-0".into(),
            token: "t2".into(),
            fence: 2,
        },
        ttl + 120,
        ttl + 130,
        Output::Done,
    );
    h.refused(
        "a0",
        claim_of("a0"),
        2 * ttl + 1_000,
        2 * ttl + 1_010,
        "TAKEN",
    );
    assert_eq!(board_rules(h, 2 * ttl + 2_000, 2), ["unexplained-taken"]);
    // Renewed (answered, or not) before its end, the same claim still holds it then.
    let renew = Input::RenewTask {
        task: "task-0".into(),
        token: "t1".into(),
        fence: 1,
    };
    for answered in [true, false] {
        let mut h = H::default();
        h.ok("a1", claim_of("a1"), 0, 5, lease_of(1));
        if answered {
            h.ok("a1", renew.clone(), ttl - 100, ttl - 90, lease_of(1));
        } else {
            h.ambiguous("a1", renew.clone(), ttl - 100);
        }
        h.refused("a0", claim_of("a0"), ttl + 1_000, ttl + 1_010, "TAKEN");
        assert!(
            board_rules(h, ttl + 2_000, 1).is_empty(),
            "renewal answered: {answered}"
        );
    }
    // A refused renewal extended nothing.
    let mut h = H::default();
    h.ok("a1", claim_of("a1"), 0, 5, lease_of(1));
    h.refused("a1", renew.clone(), ttl - 100, ttl - 90, "LEASE_LOST");
    h.refused("a0", claim_of("a0"), ttl + 1_000, ttl + 1_010, "TAKEN");
    assert_eq!(board_rules(h, ttl + 2_000, 1), ["unexplained-taken"]);
    // A fence won without an answer was applied after the acknowledged claim below it was sent:
    // a refusal that came back before then is not explained by it. Here fence 2 went to the
    // unanswered claim, so it was applied after a2's claim (fence 1, sent at 3 s), and cannot
    // explain a refusal answered at 1 s, when nothing held the task.
    let mut h = H::default();
    h.ambiguous("a1", claim_of("a1"), 0);
    h.refused("a0", claim_of("a0"), 900, 1_000, "TAKEN");
    h.ok("a2", claim_of("a2"), 3_000, 3_010, lease_of(1));
    assert_eq!(board_rules(h, ttl + 5_000, 2), ["unexplained-taken"]);
}

/// A listing during the run is a linearizable read: it shows at least the fence of every claim
/// acknowledged before it was sent, and no fence more claims than were sent could reach.
#[test]
fn t71_stale_and_phantom_listings_are_reported() {
    let listing = |fence| Output::Tasks(vec![("task-0".into(), "claimed".into(), fence)]);
    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
    h.ok("r", Input::ListTasks, 20, 30, listing(0));
    assert_eq!(board_rules(h, 100, 1), ["stale-read"]);
    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
    h.ok("r", Input::ListTasks, 20, 30, listing(2));
    assert_eq!(board_rules(h, 100, 2), ["phantom-fence"]);
    // Concurrent with the claim, either answer is fine.
    for seen in [0, 1] {
        let mut h = H::default();
        h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
        h.ok("r", Input::ListTasks, 5, 15, listing(seen));
        assert!(board_rules(h, 100, 1).is_empty(), "saw {seen}");
    }
    // A chain step's claims count for its listed fence as a task's do (a listing shows every
    // task): claimed once, fence 1 is no phantom; fence 2 is, and fence 0 after the claim's
    // answer is stale.
    for (seen, expected) in [
        (1, vec![]),
        (2, vec!["phantom-fence"]),
        (0, vec!["stale-read"]),
    ] {
        let mut h = H::default();
        h.ok("c0", claim_step("chain-0-0", "c0"), 0, 10, lease_of(1));
        h.ok(
            "r",
            Input::ListTasks,
            20,
            30,
            Output::Tasks(vec![("chain-0-0".into(), "claimed".into(), seen)]),
        );
        let violations = board::check(&h.ops, 100_000_000);
        let found: Vec<&str> = rules(&violations)
            .into_iter()
            .filter(|rule| *rule != "lost-ack")
            .collect();
        assert_eq!(found, expected, "saw {seen}: {violations:?}");
    }
}

fn save(seq: u64, data: &str) -> Input {
    Input::SaveCheckpoint {
        run: "run-0".into(),
        seq,
        data: data.into(),
    }
}

fn load() -> Input {
    Input::LoadCheckpoint {
        run: "run-0".into(),
    }
}

fn loaded(seq: u64, data: &str) -> Output {
    Output::Checkpoint {
        seq,
        data: data.into(),
    }
}

/// A legal checkpoint history: a load before any save finds nothing, an equal seq is stale, a
/// save racing a higher one may land first and be overtaken, an ambiguous save that did land
/// explains both a load of its data and a refusal of a lower seq, and the final load agrees.
fn legal_checkpoints() -> H {
    let mut h = H::default();
    h.refused("s0", load(), 0, 5, "NOT_FOUND");
    h.ok("s0", save(2, "a"), 10, 20, Output::Done);
    h.refused("s1", save(2, "b"), 30, 40, "STALE_SEQ");
    // Concurrent: 3 stored, then 4 over it; the load in between sees 3.
    h.ok("s0", save(3, "c"), 50, 70, Output::Done);
    h.ok("s1", save(4, "d"), 55, 80, Output::Done);
    h.ok("s2", load(), 56, 75, loaded(3, "c"));
    h.ambiguous("s1", save(6, "e"), 90);
    h.refused("s0", save(5, "f"), 100, 110, "STALE_SEQ");
    h.ok("final", load(), 200, 210, loaded(6, "e"));
    h
}

#[test]
fn t71_a_legal_checkpoint_history_passes() {
    let h = legal_checkpoints();
    let violations = checkpoint::check(&h.ops, 200_000);
    assert!(violations.is_empty(), "{violations:?}");
}

/// contract §4: a seq at or below the stored one is `STALE_SEQ` and writes nothing. A stale save
/// acknowledged, or a load showing a stale save's data, is no order of the operations.
#[test]
fn t71_a_stale_save_stored_is_reported() {
    let mut h = legal_checkpoints();
    h.ok("s2", save(1, "g"), 120, 130, Output::Done);
    let violations = checkpoint::check(&h.ops, 200_000);
    assert_eq!(rules(&violations), ["linearizable"], "{violations:?}");
    assert!(violations[0].stuck.contains(&9), "{violations:?}");

    // The refused save's data read back: it was written though refused.
    let mut h = legal_checkpoints();
    h.ok("s2", load(), 42, 48, loaded(2, "b"));
    let violations = checkpoint::check(&h.ops, 200_000);
    assert_eq!(rules(&violations), ["linearizable"], "{violations:?}");

    // A newer seq refused as stale while nothing as high was ever sent.
    let mut h = legal_checkpoints();
    h.refused("s2", save(9, "h"), 120, 130, "STALE_SEQ");
    let violations = checkpoint::check(&h.ops, 200_000);
    assert_eq!(rules(&violations), ["linearizable"], "{violations:?}");
}

/// contract §4: `load` of a run never saved is `NOT_FOUND`, and a saved run never goes back to
/// "not found"; an acknowledged save missing after recovery is a lost acknowledgement.
#[test]
fn t71_a_lost_or_forgotten_checkpoint_is_reported() {
    let mut h = legal_checkpoints();
    h.ops.pop();
    h.ok("final", load(), 200, 210, loaded(4, "d"));
    // Seq 5's refusal shows the ambiguous seq 6 was stored; the run cannot go back to 4 (nothing
    // acknowledged is missing, so only the order rules it out).
    let violations = checkpoint::check(&h.ops, 200_000);
    assert_eq!(rules(&violations), ["linearizable"], "{violations:?}");

    let mut h = H::default();
    h.ok("s0", save(1, "a"), 0, 10, Output::Done);
    h.ok("s0", save(7, "b"), 20, 30, Output::Done);
    h.ok("final", load(), 200, 210, loaded(1, "a"));
    let violations = checkpoint::check(&h.ops, 200_000);
    assert_eq!(
        rules(&violations),
        ["linearizable", "lost-ack"],
        "{violations:?}"
    );
    let lost = violations.iter().find(|v| v.rule == "lost-ack").unwrap();
    assert_eq!(lost.ops, vec![1, 2]);

    let mut h = H::default();
    h.ok("s0", save(1, "a"), 0, 10, Output::Done);
    h.refused("final", load(), 200, 210, "NOT_FOUND");
    let violations = checkpoint::check(&h.ops, 200_000);
    assert_eq!(
        rules(&violations),
        ["linearizable", "lost-ack"],
        "{violations:?}"
    );

    // No load after recovery at all: nothing shows the save survived.
    let mut h = H::default();
    h.ok("s0", save(1, "a"), 0, 10, Output::Done);
    let violations = checkpoint::check(&h.ops, 200_000);
    assert_eq!(rules(&violations), ["lost-ack"], "{violations:?}");
}

/// A checkpoint workload whose every save was refused checked nothing.
#[test]
fn t71_checkpoint_saves_all_refused_prove_nothing() {
    let mut h = H::default();
    h.refused("s0", save(1, "a"), 0, 10, "STALE_SEQ");
    let violations = progress(&h.ops, 1);
    let keys: Vec<&str> = violations.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys, ["checkpoint"], "{violations:?}");
    h.ok("s0", save(2, "b"), 20, 30, Output::Done);
    assert!(progress(&h.ops, 1).is_empty());
}

fn submit(idempotency_key: &str, concurrency_key: &str) -> Input {
    Input::Submit {
        idempotency_key: idempotency_key.into(),
        concurrency_key: concurrency_key.into(),
    }
}

fn submitted(task: u64, replayed: bool) -> Output {
    Output::Submitted { task, replayed }
}

/// contract §5: a submission sent again with the same content gets the original task (a replay);
/// with another concurrency key it is refused `IDEMPOTENCY_CONFLICT`. Accepting the conflicting
/// one, a replay naming another task, two "originals", or a refused replay are each reported; a
/// legal history (replays, a conflict, an ambiguous resend) is not.
#[test]
fn t71_a_resubmission_gets_the_original_task_or_idempotency_conflict() {
    let legal = || {
        let mut h = H::default();
        h.ok("s", submit("s-1", "key-0"), 0, 5, submitted(1, false));
        h.ok("s", submit("s-1", "key-0"), 10, 15, submitted(1, true));
        h.refused("s", submit("s-1", "key-1"), 20, 25, "IDEMPOTENCY_CONFLICT");
        h.ambiguous("s", submit("s-1", "key-1"), 30);
        h.ok("s", submit("s-2", "key-1"), 40, 45, submitted(2, false));
        h
    };
    let h = legal();
    let violations: Vec<_> = queue::check(&h.ops, 100_000)
        .into_iter()
        .filter(|v| v.rule == "idempotent-submit")
        .collect();
    assert!(violations.is_empty(), "{violations:?}");

    type Breaks = Box<dyn Fn(&mut H)>;
    let broken: [(&str, Breaks); 4] = [
        (
            "conflict accepted",
            Box::new(|h| h.ok("s", submit("s-1", "key-1"), 50, 55, submitted(1, true))),
        ),
        (
            "replay names another task",
            Box::new(|h| h.ok("s", submit("s-1", "key-0"), 50, 55, submitted(3, true))),
        ),
        (
            "two originals",
            Box::new(|h| h.ok("s", submit("s-1", "key-0"), 50, 55, submitted(1, false))),
        ),
        (
            "replay refused",
            Box::new(|h| h.refused("s", submit("s-1", "key-0"), 50, 55, "IDEMPOTENCY_CONFLICT")),
        ),
    ];
    for (what, breaks) in broken {
        let mut h = legal();
        breaks(&mut h);
        let flagged: Vec<_> = queue::check(&h.ops, 100_000)
            .into_iter()
            .filter(|v| v.rule == "idempotent-submit")
            .collect();
        assert_eq!(flagged.len(), 1, "{what}: {flagged:?}");
        assert!(flagged[0].ops.contains(&5), "{what}: {flagged:?}");
    }
}

fn attempt_list(state: &str, outcome: &str, token: u64) -> Output {
    Output::AttemptList {
        state: state.into(),
        attempts: vec![AttemptRecord {
            number: 1,
            worker: "w0".into(),
            token: Some(token),
            outcome: outcome.into(),
        }],
    }
}

fn end_attempt(task: u64, token: u64, end: AttemptEnd) -> Input {
    Input::EndAttempt {
        task,
        attempt: 1,
        worker: "w0".into(),
        concurrency_key: "key-0".into(),
        token,
        end,
    }
}

fn cancel_task(task: u64) -> Input {
    Input::CancelTask {
        task,
        concurrency_key: "key-0".into(),
    }
}

/// A worker's failure, an unknown outcome and a cancel free the key's permit: the next lease of
/// the key within the first's TTL is legal after one of them was sent (answered or not), and
/// two holders at once after a refused one, or after a cancel whose answer shows it cancelled
/// no leased attempt.
#[test]
fn t71_a_failure_unknown_or_cancel_ends_a_queue_permit() {
    let history = |end: &dyn Fn(&mut H)| {
        let mut h = H::default();
        let lease = |worker: &str| Input::Lease {
            worker: worker.into(),
        };
        h.ok("w0", lease("w0"), 0, 10, leased(1, "key-0", Some(7), None));
        end(&mut h);
        h.ok(
            "w1",
            lease("w1"),
            1_000,
            1_010,
            leased(2, "key-0", Some(8), None),
        );
        queue::check(&h.ops, 100_000)
    };
    for end in [
        AttemptEnd::Fail { retryable: true },
        AttemptEnd::Fail { retryable: false },
        AttemptEnd::Unknown,
    ] {
        let ok = history(&|h| {
            h.ok(
                "w0",
                end_attempt(1, 7, end),
                500,
                510,
                Output::TaskState("X".into()),
            )
        });
        assert_reported(&ok, "exclusive-hold", false);
        let unanswered = history(&|h| h.ambiguous("w0", end_attempt(1, 7, end), 500));
        assert_reported(&unanswered, "exclusive-hold", false);
        let refused = history(&|h| h.refused("w0", end_attempt(1, 7, end), 500, 510, "LEASE_LOST"));
        assert_reported(&refused, "exclusive-hold", true);
    }
    let cancelled = history(&|h| {
        h.ok(
            "s",
            cancel_task(1),
            500,
            510,
            attempt_list("CANCELLED", "CANCELLED", 7),
        )
    });
    assert_reported(&cancelled, "exclusive-hold", false);
    let unanswered = history(&|h| h.ambiguous("s", cancel_task(1), 500));
    assert_reported(&unanswered, "exclusive-hold", false);
    // Answered, but what it cancelled was not the leased attempt (a waiting retry, say).
    let other = history(&|h| {
        h.ok(
            "s",
            cancel_task(1),
            500,
            510,
            attempt_list("CANCELLED", "FAILED", 7),
        )
    });
    assert_reported(&other, "exclusive-hold", true);
    let refused = history(&|h| h.refused("s", cancel_task(1), 500, 510, "ALREADY_STARTED"));
    assert_reported(&refused, "exclusive-hold", true);
}

/// After recovery an acknowledged failure, unknown outcome or cancel must be what the task
/// shows; a cancelled task is never leased or started again; a cancel refused with a code no
/// correct store sends for it is reported.
#[test]
fn t71_queue_failures_unknowns_and_cancels_are_durable_and_final() {
    let judged = |input: Input, final_state: &str, outcome: &str| {
        let mut h = H::default();
        h.ok("s", input, 0, 10, Output::TaskState("X".into()));
        h.ok(
            "final",
            Input::Attempts { task: 1 },
            100,
            110,
            attempt_list(final_state, outcome, 7),
        );
        queue::check(&h.ops, 100_000)
    };
    let fail = end_attempt(1, 7, AttemptEnd::Fail { retryable: false });
    assert!(judged(fail.clone(), "FAILED", "FAILED").is_empty());
    assert_eq!(rules(&judged(fail, "SUCCEEDED", "SUCCEEDED")), ["lost-ack"]);
    // A retryable failure may be retried: only the attempt's outcome is fixed.
    let retry = end_attempt(1, 7, AttemptEnd::Fail { retryable: true });
    assert!(judged(retry.clone(), "WAITING", "FAILED").is_empty());
    assert_eq!(rules(&judged(retry, "WAITING", "EXPIRED")), ["lost-ack"]);
    let unknown = end_attempt(1, 7, AttemptEnd::Unknown);
    assert!(judged(unknown.clone(), "NEEDS_REVIEW", "UNKNOWN").is_empty());
    assert_eq!(rules(&judged(unknown, "FAILED", "UNKNOWN")), ["lost-ack"]);
    assert!(judged(cancel_task(1), "CANCELLED", "CANCELLED").is_empty());
    assert_eq!(
        rules(&judged(cancel_task(1), "LEASED", "ACTIVE")),
        ["lost-ack"]
    );

    // Leased or started after the cancel's answer: reported; before it, or sent before it and
    // answered after (concurrent), not.
    let mut h = H::default();
    h.ok(
        "s",
        cancel_task(1),
        100,
        110,
        attempt_list("CANCELLED", "CANCELLED", 7),
    );
    h.ok(
        "w1",
        Input::Lease {
            worker: "w1".into(),
        },
        105,
        130,
        leased(1, "key-0", Some(8), None),
    );
    h.ok(
        "w2",
        Input::Lease {
            worker: "w2".into(),
        },
        200,
        210,
        leased(1, "key-0", Some(9), None),
    );
    h.ok(
        "w2",
        Input::StartAttempt {
            task: 1,
            attempt: 1,
            worker: "w2".into(),
            concurrency_key: "key-0".into(),
            token: 9,
        },
        220,
        230,
        Output::TaskState("RUNNING".into()),
    );
    let violations = queue::check(&h.ops, 100_000);
    let cancels: Vec<&Violation> = violations
        .iter()
        .filter(|v| v.rule == "cancel-final")
        .collect();
    assert_eq!(cancels.len(), 2, "{violations:?}");
    assert!(
        cancels.iter().all(|v| v.ops[0] == 0 && v.ops[1] >= 2),
        "{violations:?}"
    );

    let mut h = H::default();
    h.refused("s", cancel_task(1), 0, 10, "UNKNOWN_TASK");
    let violations = check::unexpected_refusals(&h.ops);
    assert_eq!(rules(&violations), ["unexpected-refusal"], "{violations:?}");
    let mut h = H::default();
    h.refused("s", cancel_task(1), 0, 10, "ALREADY_SETTLED");
    assert!(check::unexpected_refusals(&h.ops).is_empty());
}

fn claim_step(task: &str, agent: &str) -> Input {
    Input::ClaimStep {
        task: task.into(),
        agent: agent.into(),
    }
}

fn complete_step(task: &str, fence: u64) -> Input {
    Input::CompleteStep {
        task: task.into(),
        fence,
    }
}

/// `chain::check` over `h` plus a final listing (at 100 s) showing `tasks` as
/// `(id, state, fence)`; the rules reported, sorted.
fn chain_rules(mut h: H, tasks: &[(&str, &str, u64)]) -> Vec<String> {
    h.ok(
        "final",
        Input::ListTasks,
        100_000,
        100_010,
        Output::Tasks(
            tasks
                .iter()
                .map(|(id, state, fence)| (id.to_string(), state.to_string(), *fence))
                .collect(),
        ),
    );
    let violations = chain::check(&h.ops, 100_000_000);
    rules(&violations).into_iter().map(String::from).collect()
}

/// A chain walked in order passes; each rule of dependency order and completion is reported
/// when broken — a step claimed before its predecessor's completion was sent, claimed after its
/// own completion was answered, completed twice, `BLOCKED` after the predecessor was done,
/// `ALREADY_DONE` before any completion, and an acknowledged completion lost after recovery —
/// and not when an unanswered completion explains it.
#[test]
fn t71_chain_steps_are_claimed_in_dependency_order_and_completed_once() {
    let walked = || {
        let mut h = H::default();
        h.ok("c0", claim_step("chain-0-0", "c0"), 0, 10, lease_of(1));
        h.ok("c0", complete_step("chain-0-0", 1), 20, 30, Output::Done);
        h.refused("c1", claim_step("chain-0-0", "c1"), 40, 50, "ALREADY_DONE");
        // Tokens are unique across tasks too.
        let second = Output::Lease {
            fence: 1,
            token: "second".into(),
            until_ms: None,
        };
        h.ok("c1", claim_step("chain-0-1", "c1"), 60, 70, second);
        h
    };
    let done = [("chain-0-0", "done", 1), ("chain-0-1", "claimed", 1)];
    assert!(chain_rules(walked(), &done).is_empty());

    // Claimed with its predecessor never completed.
    let mut h = H::default();
    h.ok("c1", claim_step("chain-0-1", "c1"), 60, 70, lease_of(1));
    assert_eq!(
        chain_rules(h, &[("chain-0-1", "claimed", 1)]),
        ["blocked-claim"]
    );
    // ... but a completion sent before the claim returned, unanswered, may have done it.
    let mut h = H::default();
    h.ambiguous("c0", complete_step("chain-0-0", 1), 50);
    h.ok("c1", claim_step("chain-0-1", "c1"), 60, 70, lease_of(1));
    assert!(chain_rules(h, &[("chain-0-1", "claimed", 1)]).is_empty());

    // Claimed again after its completion was answered.
    let mut h = walked();
    h.ok("c1", claim_step("chain-0-0", "c1"), 80, 90, lease_of(2));
    let done_twice = [("chain-0-0", "done", 2), ("chain-0-1", "claimed", 1)];
    assert!(chain_rules(h, &done_twice).contains(&"done-claimed".to_string()));

    // Completed twice.
    let mut h = walked();
    h.ok("c1", complete_step("chain-0-0", 1), 80, 90, Output::Done);
    assert_eq!(chain_rules(h, &done), ["complete-once"]);

    // BLOCKED after the predecessor's completion was answered; a first step never.
    let mut h = walked();
    h.refused("c0", claim_step("chain-0-1", "c0"), 80, 90, "BLOCKED");
    assert_eq!(chain_rules(h, &done), ["stale-blocked"]);
    let mut h = H::default();
    h.refused("c0", claim_step("chain-0-0", "c0"), 0, 10, "BLOCKED");
    assert_eq!(chain_rules(h, &[]), ["stale-blocked"]);

    // ALREADY_DONE with no completion sent; an unanswered one explains it.
    let mut h = H::default();
    h.refused("c0", claim_step("chain-0-0", "c0"), 0, 10, "ALREADY_DONE");
    assert_eq!(chain_rules(h, &[]), ["phantom-done"]);
    let mut h = H::default();
    h.ambiguous("c1", complete_step("chain-0-0", 1), 0);
    h.refused("c0", claim_step("chain-0-0", "c0"), 5, 10, "ALREADY_DONE");
    assert!(chain_rules(h, &[]).is_empty());

    // An acknowledged completion that recovery does not show.
    let lost = [("chain-0-0", "claimed", 1), ("chain-0-1", "claimed", 1)];
    assert_eq!(chain_rules(walked(), &lost), ["lost-ack"]);
}

/// A completion ends its claim: a second claim of the step within the first's TTL is two
/// holders only when the completion was refused (an unanswered one may have applied), and a
/// completion with a superseded claim must not be acknowledged.
#[test]
fn t71_chain_claims_are_exclusive_until_completed() {
    let with = |completion: &dyn Fn(&mut H)| {
        let mut h = H::default();
        h.ok("c0", claim_step("chain-0-0", "c0"), 0, 10, lease_of(1));
        completion(&mut h);
        h.ok(
            "c1",
            claim_step("chain-0-0", "c1"),
            1_000,
            1_010,
            lease_of(2),
        );
        chain_rules(h, &[("chain-0-0", "claimed", 2)])
    };
    assert!(with(&|h| h.ambiguous("c0", complete_step("chain-0-0", 1), 500)).is_empty());
    // (The refusal itself, of a claim within its TTL and before any newer claim, is unexplained
    // too.)
    assert_eq!(
        with(&|h| h.refused("c0", complete_step("chain-0-0", 1), 500, 510, "LEASE_LOST")),
        ["exclusive-hold", "unexplained-lease-lost"]
    );
    let mut h = H::default();
    h.ok("c0", claim_step("chain-0-0", "c0"), 0, 10, lease_of(1));
    h.ok(
        "c1",
        claim_step("chain-0-0", "c1"),
        5_000,
        5_010,
        lease_of(2),
    );
    h.ok(
        "c0",
        complete_step("chain-0-0", 1),
        6_000,
        6_010,
        Output::Done,
    );
    assert_eq!(
        chain_rules(h, &[("chain-0-0", "done", 2)]),
        ["stale-holder"]
    );
}

/// A holder's action refused `LEASE_LOST` while its grant was certainly live — within its TTL
/// from the grant's (or an acknowledged renewal's) sending, with nothing that could have ended
/// it — is reported, on the board, the chains and the queue; once the TTL may have run out, or
/// after a cancel of the task was sent, it is not.
#[test]
fn t71_lease_lost_for_a_live_holder_is_reported() {
    let release = |fence| Input::ReleaseTask {
        task: "task-0".into(),
        token: format!("t{fence}"),
        fence,
    };
    let renew = Input::RenewTask {
        task: "task-0".into(),
        token: "t1".into(),
        fence: 1,
    };
    let board_at = |refused_at: u64, renewal: Option<bool>| {
        let mut h = H::default();
        h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
        match renewal {
            Some(true) => h.ok("a0", renew.clone(), 3_000, 3_010, lease_of(1)),
            Some(false) => h.ambiguous("a0", renew.clone(), 3_000),
            None => {}
        }
        h.refused("a0", release(1), refused_at, refused_at + 10, "LEASE_LOST");
        board_rules(h, 20_000, 1)
    };
    assert_eq!(board_at(1_000, None), ["unexplained-lease-lost"]);
    assert!(board_at(5_000, None).is_empty());
    // An acknowledged renewal moved the deadline on; an unanswered one may not have.
    assert_eq!(board_at(5_000, Some(true)), ["unexplained-lease-lost"]);
    assert!(board_at(5_000, Some(false)).is_empty());
    // A newer claim sent before the refusal came back: the store says the lease ended (whether
    // it could have is the exclusivity rule's to judge).
    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
    h.ok("a1", claim_of("a1"), 900, 1_010, lease_of(2));
    h.refused("a0", release(1), 1_000, 1_020, "LEASE_LOST");
    assert_eq!(board_rules(h, 20_000, 2), ["exclusive-hold"]);

    let chain_at = |refused_at: u64| {
        let mut h = H::default();
        h.ok("c0", claim_step("chain-0-0", "c0"), 0, 10, lease_of(1));
        h.refused(
            "c0",
            complete_step("chain-0-0", 1),
            refused_at,
            refused_at + 10,
            "LEASE_LOST",
        );
        chain_rules(h, &[("chain-0-0", "open", 1)])
    };
    assert_eq!(chain_at(1_000), ["unexplained-lease-lost"]);
    assert!(chain_at(4_000).is_empty());

    let queue_at = |refused_at: u64, cancel: Option<&str>| {
        let mut h = H::default();
        h.ok(
            "w0",
            Input::Lease {
                worker: "w0".into(),
            },
            0,
            10,
            leased(1, "key-0", Some(7), None),
        );
        match cancel {
            Some("ambiguous") => h.ambiguous("s", cancel_task(1), 500),
            Some(code) => h.refused("s", cancel_task(1), 500, 510, code),
            None => {}
        }
        h.refused(
            "w0",
            Input::StartAttempt {
                task: 1,
                attempt: 1,
                worker: "w0".into(),
                concurrency_key: "key-0".into(),
                token: 7,
            },
            refused_at,
            refused_at + 10,
            "LEASE_LOST",
        );
        let violations = queue::check(&h.ops, 100_000_000);
        violations
            .iter()
            .any(|v| v.rule == "unexplained-lease-lost")
    };
    assert!(queue_at(1_000, None));
    assert!(!queue_at(4_000, None));
    assert!(!queue_at(1_000, Some("ambiguous")));
    assert!(queue_at(1_000, Some("ALREADY_STARTED")));
    // An end follows an acknowledged start, and a running task is not cancelled: a cancel
    // explains no refused end.
    let mut h = H::default();
    h.ok(
        "w0",
        Input::Lease {
            worker: "w0".into(),
        },
        0,
        10,
        leased(1, "key-0", Some(7), None),
    );
    h.ambiguous("s", cancel_task(1), 500);
    h.refused(
        "w0",
        end_attempt(1, 7, AttemptEnd::Fail { retryable: true }),
        1_000,
        1_010,
        "LEASE_LOST",
    );
    let violations = queue::check(&h.ops, 100_000_000);
    assert_reported(&violations, "unexplained-lease-lost", true);
}

fn delivered(seq: u64, data: &str) -> Input {
    Input::WatchSaved {
        run: "run-0".into(),
        seq,
        data: data.into(),
    }
}

fn at(revision: u64) -> Output {
    Output::Position { revision, index: 0 }
}

/// The watch's rules: two saves acknowledged one after the other and delivered in that order
/// pass; a repeated position, a save delivered that nobody sent (or that was refused), two saves
/// delivered against their real-time order, an acknowledged save never delivered, and a watch
/// ended by an error are each reported; a save sent before a recorded compaction need not be
/// delivered.
#[test]
fn t71_a_watch_delivers_every_acknowledged_save_once_in_commit_order() {
    let legal = || {
        let mut h = H::default();
        h.ok("s0", save(1, "a"), 0, 10, Output::Done);
        h.ok("s1", save(2, "b"), 20, 30, Output::Done);
        h.ok(watcher::NAME, delivered(1, "a"), 12, 12, at(5));
        h.ok(watcher::NAME, delivered(2, "b"), 32, 32, at(7));
        h
    };
    assert!(watcher::check(&legal().ops, true).is_empty());

    let mut h = legal();
    h.ok(watcher::NAME, delivered(2, "b"), 40, 40, at(7));
    assert_eq!(rules(&watcher::check(&h.ops, true)), ["watch-order"]);

    let mut h = legal();
    h.ok(watcher::NAME, delivered(3, "never-sent"), 40, 40, at(9));
    assert_eq!(rules(&watcher::check(&h.ops, true)), ["watch-phantom"]);
    let mut h = legal();
    h.refused("s0", save(3, "stale"), 34, 36, "STALE_SEQ");
    h.ok(watcher::NAME, delivered(3, "stale"), 40, 40, at(9));
    assert_eq!(rules(&watcher::check(&h.ops, true)), ["watch-phantom"]);

    // "a" was acknowledged before "b" was sent, yet came after it.
    let mut h = H::default();
    h.ok("s0", save(1, "a"), 0, 10, Output::Done);
    h.ok("s1", save(2, "b"), 20, 30, Output::Done);
    h.ok(watcher::NAME, delivered(2, "b"), 32, 32, at(5));
    h.ok(watcher::NAME, delivered(1, "a"), 33, 33, at(7));
    let violations = watcher::check(&h.ops, true);
    assert_eq!(rules(&violations), ["watch-order"], "{violations:?}");
    assert_eq!(violations[0].ops, vec![0, 1]);
    // Concurrent saves may come in either order.
    let mut h = H::default();
    h.ok("s0", save(1, "a"), 0, 25, Output::Done);
    h.ok("s1", save(2, "b"), 20, 30, Output::Done);
    h.ok(watcher::NAME, delivered(2, "b"), 32, 32, at(5));
    h.ok(watcher::NAME, delivered(1, "a"), 33, 33, at(7));
    assert!(watcher::check(&h.ops, true).is_empty());

    // Never delivered: reported once the run was read back, not before.
    let mut h = legal();
    h.ok("s0", save(3, "c"), 40, 50, Output::Done);
    assert_eq!(rules(&watcher::check(&h.ops, true)), ["watch-missed"]);
    let mut h = H::default();
    h.ok("s0", save(1, "first"), 0, 10, Output::Done);
    assert_eq!(rules(&watcher::check(&h.ops, true)), ["watch-missed"]);
    assert!(watcher::check(&h.ops, false).is_empty());
    // Sent before a compaction the watch met: it may have been in the history compacted away.
    let mut h = legal();
    h.ok("s0", save(3, "c"), 40, 50, Output::Done);
    h.ok(
        watcher::NAME,
        Input::WatchCompacted { requested: 8 },
        60,
        60,
        at(20),
    );
    // The first change after it may sit at the position it went on from.
    h.ok("s1", save(4, "d"), 70, 80, Output::Done);
    h.ok(watcher::NAME, delivered(4, "d"), 82, 82, at(20));
    assert!(watcher::check(&h.ops, true).is_empty());
    // One save delivered twice, at two positions.
    let mut h = legal();
    h.ok(watcher::NAME, delivered(2, "b"), 40, 40, at(9));
    assert_eq!(rules(&watcher::check(&h.ops, true)), ["watch-order"]);

    let mut h = legal();
    h.ok(
        watcher::NAME,
        Input::WatchEnded {
            error: "protocol error".into(),
        },
        60,
        60,
        Output::Done,
    );
    assert_eq!(rules(&watcher::check(&h.ops, true)), ["watch-ended"]);
}

/// The board watch's delivery of `kind` of the claim on `task-0` at `fence` by `agent`.
fn lease_change(kind: &str, agent: &str, fence: u64) -> Input {
    Input::WatchLease {
        kind: kind.into(),
        key: "task-0".into(),
        holder: agent.into(),
        fence,
    }
}

/// Renewal of the claim on `task-0` at `fence`.
fn renew_of(fence: u64) -> Input {
    Input::RenewTask {
        task: "task-0".into(),
        token: format!("t{fence}"),
        fence,
    }
}

/// Release of the claim on `task-0` at `fence`.
fn release_of(fence: u64) -> Input {
    Input::ReleaseTask {
        task: "task-0".into(),
        token: format!("t{fence}"),
        fence,
    }
}

/// a0 claims, renews and releases task-0; a1 claims it and walks away, so its lease runs out
/// (the claim TTL is 4,000 ms): every change delivered, the loss after the TTL. Without the
/// loss's delivery (`lost_at: None`), which a test adds itself.
fn board_watched(lost_at: Option<u64>) -> H {
    let w = board_watch::NAME;
    let mut h = H::default();
    h.ok("a0", claim_of("a0"), 0, 10, lease_of(1));
    h.ok(w, lease_change("claimed", "a0", 1), 11, 11, at(5));
    h.ok("a0", renew_of(1), 20, 30, lease_of(1));
    h.ok(w, lease_change("renewed", "a0", 1), 31, 31, at(6));
    h.ok("a0", release_of(1), 40, 50, Output::Done);
    h.ok(w, lease_change("released", "a0", 1), 51, 51, at(7));
    h.ok("a1", claim_of("a1"), 100, 110, lease_of(2));
    h.ok(w, lease_change("claimed", "a1", 2), 111, 111, at(9));
    if let Some(lost_at) = lost_at {
        h.ok(w, lease_change("lost", "a1", 2), lost_at, lost_at, at(12));
    }
    h
}

/// The rules the board watch's checker reports for `h` once the run was read back.
fn board_watch_rules(h: &H) -> Vec<String> {
    rules(&board_watch::check(&h.ops, true))
        .into_iter()
        .map(String::from)
        .collect()
}

/// The board watch's rules: every acknowledged claim, renewal and release and the loss of every
/// lease never released are delivered, with their agent and fence, each after a call that
/// explains it; a loss no sooner than the lease's TTL after the claim or its latest acknowledged
/// renewal was sent (less the clock slack), and never of a lease whose release was acknowledged.
#[test]
fn t71_the_board_watch_delivers_every_change_of_a_claim_and_each_loss_in_time() {
    let w = board_watch::NAME;
    assert!(board_watch::check(&board_watched(Some(4_200)).ops, true).is_empty());
    // Within the clock slack of the TTL counted from the claim's sending (100 ms).
    assert!(board_watch::check(&board_watched(Some(3_900)).ops, true).is_empty());

    // Lost early: 2.9 s into a 4 s lease; or after a renewal, acknowledged, sent at 2,000 ms.
    let h = board_watched(Some(3_000));
    let violations = board_watch::check(&h.ops, true);
    assert_eq!(rules(&violations), ["watch-lost-early"], "{violations:?}");
    assert_eq!(violations[0].ops, [6, 8]);
    let mut h = board_watched(None);
    h.ok("a1", renew_of(2), 2_000, 2_010, lease_of(2));
    h.ok(w, lease_change("renewed", "a1", 2), 2_011, 2_011, at(10));
    h.ok(w, lease_change("lost", "a1", 2), 4_200, 4_200, at(12));
    assert_eq!(board_watch_rules(&h), ["watch-lost-early"]);
    // A renewal refused (the lease was lost) does not move the deadline.
    let mut h = board_watched(None);
    h.refused("a1", renew_of(2), 4_300, 4_310, "LEASE_LOST");
    h.ok(w, lease_change("lost", "a1", 2), 4_200, 4_200, at(12));
    assert!(board_watch_rules(&h).is_empty());

    // A loss of the lease a0 released (acknowledged).
    let mut h = board_watched(Some(4_200));
    h.ok(w, lease_change("lost", "a0", 1), 4_300, 4_300, at(13));
    let violations = board_watch::check(&h.ops, true);
    assert_eq!(
        rules(&violations),
        ["watch-lost-released"],
        "{violations:?}"
    );
    assert_eq!(violations[0].ops, [4, 9]);

    // Phantoms: a claim by an agent that sent none, or only a refused one; a claim delivered
    // before it was sent; a renewal and a release nobody sent; a loss of an agent's claim that
    // never was.
    for (agent, kind, fence) in [
        ("a2", "claimed", 3),
        ("a2", "lost", 3),
        ("a1", "renewed", 2),
        ("a1", "released", 2),
    ] {
        let mut h = board_watched(Some(4_200));
        h.refused("a2", claim_of("a2"), 4_250, 4_260, "TAKEN");
        h.ok(w, lease_change(kind, agent, fence), 4_300, 4_300, at(13));
        assert_eq!(
            board_watch_rules(&h),
            ["watch-lease-phantom"],
            "{kind} by {agent}"
        );
    }
    // A loss of a fence the watch never saw claimed (a1's claim unanswered); after a
    // compaction the claim may have been in the history compacted away.
    let mut h = board_watched(Some(4_200));
    h.ambiguous("a1", claim_of("a1"), 4_250);
    h.ok(w, lease_change("lost", "a1", 3), 8_300, 8_300, at(15));
    assert_eq!(board_watch_rules(&h), ["watch-lease-phantom"]);
    let mut h = board_watched(Some(4_200));
    h.ambiguous("a1", claim_of("a1"), 4_250);
    h.ok(
        w,
        Input::WatchCompacted { requested: 13 },
        4_300,
        4_300,
        at(14),
    );
    h.ok(w, lease_change("lost", "a1", 3), 8_300, 8_300, at(15));
    assert!(board_watch_rules(&h).is_empty());
    let mut h = H::default();
    h.ok(w, lease_change("claimed", "a0", 1), 5, 5, at(5));
    h.ok("a0", claim_of("a0"), 10, 20, lease_of(1));
    h.ok("a0", release_of(1), 40, 50, Output::Done);
    h.ok(w, lease_change("released", "a0", 1), 51, 51, at(7));
    assert_eq!(board_watch_rules(&h), ["watch-lease-phantom"]);

    // Missed, once the run was read back: a loss, a claim (or delivered with another agent),
    // a renewal, a release.
    let h = board_watched(None);
    assert_eq!(board_watch_rules(&h), ["watch-lease-missed"]);
    assert!(board_watch::check(&h.ops, false).is_empty());
    assert!(!board_watch::all_delivered(&h.ops));
    assert!(board_watch::all_delivered(&board_watched(Some(4_200)).ops));
    let mut h = board_watched(Some(4_200));
    h.ops[1].input = lease_change("claimed", "a9", 1);
    let violations = board_watch::check(&h.ops, true);
    assert_eq!(
        rules(&violations),
        ["watch-lease-missed", "watch-lease-phantom"],
        "{violations:?}"
    );
    // The renewal's or the release's delivery names another fence.
    for (dropped, other) in [
        (3, lease_change("renewed", "a0", 7)),
        (5, lease_change("released", "a0", 7)),
    ] {
        let mut h = board_watched(Some(4_200));
        h.ops[dropped].input = other;
        let violations = board_watch::check(&h.ops, true);
        assert!(
            rules(&violations).contains(&"watch-lease-missed"),
            "{dropped}: {violations:?}"
        );
    }
    // Two acknowledged renewals, one delivered.
    let mut h = board_watched(Some(4_200));
    h.ok("a0", renew_of(1), 32, 35, lease_of(1));
    assert_eq!(board_watch_rules(&h), ["watch-lease-missed"]);
    // A release refused: the lease ran out, and its loss must be delivered; a release
    // unanswered may have ended it, and nothing need be.
    let mut h = board_watched(None);
    h.refused("a1", release_of(2), 4_300, 4_310, "LEASE_LOST");
    assert_eq!(board_watch_rules(&h), ["watch-lease-missed"]);
    let mut h = board_watched(None);
    h.ambiguous("a1", release_of(2), 300);
    assert!(board_watch_rules(&h).is_empty());
    // Sent before a compaction the watch met: it may have been in the history compacted away.
    let mut h = board_watched(None);
    h.ok(w, Input::WatchCompacted { requested: 10 }, 200, 200, at(11));
    assert!(board_watch_rules(&h).is_empty());
    // The checkpoint watch's compaction is not the board watch's.
    let mut h = board_watched(None);
    h.ok(
        watcher::NAME,
        Input::WatchCompacted { requested: 10 },
        200,
        200,
        at(11),
    );
    assert_eq!(board_watch_rules(&h), ["watch-lease-missed"]);
    // Positions, per watch: the checkpoint watch's do not interleave with the board watch's.
    let mut h = board_watched(Some(4_200));
    h.ok(w, lease_change("lost", "a1", 2), 4_300, 4_300, at(12));
    let violations = board_watch::check(&h.ops, true);
    assert!(
        rules(&violations).contains(&"watch-order"),
        "{violations:?}"
    );
    let mut h = board_watched(Some(4_200));
    h.ok("s0", save(1, "a"), 0, 10, Output::Done);
    h.ok(watcher::NAME, delivered(1, "a"), 12, 12, at(6));
    assert!(board_watch::check(&h.ops, true).is_empty());
    assert!(watcher::check(&h.ops, true).is_empty());
}

/// The side-effect watch's delivery of `kind` on `key` at `fence`.
fn effect_change(kind: &str, key: &str, fence: u64) -> Input {
    Input::WatchLease {
        kind: kind.into(),
        key: key.into(),
        holder: String::new(),
        fence,
    }
}

fn acquire_of(key: &str) -> Input {
    Input::Acquire {
        key: key.into(),
        resource: "res-0".into(),
    }
}

fn granted_at(fence: u64) -> Output {
    Output::Granted {
        fence,
        holder: "h".into(),
        until_ms: None,
    }
}

fn complete_of(key: &str, fence: u64) -> Input {
    Input::CompleteEffect {
        key: key.into(),
        resource: "res-0".into(),
        fence,
    }
}

fn mark_of(key: &str, fence: u64) -> Input {
    Input::MarkUncertain {
        key: key.into(),
        resource: "res-0".into(),
        fence,
    }
}

/// Three attempts, each delivered: `holder-0/1` acquired and completed; `holder-1/1` acquired
/// and marked uncertain; `holder-2/1` acquired and left (its 2,000 ms intent runs out: `lost`,
/// delivered at `lost_at` when there is one), then resolved "happened" by a reconciler.
fn effect_watched(lost_at: Option<u64>) -> H {
    let w = effect_watch::NAME;
    let mut h = H::default();
    h.ok("holder-0", acquire_of("holder-0/1"), 0, 10, granted_at(1));
    h.ok(w, effect_change("granted", "holder-0/1", 1), 11, 11, at(5));
    h.ok(
        "holder-0",
        complete_of("holder-0/1", 1),
        20,
        30,
        Output::Result("r".into()),
    );
    h.ok(
        w,
        effect_change("completed", "holder-0/1", 1),
        31,
        31,
        at(6),
    );
    h.ok(
        "holder-1",
        acquire_of("holder-1/1"),
        100,
        110,
        granted_at(2),
    );
    h.ok(
        w,
        effect_change("granted", "holder-1/1", 2),
        111,
        111,
        at(7),
    );
    h.ok("holder-1", mark_of("holder-1/1", 2), 120, 130, Output::Done);
    h.ok(
        w,
        effect_change("uncertain", "holder-1/1", 2),
        131,
        131,
        at(8),
    );
    h.ok(
        "holder-2",
        acquire_of("holder-2/1"),
        200,
        210,
        granted_at(3),
    );
    h.ok(
        w,
        effect_change("granted", "holder-2/1", 3),
        211,
        211,
        at(9),
    );
    if let Some(lost_at) = lost_at {
        h.ok(
            w,
            effect_change("lost", "holder-2/1", 3),
            lost_at,
            lost_at,
            at(12),
        );
        h.ok(
            "reconciler-0",
            resolve("holder-2/1", Some("r2"), false, false),
            lost_at + 100,
            lost_at + 110,
            Output::Result("r2".into()),
        );
        h.ok(
            w,
            effect_change("resolved", "holder-2/1", 0),
            lost_at + 111,
            lost_at + 111,
            at(13),
        );
    }
    h
}

/// The rules the side-effect watch's checker reports for `h` once the run was read back.
fn effect_watch_rules(h: &H) -> Vec<String> {
    rules(&effect_watch::check(&h.ops, true))
        .into_iter()
        .map(String::from)
        .collect()
}

/// The side-effect watch's rules: every acknowledged grant, `mark_uncertain` and completion, and
/// the loss of every intent its holder never ended, are delivered, each after a call that
/// explains it; a loss no sooner than the acquire TTL after the acquire was sent (less the clock
/// slack), and never of an attempt marked uncertain or completed before its intent could run
/// out.
#[test]
fn t71_the_effect_watch_delivers_every_attempt_change_and_each_loss_in_time() {
    let w = effect_watch::NAME;
    assert!(effect_watch::check(&effect_watched(Some(2_300)).ops, true).is_empty());
    // Within the clock slack of the TTL counted from the acquire's sending (200 ms).
    assert!(effect_watch::check(&effect_watched(Some(1_990)).ops, true).is_empty());

    // Lost early: 1.6 s into a 2 s intent.
    let h = effect_watched(Some(1_800));
    let violations = effect_watch::check(&h.ops, true);
    assert_eq!(rules(&violations), ["watch-lost-early"], "{violations:?}");
    assert_eq!(violations[0].ops, [8, 10]);

    // A loss of the attempt marked uncertain, or of the one completed in time; a completion
    // answered after the intent could have run out does not rule a loss out.
    for (key, fence, ender) in [("holder-1/1", 2, 6), ("holder-0/1", 1, 2)] {
        let mut h = effect_watched(Some(2_300));
        h.ok(w, effect_change("lost", key, fence), 2_500, 2_500, at(14));
        let violations = effect_watch::check(&h.ops, true);
        assert_eq!(rules(&violations), ["watch-lost-ended"], "{violations:?}");
        assert_eq!(violations[0].ops, [ender, 13]);
    }
    let mut h = effect_watched(None);
    h.ok(
        "holder-2",
        complete_of("holder-2/1", 3),
        2_250,
        2_260,
        Output::Result("r".into()),
    );
    h.ok(
        w,
        effect_change("lost", "holder-2/1", 3),
        2_255,
        2_255,
        at(12),
    );
    h.ok(
        w,
        effect_change("completed", "holder-2/1", 3),
        2_261,
        2_261,
        at(13),
    );
    assert!(effect_watch_rules(&h).is_empty());
    // A mark answered once the intent could have run out: the gate answers it with no change of
    // its own (the `lost` made the key uncertain), and the loss stands.
    let mut h = effect_watched(None);
    h.ok(
        "holder-2",
        mark_of("holder-2/1", 3),
        2_150,
        2_400,
        Output::Done,
    );
    h.ok(
        w,
        effect_change("lost", "holder-2/1", 3),
        2_300,
        2_300,
        at(12),
    );
    assert!(effect_watch_rules(&h).is_empty());

    // Phantoms: a grant of a key nobody acquired; an `uncertain` of a fence nobody marked; a
    // completion and a resolution nobody sent; a grant delivered before its acquire was sent.
    for (kind, key, fence) in [
        ("granted", "holder-9/1", 7),
        ("uncertain", "holder-0/1", 1),
        ("completed", "holder-2/1", 3),
        ("resolved", "holder-1/1", 0),
    ] {
        let mut h = effect_watched(Some(2_300));
        h.ok(w, effect_change(kind, key, fence), 2_500, 2_500, at(14));
        assert_eq!(
            effect_watch_rules(&h),
            ["watch-effect-phantom"],
            "{kind} {key}"
        );
    }
    // An `uncertain` and a loss of an attempt the watch never saw granted.
    for kind in ["uncertain", "lost"] {
        let mut h = effect_watched(Some(2_300));
        h.ambiguous("holder-2", mark_of("holder-2/1", 9), 2_400);
        h.ok(
            w,
            effect_change(kind, "holder-2/1", 9),
            4_500,
            4_500,
            at(14),
        );
        assert_eq!(effect_watch_rules(&h), ["watch-effect-phantom"], "{kind}");
    }
    let mut h = H::default();
    h.ok(w, effect_change("granted", "holder-0/1", 1), 5, 5, at(5));
    h.ok("holder-0", acquire_of("holder-0/1"), 10, 20, granted_at(1));
    h.ok("holder-0", mark_of("holder-0/1", 1), 30, 40, Output::Done);
    h.ok(
        w,
        effect_change("uncertain", "holder-0/1", 1),
        41,
        41,
        at(6),
    );
    assert_eq!(effect_watch_rules(&h), ["watch-effect-phantom"]);

    // Missed, once the run was read back: the loss of an intent nobody ended, a grant, a
    // `mark_uncertain`, a completion, a "happened" resolution.
    let h = effect_watched(None);
    assert_eq!(effect_watch_rules(&h), ["watch-effect-missed"]);
    assert!(effect_watch::check(&h.ops, false).is_empty());
    assert!(!effect_watch::all_delivered(&h.ops));
    assert!(effect_watch::all_delivered(
        &effect_watched(Some(2_300)).ops
    ));
    for (dropped, other) in [
        (1, effect_change("granted", "holder-0/1", 9)),
        (3, effect_change("granted", "holder-0/1", 1)),
        (7, effect_change("lost", "holder-1/1", 9)),
        (12, effect_change("lost", "holder-2/1", 3)),
    ] {
        let mut h = effect_watched(Some(2_300));
        h.ops[dropped].input = other;
        let violations = effect_watch::check(&h.ops, true);
        assert!(
            rules(&violations).contains(&"watch-effect-missed"),
            "{dropped}: {violations:?}"
        );
    }
    // A completion refused: the intent ran out, and its loss must be delivered; one unanswered
    // may have ended it in time, and nothing need be.
    let mut h = effect_watched(None);
    h.refused(
        "holder-2",
        complete_of("holder-2/1", 3),
        2_300,
        2_310,
        "FENCE_STALE",
    );
    assert_eq!(effect_watch_rules(&h), ["watch-effect-missed"]);
    let mut h = effect_watched(None);
    h.ambiguous("holder-2", complete_of("holder-2/1", 3), 300);
    assert!(effect_watch_rules(&h).is_empty());
    // Sent before a compaction the watch met; the board watch's compaction is not this one's.
    let mut h = effect_watched(None);
    h.ok(w, Input::WatchCompacted { requested: 10 }, 250, 250, at(11));
    assert!(effect_watch_rules(&h).is_empty());
    // A key completed before a compaction: a resolution acknowledged after it only answered the
    // first result, and the key's `completed` may be in the history compacted away.
    let mut h = effect_watched(Some(2_300));
    h.ops[3].input = effect_change("granted", "holder-0/1", 1);
    h.ok(
        w,
        Input::WatchCompacted { requested: 14 },
        2_600,
        2_600,
        at(14),
    );
    h.ok(
        "reconciler-0",
        resolve("holder-0/1", Some("r3"), false, false),
        2_700,
        2_710,
        Output::Result("r".into()),
    );
    assert!(effect_watch_rules(&h).is_empty());
    let mut h = effect_watched(None);
    h.ok(
        board_watch::NAME,
        Input::WatchCompacted { requested: 10 },
        250,
        250,
        at(11),
    );
    assert_eq!(effect_watch_rules(&h), ["watch-effect-missed"]);
    // A repeated position.
    let mut h = effect_watched(Some(2_300));
    h.ok(
        w,
        effect_change("resolved", "holder-2/1", 0),
        2_500,
        2_500,
        at(13),
    );
    assert!(effect_watch_rules(&h).contains(&"watch-order".to_string()));
}

/// A reconcile of `key`.
fn begin(key: &str) -> Input {
    Input::BeginReconcile { key: key.into() }
}

/// A slot held until `until_ms` on the store clock.
fn slot(until_ms: u64) -> Output {
    Output::Reconciling { until_ms }
}

/// A resolution of `key`: "happened" with `result` when there is one, else "did not happen".
fn resolve(key: &str, result: Option<&str>, forced: bool, unsafe_action: bool) -> Input {
    Input::Resolve {
        key: key.into(),
        happened: result.is_some(),
        result: result.unwrap_or_default().into(),
        forced,
        unsafe_action,
    }
}

#[test]
fn t71_a_second_live_reconcile_slot_is_reported_on_the_store_clock() {
    // Slot lengths are reconcile::SLOT_TTL_MS (1.5 s): the second slot, until 11,000, was
    // granted at 9,500, while the first ran until 10,000.
    let mut h = H::default();
    h.ok("r0", begin("k"), 0, 10, slot(10_000));
    h.ok("r1", begin("k"), 20, 30, slot(11_000));
    let violations = reconcile::check(&h.ops);
    assert_eq!(
        rules(&violations),
        ["reconcile-exclusive"],
        "{violations:?}"
    );
    assert_eq!(violations[0].ops, [0, 1]);
    // Granted at 10,000, the first slot's deadline: it had run out (a deadline reached is
    // overdue).
    h.ops[1].outcome = Outcome::Ok(slot(11_500));
    assert!(reconcile::check(&h.ops).is_empty());
    // A resolution sent in between may have ended the first slot (and the key turned uncertain
    // again since): the pair is excused.
    h.ops[1].outcome = Outcome::Ok(slot(11_000));
    h.ambiguous("r0", resolve("k", None, false, false), 15);
    assert!(reconcile::check(&h.ops).is_empty());
}

#[test]
fn t71_a_refusal_only_its_own_retry_explains_is_reported() {
    // RECONCILE_TAKEN with no other reconcile of the key sent: its own retry took the slot.
    let mut h = H::default();
    h.refused("r0", begin("k"), 0, 10, "RECONCILE_TAKEN");
    assert_eq!(rules(&reconcile::check(&h.ops)), ["reconcile-twice"]);
    // Another reconcile refused changed nothing: still unexplained.
    let mut refused = H::default();
    refused.refused("r1", begin("k"), 0, 5, "NOT_UNCERTAIN");
    refused.refused("r0", begin("k"), 6, 10, "RECONCILE_TAKEN");
    assert_eq!(rules(&reconcile::check(&refused.ops)), ["reconcile-twice"]);
    // Another reconcile sent (unanswered) explains it.
    let mut h = H::default();
    h.ambiguous("r1", begin("k"), 0);
    h.refused("r0", begin("k"), 5, 10, "RECONCILE_TAKEN");
    assert!(reconcile::check(&h.ops).is_empty());

    // NOT_UNCERTAIN for a resolution under an answered slot, no other resolution sent.
    let mut h = H::default();
    h.ok("r0", begin("k"), 0, 10, slot(1_000));
    h.refused(
        "r0",
        resolve("k", None, false, false),
        20,
        30,
        "NOT_UNCERTAIN",
    );
    let violations = reconcile::check(&h.ops);
    assert_eq!(rules(&violations), ["resolve-twice"], "{violations:?}");
    // Another reconciler's resolution, answered retryable before: explained.
    h.ok(
        "r1",
        resolve("k", None, false, false),
        12,
        18,
        Output::Retryable,
    );
    assert!(reconcile::check(&h.ops).is_empty());
}

#[test]
fn t71_an_unsafe_action_made_retryable_unforced_is_reported() {
    let cases = [
        // (happened, forced, unsafe, outcome, reported)
        (false, false, true, Outcome::Ok(Output::Retryable), true),
        (
            false,
            false,
            true,
            Outcome::Refused("UNSAFE_NOT_RETRYABLE".into()),
            false,
        ),
        (false, true, true, Outcome::Ok(Output::Retryable), false),
        (false, false, false, Outcome::Ok(Output::Retryable), false),
        (
            false,
            false,
            false,
            Outcome::Refused("UNSAFE_NOT_RETRYABLE".into()),
            true,
        ),
        (
            false,
            true,
            true,
            Outcome::Refused("UNSAFE_NOT_RETRYABLE".into()),
            true,
        ),
        (
            true,
            false,
            true,
            Outcome::Refused("UNSAFE_NOT_RETRYABLE".into()),
            true,
        ),
    ];
    for (happened, forced, unsafe_action, outcome, reported) in cases {
        let mut h = H::default();
        let input = resolve("k", happened.then_some("k by r0"), forced, unsafe_action);
        h.op("r0", input, 0, Some(10), outcome.clone());
        let violations = reconcile::check(&h.ops);
        assert_eq!(
            rules(&violations),
            Vec::from_iter(reported.then_some("unsafe-resolution")),
            "{happened} {forced} {unsafe_action} {outcome:?}: {violations:?}"
        );
    }
}

#[test]
fn t71_a_key_resolved_retryable_and_not_granted_again_is_reported() {
    let mut h = H::default();
    h.ok(
        "r0",
        resolve("k", None, false, false),
        0,
        10,
        Output::Retryable,
    );
    h.ok(
        "r0",
        acquire("k"),
        20,
        30,
        Output::NotGranted("uncertain".into()),
    );
    let violations = reconcile::check(&h.ops);
    assert_eq!(
        rules(&violations),
        ["resolved-not-retryable"],
        "{violations:?}"
    );
    // Granted or contended is what a retryable key answers.
    for answer in [granted(2), Output::NotGranted("contended".into())] {
        h.ops[1].outcome = Outcome::Ok(answer);
        assert!(reconcile::check(&h.ops).is_empty());
    }
    // Another acquire sent meanwhile (unanswered) may have been granted and run out since.
    h.ops[1].outcome = Outcome::Ok(Output::NotGranted("in_progress".into()));
    h.ambiguous("r1", acquire("k"), 15);
    assert!(reconcile::check(&h.ops).is_empty());
}

#[test]
fn t71_a_reconcile_refused_on_a_key_certainly_uncertain_is_reported() {
    // The intent (TTL 2 s) of a grant answered at 10 ms ran out by 3,010 ms plus slack.
    let mut h = H::default();
    h.ok("h0", acquire("k"), 0, 10, granted(1));
    h.refused("r0", begin("k"), 4_000, 4_010, "NOT_UNCERTAIN");
    let violations = reconcile::check(&h.ops);
    assert_eq!(rules(&violations), ["not-uncertain"], "{violations:?}");
    // Sent while the intent may still have run: legal.
    h.ops[1].call = 1_000_000;
    assert!(reconcile::check(&h.ops).is_empty());
    // Marked uncertain by its holder (answered): it is uncertain at once.
    h.ok(
        "h0",
        Input::MarkUncertain {
            key: "k".into(),
            resource: "res-0".into(),
            fence: 1,
        },
        20,
        30,
        Output::Done,
    );
    h.ops[1].call = 40_000;
    h.ops[1].ret = Some(50_000);
    // Order matters only by time; the refusal is op 1, the mark op 2.
    let violations = reconcile::check(&h.ops);
    assert_eq!(rules(&violations), ["not-uncertain"], "{violations:?}");
    // A completion sent before the refusal came back may have completed it: legal.
    h.ambiguous(
        "h0",
        Input::CompleteEffect {
            key: "k".into(),
            resource: "res-0".into(),
            fence: 1,
        },
        35,
    );
    assert!(reconcile::check(&h.ops).is_empty());
}

#[test]
fn t71_a_completed_key_answered_otherwise_or_with_another_result_is_reported() {
    let complete = |fence: u64| Input::CompleteEffect {
        key: "k".into(),
        resource: "res-0".into(),
        fence,
    };
    let shown = |result: &str| Output::Action {
        status: "completed".into(),
        fence: 1,
        result: Some(result.into()),
    };
    let show = Input::ShowAction { key: "k".into() };
    // A resolution's result wins; the holder's later completion, stale by then (fence 2 was
    // granted on the resource, released by k's holder, before it was sent), is answered with
    // it: a repeat, legal.
    let mut h = H::default();
    h.ok("h0", acquire("k"), 0, 10, granted(1));
    h.ok(
        "r0",
        resolve("k", Some("k by r0"), false, false),
        20,
        30,
        Output::Result("k by r0".into()),
    );
    h.ok(
        "h0",
        Input::ReleaseEffect {
            key: "k".into(),
            resource: "res-0".into(),
            fence: 1,
        },
        32,
        35,
        Output::Done,
    );
    h.ok("h1", acquire("other"), 40, 50, granted(2));
    h.ok("h0", complete(1), 60, 70, Output::Result("k by r0".into()));
    h.ok("final", show.clone(), 100, 110, shown("k by r0"));
    let legal = h.ops.clone();
    let violations = effect::check(&legal, 100_000);
    assert!(violations.is_empty(), "{violations:?}");
    // The holder's completion answered its own result after the resolution's: the first did
    // not win.
    let mut h = H { ops: legal.clone() };
    h.ops[4].outcome = Outcome::Ok(Output::Result("k".into()));
    assert_reported(&effect::check(&h.ops, 100_000), "result-changed", true);
    // A result nobody submitted.
    let mut h = H { ops: legal.clone() };
    h.ops[4].outcome = Outcome::Ok(Output::Result("k by r9".into()));
    assert_reported(&effect::check(&h.ops, 100_000), "wrong-result", true);
    // With no resolution of k, the stale completion's answer is a use of its superseded lease.
    let mut h = H { ops: legal.clone() };
    h.ops[1].input = show.clone();
    h.ops[1].outcome = Outcome::Ok(Output::Action {
        status: "in_progress".into(),
        fence: 1,
        result: None,
    });
    h.ops[4].outcome = Outcome::Ok(Output::Result("k".into()));
    h.ops[5].outcome = Outcome::Ok(shown("k"));
    let violations = effect::check(&h.ops, 100_000);
    assert_eq!(rules(&violations), ["stale-holder"], "{violations:?}");
    // Another completion of k sent before (a reconciler's retry, granted fence 2) may have
    // completed k with the same result: the stale one's answer can be a repeat.
    h.ops[3].input = acquire("k");
    h.ok("r0", complete(2), 55, 58, Output::Result("k".into()));
    let violations = effect::check(&h.ops, 100_000);
    assert!(
        !rules(&violations).contains(&"stale-holder"),
        "{violations:?}"
    );
    // After the completed answer: granted again, a slot, retryable, shown in progress.
    for (input, answer) in [
        (acquire("k"), granted(3)),
        (begin("k"), slot(9_000)),
        (resolve("k", None, false, false), Output::Retryable),
        (
            show.clone(),
            Output::Action {
                status: "in_progress".into(),
                fence: 3,
                result: None,
            },
        ),
    ] {
        let mut h = H { ops: legal.clone() };
        h.ok("r1", input.clone(), 80, 90, answer);
        let violations = effect::check(&h.ops, 100_000);
        assert_reported(&violations, "completed-final", true);
        // Sent before the completed answer came back, it may have been applied before.
        h.ops[6].call = 25_000;
        h.ops[6].ret = Some(26_000);
        let violations = effect::check(&h.ops, 100_000);
        assert_reported(&violations, "completed-final", false);
    }
}

/// Reads of a sink during the run (a reconciler's) are not the reads after recovery: a run whose
/// final read went unanswered has nothing to judge the sink's end by, whatever was read before.
#[test]
fn t71_a_sink_read_during_the_run_is_not_judged_as_the_final_one() {
    let mut h = H::default();
    let sink = "sink-effect-res-0";
    let read = Input::SinkRead {
        resource: sink.into(),
    };
    h.ok(
        "r0",
        read.clone(),
        0,
        10,
        Output::Sink {
            seen_fence: 0,
            writes: 0,
            value: String::new(),
        },
    );
    h.ok(
        "h0",
        Input::SinkWrite {
            resource: sink.into(),
            fence: 1,
            value: "h0/1".into(),
        },
        20,
        30,
        Output::Sink {
            seen_fence: 1,
            writes: 1,
            value: String::new(),
        },
    );
    h.ambiguous("final", read.clone(), 100);
    let violations = check::sink(&h.ops, 100_000, |_| true);
    assert_eq!(rules(&violations), ["lost-ack"], "{violations:?}");
    assert!(
        violations[0]
            .detail
            .contains("no successful read after recovery"),
        "{violations:?}"
    );
    // Read after recovery, the sink is judged by that read.
    h.ok(
        "final",
        read,
        110,
        120,
        Output::Sink {
            seen_fence: 1,
            writes: 1,
            value: "h0/1".into(),
        },
    );
    assert!(check::sink(&h.ops, 100_000, |_| true).is_empty());
}

/// Keys a reconciler took on: a resolution that may have changed the key takes it out of the
/// post-recovery expiry check, one refused (changed nothing) does not; a reconciler's acquire
/// after a retryable answer is not a fresh key's first acquire.
#[test]
fn t71_resolutions_decide_which_keys_the_expiry_check_judges() {
    let mut h = H::default();
    for key in ["a", "b", "c"] {
        h.ok("h0", acquire(key), 0, 10, granted(1));
    }
    h.refused(
        "r0",
        resolve("a", None, false, true),
        20,
        30,
        "UNSAFE_NOT_RETRYABLE",
    );
    h.ambiguous("r0", resolve("b", None, true, true), 40);
    h.ok(
        "r0",
        resolve("c", None, false, false),
        50,
        60,
        Output::Retryable,
    );
    h.ok(
        "r0",
        acquire("c"),
        70,
        80,
        Output::NotGranted("contended".into()),
    );
    let unresolved: Vec<String> = effect::unresolved_keys(&h.ops)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(unresolved, ["a"]);
    // c's second acquire answering in_progress is resolved-not-retryable's to judge (with
    // nothing sent meanwhile, it would be a violation there), not fresh-key-acquire's.
    h.ops[6].outcome = Outcome::Ok(Output::NotGranted("in_progress".into()));
    assert_reported(&effect::check(&h.ops, 100_000), "fresh-key-acquire", false);
    assert_eq!(rules(&reconcile::check(&h.ops)), ["resolved-not-retryable"]);
}

/// A courier's reply with token `t1`.
fn courier_reply(key: &str) -> Input {
    Input::Reply {
        key: key.into(),
        token: "t1".into(),
    }
}

/// The courier rules on `h`, final reads from 4 s on.
fn courier_rules(h: &H) -> Vec<Violation> {
    courier::check(&h.ops, 4_000_000)
}

#[test]
fn t71_a_courier_ticket_accepted_late_or_expired_early_is_reported() {
    let key = "courier-c0-1";
    // Offered at 0–10 ms with a TTL of 1.5 s: the deadline lies in 1,500–1,510 ms; the rules
    // judge with 250 ms of slack either side.
    let offered = || {
        let mut h = H::default();
        h.ok("c0", offer(key), 0, 10, ticket(1, "offered", None));
        h
    };
    let taken = || {
        let mut h = offered();
        h.ok("c0", take(key), 20, 30, handle(1, "t1"));
        h
    };
    let judged = |h: &H| {
        rules(&courier_rules(h))
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    for (late_call, outcome, ret, expected) in [
        // Sent after the deadline certainly passed, acknowledged.
        (
            2_000,
            Outcome::Ok(Output::Done),
            2_010,
            vec!["late-accepted"],
        ),
        // Sent before it (and applied whenever): legal.
        (1_400, Outcome::Ok(Output::Done), 2_010, vec![]),
        // Refused EXPIRED though answered before the deadline could have come.
        (
            900,
            Outcome::Refused("EXPIRED".into()),
            1_000,
            vec!["premature-expiry"],
        ),
        // Answered late enough: legal.
        (1_300, Outcome::Refused("EXPIRED".into()), 1_400, vec![]),
    ] {
        let mut h = taken();
        h.op(
            "c0",
            courier_reply(key),
            late_call,
            Some(ret),
            outcome.clone(),
        );
        assert_eq!(judged(&h), expected, "reply at {late_call}: {outcome:?}");
        // The same for the take itself.
        let mut h = offered();
        let answer = match &outcome {
            Outcome::Ok(_) => Outcome::Ok(handle(1, "t1")),
            other => other.clone(),
        };
        h.op("c0", take(key), late_call, Some(ret), answer);
        assert_eq!(judged(&h), expected, "take at {late_call}: {outcome:?}");
        // The handoff model (no clock) would call an EXPIRED take of a fresh ticket wrong:
        // courier keys are not its to judge.
        assert_reported(&handoff::check(&h.ops, 4_000_000), "linearizable", false);
    }
    // A fresh key's first offer answering another generation.
    let mut h = offered();
    h.ops[0].outcome = Outcome::Ok(ticket(2, "offered", None));
    assert_eq!(judged(&h), ["fresh-offer"]);
    // A courier's calls are refused nothing but EXPIRED (its take, its reply).
    for (input, code) in [
        (take(key), "TAKEN"),
        (courier_reply(key), "LEASE_LOST"),
        (courier_reply(key), "ALREADY_SETTLED"),
        (offer(key), "IDEMPOTENCY_CONFLICT"),
    ] {
        let mut h = taken();
        h.refused("c0", input.clone(), 40, 50, code);
        assert_eq!(judged(&h), ["unexpected-refusal"], "{input} {code}");
    }
    let mut h = offered();
    h.ops[0].outcome = Outcome::Refused("INVALID_ARGUMENT".into());
    assert_eq!(judged(&h), ["unexpected-refusal"]);
}

#[test]
fn t71_a_settled_courier_ticket_offered_again_must_start_a_generation() {
    let key = "courier-c0-1";
    let mut h = H::default();
    h.ok("c0", offer(key), 0, 10, ticket(1, "offered", None));
    h.ok("c0", take(key), 20, 30, handle(1, "t1"));
    h.ok("c0", courier_reply(key), 40, 50, Output::Done);
    h.ok("c0", offer(key), 60, 70, ticket(1, "closed", None));
    let violations = courier_rules(&h);
    assert_eq!(rules(&violations), ["reoffer-generation"], "{violations:?}");
    h.ops[3].outcome = Outcome::Ok(ticket(2, "offered", None));
    assert!(courier_rules(&h).is_empty());
    // With the reply unanswered the ticket may still have been taken: a replay is legal ...
    h.ops[2].outcome = Outcome::Ambiguous("timed out".into());
    h.ops[2].ret = None;
    h.ops[3].outcome = Outcome::Ok(ticket(1, "accepted", Some("dst")));
    assert!(courier_rules(&h).is_empty());
    // ... unless it was sent after the deadline had certainly passed (lazy expiry).
    h.ops[3].call = 1_800_000;
    h.ops[3].ret = Some(1_810_000);
    let violations = courier_rules(&h);
    assert_eq!(rules(&violations), ["reoffer-generation"], "{violations:?}");
    // Settled by an answered EXPIRED (of the take): a new generation too.
    let mut h = H::default();
    h.ok("c0", offer(key), 0, 10, ticket(1, "offered", None));
    h.refused("c0", take(key), 1_550, 1_560, "EXPIRED");
    h.ok("c0", offer(key), 1_570, 1_580, ticket(1, "expired", None));
    let violations = courier_rules(&h);
    assert_eq!(rules(&violations), ["reoffer-generation"], "{violations:?}");
    h.ops[2].outcome = Outcome::Ok(ticket(2, "offered", None));
    assert!(courier_rules(&h).is_empty());
}

#[test]
fn t71_a_courier_ticket_in_the_wrong_state_after_recovery_is_reported() {
    let key = "courier-c0-1";
    let base = |reply: Option<Outcome>| {
        let mut h = H::default();
        h.ok("c0", offer(key), 0, 10, ticket(1, "offered", None));
        h.ok("c0", take(key), 20, 30, handle(1, "t1"));
        if let Some(outcome) = reply {
            let ret = matches!(outcome, Outcome::Ok(_)).then_some(50);
            h.op("c0", courier_reply(key), 40, ret, outcome);
        }
        h
    };
    // Read at 9 s: the deadline (by 1.76 s) passed more than the sweeper's 5 s before.
    let judged = |mut h: H, generation: u64, state: &str| {
        h.ok(
            "final",
            read(key),
            9_000,
            9_010,
            ticket(generation, state, None),
        );
        rules(&courier_rules(&h))
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let bad = ["final-state"];
    let none: [&str; 0] = [];
    // A reply acknowledged: closed, never expired.
    let acked = || base(Some(Outcome::Ok(Output::Done)));
    assert_eq!(judged(acked(), 1, "closed"), none);
    assert_eq!(judged(acked(), 1, "expired"), bad);
    // No reply: expired (the sweep), never closed nor still accepted.
    assert_eq!(judged(base(None), 1, "expired"), none);
    assert_eq!(judged(base(None), 1, "closed"), bad);
    assert_eq!(judged(base(None), 1, "accepted"), bad);
    // A reply unanswered: either.
    let unknown = || base(Some(Outcome::Ambiguous("timed out".into())));
    assert_eq!(judged(unknown(), 1, "closed"), none);
    assert_eq!(judged(unknown(), 1, "expired"), none);
    // Offered again as generation 2 (answered at 70 ms): only generation 2, expired by now.
    let again = |outcome: Outcome| {
        let mut h = acked();
        let ret = matches!(outcome, Outcome::Ok(_)).then_some(70);
        h.op("c0", offer(key), 60, ret, outcome);
        h
    };
    let made = || again(Outcome::Ok(ticket(2, "offered", None)));
    assert_eq!(judged(made(), 2, "expired"), none);
    assert_eq!(judged(made(), 2, "offered"), bad);
    assert_eq!(judged(made(), 1, "closed"), bad);
    // Unanswered: generation 1's ending, or generation 2 (maybe applied late, not yet expired).
    let maybe = || again(Outcome::Ambiguous("timed out".into()));
    assert_eq!(judged(maybe(), 1, "closed"), none);
    assert_eq!(judged(maybe(), 2, "offered"), none);
    assert_eq!(judged(maybe(), 1, "expired"), bad);
    // Read sooner, a ticket the sweeper may not have reached yet is not judged; nor is a read
    // that found no ticket (handoff's lost-ack reports that).
    let mut h = base(None);
    h.ok(
        "final",
        read(key),
        6_500,
        6_510,
        ticket(1, "accepted", None),
    );
    assert!(courier_rules(&h).is_empty());
    let mut h = base(None);
    h.refused("final", read(key), 9_000, 9_010, "UNKNOWN_KEY");
    assert!(courier_rules(&h).is_empty());
}

/// A completed key refuses nothing but a reconcile (`NOT_UNCERTAIN`): an acquire or a resolution
/// of it answers the result.
#[test]
fn t71_a_completed_key_refusing_a_resolution_is_reported() {
    let completed = || {
        let mut h = H::default();
        h.ok("h0", acquire("k"), 0, 10, granted(1));
        h.ok(
            "h0",
            Input::CompleteEffect {
                key: "k".into(),
                resource: "res-0".into(),
                fence: 1,
            },
            20,
            30,
            Output::Result("k".into()),
        );
        h
    };
    let mut h = completed();
    h.refused("r0", begin("k"), 40, 50, "NOT_UNCERTAIN");
    assert_reported(&effect::check(&h.ops, 100_000), "completed-final", false);
    for (input, code) in [
        (resolve("k", None, false, false), "NOT_UNCERTAIN"),
        (resolve("k", None, false, true), "UNSAFE_NOT_RETRYABLE"),
        (begin("k"), "RECONCILE_TAKEN"),
    ] {
        let mut h = completed();
        h.refused("r0", input.clone(), 40, 50, code);
        assert_reported(&effect::check(&h.ops, 100_000), "completed-final", true);
        // Sent before the completion's answer came back: it may have come first.
        h.ops[2].call = 25_000;
        assert_reported(&effect::check(&h.ops, 100_000), "completed-final", false);
    }
}

/// `contended` needs a hold that may have been live: a grant on the resource neither released
/// (answered) nor certainly expired (answer + TTL 2 s + 250 ms) before the acquire was sent, or
/// a grant left unanswered.
#[test]
fn t71_an_acquire_contended_on_a_free_resource_is_reported() {
    let contended = || Outcome::Ok(Output::NotGranted("contended".into()));
    let release = Input::ReleaseEffect {
        key: "a".into(),
        resource: "res-0".into(),
        fence: 1,
    };
    let judged = |h: &H| rules(&effect::check(&h.ops, 100_000)).contains(&"unexplained-contended");
    // Held: explained.
    let mut h = H::default();
    h.ok("h0", acquire("a"), 0, 10, granted(1));
    h.op("h1", acquire("b"), 20, Some(30), contended());
    assert!(!judged(&h));
    // Released (answered) before the acquire was sent: unexplained ...
    let mut freed = H::default();
    freed.ok("h0", acquire("a"), 0, 10, granted(1));
    freed.ok("h0", release.clone(), 12, 15, Output::Done);
    freed.op("h1", acquire("b"), 20, Some(30), contended());
    let violations = effect::check(&freed.ops, 100_000);
    assert_eq!(
        rules(&violations),
        ["unexplained-contended"],
        "{violations:?}"
    );
    assert_eq!(violations[0].ops, [2]);
    // ... but not when the release was refused (it freed nothing), or still on its way.
    let mut h = H {
        ops: freed.ops.clone(),
    };
    h.ops[1].outcome = Outcome::Refused("FENCE_STALE".into());
    assert!(!judged(&h));
    let mut h = H {
        ops: freed.ops.clone(),
    };
    h.ops[1].ret = Some(25_000);
    assert!(!judged(&h));
    // A release of another fence frees nothing of this hold.
    let mut h = H {
        ops: freed.ops.clone(),
    };
    h.ops[1].input = Input::ReleaseEffect {
        key: "a".into(),
        resource: "res-0".into(),
        fence: 7,
    };
    assert!(!judged(&h));
    // Certainly expired before the acquire was sent (answer 10 ms + TTL 2,000 + slack 250 <
    // 2,300): unexplained; sent at 2,200 ms, it may not have been.
    let mut h = H::default();
    h.ok("h0", acquire("a"), 0, 10, granted(1));
    h.op("h1", acquire("b"), 2_300, Some(2_310), contended());
    assert!(judged(&h));
    h.ops[1].call = 2_200_000;
    assert!(!judged(&h));
    h.ops[1].call = 2_300_000;
    // An acquire sent after the answer came back explains nothing; one that went unanswered,
    // sent before, may have been granted meanwhile.
    h.ambiguous("h2", acquire("c"), 2_400);
    assert!(judged(&h));
    h.ambiguous("h2", acquire("c"), 2_250);
    assert!(!judged(&h));
}

/// The handoff watch's delivery of `kind` of `key`'s generation `fence`, naming `taker`.
fn ticket_change(kind: &str, key: &str, taker: &str, fence: u64) -> Input {
    Input::WatchLease {
        kind: kind.into(),
        key: key.into(),
        holder: taker.into(),
        fence,
    }
}

fn reply_with(key: &str, token: &str) -> Input {
    Input::Reply {
        key: key.into(),
        token: token.into(),
    }
}

fn cancel(key: &str) -> Input {
    Input::Cancel {
        key: key.into(),
        by: handoff::FROM.into(),
    }
}

/// Two couriers' tickets (TTL 1.5 s) and an hour-long one, every change delivered: `courier-a/1`
/// is offered, taken, replied to, offered again and left to expire; `ticket-0` is offered and
/// withdrawn; `courier-b/1` is offered and taken, never replied to, and lost. Without the two
/// ends (`ends: false`), which a test adds itself.
fn tickets_watched(ends: bool) -> H {
    let w = handoff_watch::NAME;
    let (a, b, dst) = ("courier-a/1", "courier-b/1", handoff::TO);
    let mut h = H::default();
    h.ok("c0", offer(a), 0, 10, ticket(1, "offered", None));
    h.ok(w, ticket_change("offered", a, "", 1), 11, 11, at(1));
    h.ok("c0", take(a), 20, 30, handle(1, "t1"));
    h.ok(w, ticket_change("taken", a, dst, 1), 31, 31, at(2));
    h.ok("c0", reply_with(a, "t1"), 40, 50, Output::Done);
    h.ok(w, ticket_change("closed", a, dst, 1), 51, 51, at(3));
    h.ok("c0", offer(a), 60, 70, ticket(2, "offered", None));
    h.ok(w, ticket_change("offered", a, "", 2), 71, 71, at(4));
    h.ok(
        "c1",
        offer("ticket-0"),
        100,
        110,
        ticket(1, "offered", None),
    );
    h.ok(
        w,
        ticket_change("offered", "ticket-0", "", 1),
        111,
        111,
        at(5),
    );
    h.ok("c1", cancel("ticket-0"), 120, 130, Output::Done);
    h.ok(
        w,
        ticket_change("withdrawn", "ticket-0", "", 1),
        131,
        131,
        at(6),
    );
    h.ok("c2", offer(b), 200, 210, ticket(1, "offered", None));
    h.ok(w, ticket_change("offered", b, "", 1), 211, 211, at(7));
    h.ok("c2", take(b), 220, 230, handle(1, "t9"));
    h.ok(w, ticket_change("taken", b, dst, 1), 231, 231, at(8));
    if ends {
        h.ok(w, ticket_change("expired", a, "", 2), 1_600, 1_600, at(9));
        h.ok(w, ticket_change("lost", b, dst, 1), 1_800, 1_800, at(10));
    }
    h
}

fn handoff_watch_rules(h: &H) -> Vec<String> {
    rules(&handoff_watch::check(&h.ops, true))
        .into_iter()
        .map(String::from)
        .collect()
}

/// `h` without its op `i` (the others renumbered).
fn without(mut h: H, i: usize) -> H {
    h.ops.remove(i);
    for (index, op) in h.ops.iter_mut().enumerate() {
        op.index = index;
    }
    h
}

/// The handoff watch's rules: every acknowledged offer, take, reply and cancel is delivered,
/// and on the couriers' short-lived tickets every generation's end; each change after a call
/// that explains it, an expiry or loss no sooner than the TTL after the offer that created the
/// generation was sent (less the clock slack), and one end per generation, as its calls say,
/// before the next is offered.
#[test]
fn t71_the_handoff_watch_delivers_every_change_of_a_ticket_and_each_end_in_time() {
    let w = handoff_watch::NAME;
    let (a, b, dst) = ("courier-a/1", "courier-b/1", handoff::TO);
    let h = tickets_watched(true);
    let violations = handoff_watch::check(&h.ops, true);
    assert!(violations.is_empty(), "{violations:?}");
    assert!(handoff_watch::all_delivered(&h.ops));

    // Early: the second generation of `a` expired 1,260 ms after its offer was sent (1,500 ms
    // TTL, 250 ms slack); `b` lost 1,440 ms after; an hour-long ticket expired after 5 s. Just
    // within the slack passes.
    let mut h = tickets_watched(true);
    h.ops[16].call = 1_320_000;
    assert!(handoff_watch_rules(&h).is_empty());
    h.ops[16].call = 1_300_000;
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-early"]);
    let mut h = tickets_watched(true);
    h.ops[17].call = 1_440_000;
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-early"]);
    let mut h = tickets_watched(true);
    h.ok(
        "c3",
        offer("ticket-1"),
        300,
        310,
        ticket(1, "offered", None),
    );
    h.ok(
        w,
        ticket_change("offered", "ticket-1", "", 1),
        311,
        311,
        at(11),
    );
    h.ok(
        w,
        ticket_change("expired", "ticket-1", "", 1),
        5_000,
        5_000,
        at(12),
    );
    let violations = handoff_watch::check(&h.ops, true);
    assert_eq!(rules(&violations), ["watch-ticket-early"], "{violations:?}");
    assert_eq!(violations[0].ops, [20]);

    // Phantoms: an offer of a key nobody offered; a take by another agent; a loss of a
    // generation only a take acknowledged with another generation could explain; a reply with
    // a token other than the take's; a withdrawal nobody asked for; an offer delivered before
    // it was sent; a take delivered before the watch delivered its offer.
    for change in [
        ticket_change("offered", "ticket-9", "", 1),
        ticket_change("taken", b, "other", 1),
        ticket_change("lost", a, dst, 2),
        ticket_change("withdrawn", a, "", 2),
    ] {
        let mut h = tickets_watched(false);
        h.ok(w, change.clone(), 1_900, 1_900, at(11));
        assert!(
            handoff_watch_rules(&h).contains(&"watch-ticket-phantom".to_string()),
            "{change}"
        );
    }
    let mut h = tickets_watched(true);
    h.ops[4].input = reply_with(a, "t7");
    assert!(handoff_watch_rules(&h).contains(&"watch-ticket-phantom".to_string()));
    let mut h = tickets_watched(true);
    h.ops[0].call = 12_000;
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-phantom"]);
    let mut h = tickets_watched(true);
    h.ops[1].input = ticket_change("taken", a, dst, 1);
    h.ops[1].call = 25_000;
    h.ops[3].input = ticket_change("offered", a, "", 1);
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-phantom"]);
    // The same take unanswered explains a `taken` of any generation; refused, none.
    let mut h = tickets_watched(true);
    h.ops[2].outcome = Outcome::Ambiguous("timed out".into());
    h.ok(w, ticket_change("lost", a, dst, 2), 1_900, 1_900, at(11));
    assert!(!handoff_watch_rules(&h).contains(&"watch-ticket-phantom".to_string()));
    let mut h = tickets_watched(true);
    h.ops[14].outcome = Outcome::Refused("TAKEN".into());
    assert!(handoff_watch_rules(&h).contains(&"watch-ticket-phantom".to_string()));

    // Ended: a second end; an expiry of a generation an acknowledged take took; a loss of one
    // an acknowledged reply closed; a withdrawal of one taken; the next generation offered
    // before the last one's end.
    let mut h = tickets_watched(true);
    h.ok(w, ticket_change("expired", a, "", 2), 1_900, 1_900, at(11));
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-ended"]);
    let mut h = tickets_watched(true);
    h.ops[17].input = ticket_change("expired", b, "", 1);
    let found = handoff_watch_rules(&h);
    assert!(
        found.contains(&"watch-ticket-ended".to_string()),
        "{found:?}"
    );
    let mut h = tickets_watched(true);
    h.ops[5].input = ticket_change("lost", a, dst, 1);
    let found = handoff_watch_rules(&h);
    assert!(
        found.contains(&"watch-ticket-ended".to_string()),
        "{found:?}"
    );
    let mut h = tickets_watched(true);
    h.ok("c2", cancel(b), 240, 250, Output::Done);
    h.ok(w, ticket_change("withdrawn", b, "", 1), 251, 251, at(11));
    let found = handoff_watch_rules(&h);
    assert!(
        found.contains(&"watch-ticket-ended".to_string()),
        "{found:?}"
    );
    let mut h = tickets_watched(true);
    h.ops[5].input = ticket_change("offered", a, "", 2);
    h.ops[6].call = 45_000;
    h.ops[7].input = ticket_change("closed", a, dst, 1);
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-ended"]);
    // The same after a compaction: the watch's generations since then count.
    let mut h = tickets_watched(true);
    h.ops[0].outcome = Outcome::Ambiguous("timed out".into());
    h.ops[0].ret = None;
    h.ops[1].input = Input::WatchCompacted { requested: 1 };
    h.ops[5].input = ticket_change("offered", a, "", 2);
    h.ops[6].call = 45_000;
    h.ops[7].input = ticket_change("closed", a, dst, 1);
    let found = handoff_watch_rules(&h);
    assert!(found.is_empty(), "{found:?}");
    h.ops[3].input = ticket_change("offered", a, "", 1);
    let found = handoff_watch_rules(&h);
    assert!(
        found.contains(&"watch-ticket-ended".to_string()),
        "{found:?}"
    );

    // Missed, once the run was read back: the couriers' ends; each offer, take, reply and
    // cancel.
    let h = tickets_watched(false);
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-missed"]);
    assert!(handoff_watch::check(&h.ops, false).is_empty());
    assert!(!handoff_watch::all_delivered(&h.ops));
    for delivery in [1, 3, 5, 7, 11] {
        let h = without(tickets_watched(true), delivery);
        let found = handoff_watch_rules(&h);
        assert!(
            found.contains(&"watch-ticket-missed".to_string()),
            "{delivery}: {found:?}"
        );
    }
    // A courier's generation never taken must expire; one taken and never replied to, be lost.
    for (delivery, what) in [
        (16, "the expiry of generation 2 (never taken)"),
        (17, "the loss of generation 1, taken by dst (never replied)"),
    ] {
        let violations = handoff_watch::check(&without(tickets_watched(true), delivery).ops, true);
        assert_eq!(
            rules(&violations),
            ["watch-ticket-missed"],
            "{violations:?}"
        );
        assert!(violations[0].detail.starts_with(what), "{violations:?}");
    }
    // A courier's generation a take left unanswered may have taken: it must end somehow.
    let mut h = tickets_watched(true);
    h.ops[14].outcome = Outcome::Ambiguous("timed out".into());
    h.ops[14].ret = None;
    assert!(handoff_watch_rules(&h).is_empty());
    let violations = handoff_watch::check(&without(h, 17).ops, true);
    assert_eq!(
        rules(&violations),
        ["watch-ticket-missed"],
        "{violations:?}"
    );
    assert!(violations[0].detail.starts_with("the end of generation 1"));
    // Two cancels acknowledged, one withdrawal delivered.
    let mut h = tickets_watched(true);
    h.ok("c1", cancel("ticket-0"), 140, 150, Output::Done);
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-missed"]);
    // A taken ticket whose reply went unanswered may have been closed or lost: any end will do,
    // and an hour-long ticket's need not come.
    let mut h = tickets_watched(true);
    h.ok("c2", reply_with(b, "t9"), 240, 250, Output::Done);
    h.ops[17].input = ticket_change("closed", b, dst, 1);
    assert!(handoff_watch_rules(&h).is_empty());
    let mut h = tickets_watched(true);
    h.ok("c2", reply_with(b, "t9"), 240, 250, Output::Done);
    assert_eq!(
        handoff_watch_rules(&h),
        ["watch-ticket-ended", "watch-ticket-missed"]
    );
    let mut h = tickets_watched(true);
    h.ambiguous("c2", reply_with(b, "t9"), 240);
    assert!(handoff_watch_rules(&h).is_empty());
    // Sent before a compaction the watch met: it may have been in the history compacted away.
    let mut h = tickets_watched(false);
    h.ok(
        w,
        Input::WatchCompacted { requested: 9 },
        1_000,
        1_000,
        at(9),
    );
    assert!(handoff_watch_rules(&h).is_empty());
}

/// The handoff watch after a compaction, and the calls a change must have behind it: an
/// acknowledged offer answering a generation created before the compaction need not be
/// delivered; a withdrawal needs a cancel by the ticket's source, a closing a take of that
/// generation, any change enough offers to create its generation; withdrawals delivered before
/// a compaction do not stand for cancels acknowledged after it.
#[test]
fn t71_the_handoff_watch_judges_a_generation_by_the_offers_that_can_have_created_it() {
    let w = handoff_watch::NAME;
    let (a, dst) = ("courier-a/1", handoff::TO);
    // `ticket-5` offered by a call left unanswered, the history compacted, and offered again:
    // the answer is the live generation the first offer made, which may have been in the
    // compacted history. Had the first offer come after the compaction, it must be delivered.
    for (first, expected) in [
        (300, Vec::<String>::new()),
        (450, vec!["watch-ticket-missed".into()]),
    ] {
        let mut h = tickets_watched(true);
        h.ambiguous("c3", offer("ticket-5"), first);
        h.ok(w, Input::WatchCompacted { requested: 11 }, 400, 400, at(11));
        h.ok(
            "c3",
            offer("ticket-5"),
            500,
            510,
            ticket(1, "offered", None),
        );
        assert_eq!(
            handoff_watch_rules(&h),
            expected,
            "first offer at {first} ms"
        );
    }

    // A never-taken courier generation delivered closed (a reply of the generation before was
    // sent): no take can have taken it, and its expiry is missing.
    let mut h = tickets_watched(true);
    h.ops[16].input = ticket_change("closed", a, dst, 2);
    assert_eq!(
        handoff_watch_rules(&h),
        ["watch-ticket-missed", "watch-ticket-phantom"]
    );
    // A generation no offer sent before can have created; a withdrawal only the addressee
    // asked for (it is refused `NOT_SOURCE`, here unanswered).
    let mut h = tickets_watched(true);
    h.ok(w, ticket_change("offered", a, "", 3), 1_900, 1_900, at(11));
    assert!(handoff_watch_rules(&h).contains(&"watch-ticket-phantom".to_string()));
    let mut h = tickets_watched(true);
    h.ops[10].input = Input::Cancel {
        key: "ticket-0".into(),
        by: dst.into(),
    };
    h.ops[10].outcome = Outcome::Ambiguous("timed out".into());
    h.ops[10].ret = None;
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-phantom"]);

    // The end of `a`'s first generation compacted away: its second generation's offer does
    // not come before an end the watch can have seen.
    let mut h = tickets_watched(true);
    h.ops[3].input = Input::WatchCompacted { requested: 2 };
    h.ops[5].input = Input::WatchCompacted { requested: 3 };
    let found = handoff_watch_rules(&h);
    assert!(found.is_empty(), "{found:?}");

    // `ticket-0`'s first generation withdrawn and delivered before a compaction; its second
    // withdrawn by an acknowledged cancel after it, not delivered.
    let mut h = tickets_watched(true);
    h.ok(
        w,
        Input::WatchCompacted { requested: 11 },
        1_900,
        1_900,
        at(11),
    );
    h.ok(
        "c1",
        offer("ticket-0"),
        2_000,
        2_010,
        ticket(2, "offered", None),
    );
    h.ok(
        w,
        ticket_change("offered", "ticket-0", "", 2),
        2_011,
        2_011,
        at(12),
    );
    h.ok("c1", cancel("ticket-0"), 2_020, 2_030, Output::Done);
    assert_eq!(handoff_watch_rules(&h), ["watch-ticket-missed"]);
    h.ok(
        w,
        ticket_change("withdrawn", "ticket-0", "", 2),
        2_031,
        2_031,
        at(13),
    );
    assert!(handoff_watch_rules(&h).is_empty());
}

/// The queue watch's delivery of `kind` of task `task`'s attempt with permit `token`, by
/// `worker`.
fn attempt_change(kind: &str, task: u64, worker: &str, token: u64) -> Input {
    Input::WatchLease {
        kind: kind.into(),
        key: task.to_string(),
        holder: worker.into(),
        fence: token,
    }
}

fn lease_by(worker: &str) -> Input {
    Input::Lease {
        worker: worker.into(),
    }
}

fn start_of(task: u64, worker: &str, token: u64) -> Input {
    Input::StartAttempt {
        task,
        attempt: 1,
        worker: worker.into(),
        concurrency_key: "key-0".into(),
        token,
    }
}

/// w0 leases task 1 (token 1), starts and completes it; w1 leases task 2 (token 4) and walks
/// away, so its lease (3 s) runs out: every change delivered, the loss after the TTL. Without
/// the loss's delivery (`lost_at: None`), which a test adds itself.
fn queue_watched(lost_at: Option<u64>) -> H {
    let w = queue_watch::NAME;
    let mut h = H::default();
    h.ok(
        "w0",
        lease_by("w0"),
        0,
        10,
        leased(1, "key-0", Some(1), None),
    );
    h.ok(w, attempt_change("leased", 1, "w0", 1), 11, 11, at(1));
    h.ok(
        "w0",
        start_of(1, "w0", 1),
        20,
        30,
        Output::TaskState("running".into()),
    );
    h.ok(w, attempt_change("started", 1, "w0", 1), 31, 31, at(2));
    let complete = end_attempt(1, 1, AttemptEnd::Complete);
    h.ok(
        "w0",
        complete,
        40,
        50,
        Output::TaskState("succeeded".into()),
    );
    h.ok(w, attempt_change("succeeded", 1, "w0", 1), 51, 51, at(3));
    h.ok(
        "w1",
        lease_by("w1"),
        100,
        110,
        leased(2, "key-1", Some(4), None),
    );
    h.ok(w, attempt_change("leased", 2, "w1", 4), 111, 111, at(4));
    if let Some(lost_at) = lost_at {
        h.ok(
            w,
            attempt_change("lost", 2, "w1", 4),
            lost_at,
            lost_at,
            at(5),
        );
    }
    h
}

fn queue_watch_rules(h: &H) -> Vec<String> {
    rules(&queue_watch::check(&h.ops, true))
        .into_iter()
        .map(String::from)
        .collect()
}

/// The queue watch's rules: every acknowledged lease, start and completion of an attempt, and
/// the loss of every attempt nothing can have ended, are delivered with the worker and permit
/// token, each after a call that explains it; a loss no sooner than the lease TTL after the
/// lease was sent (less the clock slack), and never of an attempt whose end was acknowledged.
#[test]
fn t71_the_queue_watch_delivers_every_attempt_change_and_each_loss_in_time() {
    let w = queue_watch::NAME;
    let violations = queue_watch::check(&queue_watched(Some(3_200)).ops, true);
    assert!(violations.is_empty(), "{violations:?}");
    assert!(queue_watch::all_delivered(&queue_watched(Some(3_200)).ops));
    // Within the clock slack of the TTL counted from the lease's sending (100 ms).
    assert!(queue_watch_rules(&queue_watched(Some(2_900))).is_empty());

    // Lost early: 2.7 s into a 3 s lease.
    let h = queue_watched(Some(2_800));
    let violations = queue_watch::check(&h.ops, true);
    assert_eq!(rules(&violations), ["watch-lost-early"], "{violations:?}");
    assert_eq!(violations[0].ops, [6, 8]);

    // Lost although its end was acknowledged (w0's attempt, completed).
    let mut h = queue_watched(Some(3_200));
    h.ok(w, attempt_change("lost", 1, "w0", 1), 3_300, 3_300, at(6));
    let violations = queue_watch::check(&h.ops, true);
    assert_eq!(rules(&violations), ["watch-lost-ended"], "{violations:?}");
    assert_eq!(violations[0].ops, [4, 9]);

    // Phantoms: a lease by a worker that sent none, or whose lease was answered with other work;
    // a start and a completion nobody sent; a lease delivered before it was sent; a start
    // delivered before the watch delivered the lease.
    for change in [
        attempt_change("leased", 3, "w9", 5),
        attempt_change("leased", 3, "w0", 5),
        attempt_change("lost", 3, "w0", 5),
        attempt_change("started", 2, "w1", 4),
        attempt_change("succeeded", 2, "w1", 4),
    ] {
        let mut h = queue_watched(Some(3_200));
        h.ok(w, change.clone(), 3_300, 3_300, at(6));
        assert_eq!(queue_watch_rules(&h), ["watch-queue-phantom"], "{change}");
    }
    // A lease left unanswered may have handed out any attempt; one refused, none.
    let mut h = queue_watched(Some(3_200));
    h.ambiguous("w0", lease_by("w0"), 200);
    h.ok(w, attempt_change("leased", 3, "w0", 5), 3_300, 3_300, at(6));
    let found = queue_watch_rules(&h);
    assert!(
        !found.contains(&"watch-queue-phantom".to_string()),
        "{found:?}"
    );
    for (op, late) in [(0, 12_000), (2, 32_000)] {
        let mut h = queue_watched(Some(3_200));
        h.ops[op].call = late;
        assert_eq!(queue_watch_rules(&h), ["watch-queue-phantom"], "{op}");
    }
    let mut h = queue_watched(Some(3_200));
    h.ops[1].input = attempt_change("started", 1, "w0", 1);
    h.ops[1].call = 35_000;
    h.ops[3].input = attempt_change("leased", 1, "w0", 1);
    assert_eq!(queue_watch_rules(&h), ["watch-queue-phantom"]);

    // Missed, once the run was read back: the loss; the lease (or delivered to another worker),
    // the start, the completion.
    let h = queue_watched(None);
    assert_eq!(queue_watch_rules(&h), ["watch-queue-missed"]);
    assert!(queue_watch::check(&h.ops, false).is_empty());
    assert!(!queue_watch::all_delivered(&h.ops));
    for delivery in [1, 3, 5] {
        let h = without(queue_watched(Some(3_200)), delivery);
        let found = queue_watch_rules(&h);
        assert!(
            found.contains(&"watch-queue-missed".to_string()),
            "{delivery}: {found:?}"
        );
    }
    let mut h = queue_watched(Some(3_200));
    h.ops[7].input = attempt_change("leased", 2, "w9", 4);
    let found = queue_watch_rules(&h);
    assert!(
        found.contains(&"watch-queue-missed".to_string()),
        "{found:?}"
    );
    // An end or a cancel refused: the lease ran out, and its loss must be delivered; one
    // unanswered may have ended it, and nothing need be.
    for input in [end_attempt(2, 4, AttemptEnd::Unknown), cancel_task(2)] {
        let mut h = queue_watched(None);
        h.refused("w1", input.clone(), 3_300, 3_310, "LEASE_LOST");
        assert_eq!(queue_watch_rules(&h), ["watch-queue-missed"], "{input}");
        let mut h = queue_watched(None);
        h.ambiguous("w1", input.clone(), 300);
        assert!(queue_watch_rules(&h).is_empty(), "{input}");
    }
    // Sent before a compaction the watch met: it may have been in the history compacted away.
    let mut h = queue_watched(None);
    h.ok(w, Input::WatchCompacted { requested: 5 }, 200, 200, at(5));
    assert!(queue_watch_rules(&h).is_empty());
}

/// A read of task `task` showing its one attempt (by `worker`, permit `token`) with `outcome`.
fn attempt_read(h: &mut H, task: u64, worker: &str, token: u64, outcome: &str, at: u64) {
    let attempts = vec![AttemptRecord {
        number: 1,
        worker: worker.into(),
        token: Some(token),
        outcome: outcome.into(),
    }];
    let state = "WAITING".to_string();
    h.ok(
        "final",
        Input::Attempts { task },
        at,
        at + 10,
        Output::AttemptList { state, attempts },
    );
}

/// The queue watch judges a loss by the attempt's outcome where a read showed it: an attempt
/// read back `EXPIRED` must be delivered `lost` (a cancel of its task, answered, does not excuse
/// it), an attempt read with another outcome after its loss was delivered was not lost; a
/// change delivered twice, or naming another worker than the call's, is a phantom.
#[test]
fn t71_the_queue_watch_judges_a_loss_by_the_outcome_read_back() {
    let w = queue_watch::NAME;
    // Read back EXPIRED, and lost: legal; not delivered, though a cancel was answered: missed.
    let mut h = queue_watched(Some(3_200));
    attempt_read(&mut h, 2, "w1", 4, "EXPIRED", 4_000);
    assert!(queue_watch_rules(&h).is_empty());
    let mut h = queue_watched(None);
    h.ok(
        "s",
        cancel_task(2),
        3_300,
        3_310,
        Output::TaskState("CANCELLED".into()),
    );
    assert!(queue_watch_rules(&h).is_empty());
    attempt_read(&mut h, 2, "w1", 4, "EXPIRED", 4_000);
    let violations = queue_watch::check(&h.ops, true);
    assert_eq!(rules(&violations), ["watch-queue-missed"], "{violations:?}");
    assert_eq!(violations[0].ops, [9]);
    // The same for an attempt whose lease went unanswered; unless the watch met a compaction.
    let mut h = queue_watched(Some(3_200));
    h.ambiguous("w0", lease_by("w0"), 200);
    attempt_read(&mut h, 3, "w0", 5, "EXPIRED", 4_000);
    assert_eq!(queue_watch_rules(&h), ["watch-queue-missed"]);
    h.ok(
        w,
        Input::WatchCompacted { requested: 6 },
        3_500,
        3_500,
        at(6),
    );
    assert!(queue_watch_rules(&h).is_empty());
    // Read back with another outcome after the loss was delivered; before it, still live.
    for outcome in ["CANCELLED", "ACTIVE", "SUCCEEDED"] {
        let mut h = queue_watched(Some(3_200));
        attempt_read(&mut h, 2, "w1", 4, outcome, 4_000);
        let violations = queue_watch::check(&h.ops, true);
        assert_eq!(rules(&violations), ["watch-lost-ended"], "{violations:?}");
        assert_eq!(violations[0].ops, [8, 9]);
    }
    let mut h = queue_watched(Some(3_200));
    attempt_read(&mut h, 2, "w1", 4, "ACTIVE", 1_000);
    assert!(queue_watch_rules(&h).is_empty());
    // Read back still live (leased just before the workloads stopped): no loss is owed yet.
    let mut h = queue_watched(None);
    attempt_read(&mut h, 2, "w1", 4, "ACTIVE", 2_000);
    assert!(queue_watch_rules(&h).is_empty());

    // Twice the same loss; a start or completion delivered with another worker.
    let mut h = queue_watched(Some(3_200));
    h.ok(w, attempt_change("lost", 2, "w1", 4), 3_300, 3_300, at(6));
    assert_eq!(queue_watch_rules(&h), ["watch-queue-phantom"]);
    for delivery in [3, 5] {
        let mut h = queue_watched(Some(3_200));
        let Input::WatchLease { holder, .. } = &mut h.ops[delivery].input else {
            unreachable!()
        };
        *holder = "w9".into();
        let found = queue_watch_rules(&h);
        assert_eq!(
            found,
            ["watch-queue-missed", "watch-queue-phantom"],
            "{delivery}"
        );
    }
}

fn sink_written(resource: &str, fence: u64, writes: u64, value: &str) -> Input {
    Input::WatchSinkWritten {
        resource: resource.into(),
        fence,
        seen_fence: fence,
        writes,
        value: value.into(),
    }
}

/// Two holders write one sink in turn (fences 1 and 3) and a stale third is refused; the watch
/// delivers both accepted writes, numbered 1 and 2.
fn sink_watched() -> H {
    let w = sink_watch::NAME;
    let r = effect::sink_of("res-0");
    let mut h = H::default();
    h.ok("h0", write(&r, 1, "a"), 0, 10, sink(1, 1, ""));
    h.ok(w, sink_written(&r, 1, 1, "a"), 11, 11, at(1));
    h.ok("h1", write(&r, 3, "b"), 20, 30, sink(3, 2, ""));
    h.ok(w, sink_written(&r, 3, 2, "b"), 31, 31, at(2));
    h.refused("h0", write(&r, 1, "c"), 40, 50, "FENCE_STALE");
    h
}

/// Three writes; the watch delivers the first, then meets `COMPACTED` (the second's change was
/// in the history compacted away) and goes on from revision 3 with the third.
fn sink_compacted() -> H {
    let w = sink_watch::NAME;
    let r = effect::sink_of("res-0");
    let mut h = H::default();
    h.ok("h0", write(&r, 1, "a"), 0, 10, sink(1, 1, ""));
    h.ok(w, sink_written(&r, 1, 1, "a"), 11, 11, at(1));
    h.ok("h1", write(&r, 2, "m"), 12, 14, sink(2, 2, ""));
    h.ok(w, Input::WatchCompacted { requested: 2 }, 15, 15, at(3));
    h.ok("h2", write(&r, 3, "b"), 20, 30, sink(3, 3, ""));
    h.ok(w, sink_written(&r, 3, 3, "b"), 31, 31, at(3));
    h
}

fn sink_watch_rules(h: &H) -> Vec<String> {
    rules(&sink_watch::check(&h.ops, true))
        .into_iter()
        .map(String::from)
        .collect()
}

/// Asserts that the sink watch reports `rule`, among anything else, for each of `cases`.
fn sink_watch_reports(rule: &str, cases: Vec<(&str, H)>) {
    for (what, h) in cases {
        let violations = sink_watch::check(&h.ops, true);
        assert!(rules(&violations).contains(&rule), "{what}: {violations:?}");
    }
}

/// The sink watch's rules: every acknowledged write is delivered as the write its answer
/// numbered, with its fence and value; each delivered write after a write that explains it; a
/// resource's writes delivered 1, 2, 3, ... with no gap or repeat (any after a compaction), each
/// leaving its own fence as the seen one, fences never going back.
#[test]
fn t71_the_sink_watch_delivers_every_accepted_write_in_order() {
    let w = sink_watch::NAME;
    let r = effect::sink_of("res-0");
    let h = sink_watched();
    let violations = sink_watch::check(&h.ops, true);
    assert!(violations.is_empty(), "{violations:?}");
    assert!(sink_watch::all_delivered(&h.ops));

    // Missed, once the run was read back: either write; or delivered with another value or
    // fence than the write its answer numbered.
    for delivery in [1, 3] {
        let h = without(sink_watched(), delivery);
        let violations = sink_watch::check(&h.ops, true);
        assert!(
            rules(&violations).contains(&"watch-sink-missed"),
            "{delivery}: {violations:?}"
        );
        assert!(!sink_watch::all_delivered(&h.ops));
        let unread = sink_watch::check(&h.ops, false);
        assert!(!rules(&unread).contains(&"watch-sink-missed"), "{unread:?}");
    }
    // (An unanswered write explains each delivery, so that only the mismatch is at fault.)
    for (fence, value) in [(3, "x"), (4, "b")] {
        let mut h = sink_watched();
        h.ops[3].input = sink_written(&r, fence, 2, value);
        h.ambiguous("h2", write(&r, fence, value), 21);
        assert_eq!(
            sink_watch_rules(&h),
            ["watch-sink-missed"],
            "{fence} {value}: {:?}",
            sink_watch::check(&h.ops, true)
        );
    }
    // A write sent before the latest compaction the watch met need not be delivered, and the
    // next write of its resource may be any later one.
    let violations = sink_watch::check(&sink_compacted().ops, true);
    assert!(violations.is_empty(), "{violations:?}");
    let mut h = sink_compacted();
    h.ops[2].call = 16_000;
    h.ops[2].ret = Some(18_000);
    assert_eq!(sink_watch_rules(&h), ["watch-sink-missed"], "sent after it");

    // Order: a gap, a repeat, a first write other than 1, a seen fence other than the write's,
    // a fence going back.
    let mut gap = sink_watched();
    gap.ops[3].input = sink_written(&r, 3, 3, "b");
    let mut repeat = sink_watched();
    repeat.ok(w, sink_written(&r, 3, 2, "b"), 60, 60, at(3));
    let mut late_first = sink_watched();
    late_first.ops[1].input = sink_written(&r, 1, 2, "a");
    late_first.ops[3].input = sink_written(&r, 3, 3, "b");
    let mut seen = sink_watched();
    seen.ops[3].input = Input::WatchSinkWritten {
        resource: r.clone(),
        fence: 3,
        seen_fence: 4,
        writes: 2,
        value: "b".into(),
    };
    let mut back = sink_watched();
    back.ok("h2", write(&r, 2, "d"), 55, 65, sink(2, 3, ""));
    back.ok(w, sink_written(&r, 2, 3, "d"), 66, 66, at(3));
    sink_watch_reports(
        "watch-sink-order",
        vec![
            ("gap", gap),
            ("repeat", repeat),
            ("late first", late_first),
            ("seen fence", seen),
            ("fence back", back),
        ],
    );

    // Phantoms: a write nobody sent, one delivered before it was sent, one refused, one with
    // another value or fence than any sent.
    let mut nobody = sink_watched();
    nobody.ok(w, sink_written(&r, 5, 3, "z"), 60, 60, at(3));
    let mut early = sink_watched();
    early.ops[0].call = 12_000;
    let mut refused = sink_watched();
    refused.ok(w, sink_written(&r, 1, 3, "c"), 60, 60, at(3));
    let mut other_value = sink_watched();
    other_value.ops[3].input = sink_written(&r, 3, 2, "q");
    let mut other_fence = sink_watched();
    other_fence.ops[3].input = sink_written(&r, 5, 2, "b");
    sink_watch_reports(
        "watch-sink-phantom",
        vec![
            ("nobody", nobody),
            ("early", early),
            ("refused", refused),
            ("other value", other_value),
            ("other fence", other_fence),
        ],
    );
    // An unanswered write may have been accepted: it explains its delivery; and once a read
    // showed it, it is owed (no later delivery would show it missing).
    let mut h = sink_watched();
    h.ambiguous("h2", write(&r, 4, "e"), 60);
    h.ok(w, sink_written(&r, 4, 3, "e"), 70, 70, at(3));
    h.ok("final", sink_read(&r), 80, 90, sink(4, 3, "e"));
    let violations = sink_watch::check(&h.ops, true);
    assert!(violations.is_empty(), "{violations:?}");
    h.ok("reader", sink_read(&r), 35, 36, sink(3, 2, "b"));
    let h = without(h, 6);
    assert_eq!(sink_watch_rules(&h), ["watch-sink-missed"]);
    assert!(!sink_watch::all_delivered(&h.ops));
    // Also on a resource no write to was acknowledged.
    let lone = effect::sink_of("res-2");
    let mut h = sink_watched();
    h.ambiguous("h2", write(&lone, 1, "g"), 60);
    h.ok("final", sink_read(&lone), 80, 90, sink(1, 1, "g"));
    assert_eq!(sink_watch_rules(&h), ["watch-sink-missed"]);

    // Across a compaction: a write a read showed is owed only if a write acknowledged after the
    // compaction came no later; a resource's next may skip ahead, never repeat or go back; one
    // first written after the compaction starts at 1.
    let mut h = sink_compacted();
    h.ambiguous("h3", write(&r, 4, "f"), 40);
    h.ok("final", sink_read(&r), 80, 90, sink(4, 4, "f"));
    assert_eq!(sink_watch_rules(&h), ["watch-sink-missed"]);
    h.ok(w, sink_written(&r, 4, 4, "f"), 91, 91, at(4));
    assert!(sink_watch_rules(&h).is_empty());
    let mut h = without(without(sink_compacted(), 5), 4);
    h.ok("final", sink_read(&r), 80, 90, sink(2, 2, "m"));
    let violations = sink_watch::check(&h.ops, true);
    assert!(violations.is_empty(), "{violations:?}");
    // A write a read showed that came before the first write acknowledged after the compaction
    // may have been taken away; a write between two acknowledged after it may not.
    let mut h = sink_compacted();
    h.ok("reader", sink_read(&r), 13, 14, sink(2, 2, "m"));
    let violations = sink_watch::check(&h.ops, true);
    assert!(violations.is_empty(), "{violations:?}");
    let mut h = sink_compacted();
    h.ambiguous("h3", write(&r, 4, "f"), 40);
    h.ok("reader", sink_read(&r), 45, 46, sink(4, 4, "f"));
    h.ok("h4", write(&r, 5, "g"), 50, 55, sink(5, 5, ""));
    h.ok(w, sink_written(&r, 5, 5, "g"), 56, 56, at(5));
    assert_eq!(
        sink_watch_rules(&h),
        ["watch-sink-missed", "watch-sink-order"]
    );
    // A resource whose first writes were compacted away may start anywhere.
    let violations = sink_watch::check(&without(sink_compacted(), 1).ops, true);
    assert!(violations.is_empty(), "{violations:?}");
    let mut repeat = sink_compacted();
    repeat.ops[5].input = sink_written(&r, 1, 1, "a");
    assert_eq!(
        sink_watch_rules(&repeat),
        ["watch-sink-missed", "watch-sink-order"]
    );
    let other = effect::sink_of("res-1");
    let mut h = sink_compacted();
    h.ok("h4", write(&other, 2, "n"), 40, 50, sink(2, 1, ""));
    h.ok(w, sink_written(&other, 2, 2, "n"), 51, 51, at(4));
    assert_eq!(
        sink_watch_rules(&h),
        ["watch-sink-missed", "watch-sink-order"]
    );

    // Positions strictly increase.
    let mut h = sink_watched();
    h.ops[3].outcome = Outcome::Ok(at(1));
    assert_eq!(sink_watch_rules(&h), ["watch-order"]);
}
