//! The side-effect gate contract (contract.md sections 0 and 3, seed 001 `pgstore.EffectStore`),
//! one rule per test, driven through `apply` with hand-built envelopes.
//!
//! The fine print pinned here comes from the seed: the judging order of `acquire`, the three-way
//! check on every holder action (and that a refusal writes nothing), "release does not touch the
//! intent", "a failed mark-uncertain keeps the intent", first completion / resolution wins, no
//! fence check on resolution, and an unsafe "did not happen" needs an explicit force.
#![allow(clippy::unwrap_used)]

use baton_statemachine::effect::{
    self, Action, EffectLease, KeyStatus, Outcome, Reconcile, Resolution, Resolved, RetrySafety,
};
use baton_statemachine::limits::{MAX_KEY_BYTES, MAX_TEXT_BYTES};
use baton_statemachine::{
    apply, Command, Envelope, Origin, Refusal, Reply, Response, Stamp, State,
};

const T0: u64 = 1_000_000;
const TTL: i64 = 1_000;
const CLIENT: u64 = 11;

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

    /// Sends an effect command as the client, stamped `now_ms`, with entropy derived from the
    /// request number.
    fn send(&mut self, now_ms: u64, command: effect::Command) -> Result<Reply, Refusal> {
        self.seq += 1;
        let origin = Origin {
            client_id: CLIENT,
            seq: self.seq,
            acked_below: 0,
        };
        let stamp = Stamp {
            now_ms,
            entropy: entropy_for(self.seq),
        };
        match self.send_raw(stamp, Some(origin), Command::Effect(command)) {
            Response::Answer(result) => result,
            other => panic!("unexpected {other:?}"),
        }
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

    fn acquire(&mut self, now_ms: u64, action: &Action, ttl_ms: i64) -> Outcome {
        match self.send(
            now_ms,
            effect::Command::Acquire {
                action: action.clone(),
                ttl_ms,
            },
        ) {
            Ok(Reply::Outcome(outcome)) => *outcome,
            other => panic!("acquire answered {other:?}"),
        }
    }

    /// An acquire that must grant; returns the lease.
    fn grant(&mut self, now_ms: u64, action: &Action, ttl_ms: i64) -> EffectLease {
        match self.acquire(now_ms, action, ttl_ms) {
            Outcome::Granted(lease) => lease,
            other => panic!("acquire of {} should grant, got {other:?}", action.key),
        }
    }

    fn complete(
        &mut self,
        now_ms: u64,
        action: &Action,
        lease: &EffectLease,
        result: &str,
    ) -> Result<String, Refusal> {
        self.send(now_ms, complete(action, lease, result))
            .map(|reply| match reply {
                Reply::EffectResult(result) => result,
                other => panic!("complete answered {other:?}"),
            })
    }

    fn release(
        &mut self,
        now_ms: u64,
        action: &Action,
        lease: &EffectLease,
    ) -> Result<(), Refusal> {
        self.send(now_ms, release(action, lease))
            .map(|reply| assert_eq!(reply, Reply::Done))
    }

    fn abandon(
        &mut self,
        now_ms: u64,
        action: &Action,
        lease: &EffectLease,
    ) -> Result<(), Refusal> {
        self.send(now_ms, abandon(action, lease))
            .map(|reply| assert_eq!(reply, Reply::Done))
    }

    fn renew(
        &mut self,
        now_ms: u64,
        action: &Action,
        lease: &EffectLease,
        ttl_ms: i64,
    ) -> Result<EffectLease, Refusal> {
        self.send(now_ms, renew(action, lease, ttl_ms))
            .map(|reply| match reply {
                Reply::EffectLease(lease) => *lease,
                other => panic!("renew answered {other:?}"),
            })
    }

    fn mark_uncertain(
        &mut self,
        now_ms: u64,
        action: &Action,
        lease: &EffectLease,
    ) -> Result<(), Refusal> {
        self.send(now_ms, mark_uncertain(action, lease))
            .map(|reply| assert_eq!(reply, Reply::Done))
    }

    fn begin_reconcile(
        &mut self,
        now_ms: u64,
        action: &Action,
        ttl_ms: i64,
    ) -> Result<Reconcile, Refusal> {
        self.send(
            now_ms,
            effect::Command::BeginReconcile {
                action: action.clone(),
                ttl_ms,
            },
        )
        .map(|reply| match reply {
            Reply::Reconcile(reconcile) => reconcile,
            other => panic!("begin_reconcile answered {other:?}"),
        })
    }

    fn resolve(
        &mut self,
        now_ms: u64,
        action: &Action,
        resolution: Resolution,
    ) -> Result<Resolved, Refusal> {
        self.send(now_ms, resolve(action, resolution))
            .map(|reply| match reply {
                Reply::Resolved(resolved) => resolved,
                other => panic!("resolve answered {other:?}"),
            })
    }

    fn sweep(&mut self, now_ms: u64) -> u64 {
        match self.send_raw(Stamp { now_ms, entropy: 0 }, None, Command::Sweep) {
            Response::Answer(Ok(Reply::Swept { expired })) => expired,
            other => panic!("sweep answered {other:?}"),
        }
    }

    fn status(&self, key: &str) -> KeyStatus {
        self.state.effects.show(key).expect("key exists").status
    }

    /// Sends `command` without an origin (no session entry) stamped at the current store clock,
    /// expects `expected`, and expects the whole state — except the clock field — unchanged.
    fn assert_refused_unchanged(&mut self, command: effect::Command, expected: &Refusal) {
        let before = self.state.clone();
        let stamp = Stamp {
            now_ms: self.state.clock_ms,
            entropy: 0xbeef,
        };
        let response = self.send_raw(stamp, None, Command::Effect(command.clone()));
        assert_eq!(
            response,
            Response::Answer(Err(expected.clone())),
            "command {command:?}"
        );
        let mut after = self.state.clone();
        after.clock_ms = before.clock_ms;
        assert_eq!(
            after,
            before,
            "a refused {} must change nothing",
            command.name()
        );
    }
}

fn entropy_for(seq: u64) -> u128 {
    (u128::from(seq) << 64) | 0x0000_00ee_ff00_1122
}

fn action(key: &str, resource: &str) -> Action {
    Action {
        key: key.into(),
        resource: resource.into(),
        safety: RetrySafety::Safe,
    }
}

fn unsafe_action(key: &str, resource: &str) -> Action {
    Action {
        safety: RetrySafety::Unsafe,
        ..action(key, resource)
    }
}

fn complete(action: &Action, lease: &EffectLease, result: &str) -> effect::Command {
    effect::Command::Complete {
        action: action.clone(),
        lease: lease.clone(),
        result: result.into(),
    }
}

fn release(action: &Action, lease: &EffectLease) -> effect::Command {
    effect::Command::Release {
        action: action.clone(),
        lease: lease.clone(),
    }
}

fn abandon(action: &Action, lease: &EffectLease) -> effect::Command {
    effect::Command::Abandon {
        action: action.clone(),
        lease: lease.clone(),
        reason: "gave up".into(),
    }
}

fn renew(action: &Action, lease: &EffectLease, ttl_ms: i64) -> effect::Command {
    effect::Command::Renew {
        action: action.clone(),
        lease: lease.clone(),
        ttl_ms,
    }
}

fn mark_uncertain(action: &Action, lease: &EffectLease) -> effect::Command {
    effect::Command::MarkUncertain {
        action: action.clone(),
        lease: lease.clone(),
        reason: "timed out talking to the bank".into(),
    }
}

fn resolve(action: &Action, resolution: Resolution) -> effect::Command {
    effect::Command::ResolveUncertain {
        action: action.clone(),
        resolution,
    }
}

fn happened(result: &str) -> Resolution {
    Resolution {
        happened: true,
        result: result.into(),
        force_retryable: false,
    }
}

fn did_not_happen(force_retryable: bool) -> Resolution {
    Resolution {
        happened: false,
        result: String::new(),
        force_retryable,
    }
}

/// All five holder actions, for the three-way check.
fn holder_actions(action: &Action, lease: &EffectLease) -> Vec<effect::Command> {
    vec![
        complete(action, lease, "late result"),
        release(action, lease),
        abandon(action, lease),
        renew(action, lease, TTL),
        mark_uncertain(action, lease),
    ]
}

fn is_invalid(result: &Result<Reply, Refusal>, field: &str) -> bool {
    matches!(result, Err(Refusal::Invalid { field: f, rule }) if f == field && !rule.is_empty())
}

// ---------------------------------------------------------------------------------------------
// acquire: validation, grant

#[test]
fn acquire_with_invalid_input_is_refused_and_changes_nothing() {
    let mut w = World::new();
    let long = "x".repeat(MAX_KEY_BYTES + 1);
    let cases = vec![
        (action("", "r"), TTL, "action.key"),
        (action(&long, "r"), TTL, "action.key"),
        (action("k", ""), TTL, "action.resource"),
        (action("k", &long), TTL, "action.resource"),
        (action("k", "r"), 0, "ttl"),
        (action("k", "r"), -1, "ttl"),
        (action("k", "r"), i64::MIN, "ttl"),
    ];
    for (act, ttl_ms, field) in cases {
        let before = w.state.effects.clone();
        let result = w.send(
            T0,
            effect::Command::Acquire {
                action: act,
                ttl_ms,
            },
        );
        assert!(
            is_invalid(&result, field),
            "expected invalid {field}, got {result:?}"
        );
        assert_eq!(w.state.effects, before);
    }
    assert_eq!(w.state.effects.resource_fence("r"), 0);
}

#[test]
fn grant_mints_fence_holder_intent_and_hold_in_one_step() {
    let mut w = World::new();
    let a = action("pay-1", "bank");
    let lease = w.grant(T0, &a, 250);
    assert_eq!(lease.key, "pay-1");
    assert_eq!(lease.resource, "bank");
    assert_eq!(lease.fence, 1, "fence = resource's highest (0) + 1");
    // The holder identity comes from the stamp's entropy: request 1 of this client.
    assert_eq!(lease.holder, format!("{:032x}", entropy_for(1)));
    assert_eq!(lease.until_ms, T0 + 250);
    assert_eq!(w.state.effects.resource_fence("bank"), 1);
    assert_eq!(w.state.effects.holds(), 1);
    let view = w.state.effects.show("pay-1").unwrap();
    assert_eq!(view.status, KeyStatus::InProgress);
    assert_eq!(view.fence, 1);
    assert!(
        !format!("{view:?}").contains(&lease.holder),
        "the holder identity is the lease's credential and is never shown: {view:?}"
    );
    assert_eq!(view.intent_until_ms, Some(T0 + 250));
    assert_eq!(view.resource, "bank");
    assert_eq!(view.safety, RetrySafety::Safe);
}

#[test]
fn grant_fence_is_the_resource_highest_plus_one_across_keys() {
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let c = action("c", "other");
    let la = w.grant(T0, &a, TTL);
    w.complete(T0, &a, &la, "ok").unwrap();
    w.release(T0, &a, &la).unwrap();
    let lb = w.grant(T0 + 1, &b, TTL);
    let lc = w.grant(T0 + 1, &c, TTL);
    assert_eq!(
        (la.fence, lb.fence),
        (1, 2),
        "fences are per resource, not per key"
    );
    assert_eq!(lc.fence, 1, "another resource has its own counter");
    assert_ne!(la.holder, lb.holder);
}

// ---------------------------------------------------------------------------------------------
// acquire: judging order completed > uncertain > in progress > contended > granted

#[test]
fn acquire_judges_completed_before_contended() {
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let la = w.grant(T0, &a, TTL);
    w.complete(T0, &a, &la, "receipt-1").unwrap();
    w.release(T0, &a, &la).unwrap();
    w.grant(T0, &b, TTL); // r is now held by b
    assert_eq!(
        w.acquire(T0 + 1, &a, TTL),
        Outcome::Completed("receipt-1".into())
    );
    assert_eq!(
        w.acquire(T0 + 2, &action("c", "r"), TTL),
        Outcome::Contended
    );
}

#[test]
fn acquire_judges_completed_even_while_the_own_hold_is_kept() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.complete(T0, &a, &la, "receipt-1").unwrap();
    // complete does not release: the hold is still there, yet the answer is Completed
    assert_eq!(w.state.effects.holds(), 1);
    assert_eq!(
        w.acquire(T0 + 1, &a, TTL),
        Outcome::Completed("receipt-1".into())
    );
}

#[test]
fn acquire_judges_uncertain_before_contended() {
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let la = w.grant(T0, &a, TTL);
    w.mark_uncertain(T0, &a, &la).unwrap();
    w.release(T0, &a, &la).unwrap();
    w.grant(T0, &b, TTL);
    assert_eq!(w.acquire(T0 + 1, &a, TTL), Outcome::Uncertain);
}

#[test]
fn acquire_judges_uncertain_before_contended_when_the_hold_is_still_its_own() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.mark_uncertain(T0, &a, &la).unwrap();
    // a's own hold is still live (mark_uncertain keeps it); a hears uncertain, not contended
    assert_eq!(w.acquire(T0 + 1, &a, TTL), Outcome::Uncertain);
}

#[test]
fn acquire_judges_in_progress_before_contended() {
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let la = w.grant(T0, &a, TTL);
    // a's own hold: in progress
    assert_eq!(w.acquire(T0 + 1, &a, TTL), Outcome::InProgress);
    // a releases (intent stays) and b takes r: a is in progress AND r is held by another
    w.release(T0 + 2, &a, &la).unwrap();
    w.grant(T0 + 3, &b, TTL);
    assert_eq!(w.acquire(T0 + 4, &a, TTL), Outcome::InProgress);
}

#[test]
fn acquire_judges_contended_before_granted() {
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let la = w.grant(T0, &a, TTL);
    let before_fence = w.state.effects.resource_fence("r");
    assert_eq!(w.acquire(T0 + 1, &b, TTL), Outcome::Contended);
    assert_eq!(
        w.state.effects.resource_fence("r"),
        before_fence,
        "no fence minted"
    );
    assert!(w.state.effects.show("b").is_none(), "no intent registered");
    // once the hold is gone, b is granted
    w.release(T0 + 2, &a, &la).unwrap();
    assert_eq!(w.grant(T0 + 3, &b, TTL).fence, 2);
}

#[test]
fn expired_hold_of_another_key_does_not_contend() {
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    w.grant(T0, &a, 100);
    assert_eq!(w.acquire(T0 + 99, &b, TTL), Outcome::Contended);
    let lb = w.grant(T0 + 100, &b, TTL);
    assert_eq!(lb.fence, 2);
    // ...and a, whose intent ran out with it, is uncertain: never granted afresh
    assert_eq!(w.acquire(T0 + 101, &a, TTL), Outcome::Uncertain);
}

// ---------------------------------------------------------------------------------------------
// an intent that expires unresolved makes the key uncertain

#[test]
fn expired_intent_is_uncertain_lazily_never_a_fresh_grant() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, 100);
    assert_eq!(w.acquire(T0 + 99, &a, TTL), Outcome::InProgress);
    // exactly at the deadline, no sweep in between
    assert_eq!(w.acquire(la.until_ms, &a, TTL), Outcome::Uncertain);
    assert_eq!(w.status("a"), KeyStatus::Uncertain);
    assert_eq!(
        w.state.effects.resource_fence("r"),
        1,
        "no fresh fence was minted"
    );
    assert_eq!(w.acquire(T0 + 10_000, &a, TTL), Outcome::Uncertain);
    let view = w.state.effects.show("a").unwrap();
    assert_eq!(view.intent_until_ms, None);
    assert!(!view.reason.is_empty());
}

/// Contract §0 "store clock": a leader whose wall clock is behind the store clock (a new leader
/// after a failover) neither shortens a grant or renewal nor ends a live intent early.
#[test]
fn deadlines_use_the_store_clock_not_a_lagging_leader_stamp() {
    let mut w = World::new();
    w.sweep(T0 + 5_000);
    let a = action("a", "r");
    let lease = w.grant(T0 + 1_000, &a, 100);
    assert_eq!(lease.until_ms, T0 + 5_000 + 100);
    let renewed = w.renew(T0 + 1_050, &a, &lease, 200).unwrap();
    assert_eq!(renewed.until_ms, T0 + 5_000 + 200);
    // Behind the deadline by the lagging stamp, not by the store clock: still in progress.
    w.sweep(T0 + 5_150);
    assert_eq!(w.acquire(T0 + 1_100, &a, TTL), Outcome::InProgress);
    assert_eq!(w.status("a"), KeyStatus::InProgress);
}

#[test]
fn expired_intent_is_uncertain_via_sweep() {
    let mut w = World::new();
    let a = action("a", "r");
    w.grant(T0, &a, 100);
    assert!(!w.state.sweep_due(T0 + 99));
    assert!(w.state.sweep_due(T0 + 100));
    assert_eq!(w.sweep(T0 + 100), 2, "the intent and the hold");
    assert_eq!(w.status("a"), KeyStatus::Uncertain);
    assert_eq!(w.state.effects.holds(), 0);
    assert!(!w.state.sweep_due(T0 + 10_000));
    assert_eq!(w.acquire(T0 + 200, &a, TTL), Outcome::Uncertain);
    // the resource is free for other keys
    assert_eq!(w.grant(T0 + 200, &action("b", "r"), TTL).fence, 2);
}

#[test]
fn expired_intent_after_release_is_uncertain() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, 100);
    w.release(T0 + 1, &a, &la).unwrap();
    assert_eq!(
        w.acquire(T0 + 2, &a, TTL),
        Outcome::InProgress,
        "release keeps the intent"
    );
    assert_eq!(w.acquire(T0 + 100, &a, TTL), Outcome::Uncertain);
}

// ---------------------------------------------------------------------------------------------
// the three-way check: FENCE_STALE, NOT_HOLDER, RESOURCE_MISMATCH; refusals write nothing

#[test]
fn holder_actions_with_a_stale_fence_are_fence_stale_and_change_nothing() {
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let la = w.grant(T0, &a, TTL);
    w.release(T0, &a, &la).unwrap();
    let lb = w.grant(T0, &b, TTL); // a newer fence on r
    assert!(lb.fence > la.fence);
    for command in holder_actions(&a, &la) {
        w.assert_refused_unchanged(command, &Refusal::FenceStale);
    }
    assert_eq!(
        w.status("a"),
        KeyStatus::InProgress,
        "the intent is still there"
    );
    // b's attempt is untouched
    w.complete(T0 + 1, &b, &lb, "b done").unwrap();
}

#[test]
fn holder_actions_with_a_fence_from_the_future_are_fence_stale() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    let forged = EffectLease {
        fence: la.fence + 1,
        ..la.clone()
    };
    for command in holder_actions(&a, &forged) {
        w.assert_refused_unchanged(command, &Refusal::FenceStale);
    }
}

#[test]
fn holder_actions_with_a_wrong_holder_are_not_holder_and_change_nothing() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    let impostor = EffectLease {
        holder: "f".repeat(32),
        ..la.clone()
    };
    for command in holder_actions(&a, &impostor) {
        w.assert_refused_unchanged(command, &Refusal::NotHolder);
    }
    assert_eq!(w.status("a"), KeyStatus::InProgress);
    assert_eq!(w.state.effects.holds(), 1);
}

#[test]
fn holder_actions_with_another_keys_lease_are_not_holder() {
    // b's lease carries the latest fence on r; presented for key a (same resource, whose own
    // attempt has an older fence and another holder), it is refused as not a's holder.
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let la = w.grant(T0, &a, TTL);
    w.release(T0, &a, &la).unwrap();
    let lb = w.grant(T0, &b, TTL);
    for command in holder_actions(&a, &lb) {
        w.assert_refused_unchanged(command, &Refusal::NotHolder);
    }
}

#[test]
fn holder_actions_whose_lease_resource_differs_are_resource_mismatch_and_change_nothing() {
    let mut w = World::new();
    let a = action("a", "r1");
    let la = w.grant(T0, &a, TTL);
    // the action names another resource than the lease (and the key) was granted on
    let wrong = action("a", "r2");
    for command in holder_actions(&wrong, &la) {
        w.assert_refused_unchanged(command, &Refusal::ResourceMismatch);
    }
    assert_eq!(w.status("a"), KeyStatus::InProgress);
    assert_eq!(w.state.effects.holds(), 1);
}

#[test]
fn three_way_check_judges_resource_then_fence_then_holder() {
    let mut w = World::new();
    let a = action("a", "r1");
    let la = w.grant(T0, &a, TTL);
    w.release(T0, &a, &la).unwrap();
    let lb = w.grant(T0, &action("b", "r1"), TTL);
    assert!(lb.fence > la.fence);
    // wrong resource AND stale fence AND wrong holder: the resource is judged first
    let all_wrong = EffectLease {
        resource: "r2".into(),
        holder: "0".repeat(32),
        ..la.clone()
    };
    for command in holder_actions(&a, &all_wrong) {
        w.assert_refused_unchanged(command, &Refusal::ResourceMismatch);
    }
    // right resource, stale fence AND wrong holder: the fence comes next
    let stale_and_wrong = EffectLease {
        holder: "0".repeat(32),
        ..la.clone()
    };
    for command in holder_actions(&a, &stale_and_wrong) {
        w.assert_refused_unchanged(command, &Refusal::FenceStale);
    }
}

#[test]
fn holder_actions_on_an_unknown_key_are_unknown_action() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    let ghost = action("ghost", "r");
    let lease = EffectLease {
        key: "ghost".into(),
        ..la
    };
    for command in holder_actions(&ghost, &lease) {
        w.assert_refused_unchanged(command, &Refusal::UnknownAction);
    }
}

#[test]
fn holder_actions_with_invalid_lease_fields_are_invalid() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    let no_holder = EffectLease {
        holder: String::new(),
        ..la.clone()
    };
    let no_resource = EffectLease {
        resource: String::new(),
        ..la.clone()
    };
    for (lease, field) in [(no_holder, "lease.holder"), (no_resource, "lease.resource")] {
        for command in holder_actions(&a, &lease) {
            let before = w.state.effects.clone();
            let result = w.send(T0, command);
            assert!(is_invalid(&result, field), "got {result:?}");
            assert_eq!(w.state.effects, before);
        }
    }
    let too_long = "x".repeat(MAX_TEXT_BYTES + 1);
    let result = w.send(T0, complete(&a, &la, &too_long));
    assert!(is_invalid(&result, "result"), "got {result:?}");
    assert_eq!(w.status("a"), KeyStatus::InProgress);
}

// ---------------------------------------------------------------------------------------------
// complete

#[test]
fn first_completion_wins_and_a_repeat_returns_the_first_result() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    assert_eq!(w.complete(T0 + 1, &a, &la, "first").unwrap(), "first");
    assert_eq!(w.status("a"), KeyStatus::Completed);
    assert_eq!(w.state.effects.show("a").unwrap().intent_until_ms, None);
    assert_eq!(w.complete(T0 + 2, &a, &la, "second").unwrap(), "first");
    assert_eq!(
        w.state.effects.show("a").unwrap().result.as_deref(),
        Some("first")
    );
    assert_eq!(
        w.acquire(T0 + 3, &a, TTL),
        Outcome::Completed("first".into())
    );
    // the completed key leaves no intent for the sweep to turn uncertain
    w.release(T0 + 4, &a, &la).unwrap();
    assert_eq!(w.sweep(T0 + 10 * TTL as u64), 0);
    assert_eq!(w.status("a"), KeyStatus::Completed);
}

#[test]
fn a_repeated_completion_after_the_resource_moved_on_returns_the_first_result() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.complete(T0, &a, &la, "first").unwrap();
    w.release(T0, &a, &la).unwrap();
    w.grant(T0 + 1, &action("b", "r"), TTL); // a's fence is stale now
    let before = w.state.effects.clone();
    assert_eq!(w.complete(T0 + 2, &a, &la, "second").unwrap(), "first");
    assert_eq!(w.state.effects, before, "the repeat writes nothing");
}

#[test]
fn complete_after_release_is_still_accepted_while_no_newer_fence_exists() {
    // release frees the hold only; the attempt is still the key's latest and the fence still
    // the resource's latest, so the holder may still record what happened.
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.release(T0, &a, &la).unwrap();
    assert_eq!(w.complete(T0 + 1, &a, &la, "done").unwrap(), "done");
    assert_eq!(
        w.acquire(T0 + 2, &a, TTL),
        Outcome::Completed("done".into())
    );
}

// ---------------------------------------------------------------------------------------------
// release, abandon, renew, mark_uncertain

#[test]
fn release_frees_the_resource_but_not_the_intent() {
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let la = w.grant(T0, &a, 100);
    w.release(T0 + 1, &a, &la).unwrap();
    assert_eq!(w.state.effects.holds(), 0);
    let view = w.state.effects.show("a").unwrap();
    assert_eq!(view.status, KeyStatus::InProgress);
    assert_eq!(view.intent_until_ms, Some(T0 + 100));
    // the key cannot be granted again
    assert_eq!(w.acquire(T0 + 2, &a, TTL), Outcome::InProgress);
    // the resource can
    let lb = w.grant(T0 + 3, &b, TTL);
    assert_eq!(lb.fence, 2);
    // and after the intent runs out the key is uncertain, still not granted
    assert_eq!(w.acquire(T0 + 100, &a, TTL), Outcome::Uncertain);
}

#[test]
fn release_does_not_free_a_newer_holders_resource() {
    // a's hold expired and b took r; a's release is refused (stale fence) and b keeps r.
    let mut w = World::new();
    let a = action("a", "r");
    let b = action("b", "r");
    let la = w.grant(T0, &a, 100);
    let lb = w.grant(T0 + 100, &b, TTL);
    // materialise a's expired intent first, so the refusal below has nothing lazy to do
    assert_eq!(w.sweep(T0 + 100), 1);
    w.assert_refused_unchanged(release(&a, &la), &Refusal::FenceStale);
    assert_eq!(
        w.acquire(T0 + 101, &action("c", "r"), TTL),
        Outcome::Contended
    );
    w.renew(T0 + 102, &b, &lb, TTL).unwrap();
}

#[test]
fn abandon_withdraws_the_intent_and_frees_the_resource() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, 100);
    w.abandon(T0 + 1, &a, &la).unwrap();
    let view = w.state.effects.show("a").unwrap();
    assert_eq!(view.status, KeyStatus::Idle);
    assert_eq!(view.intent_until_ms, None);
    assert_eq!(view.reason, "gave up");
    assert_eq!(w.state.effects.holds(), 0);
    // the withdrawn intent does not turn the key uncertain later
    assert_eq!(w.sweep(T0 + 1_000), 0);
    assert_eq!(w.status("a"), KeyStatus::Idle);
    // and the key may be granted again, with a higher fence
    let again = w.grant(T0 + 1_001, &a, TTL);
    assert_eq!(again.fence, 2);
    // the old lease is dead
    w.assert_refused_unchanged(complete(&a, &la, "x"), &Refusal::FenceStale);
}

/// A release frees the resource and leaves the intent; abandoning it afterwards withdraws the
/// intent and leaves no hold behind, so the key can be granted again at once. (A newer hold on
/// the resource cannot exist here: a newer grant would make this lease's fence stale.)
#[test]
fn abandon_after_release_withdraws_the_intent_and_leaves_no_hold() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.release(T0, &a, &la).unwrap();
    assert_eq!(w.state.effects.holds(), 0, "the release freed the resource");
    assert_eq!(
        w.status("a"),
        KeyStatus::InProgress,
        "the intent outlives the release"
    );
    w.abandon(T0 + 1, &a, &la).unwrap();
    assert_eq!(w.status("a"), KeyStatus::Idle);
    assert_eq!(w.state.effects.holds(), 0, "the abandon left a hold behind");
    assert_eq!(w.grant(T0 + 2, &a, TTL).fence, 2);
}

#[test]
fn abandon_is_refused_once_the_attempt_is_not_in_progress() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.complete(T0, &a, &la, "done").unwrap();
    w.assert_refused_unchanged(abandon(&a, &la), &Refusal::NotInProgress);
    assert_eq!(w.status("a"), KeyStatus::Completed);

    let b = action("b", "s");
    let lb = w.grant(T0, &b, TTL);
    w.mark_uncertain(T0, &b, &lb).unwrap();
    w.assert_refused_unchanged(abandon(&b, &lb), &Refusal::NotInProgress);
    assert_eq!(
        w.status("b"),
        KeyStatus::Uncertain,
        "abandon cannot erase uncertainty"
    );

    // an expired intent cannot be abandoned either: the key went uncertain
    let c = action("c", "t");
    let lc = w.grant(T0, &c, 100);
    assert_eq!(w.abandon(T0 + 100, &c, &lc), Err(Refusal::NotInProgress));
    assert_eq!(w.status("c"), KeyStatus::Uncertain);
}

#[test]
fn renew_keeps_fence_and_holder_and_extends_intent_and_hold() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, 100);
    let renewed = w.renew(T0 + 50, &a, &la, 500).unwrap();
    assert_eq!(
        renewed,
        EffectLease {
            until_ms: T0 + 550,
            ..la.clone()
        }
    );
    assert_eq!(
        w.state.effects.resource_fence("r"),
        1,
        "renewal mints no fence"
    );
    let view = w.state.effects.show("a").unwrap();
    assert_eq!(view.intent_until_ms, Some(T0 + 550));
    // past the old deadline: still in progress, still held, nothing to sweep
    assert_eq!(w.sweep(T0 + 200), 0);
    assert_eq!(w.acquire(T0 + 200, &a, TTL), Outcome::InProgress);
    assert_eq!(
        w.acquire(T0 + 200, &action("b", "r"), TTL),
        Outcome::Contended
    );
    // the old lease value (same fence and holder) keeps working
    w.renew(T0 + 300, &a, &la, 100).unwrap();
    assert_eq!(w.sweep(T0 + 400), 2);
    assert_eq!(w.status("a"), KeyStatus::Uncertain);
}

#[test]
fn renew_is_refused_after_the_intent_expired() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, 100);
    assert_eq!(w.renew(T0 + 100, &a, &la, TTL), Err(Refusal::NotInProgress));
    assert_eq!(w.status("a"), KeyStatus::Uncertain);
    assert_eq!(w.acquire(T0 + 101, &a, TTL), Outcome::Uncertain);
}

#[test]
fn renew_is_refused_after_the_intent_expired_via_sweep() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, 100);
    w.sweep(T0 + 100);
    w.assert_refused_unchanged(renew(&a, &la, TTL), &Refusal::NotInProgress);
}

#[test]
fn renew_is_refused_after_the_hold_was_released() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.release(T0, &a, &la).unwrap();
    w.assert_refused_unchanged(renew(&a, &la, TTL), &Refusal::NotHolder);
    assert_eq!(w.status("a"), KeyStatus::InProgress);
    assert_eq!(
        w.state.effects.holds(),
        0,
        "a refused renew does not re-take the hold"
    );
}

#[test]
fn renew_is_refused_after_completion_or_mark_uncertain() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.complete(T0, &a, &la, "done").unwrap();
    w.assert_refused_unchanged(renew(&a, &la, TTL), &Refusal::NotInProgress);
    let b = action("b", "s");
    let lb = w.grant(T0, &b, TTL);
    w.mark_uncertain(T0, &b, &lb).unwrap();
    w.assert_refused_unchanged(renew(&b, &lb, TTL), &Refusal::NotInProgress);
}

#[test]
fn renew_with_a_non_positive_ttl_is_invalid_and_changes_nothing() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    for ttl in [0, -5] {
        let before = w.state.effects.clone();
        let result = w.send(T0, renew(&a, &la, ttl));
        assert!(is_invalid(&result, "ttl"), "got {result:?}");
        assert_eq!(w.state.effects, before);
    }
}

#[test]
fn mark_uncertain_keeps_the_hold_and_withdraws_the_intent() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, 100);
    w.mark_uncertain(T0 + 1, &a, &la).unwrap();
    let view = w.state.effects.show("a").unwrap();
    assert_eq!(view.status, KeyStatus::Uncertain);
    assert_eq!(view.intent_until_ms, None);
    assert_eq!(view.reason, "timed out talking to the bank");
    // the hold is not freed: other keys are contended until the caller releases
    assert_eq!(w.state.effects.holds(), 1);
    assert_eq!(
        w.acquire(T0 + 2, &action("b", "r"), TTL),
        Outcome::Contended
    );
    assert_eq!(w.acquire(T0 + 2, &a, TTL), Outcome::Uncertain);
    // marking again is harmless
    w.mark_uncertain(T0 + 3, &a, &la).unwrap();
    w.release(T0 + 4, &a, &la).unwrap();
    assert_eq!(w.grant(T0 + 5, &action("b", "r"), TTL).fence, 2);
    assert_eq!(w.acquire(T0 + 6, &a, TTL), Outcome::Uncertain);
}

#[test]
fn a_refused_mark_uncertain_keeps_the_intent() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, 100);
    let refusals = [
        (
            EffectLease {
                holder: "0".repeat(32),
                ..la.clone()
            },
            a.clone(),
            Refusal::NotHolder,
        ),
        (
            EffectLease {
                fence: 7,
                ..la.clone()
            },
            a.clone(),
            Refusal::FenceStale,
        ),
        (
            la.clone(),
            action("a", "elsewhere"),
            Refusal::ResourceMismatch,
        ),
    ];
    for (lease, act, expected) in refusals {
        w.assert_refused_unchanged(mark_uncertain(&act, &lease), &expected);
        let view = w.state.effects.show("a").unwrap();
        assert_eq!(view.status, KeyStatus::InProgress);
        assert_eq!(
            view.intent_until_ms,
            Some(T0 + 100),
            "the intent is still registered"
        );
        assert_eq!(w.acquire(T0 + 1, &a, TTL), Outcome::InProgress);
    }
    // the intent still runs its course: it expires into uncertain
    assert_eq!(w.sweep(T0 + 100), 2);
    assert_eq!(w.status("a"), KeyStatus::Uncertain);
}

#[test]
fn mark_uncertain_on_a_completed_key_is_refused() {
    let mut w = World::new();
    let a = action("a", "r");
    let la = w.grant(T0, &a, TTL);
    w.complete(T0, &a, &la, "done").unwrap();
    w.assert_refused_unchanged(mark_uncertain(&a, &la), &Refusal::NotInProgress);
    assert_eq!(w.status("a"), KeyStatus::Completed);
}

// ---------------------------------------------------------------------------------------------
// reconcile

/// `mark_uncertain` leaves the resource held for the caller to release, and a resolution (either
/// way) does not take that right away: the holder releases its hold afterwards, a stranger cannot,
/// and the next grant gets the next fence, after which the old lease is stale.
#[test]
fn the_hold_kept_through_an_uncertain_key_is_released_by_its_holder_after_a_resolution() {
    for resolution in [did_not_happen(false), happened("receipt")] {
        let a = action("a", "r");
        let mut w = World::new();
        let la = w.grant(T0, &a, TTL);
        w.mark_uncertain(T0, &a, &la).unwrap();
        w.resolve(T0 + 1, &a, resolution.clone()).unwrap();
        assert_eq!(w.state.effects.holds(), 1, "the resolution kept the hold");

        let stranger = EffectLease {
            holder: "f".repeat(32),
            ..la.clone()
        };
        w.assert_refused_unchanged(release(&a, &stranger), &Refusal::NotHolder);
        w.release(T0 + 2, &a, &la).unwrap();
        assert_eq!(w.state.effects.holds(), 0, "the holder released it");

        if !resolution.happened {
            let again = w.grant(T0 + 3, &a, TTL);
            assert_eq!(again.fence, la.fence + 1);
            w.assert_refused_unchanged(release(&a, &la), &Refusal::FenceStale);
        }
    }
}

/// A world where key `a` on `r` went uncertain (marked and released); returns the old lease.
fn uncertain(act: &Action) -> (World, EffectLease) {
    let mut w = World::new();
    let lease = w.grant(T0, act, TTL);
    w.mark_uncertain(T0, act, &lease).unwrap();
    w.release(T0, act, &lease).unwrap();
    (w, lease)
}

#[test]
fn begin_reconcile_only_on_uncertain_keys() {
    let mut w = World::new();
    let a = action("a", "r");
    let begin = |act: &Action| effect::Command::BeginReconcile {
        action: act.clone(),
        ttl_ms: TTL,
    };
    w.assert_refused_unchanged(begin(&a), &Refusal::UnknownAction);
    let la = w.grant(T0, &a, TTL);
    w.assert_refused_unchanged(begin(&a), &Refusal::NotUncertain);
    w.complete(T0, &a, &la, "done").unwrap();
    w.assert_refused_unchanged(begin(&a), &Refusal::NotUncertain);
    let b = action("b", "s");
    let lb = w.grant(T0, &b, TTL);
    w.abandon(T0, &b, &lb).unwrap();
    w.assert_refused_unchanged(begin(&b), &Refusal::NotUncertain);
    // an intent that ran out counts as uncertain, even before any sweep
    let c = action("c", "t");
    w.grant(T0, &c, 100);
    w.begin_reconcile(T0 + 100, &c, TTL).unwrap();
}

#[test]
fn begin_reconcile_validates_its_input() {
    let (mut w, _) = uncertain(&action("a", "r"));
    for (ttl_ms, act, field) in [
        (0, action("a", "r"), "ttl"),
        (-1, action("a", "r"), "ttl"),
        (TTL, action("", "r"), "action.key"),
        (TTL, action("a", ""), "action.resource"),
    ] {
        let before = w.state.effects.clone();
        let result = w.send(
            T0,
            effect::Command::BeginReconcile {
                action: act,
                ttl_ms,
            },
        );
        assert!(is_invalid(&result, field), "got {result:?}");
        assert_eq!(w.state.effects, before);
    }
}

#[test]
fn one_reconciler_at_a_time_and_expired_occupancy_can_be_taken_over() {
    let a = action("a", "r");
    let (mut w, _) = uncertain(&a);
    let first = w.begin_reconcile(T0 + 10, &a, 100).unwrap();
    assert_eq!(first.until_ms, T0 + 110);
    assert_eq!(first.token.len(), 32);
    assert_eq!(
        w.state.effects.show("a").unwrap().reconcile_until_ms,
        Some(T0 + 110)
    );
    w.assert_refused_unchanged(
        effect::Command::BeginReconcile {
            action: a.clone(),
            ttl_ms: 100,
        },
        &Refusal::ReconcileTaken,
    );
    assert_eq!(
        w.begin_reconcile(T0 + 109, &a, 100),
        Err(Refusal::ReconcileTaken)
    );
    // the occupancy ends at its until: another reconciler may begin
    let second = w.begin_reconcile(T0 + 110, &a, 100).unwrap();
    assert_ne!(second.token, first.token);
    assert_eq!(second.until_ms, T0 + 210);
    assert_eq!(
        w.status("a"),
        KeyStatus::Uncertain,
        "reconciling resolves nothing by itself"
    );
}

#[test]
fn resolve_needs_no_fence_and_happened_completes_the_key() {
    let a = action("a", "r");
    let (mut w, la) = uncertain(&a);
    // a newer attempt on the resource makes a's fence stale: resolution does not care
    let lb = w.grant(T0 + 1, &action("b", "r"), TTL);
    assert!(lb.fence > la.fence);
    w.begin_reconcile(T0 + 2, &a, TTL).unwrap();
    assert_eq!(
        w.resolve(T0 + 3, &a, happened("found it downstream"))
            .unwrap(),
        Resolved::Completed("found it downstream".into())
    );
    let view = w.state.effects.show("a").unwrap();
    assert_eq!(view.status, KeyStatus::Completed);
    assert_eq!(
        view.reconcile_until_ms, None,
        "a resolution clears the occupancy"
    );
    assert_eq!(
        w.acquire(T0 + 4, &a, TTL),
        Outcome::Completed("found it downstream".into())
    );
}

#[test]
fn first_resolution_wins() {
    let a = action("a", "r");
    let (mut w, _) = uncertain(&a);
    assert_eq!(
        w.resolve(T0 + 1, &a, happened("first")).unwrap(),
        Resolved::Completed("first".into())
    );
    assert_eq!(
        w.resolve(T0 + 2, &a, happened("second")).unwrap(),
        Resolved::Completed("first".into())
    );
    assert_eq!(
        w.resolve(T0 + 3, &a, did_not_happen(true)).unwrap(),
        Resolved::Completed("first".into())
    );
    assert_eq!(
        w.acquire(T0 + 4, &a, TTL),
        Outcome::Completed("first".into())
    );
}

#[test]
fn resolve_is_refused_on_keys_that_are_not_uncertain() {
    let mut w = World::new();
    let a = action("a", "r");
    w.assert_refused_unchanged(resolve(&a, happened("x")), &Refusal::UnknownAction);
    let la = w.grant(T0, &a, TTL);
    w.assert_refused_unchanged(resolve(&a, happened("x")), &Refusal::NotUncertain);
    w.assert_refused_unchanged(resolve(&a, did_not_happen(true)), &Refusal::NotUncertain);
    w.abandon(T0, &a, &la).unwrap();
    w.assert_refused_unchanged(resolve(&a, did_not_happen(false)), &Refusal::NotUncertain);
}

/// Unsafe once, unsafe for good: neither a later grant declaring the key safe nor a resolver
/// declaring it unsafe on a key granted as safe lets "did not happen" unblock it unforced.
#[test]
fn a_key_declared_unsafe_by_any_grant_or_resolver_needs_the_force() {
    let unsafe_a = unsafe_action("a", "r");
    let safe_a = action("a", "r");
    let mut w = World::new();
    let first = w.grant(T0, &unsafe_a, TTL);
    w.abandon(T0, &unsafe_a, &first).unwrap();
    w.grant(T0 + 1, &safe_a, TTL);
    w.sweep(T0 + 1 + TTL as u64);
    assert_eq!(w.status("a"), KeyStatus::Uncertain);
    w.assert_refused_unchanged(
        resolve(&safe_a, did_not_happen(false)),
        &Refusal::UnsafeNotRetryable,
    );
    // A key only ever granted as safe, resolved by a caller who says it is unsafe.
    let safe_b = action("b", "r2");
    let mut w = World::new();
    w.grant(T0, &safe_b, TTL);
    w.sweep(T0 + TTL as u64);
    w.assert_refused_unchanged(
        resolve(&unsafe_action("b", "r2"), did_not_happen(false)),
        &Refusal::UnsafeNotRetryable,
    );
    assert_eq!(
        w.resolve(T0 + TTL as u64, &safe_b, did_not_happen(false)),
        Ok(Resolved::Retryable)
    );
}

#[test]
fn unsafe_did_not_happen_is_not_retryable_without_force() {
    let a = unsafe_action("a", "r");
    let (mut w, la) = uncertain(&a);
    w.begin_reconcile(T0 + 1, &a, TTL).unwrap();
    w.assert_refused_unchanged(
        resolve(&a, did_not_happen(false)),
        &Refusal::UnsafeNotRetryable,
    );
    assert_eq!(w.status("a"), KeyStatus::Uncertain);
    assert_eq!(
        w.acquire(T0 + 2, &a, TTL),
        Outcome::Uncertain,
        "still blocked"
    );
    // the explicit force unblocks it, and the next grant has a higher fence
    assert_eq!(
        w.resolve(T0 + 3, &a, did_not_happen(true)).unwrap(),
        Resolved::Retryable
    );
    let view = w.state.effects.show("a").unwrap();
    assert_eq!(view.status, KeyStatus::Idle);
    assert_eq!(view.reconcile_until_ms, None);
    let again = w.grant(T0 + 4, &a, TTL);
    assert!(again.fence > la.fence);
}

#[test]
fn unsafe_happened_needs_no_force() {
    let a = unsafe_action("a", "r");
    let (mut w, _) = uncertain(&a);
    assert_eq!(
        w.resolve(T0 + 1, &a, happened("charged")).unwrap(),
        Resolved::Completed("charged".into())
    );
}

#[test]
fn safe_did_not_happen_makes_the_next_acquire_grant_with_a_higher_fence() {
    let a = action("a", "r");
    let mut w = World::new();
    let la = w.grant(T0, &a, 100);
    // the intent expires unresolved (via the sweep), then a reconciler finds nothing happened
    w.sweep(T0 + 100);
    assert_eq!(w.status("a"), KeyStatus::Uncertain);
    assert_eq!(
        w.resolve(T0 + 101, &a, did_not_happen(false)).unwrap(),
        Resolved::Retryable
    );
    let again = w.grant(T0 + 102, &a, TTL);
    assert_eq!(again.fence, la.fence + 1);
    assert_ne!(again.holder, la.holder);
    // the old lease cannot act on the new attempt
    for command in holder_actions(&a, &la) {
        w.assert_refused_unchanged(command, &Refusal::FenceStale);
    }
}

// ---------------------------------------------------------------------------------------------
// retries through the session table

#[test]
fn a_retried_acquire_returns_the_first_grant_not_in_progress() {
    let mut w = World::new();
    let a = action("a", "r");
    let origin = Origin {
        client_id: 5,
        seq: 1,
        acked_below: 0,
    };
    let command = Command::Effect(effect::Command::Acquire {
        action: a,
        ttl_ms: TTL,
    });
    let first = w.send_raw(
        Stamp {
            now_ms: T0,
            entropy: 1,
        },
        Some(origin),
        command.clone(),
    );
    let retry = w.send_raw(
        Stamp {
            now_ms: T0 + 1,
            entropy: 2,
        },
        Some(origin),
        command,
    );
    assert!(
        matches!(&first, Response::Answer(Ok(Reply::Outcome(o))) if matches!(**o, Outcome::Granted(_)))
    );
    assert_eq!(retry, first);
    assert_eq!(w.state.effects.resource_fence("r"), 1);
}
