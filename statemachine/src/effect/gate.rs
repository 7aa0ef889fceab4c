//! The gate's state and what each command does to it.
//!
//! Holder actions pass the three-way check in this order: the lease's resource must be the
//! action's (`RESOURCE_MISMATCH`), its fence the resource's latest (`FENCE_STALE`), its holder the
//! key's current attempt's (`NOT_HOLDER`). Nothing is written when any of them fails.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::types::{
    Action, ActionView, EffectLease, KeyStatus, Outcome, Reconcile, Resolution, Resolved,
    RetrySafety,
};
use crate::change::{Change, ChangeKind, ChangeValue, Journal, Primitive};
use crate::command::Stamp;
use crate::error::Refusal;
use crate::limits::{MAX_KEY_BYTES, MAX_TEXT_BYTES};
use crate::sweep::Weight;
use crate::time::{deadline_after, is_overdue};
use crate::validate;

/// The latest grant on a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Attempt {
    fence: u64,
    holder: String,
    /// When the execution intent ends (meaningful while the key is in progress).
    until_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KeyRecord {
    resource: String,
    safety: RetrySafety,
    status: KeyStatus,
    attempt: Option<Attempt>,
    result: Option<String>,
    reason: String,
    reconcile: Option<Reconcile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Hold {
    key: String,
    holder: String,
    until_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ResourceRecord {
    /// The highest fence ever issued on this resource; never reset.
    max_fence: u64,
    hold: Option<Hold>,
}

/// Every action key, every resource, and the deadlines the sweep watches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gate {
    keys: BTreeMap<String, KeyRecord>,
    resources: BTreeMap<String, ResourceRecord>,
    intent_deadlines: BTreeSet<(u64, String)>,
    hold_deadlines: BTreeSet<(u64, String)>,
    /// Changes of the command being applied (transient).
    #[serde(skip)]
    journal: Journal,
}

fn validate_action(action: &Action) -> Result<(), Refusal> {
    validate::required("action.key", &action.key, MAX_KEY_BYTES)?;
    validate::required("action.resource", &action.resource, MAX_KEY_BYTES)
}

impl Gate {
    /// Judges an attempt: completed > uncertain > in progress > contended > granted.
    pub fn acquire(
        &mut self,
        stamp: &Stamp,
        clock_ms: u64,
        fence_floor: u64,
        action: &Action,
        ttl_ms: i64,
    ) -> Result<Outcome, Refusal> {
        validate_action(action)?;
        validate::ttl(ttl_ms)?;
        self.expire_intent_if_overdue(&action.key, clock_ms);
        if let Some(record) = self.keys.get(&action.key) {
            if record.resource != action.resource {
                return Err(Refusal::ResourceMismatch);
            }
            match record.status {
                KeyStatus::Completed => {
                    return Ok(Outcome::Completed(
                        record.result.clone().unwrap_or_default(),
                    ))
                }
                KeyStatus::Uncertain => return Ok(Outcome::Uncertain),
                KeyStatus::InProgress => return Ok(Outcome::InProgress),
                KeyStatus::Idle => {}
            }
        }
        self.expire_hold_if_overdue(&action.resource, clock_ms);
        // A resource new to the store starts at the floor (crate::State::fence_floor).
        let resource = self
            .resources
            .entry(action.resource.clone())
            .or_insert_with(|| ResourceRecord {
                max_fence: fence_floor,
                hold: None,
            });
        if resource.hold.is_some() {
            return Ok(Outcome::Contended);
        }
        let until_ms = deadline_after(clock_ms, ttl_ms);
        let lease = EffectLease {
            key: action.key.clone(),
            resource: action.resource.clone(),
            fence: resource.max_fence + 1,
            holder: stamp.token(),
            until_ms,
        };
        resource.max_fence = lease.fence;
        resource.hold = Some(Hold {
            key: action.key.clone(),
            holder: lease.holder.clone(),
            until_ms,
        });
        self.hold_deadlines
            .insert((until_ms, action.resource.clone()));
        self.intent_deadlines.insert((until_ms, action.key.clone()));
        let record = self
            .keys
            .entry(action.key.clone())
            .or_insert_with(|| KeyRecord {
                resource: action.resource.clone(),
                safety: action.safety,
                status: KeyStatus::Idle,
                attempt: None,
                result: None,
                reason: String::new(),
                reconcile: None,
            });
        record.safety = stricter(record.safety, action.safety);
        record.status = KeyStatus::InProgress;
        record.reason.clear();
        record.attempt = Some(Attempt {
            fence: lease.fence,
            holder: lease.holder.clone(),
            until_ms,
        });
        self.note(ChangeKind::Granted, &action.key, lease.fence);
        Ok(Outcome::Granted(lease))
    }

    /// Records the result of the holder's attempt; the first completion wins and later ones
    /// (with valid credentials) get the first result back.
    pub fn complete(
        &mut self,
        clock_ms: u64,
        action: &Action,
        lease: &EffectLease,
        result: String,
    ) -> Result<String, Refusal> {
        validate::bounded("result", &result, MAX_TEXT_BYTES)?;
        validate_action(action)?;
        if let Some(record) = self.keys.get(&action.key) {
            if record.status == KeyStatus::Completed {
                // First completion wins: a repeat (even after the resource moved on) is answered
                // with the recorded result and never overwrites it.
                return Ok(record.result.clone().unwrap_or_default());
            }
        }
        self.expire_intent_if_overdue(&action.key, clock_ms);
        self.three_way_check(action, lease)?;
        let record = self.record_mut(&action.key)?;
        let intent_until = (record.status == KeyStatus::InProgress)
            .then(|| record.attempt.as_ref().map(|a| a.until_ms))
            .flatten();
        record.status = KeyStatus::Completed;
        record.result = Some(result.clone());
        record.reason.clear();
        record.reconcile = None;
        if let Some(until) = intent_until {
            self.intent_deadlines.remove(&(until, action.key.clone()));
        }
        self.note(ChangeKind::Completed, &action.key, lease.fence);
        Ok(result)
    }

    /// Frees the resource hold if it is still this attempt's; the intent is not touched, so the
    /// key cannot be granted again until the attempt is resolved.
    pub fn release(
        &mut self,
        clock_ms: u64,
        action: &Action,
        lease: &EffectLease,
    ) -> Result<(), Refusal> {
        self.expire_intent_if_overdue(&action.key, clock_ms);
        match self.three_way_check(action, lease) {
            Ok(()) => {}
            // The attempt may be gone while its hold stays: `mark_uncertain` keeps the hold for
            // the caller to release, and a "did not happen" resolution then clears the attempt.
            // The hold itself still names its holder and key, and its fence is the latest.
            Err(Refusal::NotHolder) if self.holds_for(action, lease, clock_ms) => {}
            Err(refusal) => return Err(refusal),
        }
        if self.free_hold_if_ours(lease) {
            self.note(ChangeKind::Released, &action.key, lease.fence);
        }
        Ok(())
    }

    /// Withdraws the attempt's intent (the key becomes idle) and frees the resource if still ours.
    pub fn abandon(
        &mut self,
        clock_ms: u64,
        action: &Action,
        lease: &EffectLease,
        reason: &str,
    ) -> Result<(), Refusal> {
        validate::bounded("reason", reason, MAX_TEXT_BYTES)?;
        self.expire_intent_if_overdue(&action.key, clock_ms);
        self.three_way_check(action, lease)?;
        let until = self.in_progress_intent(&action.key)?;
        self.intent_deadlines.remove(&(until, action.key.clone()));
        let record = self.record_mut(&action.key)?;
        record.status = KeyStatus::Idle;
        record.attempt = None;
        record.reason = reason.to_string();
        self.free_hold_if_ours(lease);
        self.note(ChangeKind::Abandoned, &action.key, lease.fence);
        Ok(())
    }

    /// Extends a valid attempt: the intent must still be live and the hold still ours.
    pub fn renew(
        &mut self,
        clock_ms: u64,
        action: &Action,
        lease: &EffectLease,
        ttl_ms: i64,
    ) -> Result<EffectLease, Refusal> {
        validate::ttl(ttl_ms)?;
        self.expire_intent_if_overdue(&action.key, clock_ms);
        self.expire_hold_if_overdue(&lease.resource, clock_ms);
        self.three_way_check(action, lease)?;
        let old_intent = self.in_progress_intent(&action.key)?;
        let old_hold = match self
            .resources
            .get(&lease.resource)
            .and_then(|r| r.hold.as_ref())
        {
            Some(hold) if hold.holder == lease.holder => hold.until_ms,
            _ => return Err(Refusal::NotHolder),
        };
        let until_ms = deadline_after(clock_ms, ttl_ms);
        self.intent_deadlines
            .remove(&(old_intent, action.key.clone()));
        self.intent_deadlines.insert((until_ms, action.key.clone()));
        self.hold_deadlines
            .remove(&(old_hold, lease.resource.clone()));
        self.hold_deadlines
            .insert((until_ms, lease.resource.clone()));
        if let Some(attempt) = self.record_mut(&action.key)?.attempt.as_mut() {
            attempt.until_ms = until_ms;
        }
        if let Some(hold) = self
            .resources
            .get_mut(&lease.resource)
            .and_then(|r| r.hold.as_mut())
        {
            hold.until_ms = until_ms;
        }
        self.note(ChangeKind::Renewed, &action.key, lease.fence);
        Ok(EffectLease {
            until_ms,
            ..lease.clone()
        })
    }

    /// Declares the attempt's outcome unknown: the key becomes uncertain and its intent is
    /// withdrawn, but the resource stays held (the caller releases it explicitly). Nothing
    /// changes if any check fails, so a failed mark never loses the intent.
    pub fn mark_uncertain(
        &mut self,
        clock_ms: u64,
        action: &Action,
        lease: &EffectLease,
        reason: &str,
    ) -> Result<(), Refusal> {
        validate::bounded("reason", reason, MAX_TEXT_BYTES)?;
        self.expire_intent_if_overdue(&action.key, clock_ms);
        self.three_way_check(action, lease)?;
        let record = self.keys.get(&action.key).ok_or(Refusal::UnknownAction)?;
        if record.status == KeyStatus::Uncertain {
            return Ok(());
        }
        let until = self.in_progress_intent(&action.key)?;
        self.intent_deadlines.remove(&(until, action.key.clone()));
        let record = self.record_mut(&action.key)?;
        record.status = KeyStatus::Uncertain;
        record.reason = reason.to_string();
        self.note(ChangeKind::Uncertain, &action.key, lease.fence);
        Ok(())
    }

    /// Grants the one reconciler slot of an uncertain key; an expired occupancy may be taken over.
    pub fn begin_reconcile(
        &mut self,
        stamp: &Stamp,
        clock_ms: u64,
        action: &Action,
        ttl_ms: i64,
    ) -> Result<Reconcile, Refusal> {
        validate_action(action)?;
        validate::ttl(ttl_ms)?;
        self.expire_intent_if_overdue(&action.key, clock_ms);
        let record = self.record_mut(&action.key)?;
        if record.status != KeyStatus::Uncertain {
            return Err(Refusal::NotUncertain);
        }
        if let Some(current) = &record.reconcile {
            if !is_overdue(current.until_ms, clock_ms) {
                return Err(Refusal::ReconcileTaken);
            }
        }
        let reconcile = Reconcile {
            token: stamp.token(),
            until_ms: deadline_after(clock_ms, ttl_ms),
        };
        record.reconcile = Some(reconcile.clone());
        self.note(ChangeKind::Reconciling, &action.key, 0);
        Ok(reconcile)
    }

    /// Resolves an uncertain key from downstream facts (no fence check: the original holder may
    /// be long dead). The first resolution wins. For an unsafe action, "did not happen" leaves
    /// the key blocked unless the resolution forces it retryable: unsafe as any grant of the key
    /// or the resolver declared it (`stricter`).
    pub fn resolve_uncertain(
        &mut self,
        clock_ms: u64,
        action: &Action,
        resolution: &Resolution,
    ) -> Result<Resolved, Refusal> {
        validate_action(action)?;
        validate::bounded("resolution.result", &resolution.result, MAX_TEXT_BYTES)?;
        self.expire_intent_if_overdue(&action.key, clock_ms);
        let record = self.record_mut(&action.key)?;
        match record.status {
            KeyStatus::Completed => {
                return Ok(Resolved::Completed(
                    record.result.clone().unwrap_or_default(),
                ))
            }
            KeyStatus::Uncertain => {}
            KeyStatus::Idle | KeyStatus::InProgress => return Err(Refusal::NotUncertain),
        }
        if resolution.happened {
            record.status = KeyStatus::Completed;
            record.result = Some(resolution.result.clone());
            record.reconcile = None;
            self.note(ChangeKind::Resolved, &action.key, 0);
            return Ok(Resolved::Completed(resolution.result.clone()));
        }
        if stricter(record.safety, action.safety) == RetrySafety::Unsafe
            && !resolution.force_retryable
        {
            return Err(Refusal::UnsafeNotRetryable);
        }
        record.status = KeyStatus::Idle;
        record.attempt = None;
        record.reconcile = None;
        self.note(ChangeKind::Resolved, &action.key, 0);
        Ok(Resolved::Retryable)
    }

    /// Materialises every due expiry: intents turn their keys uncertain, holds are freed.
    /// Returns how many expiries it materialised.
    pub fn sweep(&mut self, clock_ms: u64) -> u64 {
        self.sweep_first(clock_ms, usize::MAX, usize::MAX)
    }

    /// Materialises the first `intents` due execution intents, then the first `holds` due
    /// resource holds (fewer when fewer are due), each in deadline order (then key or resource);
    /// returns how many expiries it materialised.
    pub(crate) fn sweep_first(&mut self, clock_ms: u64, intents: usize, holds: usize) -> u64 {
        let mut expired = 0;
        for _ in 0..intents {
            if !first_due(&self.intent_deadlines, clock_ms) {
                break;
            }
            let Some((_, key)) = self.intent_deadlines.pop_first() else {
                break;
            };
            if let Some(record) = self.keys.get_mut(&key) {
                let lost = mark_intent_expired(record);
                if let Some(fence) = lost {
                    self.note(ChangeKind::Lost, &key, fence);
                }
                expired += 1;
            }
        }
        for _ in 0..holds {
            if !first_due(&self.hold_deadlines, clock_ms) {
                break;
            }
            let Some((_, resource)) = self.hold_deadlines.pop_first() else {
                break;
            };
            if let Some(record) = self.resources.get_mut(&resource) {
                if let Some(hold) = record.hold.take() {
                    let fence = record.max_fence;
                    self.note(ChangeKind::HoldExpired, &hold.key, fence);
                }
                expired += 1;
            }
        }
        expired
    }

    /// The deadlines of the intents due at `clock_ms`, earliest first.
    pub(crate) fn due_intents(&self, clock_ms: u64) -> impl Iterator<Item = (u64, &str)> + '_ {
        due_in(&self.intent_deadlines, clock_ms)
    }

    /// The deadlines of the resource holds due at `clock_ms`, earliest first.
    pub(crate) fn due_holds(&self, clock_ms: u64) -> impl Iterator<Item = (u64, &str)> + '_ {
        due_in(&self.hold_deadlines, clock_ms)
    }

    /// What the expiry of action `key`'s intent adds to a sweep's changes: at most one change
    /// carrying the key's view.
    pub(crate) fn intent_weight(&self, key: &str) -> Weight {
        self.view_weight(key)
    }

    /// What the expiry of the hold on `resource` adds to a sweep's changes: at most one change
    /// carrying the holding key's view.
    pub(crate) fn hold_weight(&self, resource: &str) -> Weight {
        self.resources
            .get(resource)
            .and_then(|record| record.hold.as_ref())
            .map_or(Weight::NONE, |hold| self.view_weight(&hold.key))
    }

    /// One change carrying `key`'s view as an expiry leaves it (with room for the reason an
    /// expired intent gets).
    fn view_weight(&self, key: &str) -> Weight {
        const REASON: usize = 64;
        self.keys.get(key).map_or(Weight::NONE, |record| {
            Weight::change(
                2 * key.len()
                    + record.resource.len()
                    + record.reason.len().max(REASON)
                    + record.result.as_ref().map_or(0, String::len),
            )
        })
    }

    /// Whether an intent or a hold is due for the sweep.
    pub fn has_overdue(&self, clock_ms: u64) -> bool {
        first_due(&self.intent_deadlines, clock_ms) || first_due(&self.hold_deadlines, clock_ms)
    }

    /// How one key stands.
    pub fn show(&self, key: &str) -> Option<ActionView> {
        let record = self.keys.get(key)?;
        let attempt = record.attempt.as_ref();
        Some(ActionView {
            key: key.to_string(),
            resource: record.resource.clone(),
            safety: record.safety,
            status: record.status,
            fence: attempt.map_or(0, |a| a.fence),
            intent_until_ms: (record.status == KeyStatus::InProgress)
                .then(|| attempt.map(|a| a.until_ms))
                .flatten(),
            result: record.result.clone(),
            reason: record.reason.clone(),
            reconcile_until_ms: record.reconcile.as_ref().map(|r| r.until_ms),
        })
    }

    /// Raises every resource's highest fence by `by` ([`crate::State::raise_fences`]).
    pub(crate) fn raise_fences(&mut self, by: u64) {
        for resource in self.resources.values_mut() {
            resource.max_fence = resource.max_fence.saturating_add(by);
        }
    }

    /// The highest fence ever issued on a resource (0 if none).
    pub fn resource_fence(&self, resource: &str) -> u64 {
        self.resources.get(resource).map_or(0, |r| r.max_fence)
    }

    /// Number of live resource holds.
    pub fn holds(&self) -> usize {
        self.hold_deadlines.len()
    }

    /// The three-way check every holder action passes before anything is written.
    fn three_way_check(&self, action: &Action, lease: &EffectLease) -> Result<(), Refusal> {
        validate_action(action)?;
        validate::required("lease.resource", &lease.resource, MAX_KEY_BYTES)?;
        validate::required("lease.holder", &lease.holder, MAX_KEY_BYTES)?;
        let record = self.keys.get(&action.key).ok_or(Refusal::UnknownAction)?;
        // The resource comes first: a fence is only comparable on the resource it was issued on.
        if lease.resource != action.resource || record.resource != action.resource {
            return Err(Refusal::ResourceMismatch);
        }
        if lease.fence != self.resource_fence(&lease.resource) {
            return Err(Refusal::FenceStale);
        }
        match &record.attempt {
            Some(attempt) if attempt.holder == lease.holder && attempt.fence == lease.fence => {}
            _ => return Err(Refusal::NotHolder),
        }
        Ok(())
    }

    /// Whether `lease` still holds `action`'s resource for `action`'s key at `clock_ms` (the
    /// three-way check's other two parts already passed: same resource, latest fence).
    fn holds_for(&self, action: &Action, lease: &EffectLease, clock_ms: u64) -> bool {
        self.resources
            .get(&lease.resource)
            .and_then(|resource| resource.hold.as_ref())
            .is_some_and(|hold| {
                hold.holder == lease.holder
                    && hold.key == action.key
                    && !is_overdue(hold.until_ms, clock_ms)
            })
    }

    /// The intent deadline of a key whose attempt is in progress.
    fn in_progress_intent(&self, key: &str) -> Result<u64, Refusal> {
        let record = self.keys.get(key).ok_or(Refusal::UnknownAction)?;
        match (&record.status, &record.attempt) {
            (KeyStatus::InProgress, Some(attempt)) => Ok(attempt.until_ms),
            _ => Err(Refusal::NotInProgress),
        }
    }

    fn record_mut(&mut self, key: &str) -> Result<&mut KeyRecord, Refusal> {
        validate::required("action.key", key, MAX_KEY_BYTES)?;
        self.keys.get_mut(key).ok_or(Refusal::UnknownAction)
    }

    /// Frees the resource hold if `lease` holds it; returns whether it did.
    fn free_hold_if_ours(&mut self, lease: &EffectLease) -> bool {
        let Some(resource) = self.resources.get_mut(&lease.resource) else {
            return false;
        };
        if let Some(hold) = &resource.hold {
            if hold.holder == lease.holder {
                self.hold_deadlines
                    .remove(&(hold.until_ms, lease.resource.clone()));
                resource.hold = None;
                return true;
            }
        }
        false
    }

    fn expire_intent_if_overdue(&mut self, key: &str, clock_ms: u64) {
        let Some(record) = self.keys.get_mut(key) else {
            return;
        };
        if record.status != KeyStatus::InProgress {
            return;
        }
        if let Some(attempt) = &record.attempt {
            if is_overdue(attempt.until_ms, clock_ms) {
                self.intent_deadlines
                    .remove(&(attempt.until_ms, key.to_string()));
                if let Some(fence) = mark_intent_expired(record) {
                    self.note(ChangeKind::Lost, key, fence);
                }
            }
        }
    }

    fn expire_hold_if_overdue(&mut self, resource: &str, clock_ms: u64) {
        let Some(record) = self.resources.get_mut(resource) else {
            return;
        };
        if let Some(hold) = &record.hold {
            if is_overdue(hold.until_ms, clock_ms) {
                self.hold_deadlines
                    .remove(&(hold.until_ms, resource.to_string()));
                if let Some(hold) = record.hold.take() {
                    let fence = record.max_fence;
                    self.note(ChangeKind::HoldExpired, &hold.key, fence);
                }
            }
        }
    }

    /// Records a change of `key`, with its view after the change as the value. The change names
    /// no holder: an effect lease's holder identity is its credential (with the public fence it
    /// is all `complete` or `abandon` ask for), so it is never published, as a board claim's
    /// token is not; the holder recognises its own changes by key and fence.
    fn note(&mut self, kind: ChangeKind, key: &str, fence: u64) {
        let Some(view) = self.show(key) else {
            return;
        };
        self.journal.push(Change {
            primitive: Primitive::Effect,
            key: key.to_string(),
            kind,
            holder: String::new(),
            fence,
            value: ChangeValue::Action(Box::new(view)),
        });
    }

    /// The changes recorded since the last call (drained after every command).
    pub(crate) fn take_changes(&mut self) -> Vec<Change> {
        self.journal.take()
    }
}

/// Whether the earliest deadline in `set` has passed at `clock_ms`.
fn first_due(set: &BTreeSet<(u64, String)>, clock_ms: u64) -> bool {
    set.first()
        .is_some_and(|(until, _)| is_overdue(*until, clock_ms))
}

/// The deadlines in `set` that have passed at `clock_ms`, earliest first.
fn due_in(set: &BTreeSet<(u64, String)>, clock_ms: u64) -> impl Iterator<Item = (u64, &str)> + '_ {
    set.iter()
        .map(|(until, key)| (*until, key.as_str()))
        .take_while(move |(until, _)| is_overdue(*until, clock_ms))
}

/// An intent that ran out unresolved: nobody knows whether the effect happened. Returns the
/// fence of the attempt that lost its lease.
fn mark_intent_expired(record: &mut KeyRecord) -> Option<u64> {
    if record.status != KeyStatus::InProgress {
        return None;
    }
    record.status = KeyStatus::Uncertain;
    record.reason = "execution intent expired unresolved".into();
    record.attempt.as_ref().map(|attempt| attempt.fence)
}

/// The stricter of two retry safeties. A key declared unsafe once stays unsafe: a later caller
/// declaring it safe must not make a "did not happen" finding unblock, without the force flag,
/// an action that may repeat a harmful effect.
fn stricter(a: RetrySafety, b: RetrySafety) -> RetrySafety {
    if a == RetrySafety::Unsafe || b == RetrySafety::Unsafe {
        RetrySafety::Unsafe
    } else {
        RetrySafety::Safe
    }
}
