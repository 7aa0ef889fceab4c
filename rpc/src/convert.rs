//! Protobuf <-> state-machine types. Decoding input from the wire validates enum-like strings
//! and required messages, returning the same typed refusal the state machine would.

use baton_statemachine::board::{Lease as TaskLease, Task, TaskSpec, TaskState};
use baton_statemachine::effect::{
    Action, ActionView, EffectLease, KeyStatus, Outcome, Reconcile, Resolution, Resolved,
    RetrySafety,
};
use baton_statemachine::handoff::{Handle, Receipt, ReceiptStatus, Ticket, TicketState};
use baton_statemachine::Refusal;

use crate::proto;

/// A state-machine receipt as protobuf.
pub fn receipt_to_proto(receipt: &Receipt) -> proto::Receipt {
    proto::Receipt {
        status: receipt.status.as_str().to_string(),
        summary: receipt.summary.clone(),
        failure: receipt.failure.clone(),
        artifacts: receipt.artifacts.clone(),
    }
}

/// A protobuf receipt as a state-machine receipt; a missing receipt or an unknown status is an
/// `INVALID_ARGUMENT` refusal.
pub fn receipt_from_proto(receipt: Option<proto::Receipt>) -> Result<Receipt, Refusal> {
    let receipt = receipt.ok_or_else(|| Refusal::invalid("receipt", "is required"))?;
    let status = ReceiptStatus::parse(&receipt.status).ok_or_else(|| {
        Refusal::invalid("receipt.status", "must be one of done, failed, refused")
    })?;
    Ok(Receipt {
        status,
        summary: receipt.summary,
        failure: receipt.failure,
        artifacts: receipt.artifacts,
    })
}

/// A ticket as protobuf.
pub fn ticket_to_proto(ticket: &Ticket) -> proto::Ticket {
    proto::Ticket {
        key: ticket.key.clone(),
        from: ticket.from.clone(),
        to: ticket.to.clone(),
        payload: ticket.payload.clone(),
        reply_to: ticket.reply_to.clone(),
        ttl_ms: ticket.ttl_ms,
        generation: ticket.generation,
        deadline_ms: ticket.deadline_ms,
        state: ticket.state.as_str().to_string(),
        holder: ticket.holder.clone(),
        receipt_at_ms: ticket.receipt_at_ms,
        receipt: ticket.receipt.as_ref().map(receipt_to_proto),
    }
}

/// A protobuf ticket as a state-machine ticket. Nothing is rejected: an unknown state or receipt
/// status is kept visible (as [`TicketState::Unrecognized`] / a dropped receipt) so that `check`
/// can report what a broken store sent.
pub fn ticket_from_proto(ticket: proto::Ticket) -> Ticket {
    Ticket {
        key: ticket.key,
        from: ticket.from,
        to: ticket.to,
        payload: ticket.payload,
        reply_to: ticket.reply_to,
        ttl_ms: ticket.ttl_ms,
        generation: ticket.generation,
        deadline_ms: ticket.deadline_ms,
        state: TicketState::parse(&ticket.state),
        holder: ticket.holder,
        receipt_at_ms: ticket.receipt_at_ms,
        receipt: ticket
            .receipt
            .and_then(|r| receipt_from_proto(Some(r)).ok()),
    }
}

/// A take's handle as protobuf.
pub fn handle_to_proto(handle: &Handle) -> proto::Handle {
    proto::Handle {
        token: handle.token.clone(),
        fence: handle.fence,
        until_ms: handle.until_ms,
    }
}

/// A protobuf handle as a state-machine handle.
pub fn handle_from_proto(handle: proto::Handle) -> Handle {
    Handle {
        token: handle.token,
        fence: handle.fence,
        until_ms: handle.until_ms,
    }
}

// ---------------------------------------------------------------- task board

/// A seeded task's spec as protobuf.
pub fn task_spec_to_proto(spec: &TaskSpec) -> proto::TaskSpec {
    proto::TaskSpec {
        id: spec.id.clone(),
        deps: spec.deps.clone(),
    }
}

/// A protobuf task spec as a state-machine spec (the state machine validates it).
pub fn task_spec_from_proto(spec: proto::TaskSpec) -> TaskSpec {
    TaskSpec {
        id: spec.id,
        deps: spec.deps,
    }
}

fn task_lease_to_proto(lease: &TaskLease, with_token: bool) -> proto::TaskLease {
    proto::TaskLease {
        agent: lease.agent.clone(),
        token: if with_token {
            lease.token.clone()
        } else {
            String::new()
        },
        fence: lease.fence,
        until_ms: lease.until_ms,
    }
}

fn task_with(task: &Task, with_token: bool) -> proto::Task {
    proto::Task {
        id: task.id.clone(),
        deps: task.deps.clone(),
        state: task.state.as_str().to_string(),
        lease: task
            .lease
            .as_ref()
            .map(|lease| task_lease_to_proto(lease, with_token)),
        max_fence: task.max_fence,
    }
}

/// A task as protobuf, lease token included: only for the claimer (claim and renew answers).
pub fn task_to_proto(task: &Task) -> proto::Task {
    task_with(task, true)
}

/// A task as protobuf for listings: the lease token is withheld (empty), because only the
/// claimer may ever see it.
pub fn task_listing_to_proto(task: &Task) -> proto::Task {
    task_with(task, false)
}

/// A protobuf task as a state-machine task. Nothing is rejected: an unknown state is kept visible
/// as [`TaskState::Unrecognized`] so that `board::check` can report what a broken store sent.
pub fn task_from_proto(task: proto::Task) -> Task {
    Task {
        id: task.id,
        deps: task.deps,
        state: TaskState::parse(&task.state),
        lease: task.lease.map(|lease| TaskLease {
            agent: lease.agent,
            token: lease.token,
            fence: lease.fence,
            until_ms: lease.until_ms,
        }),
        max_fence: task.max_fence,
    }
}

// ---------------------------------------------------------------- side-effect gate

/// A retry safety's wire name as the state-machine value; anything but `safe` / `unsafe` is an
/// `INVALID_ARGUMENT` refusal naming `field`.
pub fn safety_from_str(field: &str, safety: &str) -> Result<RetrySafety, Refusal> {
    match safety {
        "safe" => Ok(RetrySafety::Safe),
        "unsafe" => Ok(RetrySafety::Unsafe),
        _ => Err(Refusal::invalid(field, "must be one of safe, unsafe")),
    }
}

/// A key status's wire name as the state-machine value.
pub fn key_status_from_str(field: &str, status: &str) -> Result<KeyStatus, Refusal> {
    match status {
        "idle" => Ok(KeyStatus::Idle),
        "in_progress" => Ok(KeyStatus::InProgress),
        "uncertain" => Ok(KeyStatus::Uncertain),
        "completed" => Ok(KeyStatus::Completed),
        _ => Err(Refusal::invalid(
            field,
            "must be one of idle, in_progress, uncertain, completed",
        )),
    }
}

/// An action as protobuf.
pub fn action_to_proto(action: &Action) -> proto::Action {
    proto::Action {
        key: action.key.clone(),
        resource: action.resource.clone(),
        safety: action.safety.as_str().to_string(),
    }
}

/// A protobuf action as a state-machine action; a missing action or an unknown safety is an
/// `INVALID_ARGUMENT` refusal.
pub fn action_from_proto(action: Option<proto::Action>) -> Result<Action, Refusal> {
    let action = action.ok_or_else(|| Refusal::invalid("action", "is required"))?;
    Ok(Action {
        safety: safety_from_str("action.safety", &action.safety)?,
        key: action.key,
        resource: action.resource,
    })
}

/// A side-effect lease as protobuf.
pub fn effect_lease_to_proto(lease: &EffectLease) -> proto::EffectLease {
    proto::EffectLease {
        key: lease.key.clone(),
        resource: lease.resource.clone(),
        fence: lease.fence,
        holder: lease.holder.clone(),
        until_ms: lease.until_ms,
    }
}

/// A protobuf side-effect lease as the state-machine lease; a missing lease is an
/// `INVALID_ARGUMENT` refusal naming `field`.
pub fn effect_lease_from_proto(
    field: &str,
    lease: Option<proto::EffectLease>,
) -> Result<EffectLease, Refusal> {
    let lease = lease.ok_or_else(|| Refusal::invalid(field, "is required"))?;
    Ok(EffectLease {
        key: lease.key,
        resource: lease.resource,
        fence: lease.fence,
        holder: lease.holder,
        until_ms: lease.until_ms,
    })
}

/// An acquire outcome as protobuf.
pub fn outcome_to_proto(outcome: &Outcome) -> proto::Outcome {
    let (lease, result) = match outcome {
        Outcome::Granted(lease) => (Some(effect_lease_to_proto(lease)), String::new()),
        Outcome::Completed(result) => (None, result.clone()),
        Outcome::Contended | Outcome::InProgress | Outcome::Uncertain => (None, String::new()),
    };
    proto::Outcome {
        outcome: outcome.name().to_string(),
        lease,
        result,
    }
}

/// A protobuf outcome as the state-machine outcome; a missing outcome, an unknown outcome name or
/// a grant without a lease is an `INVALID_ARGUMENT` refusal.
pub fn outcome_from_proto(outcome: Option<proto::Outcome>) -> Result<Outcome, Refusal> {
    let outcome = outcome.ok_or_else(|| Refusal::invalid("outcome", "is required"))?;
    match outcome.outcome.as_str() {
        "granted" => Ok(Outcome::Granted(effect_lease_from_proto(
            "outcome.lease",
            outcome.lease,
        )?)),
        "contended" => Ok(Outcome::Contended),
        "in_progress" => Ok(Outcome::InProgress),
        "uncertain" => Ok(Outcome::Uncertain),
        "completed" => Ok(Outcome::Completed(outcome.result)),
        _ => Err(Refusal::invalid(
            "outcome.outcome",
            "must be one of granted, contended, in_progress, uncertain, completed",
        )),
    }
}

/// A reconcile slot as protobuf.
pub fn reconcile_to_proto(reconcile: &Reconcile) -> proto::Reconcile {
    proto::Reconcile {
        token: reconcile.token.clone(),
        until_ms: reconcile.until_ms,
    }
}

/// A protobuf reconcile slot as the state-machine value.
pub fn reconcile_from_proto(reconcile: proto::Reconcile) -> Reconcile {
    Reconcile {
        token: reconcile.token,
        until_ms: reconcile.until_ms,
    }
}

/// A resolution as protobuf.
pub fn resolution_to_proto(resolution: &Resolution) -> proto::Resolution {
    proto::Resolution {
        happened: resolution.happened,
        result: resolution.result.clone(),
        force_retryable: resolution.force_retryable,
    }
}

/// A protobuf resolution as the state-machine value; a missing one is an `INVALID_ARGUMENT`
/// refusal.
pub fn resolution_from_proto(resolution: Option<proto::Resolution>) -> Result<Resolution, Refusal> {
    let resolution = resolution.ok_or_else(|| Refusal::invalid("resolution", "is required"))?;
    Ok(Resolution {
        happened: resolution.happened,
        result: resolution.result,
        force_retryable: resolution.force_retryable,
    })
}

/// What a resolution left behind, as a protobuf response.
pub fn resolved_to_proto(resolved: &Resolved) -> proto::ResolveUncertainResponse {
    match resolved {
        Resolved::Completed(result) => proto::ResolveUncertainResponse {
            resolved: "completed".into(),
            result: result.clone(),
        },
        Resolved::Retryable => proto::ResolveUncertainResponse {
            resolved: "retryable".into(),
            result: String::new(),
        },
    }
}

/// A protobuf resolve response as the state-machine value; an unknown name is an
/// `INVALID_ARGUMENT` refusal.
pub fn resolved_from_proto(resolved: proto::ResolveUncertainResponse) -> Result<Resolved, Refusal> {
    match resolved.resolved.as_str() {
        "completed" => Ok(Resolved::Completed(resolved.result)),
        "retryable" => Ok(Resolved::Retryable),
        _ => Err(Refusal::invalid(
            "resolved",
            "must be one of completed, retryable",
        )),
    }
}

/// A key's view as protobuf.
pub fn action_view_to_proto(view: &ActionView) -> proto::ActionView {
    proto::ActionView {
        key: view.key.clone(),
        resource: view.resource.clone(),
        safety: view.safety.as_str().to_string(),
        status: view.status.as_str().to_string(),
        fence: view.fence,
        holder: view.holder.clone(),
        intent_until_ms: view.intent_until_ms,
        result: view.result.clone(),
        reason: view.reason.clone(),
        reconcile_until_ms: view.reconcile_until_ms,
    }
}

/// A protobuf key view as the state-machine value; an unknown safety or status is an
/// `INVALID_ARGUMENT` refusal.
pub fn action_view_from_proto(view: proto::ActionView) -> Result<ActionView, Refusal> {
    Ok(ActionView {
        safety: safety_from_str("action.safety", &view.safety)?,
        status: key_status_from_str("action.status", &view.status)?,
        key: view.key,
        resource: view.resource,
        fence: view.fence,
        holder: view.holder,
        intent_until_ms: view.intent_until_ms,
        result: view.result,
        reason: view.reason,
        reconcile_until_ms: view.reconcile_until_ms,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn lease() -> EffectLease {
        EffectLease {
            key: "k".into(),
            resource: "r".into(),
            fence: 3,
            holder: "h".into(),
            until_ms: 99,
        }
    }

    fn invalid_field(result: Result<impl std::fmt::Debug, Refusal>) -> String {
        match result {
            Err(Refusal::Invalid { field, .. }) => field,
            other => panic!("want Invalid, got {other:?}"),
        }
    }

    #[test]
    fn action_safety_must_be_known() {
        for (safety, want) in [("safe", RetrySafety::Safe), ("unsafe", RetrySafety::Unsafe)] {
            let action = action_from_proto(Some(proto::Action {
                key: "k".into(),
                resource: "r".into(),
                safety: safety.into(),
            }))
            .unwrap();
            assert_eq!(action.safety, want);
            assert_eq!(action_to_proto(&action).safety, safety);
        }
        for bad in ["", "Safe", "maybe"] {
            let result = action_from_proto(Some(proto::Action {
                key: "k".into(),
                resource: "r".into(),
                safety: bad.into(),
            }));
            assert_eq!(invalid_field(result), "action.safety", "safety {bad:?}");
        }
        assert_eq!(invalid_field(action_from_proto(None)), "action");
    }

    #[test]
    fn every_outcome_survives_the_wire() {
        for outcome in [
            Outcome::Granted(lease()),
            Outcome::Contended,
            Outcome::InProgress,
            Outcome::Uncertain,
            Outcome::Completed("sent".into()),
        ] {
            let wire = outcome_to_proto(&outcome);
            assert_eq!(wire.outcome, outcome.name());
            assert_eq!(outcome_from_proto(Some(wire)).unwrap(), outcome);
        }
    }

    #[test]
    fn unknown_or_incomplete_outcomes_are_invalid() {
        let unknown = proto::Outcome {
            outcome: "maybe".into(),
            ..Default::default()
        };
        assert_eq!(
            invalid_field(outcome_from_proto(Some(unknown))),
            "outcome.outcome"
        );
        let granted_without_lease = proto::Outcome {
            outcome: "granted".into(),
            ..Default::default()
        };
        assert_eq!(
            invalid_field(outcome_from_proto(Some(granted_without_lease))),
            "outcome.lease"
        );
        assert_eq!(invalid_field(outcome_from_proto(None)), "outcome");
    }

    #[test]
    fn required_messages_are_invalid_when_missing() {
        assert_eq!(
            invalid_field(effect_lease_from_proto("lease", None)),
            "lease"
        );
        assert_eq!(
            effect_lease_from_proto("lease", Some(effect_lease_to_proto(&lease()))).unwrap(),
            lease()
        );
        assert_eq!(invalid_field(resolution_from_proto(None)), "resolution");
        let resolution = Resolution {
            happened: false,
            result: String::new(),
            force_retryable: true,
        };
        assert_eq!(
            resolution_from_proto(Some(resolution_to_proto(&resolution))).unwrap(),
            resolution
        );
    }

    #[test]
    fn resolved_names_must_be_known() {
        for resolved in [Resolved::Completed("done".into()), Resolved::Retryable] {
            assert_eq!(
                resolved_from_proto(resolved_to_proto(&resolved)).unwrap(),
                resolved
            );
        }
        let unknown = proto::ResolveUncertainResponse {
            resolved: "perhaps".into(),
            result: String::new(),
        };
        assert_eq!(invalid_field(resolved_from_proto(unknown)), "resolved");
    }

    #[test]
    fn action_views_survive_the_wire_and_reject_unknown_names() {
        let view = ActionView {
            key: "k".into(),
            resource: "r".into(),
            safety: RetrySafety::Unsafe,
            status: KeyStatus::InProgress,
            fence: 2,
            holder: "h".into(),
            intent_until_ms: Some(5),
            result: None,
            reason: String::new(),
            reconcile_until_ms: None,
        };
        for status in [
            KeyStatus::Idle,
            KeyStatus::InProgress,
            KeyStatus::Uncertain,
            KeyStatus::Completed,
        ] {
            let view = ActionView {
                status,
                ..view.clone()
            };
            assert_eq!(
                action_view_from_proto(action_view_to_proto(&view)).unwrap(),
                view
            );
        }
        let mut bad_status = action_view_to_proto(&view);
        bad_status.status = "running".into();
        assert_eq!(
            invalid_field(action_view_from_proto(bad_status)),
            "action.status"
        );
        let mut bad_safety = action_view_to_proto(&view);
        bad_safety.safety = "".into();
        assert_eq!(
            invalid_field(action_view_from_proto(bad_safety)),
            "action.safety"
        );
    }

    #[test]
    fn listings_withhold_the_lease_token_and_keep_unknown_states_visible() {
        let task = Task {
            id: "t".into(),
            deps: vec!["a".into()],
            state: TaskState::Claimed,
            lease: Some(TaskLease {
                agent: "agent".into(),
                token: "secret".into(),
                fence: 4,
                until_ms: 10,
            }),
            max_fence: 4,
        };
        assert_eq!(task_from_proto(task_to_proto(&task)), task);
        let listed = task_listing_to_proto(&task);
        let lease = listed.lease.as_ref().unwrap();
        assert_eq!(lease.token, "");
        assert_eq!((lease.agent.as_str(), lease.fence), ("agent", 4));
        let mut odd = listed;
        odd.state = "stolen".into();
        assert_eq!(
            task_from_proto(odd).state,
            TaskState::Unrecognized("stolen".into())
        );
    }
}
