//! Checkers shared by the workloads: exclusive grants, monotonic fences, stale holders, and the
//! fenced sink. Each takes the finished history and returns the violations it found, each with
//! the smallest set of operations that shows it.
//!
//! Only definite answers are evidence. An ambiguous operation never counts as an
//! acknowledgement, but it may explain a later answer (a refusal caused by an ambiguous write
//! that did take effect is not a violation).

use std::collections::BTreeMap;
use std::fmt;

use super::history::{Input, Op, Outcome, Output};
use crate::linearizability::{self, Model, Operation, Verdict};

/// A broken rule and the operations that show it.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The rule, e.g. `unique-grant`.
    pub rule: String,
    /// The key (ticket, task, resource, concurrency key) it concerns.
    pub key: String,
    /// What is wrong, in one sentence.
    pub detail: String,
    /// The operations (history indexes) that show it, in the order to print them. For a
    /// linearizability violation: the longest linearizable prefix, in linearization order.
    pub ops: Vec<usize>,
    /// For a linearizability violation: the operations that could not follow the prefix.
    pub stuck: Vec<usize>,
}

/// Longest slice of a violation printed in full; longer ones keep their head and tail.
const SHOWN: usize = 60;

impl Violation {
    /// A violation of `rule` on `key`.
    pub fn new(rule: &str, key: &str, detail: impl Into<String>, ops: Vec<usize>) -> Violation {
        Violation {
            rule: rule.to_string(),
            key: key.to_string(),
            detail: detail.into(),
            ops,
            stuck: Vec::new(),
        }
    }

    /// The violation with its slice of history, one operation per line. With `full`, every
    /// operation of the slice; otherwise a long prefix keeps its first and last operations.
    pub fn render(&self, history: &[Op], full: bool) -> String {
        let mut text = format!("VIOLATION {} on {}: {}\n", self.rule, self.key, self.detail);
        let line = |text: &mut String, index: &usize| {
            if let Some(op) = history.get(*index) {
                text.push_str(&format!("    {op}\n"));
            }
        };
        if !self.stuck.is_empty() {
            text.push_str(&format!(
                "  longest linearizable prefix ({} operations, in linearization order):\n",
                self.ops.len()
            ));
        }
        if full || self.ops.len() <= SHOWN {
            self.ops.iter().for_each(|i| line(&mut text, i));
        } else {
            let head = SHOWN / 3;
            let tail = SHOWN - head;
            self.ops[..head].iter().for_each(|i| line(&mut text, i));
            text.push_str(&format!(
                "    ... {} operations left out (the full history is in the history file) ...\n",
                self.ops.len() - SHOWN
            ));
            self.ops[self.ops.len() - tail..]
                .iter()
                .for_each(|i| line(&mut text, i));
        }
        if !self.stuck.is_empty() {
            text.push_str("  operations that could not follow it:\n");
            self.stuck.iter().for_each(|i| line(&mut text, i));
        }
        text
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}: {}", self.rule, self.key, self.detail)
    }
}

/// An acknowledged grant: a successful take, claim, acquire or permit lease.
#[derive(Debug, Clone)]
pub struct Grant {
    /// What the grant is exclusive over (ticket key, task id, resource, concurrency key).
    pub key: String,
    /// Its fence (generation, fence, permit token).
    pub fence: u64,
    /// The operation that got it.
    pub op: usize,
    /// When it ends on the store clock (Unix ms), as its answer said: the store clock at its
    /// apply plus the TTL. `None` where the answer carries no deadline.
    pub until_ms: Option<u64>,
    /// When it ends at the latest, counting acknowledged renewals (at least `until_ms`).
    pub renewed_until_ms: Option<u64>,
}

/// At most one acknowledged grant per key and fence.
pub fn unique_grants(what: &str, grants: &[Grant], history: &[Op]) -> Vec<Violation> {
    let mut by_fence: BTreeMap<(&str, u64), Vec<usize>> = BTreeMap::new();
    for grant in grants {
        by_fence
            .entry((&grant.key, grant.fence))
            .or_default()
            .push(grant.op);
    }
    let mut violations = Vec::new();
    for ((key, fence), ops) in by_fence {
        if ops.len() > 1 {
            let clients: Vec<&str> = ops.iter().map(|i| history[*i].client.as_str()).collect();
            violations.push(Violation::new(
                "unique-grant",
                key,
                format!(
                    "{} acknowledged {what}s at fence {fence} (clients {})",
                    ops.len(),
                    clients.join(", ")
                ),
                ops,
            ));
        }
    }
    violations
}

/// A credential the store minted for one grant names no other: the same token (or holder
/// identity) acknowledged for two grants of different keys or fences would let the older holder
/// act as the newer one (contract: tokens are never reused). `token_of` reads it from a grant's
/// answer; empty ones are skipped.
pub fn unique_tokens<'a>(
    what: &str,
    grants: &[Grant],
    token_of: impl Fn(&'a Output) -> Option<&'a str>,
    history: &'a [Op],
) -> Vec<Violation> {
    let mut first: BTreeMap<&str, &Grant> = BTreeMap::new();
    let mut violations = Vec::new();
    for grant in grants {
        let Some(token) = history[grant.op]
            .ok()
            .and_then(&token_of)
            .filter(|t| !t.is_empty())
        else {
            continue;
        };
        match first.get(token) {
            Some(earlier) if (&earlier.key, earlier.fence) != (&grant.key, grant.fence) => {
                violations.push(Violation::new(
                    "unique-token",
                    &grant.key,
                    format!(
                        "one {what} credential was handed out for {} at fence {} and for {} at \
                         fence {}",
                        earlier.key, earlier.fence, grant.key, grant.fence
                    ),
                    vec![earlier.op, grant.op],
                ))
            }
            Some(_) => {}
            None => {
                first.insert(token, grant);
            }
        }
    }
    violations
}

/// Fences strictly increase per key in real-time order: a grant that completed before another
/// was invoked has the lower fence.
pub fn increasing_fences(what: &str, grants: &[Grant], history: &[Op]) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for grant in grants {
        by_key.entry(&grant.key).or_default().push(grant);
    }
    let mut violations = Vec::new();
    for (key, grants) in by_key {
        // Sweep the grants in invocation order, keeping the highest fence among the grants that
        // completed before the current one was invoked.
        let mut by_ret: Vec<&Grant> = grants.clone();
        by_ret.sort_by_key(|g| history[g.op].ret);
        let mut by_call: Vec<&Grant> = grants;
        by_call.sort_by_key(|g| history[g.op].call);
        let mut done = 0;
        let mut highest: Option<&Grant> = None;
        let mut found = 0;
        for grant in by_call {
            let call = history[grant.op].call;
            while done < by_ret.len() && history[by_ret[done].op].ret.is_some_and(|r| r < call) {
                let before = by_ret[done];
                if highest.is_none_or(|h| before.fence > h.fence) {
                    highest = Some(before);
                }
                done += 1;
            }
            if let Some(before) = highest {
                if before.fence >= grant.fence {
                    violations.push(Violation::new(
                        "increasing-fence",
                        key,
                        format!(
                            "{what} at fence {} was acknowledged before a later {what} got fence {}",
                            before.fence, grant.fence
                        ),
                        vec![before.op, grant.op],
                    ));
                    found += 1;
                    if found >= 3 {
                        break;
                    }
                }
            }
        }
    }
    violations
}

/// An acknowledged action of a holder (release, renew, complete, start) that needs its grant to
/// be the current one.
#[derive(Debug, Clone)]
pub struct Use {
    /// The grant's key.
    pub key: String,
    /// The grant's fence.
    pub fence: u64,
    /// The acknowledged operation.
    pub op: usize,
}

/// No holder acts on a superseded grant: once a grant with a higher fence was acknowledged, an
/// action with the lower fence that was invoked afterwards must be refused.
pub fn no_stale_holder(
    what: &str,
    grants: &[Grant],
    uses: &[Use],
    history: &[Op],
) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for grant in grants {
        by_key.entry(&grant.key).or_default().push(grant);
    }
    let mut violations = Vec::new();
    for used in uses {
        let Some(grants) = by_key.get(used.key.as_str()) else {
            continue;
        };
        let use_op = &history[used.op];
        let newer = grants
            .iter()
            .filter(|g| g.fence > used.fence && history[g.op].precedes(use_op))
            .min_by_key(|g| g.fence);
        if let Some(newer) = newer {
            violations.push(Violation::new(
                "stale-holder",
                &used.key,
                format!(
                    "{what} with fence {} was acknowledged after fence {} had been granted",
                    used.fence, newer.fence
                ),
                vec![newer.op, used.op],
            ));
        }
    }
    violations
}

/// Every operation that ended in an error no fault explains ([`Outcome::Unexpected`]: a server
/// code no correct store sends for a data call, an undecodable answer, a reply missing its
/// content): the checkers treat its effect as unknown, so without this rule a store answering
/// `SEQ_REUSED` (another request's result) to a retry would only add unknowns. Reports the
/// first few, and how many there were.
pub fn unexpected_errors(history: &[Op]) -> Vec<Violation> {
    const SHOWN: usize = 3;
    let unexpected: Vec<&Op> = history
        .iter()
        .filter(|op| matches!(op.outcome, Outcome::Unexpected(_)))
        .collect();
    unexpected
        .iter()
        .take(SHOWN)
        .map(|op| {
            let Outcome::Unexpected(reason) = &op.outcome else {
                unreachable!("filtered above")
            };
            Violation::new(
                "unexpected-error",
                "-",
                format!(
                    "{} answered an error no fault explains ({} such in the run): {reason}",
                    op.input,
                    unexpected.len()
                ),
                vec![op.index],
            )
        })
        .collect()
}

/// The refusals a workload's call can meet from a correct store, or `None` where the
/// workload's own model judges every refusal (tickets, checkpoints, submissions). A call of the
/// board, the effect gate, the sink or the queue refused with any other code is a violation:
/// a store that answers `UNKNOWN_TASK` or `RESOURCE_MISMATCH` for a while after a failover (or
/// an infrastructure failure dressed as a contract code, which §0 forbids) would otherwise
/// pass, since a refusal changes nothing the other rules look at.
fn refusals_allowed(input: &Input) -> Option<&'static [&'static str]> {
    Some(match input {
        Input::Offer { .. }
        | Input::Take { .. }
        | Input::Reply { .. }
        | Input::Cancel { .. }
        | Input::Read { .. }
        | Input::Submit { .. }
        | Input::SaveCheckpoint { .. }
        | Input::LoadCheckpoint { .. } => return None,
        // Observed, never refused.
        Input::WatchSaved { .. }
        | Input::WatchLease { .. }
        | Input::WatchSinkWritten { .. }
        | Input::WatchCompacted { .. }
        | Input::WatchEnded { .. } => return None,
        // Seeded tasks without dependencies, never completed: only another agent's claim.
        Input::Claim { .. } => &["TAKEN"],
        // Chain steps: held, not ready yet, or completed by another agent.
        Input::ClaimStep { .. } => &["TAKEN", "BLOCKED", "ALREADY_DONE"],
        // The claim ran out (a stall, a fault) and maybe went to another agent.
        Input::CompleteStep { .. } => &["LEASE_LOST"],
        Input::ReleaseTask { .. } | Input::RenewTask { .. } => &["LEASE_LOST"],
        // The lease ran out and the resource moved on, or the intent ran out (key uncertain).
        Input::CompleteEffect { .. } | Input::ReleaseEffect { .. } => {
            &["FENCE_STALE", "NOT_HOLDER"]
        }
        // Marked after the lease ran out and the resource moved on, after a reconciler made
        // the key retryable (the attempt is gone), or after one resolved it "happened" (the
        // attempt stays, the key is no longer in progress).
        Input::MarkUncertain { .. } => &["FENCE_STALE", "NOT_HOLDER", "NOT_IN_PROGRESS"],
        // Another reconciler holds the key, or it was resolved (or completed) meanwhile.
        Input::BeginReconcile { .. } => &["NOT_UNCERTAIN", "RECONCILE_TAKEN"],
        // Resolved meanwhile; an unsafe action found not to have happened, unforced.
        Input::Resolve { .. } => &["NOT_UNCERTAIN", "UNSAFE_NOT_RETRYABLE"],
        Input::SinkWrite { .. } => &["FENCE_STALE"],
        // A sink nobody's write reached.
        Input::SinkRead { .. } => &["NOT_FOUND"],
        // The attempt's lease ran out (a stall, a fault) and the attempt ended.
        Input::StartAttempt { .. } | Input::EndAttempt { .. } => &["LEASE_LOST"],
        // The task was already running (a worker started it) or had ended.
        Input::CancelTask { .. } => &["ALREADY_STARTED", "ALREADY_SETTLED"],
        // Fresh keys on their own resources, registered workers, listed or granted ids.
        Input::ListTasks
        | Input::Acquire { .. }
        | Input::ShowAction { .. }
        | Input::Lease { .. }
        | Input::Attempts { .. } => &[],
    })
}

/// Every refusal of a call that a correct store does not make for it (`refusals_allowed`).
/// Reports the first few of each code, and how many there were.
pub fn unexpected_refusals(history: &[Op]) -> Vec<Violation> {
    const SHOWN_PER_CODE: usize = 2;
    let mut by_code: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history {
        let (Some(code), Some(allowed)) = (op.refused(), refusals_allowed(&op.input)) else {
            continue;
        };
        if !allowed.contains(&code) {
            by_code.entry(code).or_default().push(op);
        }
    }
    by_code
        .into_iter()
        .flat_map(|(code, ops)| {
            let count = ops.len();
            ops.into_iter().take(SHOWN_PER_CODE).map(move |op| {
                Violation::new(
                    "unexpected-refusal",
                    "-",
                    format!(
                        "{} was refused {code}, which a correct store never answers it ({count} \
                         such in the run)",
                        op.input
                    ),
                    vec![op.index],
                )
            })
        })
        .collect()
}

/// How much earlier than the history's clock the store's clock may run when [`exclusive_holds`]
/// counts a lease's TTL: the history counts on this process's monotonic clock, the store on its
/// leader's wall clock (the same machine's), which agree to well within this over a run.
pub const CLOCK_SLACK_US: u64 = 250_000;

/// No two grants hold one key at once: a grant acknowledged while an earlier grant on the key
/// was certainly still live is a violation, whatever the fences say (a store that ignored live
/// leases but kept raising fences would pass every fence rule), also when both went to one
/// client (a worker whose start failed leasing again while its own permit was live).
///
/// Earlier means a lower fence: the store mints a key's fences in apply order, so `g1` (fence
/// `f1`) was applied before `g2` (fence `f2 > f1`) even when the two calls overlapped — the
/// common case of a race, which a rule asking for `g1` to have returned before `g2` was sent
/// never judges. `g1` was then certainly live when `g2` was applied if, on the store's own
/// clock, `g1`'s deadline (its answer's, or a later acknowledged renewal's) lies past the store
/// time `g2` was applied at (its deadline less the TTL: a grant's deadline is the store clock at
/// its apply plus the TTL) — when both answers carry deadlines; this needs no client clock, and
/// holds however long a grant's call waited to be applied (a retried claim applied seconds after
/// it was sent). Otherwise, if `g2` returned before `g1`'s TTL ran out counted from `g1`'s
/// invocation (the store counts the TTL from its apply, which comes after the invocation; less
/// [`CLOCK_SLACK_US`]). In both cases only if no operation in `ends` (every call that could end a grant — a
/// release, a chain step's completion, a queue attempt's end or a cancel of its task; not an
/// effect's completion, which keeps its hold —,
/// answered or not, but not refused: a refusal ends nothing; matched by key and fence) on `g1`
/// was invoked before `g2` returned. Pairs with equal fences are [`unique_grants`]'s, and pairs
/// whose fences contradict real-time order [`increasing_fences`]'.
pub fn exclusive_holds(
    what: &str,
    grants: &[Grant],
    ends: &[Use],
    ttl_ms: i64,
    history: &[Op],
) -> Vec<Violation> {
    let ttl_us = u64::try_from(ttl_ms).unwrap_or(0).saturating_mul(1000);
    let mut by_key: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for grant in grants {
        by_key.entry(&grant.key).or_default().push(grant);
    }
    let mut first_end: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    for end in ends {
        let call = history[end.op].call;
        first_end
            .entry((&end.key, end.fence))
            .and_modify(|at| *at = (*at).min(call))
            .or_insert(call);
    }
    let mut violations = Vec::new();
    for (key, mut grants) in by_key {
        grants.sort_by_key(|g| (g.fence, history[g.op].call));
        let mut found = 0;
        for (i, second) in grants.iter().enumerate() {
            let Some(ret2) = history[second.op].ret else {
                continue;
            };
            let mut live = None;
            for first in grants[..i].iter().rev() {
                if first.fence == second.fence {
                    continue;
                }
                let op1 = &history[first.op];
                if history[second.op].precedes(op1) {
                    // Fences out of real-time order: not apply order here, and
                    // `increasing_fences`' to report.
                    continue;
                }
                let ended = first_end
                    .get(&(key, first.fence))
                    .is_some_and(|ended| *ended <= ret2);
                // The earlier grant's end with its renewals; the later one's own answer, which
                // dates its apply (a renewal of it says nothing of when it was granted).
                let certainly_live = match (first.renewed_until_ms, second.until_ms) {
                    // Live at the store time `g2` was applied at (expired from its deadline on).
                    (Some(until1), Some(until2)) => {
                        until1 > until2.saturating_sub(u64::try_from(ttl_ms).unwrap_or(0))
                    }
                    _ => ret2 + CLOCK_SLACK_US < op1.call + ttl_us,
                };
                if !ended && certainly_live {
                    live = Some(first);
                    break;
                }
                // Grants of lower fences were applied before this one returned, so they were
                // invoked before it too: once one returned a TTL before `g2` did, none can be
                // live.
                if op1
                    .ret
                    .is_some_and(|ret1| ret1 + ttl_us < ret2 + CLOCK_SLACK_US)
                {
                    break;
                }
            }
            if let Some(first) = live {
                violations.push(Violation::new(
                    "exclusive-hold",
                    key,
                    format!(
                        "{what} at fence {} was granted while the {what} at fence {} (client {}) \
                         was still live: not released and within its {ttl_ms} ms TTL",
                        second.fence, first.fence, history[first.op].client
                    ),
                    vec![first.op, second.op],
                ));
                found += 1;
                if found >= 3 {
                    break;
                }
            }
        }
    }
    violations
}

/// A holder's action refused `LEASE_LOST` (in `refusals`: key and fence of the grant it
/// presented) is explained by the grant's end: its TTL, counted from the latest sending of the
/// grant or of a renewal of it (in `renewals`) acknowledged before the action was sent, may have
/// run out before the action was applied (its answer; less [`CLOCK_SLACK_US`]), a newer grant on
/// the key was sent before the refusal came back, or `ended` says another operation may have
/// ended it (a cancel). A store that refused a live holder — a lease
/// judged expired early, a token lost in a failover — passes every other rule: a refusal
/// changes nothing they look at. Reports the first few per key.
pub fn unexplained_lease_lost(
    what: &str,
    grants: &[Grant],
    renewals: &[Use],
    refusals: &[Use],
    ttl_ms: i64,
    ended: impl Fn(&Op) -> bool,
    history: &[Op],
) -> Vec<Violation> {
    let ttl_us = u64::try_from(ttl_ms).unwrap_or(0).saturating_mul(1000);
    let mut granted: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    for grant in grants {
        let call = history[grant.op].call;
        let at = granted.entry((&grant.key, grant.fence)).or_insert(call);
        *at = (*at).min(call);
    }
    let mut found: BTreeMap<&str, usize> = BTreeMap::new();
    let mut violations = Vec::new();
    for refusal in refusals {
        let op = &history[refusal.op];
        let (Some("LEASE_LOST"), Some(ret)) = (op.refused(), op.ret) else {
            continue;
        };
        let Some(granted_at) = granted.get(&(refusal.key.as_str(), refusal.fence)) else {
            continue;
        };
        let since = renewals
            .iter()
            .filter(|r| r.key == refusal.key && r.fence == refusal.fence)
            .map(|r| &history[r.op])
            .filter(|renewal| renewal.precedes(op))
            .map(|renewal| renewal.call)
            .fold(*granted_at, u64::max);
        let live = ret + CLOCK_SLACK_US < since + ttl_us;
        // A newer grant sent meanwhile says the store ended it; whether it could have is
        // `exclusive_holds`' to judge.
        let superseded = grants
            .iter()
            .any(|g| g.key == refusal.key && g.fence > refusal.fence && history[g.op].call < ret);
        if live && !superseded && !ended(op) {
            let seen = found.entry(&refusal.key).or_default();
            *seen += 1;
            if *seen <= 3 {
                violations.push(Violation::new(
                    "unexplained-lease-lost",
                    &refusal.key,
                    format!(
                        "{what} with the grant at fence {} was refused LEASE_LOST while that grant \
                         was certainly live (within its {ttl_ms} ms TTL) and nothing ended it",
                        refusal.fence
                    ),
                    vec![op.index],
                ));
            }
        }
    }
    violations
}

/// The fenced sink's rules, per resource, over every `SinkWrite` and `SinkRead` in the history
/// whose resource `mine` accepts. Reads invoked from `final_from` on are the reads after recovery
/// (a read during the run, a reconciler's, judges nothing here).
///
/// - an acknowledged write's fence is at least every fence acknowledged before it was invoked
///   (a stale write is never applied), and the answer's seen fence is its own;
/// - a `FENCE_STALE` refusal is explained by a higher-fence write (acknowledged or ambiguous)
///   invoked before the refusal came back, and is evidence of it: no write of a fence at most
///   the refused one, invoked after the refusal came back, is acknowledged, and the sink ends
///   above the refused fence;
/// - after recovery the resource holds the highest acknowledged fence or a higher ambiguous one,
///   with the value of a write at that fence, and counts between the acknowledged writes and
///   those plus the ambiguous ones; a resource no write was sent to is not found.
pub fn sink(history: &[Op], final_from: u64, mine: impl Fn(&str) -> bool) -> Vec<Violation> {
    let mut writes: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    let mut finals: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history {
        match &op.input {
            Input::SinkWrite { resource, .. } if mine(resource) => {
                writes.entry(resource).or_default().push(op)
            }
            Input::SinkRead { resource } if mine(resource) && op.call >= final_from => {
                finals.entry(resource).or_default().push(op)
            }
            _ => {}
        }
    }
    // A resource nobody wrote is judged too: a value there was written by nobody.
    for resource in finals.keys() {
        writes.entry(resource).or_default();
    }
    let mut violations = Vec::new();
    for (resource, ops) in &writes {
        let fence_of = |op: &Op| match op.input {
            Input::SinkWrite { fence, .. } => fence,
            _ => 0,
        };
        let acked: Vec<&Op> = ops.iter().copied().filter(|op| op.ok().is_some()).collect();
        // A stale write applied.
        let mut grants: Vec<Grant> = Vec::new();
        for op in &acked {
            grants.push(Grant {
                key: resource.to_string(),
                fence: fence_of(op),
                op: op.index,
                until_ms: None,
                renewed_until_ms: None,
            });
            if let Some(Output::Sink { seen_fence, .. }) = op.ok() {
                if *seen_fence != fence_of(op) {
                    violations.push(Violation::new(
                        "sink-seen-fence",
                        resource,
                        format!(
                            "a write with fence {} answered seen fence {seen_fence}",
                            fence_of(op)
                        ),
                        vec![op.index],
                    ));
                }
            }
        }
        for grant in &grants {
            let write = &history[grant.op];
            let newer = acked
                .iter()
                .filter(|o| fence_of(o) > grant.fence && o.precedes(write))
                .max_by_key(|o| fence_of(o));
            if let Some(newer) = newer {
                violations.push(Violation::new(
                    "stale-write-applied",
                    resource,
                    format!(
                        "a write with fence {} was accepted after a write with fence {} had been",
                        grant.fence,
                        fence_of(newer)
                    ),
                    vec![newer.index, write.index],
                ));
            }
        }
        // A refusal is evidence too: refused `FENCE_STALE`, a write proves the sink held a
        // higher fence when it was applied (before it returned), so a write invoked after that
        // with a fence no higher must be refused, and the sink ends above it — also when the
        // write that raised it went unanswered, which the rules on acknowledged writes miss.
        let stale: Vec<&Op> = ops
            .iter()
            .copied()
            .filter(|op| op.refused() == Some("FENCE_STALE") && op.ret.is_some())
            .collect();
        for refused in &stale {
            let shown = refused.ret.unwrap_or(u64::MAX);
            if let Some(write) = acked
                .iter()
                .find(|o| fence_of(o) <= fence_of(refused) && o.call > shown)
            {
                violations.push(Violation::new(
                    "stale-write-applied",
                    resource,
                    format!(
                        "a write with fence {} was accepted after a write with fence {} had been \
                         refused FENCE_STALE (the sink held a higher fence)",
                        fence_of(write),
                        fence_of(refused)
                    ),
                    vec![refused.index, write.index],
                ));
            }
        }
        // Refusals must be explained.
        for op in ops.iter().filter(|op| op.refused() == Some("FENCE_STALE")) {
            let ret = op.ret.unwrap_or(u64::MAX);
            let explained = ops
                .iter()
                .any(|o| fence_of(o) > fence_of(op) && o.call < ret && o.refused().is_none());
            if !explained {
                violations.push(Violation::new(
                    "unexplained-fence-stale",
                    resource,
                    format!(
                        "a write with fence {} was refused FENCE_STALE though no higher fence had been presented",
                        fence_of(op)
                    ),
                    vec![op.index],
                ));
            }
        }
        // After recovery.
        let ambiguous: Vec<&Op> = ops.iter().copied().filter(|op| op.is_ambiguous()).collect();
        let highest_acked = acked.iter().max_by_key(|o| fence_of(o));
        let Some(read) = finals
            .get(resource)
            .and_then(|reads| reads.iter().rev().find(|r| r.ok().is_some()))
        else {
            if !acked.is_empty() {
                violations.push(Violation::new(
                    "lost-ack",
                    resource,
                    "acknowledged writes but no successful read after recovery",
                    highest_acked.map(|o| vec![o.index]).unwrap_or_default(),
                ));
            }
            continue;
        };
        let Some(Output::Sink {
            seen_fence,
            writes: count,
            value,
        }) = read.ok()
        else {
            continue;
        };
        let mut slice: Vec<usize> = highest_acked.map(|o| vec![o.index]).unwrap_or_default();
        slice.push(read.index);
        if let Some(refused) = stale.iter().max_by_key(|o| fence_of(o)) {
            if *seen_fence <= fence_of(refused) {
                violations.push(Violation::new(
                    "lost-ack",
                    resource,
                    format!(
                        "a write with fence {} was refused FENCE_STALE (the sink held a higher \
                         fence), the sink holds fence {seen_fence} after recovery",
                        fence_of(refused)
                    ),
                    vec![refused.index, read.index],
                ));
            }
        }
        if let Some(top) = highest_acked {
            if *seen_fence < fence_of(top) {
                violations.push(Violation::new(
                    "lost-ack",
                    resource,
                    format!(
                        "fence {} was acknowledged, the sink holds fence {seen_fence} after recovery",
                        fence_of(top)
                    ),
                    slice.clone(),
                ));
            }
        }
        let source = ops.iter().find(|o| {
            matches!(&o.input, Input::SinkWrite { fence, value: v, .. } if fence == seen_fence && v == value)
                && o.refused().is_none()
        });
        if source.is_none() {
            violations.push(Violation::new(
                "sink-final-value",
                resource,
                format!(
                    "after recovery the sink holds fence {seen_fence} value {value:?}, which no acknowledged or ambiguous write wrote"
                ),
                slice.clone(),
            ));
        }
        let low = acked.len() as u64;
        let high = low + ambiguous.len() as u64;
        if *count < low || *count > high {
            violations.push(Violation::new(
                "sink-write-count",
                resource,
                format!(
                    "after recovery the sink counts {count} accepted writes; the history allows {low}..={high}"
                ),
                slice,
            ));
        }
    }
    violations
}

/// The operations `key_of` gives a key, grouped by it, each group in history order.
pub fn by_key<'a>(
    history: &'a [Op],
    key_of: impl Fn(&'a Input) -> Option<&'a str>,
) -> BTreeMap<&'a str, Vec<&'a Op>> {
    let mut groups: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history {
        if let Some(key) = key_of(&op.input) {
            groups.entry(key).or_default().push(op);
        }
    }
    groups
}

/// `op` as the linearizability checker sees it, with the model's `input` and `output` (`None`
/// for an ambiguous operation, which then has no completion time either).
pub fn operation<I, O>(op: &Op, input: I, output: Option<O>) -> Operation<I, O> {
    Operation {
        client: op.index,
        input,
        ret: output.as_ref().and(op.ret),
        output,
        call: op.call,
    }
}

/// Linearizability of one key's history against `model`: the operations `to_model` maps are
/// searched for an order that explains every answer, for at most `max_steps` steps (a search that
/// gives up is reported, never passed). `what` names the key's kind in the message ("ticket").
pub fn linearizable<M: Model>(
    model: &M,
    what: &str,
    key: &str,
    ops: &[&Op],
    to_model: impl Fn(&Op) -> Option<Operation<M::Input, M::Output>>,
    max_steps: u64,
) -> Vec<Violation> {
    // Keep the position in `ops` of every operation the model sees: the search names them so.
    let mut positions = Vec::new();
    let mut model_ops = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if let Some(model_op) = to_model(op) {
            positions.push(i);
            model_ops.push(model_op);
        }
    }
    match linearizability::check_bounded(model, &model_ops, max_steps) {
        Verdict::Linearizable => Vec::new(),
        Verdict::Violation { longest } => {
            let in_prefix: Vec<usize> = longest.iter().map(|i| positions[*i]).collect();
            let prefix: Vec<usize> = in_prefix.iter().map(|i| ops[*i].index).collect();
            // The operations that could come next: not in the prefix and invoked before the
            // first of them had to complete.
            let rest: Vec<&&Op> = positions
                .iter()
                .filter(|i| !in_prefix.contains(i))
                .map(|i| &ops[*i])
                .collect();
            let horizon = rest
                .iter()
                .filter_map(|op| op.ret)
                .min()
                .unwrap_or(u64::MAX);
            let stuck: Vec<usize> = rest
                .iter()
                .filter(|op| op.call <= horizon)
                .map(|op| op.index)
                .collect();
            let mut violation = Violation::new(
                "linearizable",
                key,
                format!(
                    "no order of the {} operations on this {what} explains what they returned",
                    model_ops.len()
                ),
                prefix,
            );
            violation.stuck = stuck;
            vec![violation]
        }
        Verdict::Inconclusive { steps } => vec![Violation::new(
            "linearizable",
            key,
            format!(
                "INCONCLUSIVE: the search gave up after {steps} steps over {} operations",
                model_ops.len()
            ),
            Vec::new(),
        )],
    }
}
