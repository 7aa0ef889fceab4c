//! The handoff watch: a fourth watch ([`super::watcher`] runs it) follows every ticket change
//! from the first revision for the whole run and records each — `offered`, `taken`, `closed`,
//! `withdrawn`, `expired`, `lost` — with the agent it names (the taker) and the ticket's
//! generation, and its position.
//!
//! An addressee that waits for work (`baton ticket wait`) learns of it from an `offered`, and a
//! source learns from an `expired` or `lost` that its ticket ran out unanswered. A store that
//! dropped an `offered` leaves work undelivered, and one that sends an `expired` or `lost`
//! early tells a source to give up on a ticket its addressee may still take or reply to. None
//! of that changes a ticket's state, which is all the handoff and courier rules look at.
//!
//! A generation's creation is bounded below by its offers: without a restore (which raises
//! the fence floor; no scenario restores), generation g of a key needs g offers applied, so it
//! was created after the g-th offer of the key (not refused) was sent.
//!
//! Checked, on every ticket (the handoff workload's live an hour, the couriers' 1.5 s):
//! - `watch-ticket-missed` (once the run was read back): every generation an acknowledged offer
//!   answered was delivered `offered`; every acknowledged take `taken`, by its taker at its
//!   fence; every acknowledged reply `closed`, at the fence of the take whose token it
//!   presented; as many `withdrawn` of a key as cancels of it were acknowledged. And on the
//!   couriers' tickets, the end of every generation an acknowledged offer answered: the `lost`
//!   of an acknowledged take that no reply can have closed (none sent with its token, or every
//!   one refused), the `expired` of a generation no take can have taken (every take of the key
//!   refused or acknowledged with another generation), and some end for the others. Except what
//!   can have happened before a compaction the watch met (it may have been in the history
//!   compacted away): a call sent before it, a generation that can have been created before it
//!   (an offer of a live ticket answers a generation an earlier offer created);
//! - `watch-ticket-phantom`: every delivered change comes after enough offers of its key were
//!   sent to create its generation, and names calls sent, and not refused, before it was
//!   delivered: a take by its taker, not acknowledged with another generation (`taken`, `lost`,
//!   `closed`), a reply (`closed`; with the token of the take that took the generation, when
//!   that take was acknowledged), a cancel by a source of the key's offers (`withdrawn`); and
//!   every other change of a generation comes after the watch delivered its `offered` (judged
//!   up to the first compaction the watch met);
//! - `watch-ticket-early`: no `expired` or `lost` is delivered before its generation certainly
//!   ran out: the ticket's TTL counted from the earliest its generation can have been created,
//!   less [`CLOCK_SLACK_US`];
//! - `watch-ticket-ended`: a generation ends once, as its calls say, before the next is offered:
//!   no generation is delivered two ends; no `expired` of a generation an acknowledged take took
//!   (its end is a `lost` or a `closed`), no `lost` of one an acknowledged reply closed, no
//!   `withdrawn` of one taken; and no `offered` while a generation of the key the watch
//!   delivered since the latest compaction it met had not ended;
//! - `watch-ticket-double-take`: no generation is delivered `taken` twice (at two positions),
//!   nor `taken` after an end of it: only an offered ticket is taken, and every other take of
//!   its generation changes nothing (refused, or a retry answered from the session table), so a
//!   second `taken` is a second holder of one generation — which the answer-based rules
//!   (`unique-grant`, `linearizable`) miss when the answer to one of the two takes was lost;
//! - `watch-order`: positions strictly increase, resumes included (as the checkpoint watch's).

use std::collections::{BTreeMap, BTreeSet};

use baton_statemachine::{Change, ChangeKind};

use super::check::{Violation, CLOCK_SLACK_US};
use super::history::{Input, Op, Output};
use super::watcher::{self, deliveries, Delivery, Finding, Met};
use super::{courier, handoff};

/// The client name the handoff watch's changes are recorded under.
pub const NAME: &str = "handoff-watcher";

/// The kinds that end a generation.
const ENDS: [&str; 4] = ["closed", "withdrawn", "expired", "lost"];

/// What the watch records of `change`: every ticket change (its watch follows only tickets).
pub(super) fn recorded(change: &Change) -> Option<Input> {
    let judged = matches!(
        change.kind,
        ChangeKind::Offered
            | ChangeKind::Taken
            | ChangeKind::Closed
            | ChangeKind::Withdrawn
            | ChangeKind::Expired
            | ChangeKind::Lost
    );
    judged.then(|| Input::WatchLease {
        kind: change.kind.as_str().to_string(),
        key: change.key.clone(),
        holder: change.holder.clone(),
        fence: change.fence,
    })
}

/// A ticket's TTL in µs, as the history counts: the couriers' or the handoff workload's (and the
/// nemesis' probes', which offer as it does).
fn ttl_us(key: &str) -> u64 {
    let ms = if courier::is_courier_key(key) {
        courier::TTL_MS
    } else {
        handoff::TTL_MS
    };
    u64::try_from(ms).unwrap_or(0) * 1000
}

/// What the acknowledged calls of the run say about each generation.
#[derive(Default)]
struct Calls<'h> {
    /// (key, generation) -> the first acknowledged offer that answered it.
    offered: BTreeMap<(&'h str, u64), &'h Op>,
    /// (key, generation) -> the acknowledged take of it: its taker, token and op.
    taken: BTreeMap<(&'h str, u64), (&'h str, &'h str, &'h Op)>,
    /// Token -> the generation its acknowledged take took.
    fence_of: BTreeMap<&'h str, u64>,
    /// Tokens presented by a reply not refused (it may have closed its generation).
    replied: BTreeSet<&'h str>,
    /// (key, generation) -> the first acknowledged reply that closed it.
    closed: BTreeMap<(&'h str, u64), &'h Op>,
    /// Key -> its takes, whatever their outcome.
    takes: BTreeMap<&'h str, Vec<&'h Op>>,
    /// Key -> its acknowledged cancels.
    cancels: BTreeMap<&'h str, Vec<&'h Op>>,
    /// Key -> the sendings of its offers not refused, in order.
    offers_sent: BTreeMap<&'h str, Vec<u64>>,
    /// Key -> the sources its offers not refused named (who may withdraw it).
    sources: BTreeMap<&'h str, BTreeSet<&'h str>>,
}

impl<'h> Calls<'h> {
    fn of(history: &'h [Op]) -> Self {
        let mut calls = Calls::default();
        for op in history {
            let refused = op.refused().is_some();
            match (&op.input, op.ok()) {
                (Input::Offer { key, from, .. }, answer) => {
                    if !refused {
                        calls.offers_sent.entry(key).or_default().push(op.call);
                        calls.sources.entry(key).or_default().insert(from);
                    }
                    if let Some(Output::Ticket { generation, .. }) = answer {
                        calls.offered.entry((key, *generation)).or_insert(op);
                    }
                }
                (Input::Take { key, to }, answer) => {
                    calls.takes.entry(key).or_default().push(op);
                    if let Some(Output::Handle { fence, token }) = answer {
                        calls.taken.entry((key, *fence)).or_insert((to, token, op));
                        calls.fence_of.insert(token, *fence);
                    }
                }
                (Input::Reply { token, .. }, _) if !refused => {
                    calls.replied.insert(token);
                }
                (Input::Cancel { key, .. }, Some(_)) => {
                    calls.cancels.entry(key).or_default().push(op);
                }
                _ => {}
            }
        }
        for op in history {
            if let (Input::Reply { key, token }, Some(_)) = (&op.input, op.ok()) {
                if let Some(fence) = calls.fence_of.get(token.as_str()) {
                    calls.closed.entry((key, *fence)).or_insert(op);
                }
            }
        }
        for sent in calls.offers_sent.values_mut() {
            sent.sort_unstable();
        }
        calls
    }

    /// Whether a take of `key` (by `to`, when given) sent before `before` may have taken its
    /// generation `fence`: one not refused, and not acknowledged with another fence.
    fn may_have_taken(&self, key: &str, to: Option<&str>, fence: u64, before: u64) -> bool {
        self.takes.get(key).is_some_and(|takes| {
            takes.iter().any(|op| {
                let by =
                    matches!(&op.input, Input::Take { to: by, .. } if to.is_none_or(|to| to == by));
                let other = matches!(op.ok(), Some(Output::Handle { fence: f, .. }) if *f != fence);
                by && op.call < before && op.refused().is_none() && !other
            })
        })
    }

    /// The earliest the generation `fence` of `key` can have been created: when the
    /// `fence`-th offer of the key was sent (`None` when fewer were).
    fn created_after(&self, key: &str, fence: u64) -> Option<u64> {
        let nth = usize::try_from(fence.checked_sub(1)?).ok()?;
        self.offers_sent.get(key)?.get(nth).copied()
    }
}

/// Whether every change the watch must deliver so far was delivered (see `missed`).
pub fn all_delivered(history: &[Op]) -> bool {
    missed(history).is_empty()
}

/// Every change an acknowledged call made that the watch has not delivered (see the module
/// comment): its key, what is missing, and the call's op.
fn missed(history: &[Op]) -> Vec<(&str, String, usize)> {
    let since = watcher::compacted_at(history, NAME);
    let judged = |op: &Op| since.is_none_or(|since| op.call > since);
    let calls = Calls::of(history);
    let delivered = watcher::delivered_by_change(history, NAME);
    let mut withdrawn: BTreeMap<&str, usize> = BTreeMap::new();
    for d in deliveries(history, NAME) {
        if d.kind == "withdrawn" && judged(d.op) {
            *withdrawn.entry(d.key).or_default() += 1;
        }
    }
    let has = |kind: &str, key: &str, fence: u64| delivered.contains_key(&(kind, key, fence));
    let mut missing = Vec::new();
    // An acknowledged offer may answer a generation an earlier offer created (a live ticket is
    // answered as it is): the generation is judged by when it can first have been created.
    let created_since = |key: &str, fence: u64| {
        calls
            .created_after(key, fence)
            .is_some_and(|created| since.is_none_or(|since| created > since))
    };
    for (&(key, fence), op) in calls.offered.iter() {
        if !created_since(key, fence) {
            continue;
        }
        if !has("offered", key, fence) {
            missing.push((key, format!("the offer of generation {fence}"), op.index));
        }
        // (One taken by an acknowledged take never replied to must be lost: below.)
        let lost_required = calls
            .taken
            .get(&(key, fence))
            .is_some_and(|(_, token, _)| !calls.replied.contains(token));
        if courier::is_courier_key(key) && !lost_required {
            if !calls.may_have_taken(key, None, fence, u64::MAX) {
                if !has("expired", key, fence) {
                    let what = format!("the expiry of generation {fence} (never taken)");
                    missing.push((key, what, op.index));
                }
            } else if !ENDS.iter().any(|end| has(end, key, fence)) {
                missing.push((key, format!("the end of generation {fence}"), op.index));
            }
        }
    }
    for (&(key, fence), &(to, token, op)) in calls.taken.iter().filter(|(_, t)| judged(t.2)) {
        let by_taker = delivered
            .get(&("taken", key, fence))
            .is_some_and(|agents| agents.contains(&to));
        if !by_taker {
            missing.push((
                key,
                format!("the take of generation {fence} by {to}"),
                op.index,
            ));
        }
        if courier::is_courier_key(key)
            && !calls.replied.contains(token)
            && !has("lost", key, fence)
        {
            missing.push((
                key,
                format!("the loss of generation {fence}, taken by {to} (never replied)"),
                op.index,
            ));
        }
    }
    for (&(key, fence), op) in calls.closed.iter().filter(|(_, op)| judged(op)) {
        if !has("closed", key, fence) {
            missing.push((key, format!("the reply to generation {fence}"), op.index));
        }
    }
    for (key, cancels) in &calls.cancels {
        let acknowledged: Vec<&&Op> = cancels.iter().filter(|op| judged(op)).collect();
        let got = withdrawn.get(key).copied().unwrap_or(0);
        if let Some(op) = acknowledged.get(got) {
            missing.push((
                key,
                format!(
                    "{} of the {} acknowledged cancels (delivered {got} withdrawals)",
                    acknowledged.len() - got,
                    acknowledged.len()
                ),
                op.index,
            ));
        }
    }
    missing
}

/// Every handoff watch checker (see the module comment). `complete`: the run was read back and
/// the watch given time to catch up, so every acknowledged change must have been delivered.
pub fn check(history: &[Op], complete: bool) -> Vec<Violation> {
    let calls = Calls::of(history);
    let delivered = deliveries(history, NAME);
    let mut findings = phantoms(history, &calls, &delivered);
    findings.extend(early(&calls, &delivered));
    findings.extend(ended(history, &calls, &delivered));
    findings.extend(double_takes(history));
    let missed = complete.then(|| ("watch-ticket-missed", missed(history)));
    watcher::lease_verdict(
        history,
        NAME,
        ("offered", "watch-ticket-phantom"),
        findings,
        missed,
    )
}

/// `watch-ticket-phantom`: deliveries no call sent before them explains.
fn phantoms<'h>(
    history: &'h [Op],
    calls: &Calls<'h>,
    delivered: &[Delivery<'h>],
) -> Vec<Finding<'h>> {
    // The first sending, not refused, of each reply and cancel a delivery can name: (kind, key,
    // who) -> when; `who` is the token for a reply (and empty, for a reply whatever its token),
    // the canceller for a cancel.
    let mut first_sent: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
    for op in history.iter().filter(|op| op.refused().is_none()) {
        let named: Vec<(&str, &str, &str)> = match &op.input {
            Input::Reply { key, token } => vec![("closed", key, token), ("closed", key, "")],
            Input::Cancel { key, by } => vec![("withdrawn", key, by)],
            _ => Vec::new(),
        };
        for named in named {
            let at = first_sent.entry(named).or_insert(op.call);
            *at = (*at).min(op.call);
        }
    }
    let sent_before = |kind: &str, key: &str, who: &str, d: &Delivery<'_>| {
        first_sent
            .get(&(kind, key, who))
            .is_some_and(|sent| *sent < d.op.call)
    };
    let mut findings = Vec::new();
    for d in delivered {
        // Every change of a generation comes after enough offers were sent to create it.
        let created = calls
            .created_after(d.key, d.fence)
            .is_some_and(|created| created < d.op.call);
        let explained = created
            && match d.kind {
                "taken" | "lost" => calls.may_have_taken(d.key, Some(d.holder), d.fence, d.op.call),
                "closed" => {
                    // With the token of the take that took this generation, when it was
                    // acknowledged.
                    let token = calls
                        .taken
                        .get(&(d.key, d.fence))
                        .map_or("", |(_, token, _)| token);
                    calls.may_have_taken(d.key, Some(d.holder), d.fence, d.op.call)
                        && sent_before("closed", d.key, token, d)
                }
                // By the ticket's source.
                "withdrawn" => calls.sources.get(d.key).is_some_and(|sources| {
                    sources
                        .iter()
                        .any(|source| sent_before("withdrawn", d.key, source, d))
                }),
                _ => true,
            };
        if !explained {
            findings.push(phantom(d));
        }
    }
    findings
}

/// The `watch-ticket-phantom` finding for `d`.
fn phantom<'h>(d: &Delivery<'h>) -> Finding<'h> {
    (
        "watch-ticket-phantom",
        d.key,
        format!(
            "delivered {} of generation {}{}, which no call sent before (and not refused) explains",
            d.kind,
            d.fence,
            if d.holder.is_empty() {
                String::new()
            } else {
                format!(" by {}", d.holder)
            }
        ),
        vec![d.op.index],
    )
}

/// `watch-ticket-early`: an `expired` or `lost` delivered before its generation certainly ran
/// out.
fn early<'h>(calls: &Calls<'h>, delivered: &[Delivery<'h>]) -> Vec<Finding<'h>> {
    let mut findings = Vec::new();
    for d in delivered
        .iter()
        .filter(|d| matches!(d.kind, "expired" | "lost"))
    {
        let Some(created) = calls.created_after(d.key, d.fence) else {
            continue;
        };
        let ttl = ttl_us(d.key);
        if d.op.call + CLOCK_SLACK_US < created + ttl {
            findings.push((
                "watch-ticket-early",
                d.key,
                format!(
                    "delivered {} of generation {} {} ms after the offer that can first have \
                     created it was sent, within its {} ms TTL",
                    d.kind,
                    d.fence,
                    d.op.call.saturating_sub(created) / 1000,
                    ttl / 1000
                ),
                vec![d.op.index],
            ));
        }
    }
    findings
}

/// `watch-ticket-ended`: a generation ended twice, or not as its acknowledged calls say, or the
/// next one offered before it ended.
fn ended<'h>(history: &'h [Op], calls: &Calls<'h>, delivered: &[Delivery<'h>]) -> Vec<Finding<'h>> {
    let mut compactions: Vec<u64> = history
        .iter()
        .filter(|op| op.client == NAME && matches!(op.input, Input::WatchCompacted { .. }))
        .map(|op| op.call)
        .collect();
    compactions.sort_unstable();
    let mut compactions = compactions.into_iter().peekable();
    let mut findings = Vec::new();
    let mut ends: BTreeMap<(&str, u64), &Op> = BTreeMap::new();
    // Key -> the generation the watch delivered offered and no end of yet, since the latest
    // compaction it met (an end may have been in the history compacted away).
    let mut open: BTreeMap<&str, u64> = BTreeMap::new();
    for d in delivered {
        if compactions.next_if(|at| *at <= d.op.call).is_some() {
            while compactions.next_if(|at| *at <= d.op.call).is_some() {}
            open.clear();
        }
        let generation = (d.key, d.fence);
        if d.kind == "offered" {
            if let Some(before) = open.insert(d.key, d.fence) {
                findings.push((
                    "watch-ticket-ended",
                    d.key,
                    if before == d.fence {
                        format!(
                            "delivered the offer of generation {before} again, with no end of it \
                             between"
                        )
                    } else {
                        format!(
                            "delivered the offer of generation {} before any end of generation \
                             {before}",
                            d.fence
                        )
                    },
                    vec![d.op.index],
                ));
            }
            continue;
        }
        if !ENDS.contains(&d.kind) {
            continue;
        }
        if open.get(d.key) == Some(&d.fence) {
            open.remove(d.key);
        }
        if let Some(first) = ends.insert(generation, d.op) {
            findings.push((
                "watch-ticket-ended",
                d.key,
                format!(
                    "delivered a second end of generation {} ({} after {})",
                    d.fence, d.kind, first.input
                ),
                vec![first.index, d.op.index],
            ));
        }
        let contradicted = match d.kind {
            "expired" | "withdrawn" => calls.taken.get(&generation).map(|(_, _, op)| *op),
            "lost" => calls.closed.get(&generation).copied(),
            _ => None,
        };
        if let Some(op) = contradicted {
            findings.push((
                "watch-ticket-ended",
                d.key,
                format!(
                    "delivered {} of generation {}, which an acknowledged {} {}",
                    d.kind,
                    d.fence,
                    if d.kind == "lost" { "reply" } else { "take" },
                    if d.kind == "lost" { "closed" } else { "took" }
                ),
                vec![op.index, d.op.index],
            ));
        }
    }
    findings
}

/// `watch-ticket-double-take`: a generation delivered `taken` a second time, or after an end of
/// it. A take applies only to an offered ticket and makes it accepted in the same step; every
/// other take of that generation is refused (`TAKEN`, or `EXPIRED` / `ALREADY_SETTLED` once it
/// ended) and changes nothing, a retried take is answered from the session table without being
/// applied again, and offering a settled key again makes a new generation. A compaction only
/// hides changes, so it excuses nothing here; repeated deliveries of one change are left to
/// `watch-order` ([`watcher::met`]).
fn double_takes(history: &[Op]) -> Vec<Finding<'_>> {
    let mut taken: BTreeMap<(&str, u64), &Op> = BTreeMap::new();
    let mut ended: BTreeMap<(&str, u64), &Op> = BTreeMap::new();
    let mut findings = Vec::new();
    for met in watcher::met(history, NAME) {
        let Met::Change(d) = met else {
            continue;
        };
        let generation = (d.key, d.fence);
        if ENDS.contains(&d.kind) {
            ended.entry(generation).or_insert(d.op);
            continue;
        }
        if d.kind != "taken" {
            continue;
        }
        let earlier = taken
            .get(&generation)
            .or_else(|| ended.get(&generation))
            .copied();
        if let Some(earlier) = earlier {
            findings.push((
                "watch-ticket-double-take",
                d.key,
                format!(
                    "delivered a take of generation {} by {} after {}: one generation granted \
                     twice",
                    d.fence, d.holder, earlier.input
                ),
                vec![earlier.index, d.op.index],
            ));
        }
        taken.entry(generation).or_insert(d.op);
    }
    findings
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::robustness::handoff::{FROM, TO};
    use crate::robustness::test_history::{rules, H};

    const KEY: &str = "ticket-0";

    fn offer() -> Input {
        Input::Offer {
            key: KEY.into(),
            from: FROM.into(),
            to: TO.into(),
        }
    }

    fn take() -> Input {
        Input::Take {
            key: KEY.into(),
            to: TO.into(),
        }
    }

    fn offered(generation: u64) -> Output {
        Output::Ticket {
            generation,
            state: "offered".into(),
            holder: None,
        }
    }

    /// Generation 1 offered and taken by `c1` (token `t1`), each change delivered: the answer to
    /// `c2`'s take of it was lost.
    fn taken_once() -> H {
        let w = NAME;
        let mut h = H::default();
        h.ok("c0", offer(), 0, 10, offered(1));
        h.delivered(w, ("offered", KEY, "", 1), 11, 5);
        h.ok(
            "c1",
            take(),
            20,
            30,
            Output::Handle {
                fence: 1,
                token: "t1".into(),
            },
        );
        h.ambiguous("c2", take(), 25);
        h.delivered(w, ("taken", KEY, TO, 1), 31, 6);
        h
    }

    /// The rules the checker reports on `h` (before the read-back).
    fn found(h: &H) -> Vec<String> {
        rules(&check(&h.ops, false))
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// A second `taken` of one generation is a second holder, though only one take was answered.
    #[test]
    fn a_generation_taken_twice_is_a_double_take() {
        assert!(found(&taken_once()).is_empty());
        let mut h = taken_once();
        h.delivered(NAME, ("taken", KEY, TO, 1), 40, 7);
        let violations = check(&h.ops, false);
        assert_eq!(rules(&violations), ["watch-ticket-double-take"]);
        assert_eq!(violations[0].ops, [4, 5]);
    }

    /// A take delivered after its generation ended (closed by the taker's reply), also when a
    /// `COMPACTED` hid the first take.
    #[test]
    fn a_generation_taken_after_its_end_is_a_double_take() {
        let reply = Input::Reply {
            key: KEY.into(),
            token: "t1".into(),
        };
        let mut h = taken_once();
        h.ok("c1", reply.clone(), 40, 50, Output::Done);
        h.delivered(NAME, ("closed", KEY, TO, 1), 51, 7);
        assert!(found(&h).is_empty());
        h.delivered(NAME, ("taken", KEY, TO, 1), 60, 8);
        assert_eq!(found(&h), ["watch-ticket-double-take"]);

        let mut h = taken_once();
        h.ops.pop();
        h.compacted(NAME, 35, 9);
        h.ok("c1", reply, 40, 50, Output::Done);
        h.delivered(NAME, ("closed", KEY, TO, 1), 51, 10);
        assert!(found(&h).is_empty());
        h.delivered(NAME, ("taken", KEY, TO, 1), 60, 11);
        assert_eq!(found(&h), ["watch-ticket-double-take"]);
    }

    /// Legal: the next generation taken once its predecessor ended; and one change delivered
    /// twice at one position is `watch-order`'s, not a second take.
    #[test]
    fn a_new_generation_or_a_repeated_delivery_is_no_double_take() {
        let reply = Input::Reply {
            key: KEY.into(),
            token: "t1".into(),
        };
        let mut h = taken_once();
        h.ok("c1", reply, 40, 50, Output::Done);
        h.delivered(NAME, ("closed", KEY, TO, 1), 51, 7);
        h.ok("c0", offer(), 60, 70, offered(2));
        h.delivered(NAME, ("offered", KEY, "", 2), 71, 8);
        h.ok(
            "c2",
            take(),
            80,
            90,
            Output::Handle {
                fence: 2,
                token: "t2".into(),
            },
        );
        h.delivered(NAME, ("taken", KEY, TO, 2), 91, 9);
        assert!(found(&h).is_empty());

        let mut h = taken_once();
        h.delivered(NAME, ("taken", KEY, TO, 1), 40, 6);
        assert_eq!(found(&h), ["watch-order"]);
    }
}
