//! Protobuf <-> state-machine types. Decoding input from the wire validates enum-like strings
//! and required messages, returning the same typed refusal the state machine would.

use baton_statemachine::board::{Lease as TaskLease, Task, TaskSpec, TaskState};
use baton_statemachine::checkpoint::Checkpoint;
use baton_statemachine::effect::{
    Action, ActionView, EffectLease, KeyStatus, Outcome, Reconcile, Resolution, Resolved,
    RetrySafety,
};
use baton_statemachine::handoff::{Handle, Receipt, ReceiptStatus, Ticket, TicketState};
use baton_statemachine::queue::{
    validate_concurrency_key_bytes, Assignment, Attempt, AttemptOutcome, Queue, Task as QueueTask,
    TaskSpec as QueueTaskSpec, TaskState as QueueTaskState, Worker,
};
use baton_statemachine::sink::SinkValue;
use baton_statemachine::{
    Change, ChangeFilter, ChangeKind, ChangeValue, Permit, Primitive, Refusal,
};

use crate::proto;
use crate::proto::watch_event::Value as EventValue;

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

/// A protobuf ticket as a state-machine ticket. Nothing is rejected: an unknown state is kept as
/// [`TicketState::Unrecognized`] and a receipt that cannot be read is dropped, both of which
/// `check` reports (an unknown state; a closed ticket without its receipt), so that it can judge
/// what a broken store sent.
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
        intent_until_ms: view.intent_until_ms,
        result: view.result,
        reason: view.reason,
        reconcile_until_ms: view.reconcile_until_ms,
    })
}

// ---------------------------------------------------------------- task queue

/// A queue as protobuf.
pub fn queue_to_proto(queue: &Queue) -> proto::QueueInfo {
    proto::QueueInfo {
        name: queue.name.clone(),
        namespace: queue.namespace.clone(),
    }
}

/// A protobuf queue as the state-machine value.
pub fn queue_from_proto(queue: proto::QueueInfo) -> Queue {
    Queue {
        name: queue.name,
        namespace: queue.namespace,
    }
}

/// A registered worker as protobuf.
pub fn worker_to_proto(worker: &Worker) -> proto::QueueWorker {
    proto::QueueWorker {
        id: worker.id.clone(),
        concurrency_keys: worker.concurrency_keys,
    }
}

/// A protobuf worker as the state-machine value.
pub fn worker_from_proto(worker: proto::QueueWorker) -> Worker {
    Worker {
        id: worker.id,
        concurrency_keys: worker.concurrency_keys,
    }
}

/// An attempt outcome's wire name as the state-machine value.
pub fn attempt_outcome_from_str(field: &str, outcome: &str) -> Result<AttemptOutcome, Refusal> {
    Ok(match outcome {
        "ACTIVE" => AttemptOutcome::Active,
        "SUCCEEDED" => AttemptOutcome::Succeeded,
        "FAILED" => AttemptOutcome::Failed,
        "EXPIRED" => AttemptOutcome::Expired,
        "CANCELLED" => AttemptOutcome::Cancelled,
        "UNKNOWN" => AttemptOutcome::Unknown,
        _ => {
            return Err(Refusal::invalid(
                field,
                "must be one of ACTIVE, SUCCEEDED, FAILED, EXPIRED, CANCELLED, UNKNOWN",
            ))
        }
    })
}

/// A task state's wire name as the state-machine value (case-insensitive).
pub fn queue_task_state_from_str(field: &str, state: &str) -> Result<QueueTaskState, Refusal> {
    QueueTaskState::parse(state).ok_or_else(|| {
        Refusal::invalid(
            field,
            "must be one of WAITING, LEASED, RUNNING, RETRY_WAIT, SUCCEEDED, FAILED, CANCELLED, \
             NEEDS_REVIEW",
        )
    })
}

/// An attempt as protobuf (its permit token included: it is history, not a credential).
pub fn attempt_to_proto(attempt: &Attempt) -> proto::Attempt {
    proto::Attempt {
        number: attempt.number,
        worker: attempt.worker.clone(),
        concurrency_token: attempt.token,
        leased_at_ms: attempt.leased_at_ms,
        lease_until_ms: attempt.lease_until_ms,
        started_at_ms: attempt.started_at_ms,
        ended_at_ms: attempt.ended_at_ms,
        outcome: attempt.outcome.as_str().to_string(),
        note: attempt.note.clone(),
    }
}

/// A protobuf attempt as the state-machine value; an unknown outcome is an `INVALID_ARGUMENT`
/// refusal.
pub fn attempt_from_proto(attempt: proto::Attempt) -> Result<Attempt, Refusal> {
    Ok(Attempt {
        outcome: attempt_outcome_from_str("attempt.outcome", &attempt.outcome)?,
        number: attempt.number,
        worker: attempt.worker,
        token: attempt.concurrency_token,
        leased_at_ms: attempt.leased_at_ms,
        lease_until_ms: attempt.lease_until_ms,
        started_at_ms: attempt.started_at_ms,
        ended_at_ms: attempt.ended_at_ms,
        note: attempt.note,
    })
}

/// A queue task as protobuf.
pub fn queue_task_to_proto(task: &QueueTask) -> proto::QueueTask {
    proto::QueueTask {
        payload: task.spec.payload.clone(),
        result: task.result.clone(),
        ..queue_task_summary_to_proto(task)
    }
}

/// A queue task as a listing shows it: everything but the payload and the result, which only
/// the task's own read ([`queue_task_to_proto`]) carries, so listings stay small (and cost no
/// copy of them).
pub fn queue_task_summary_to_proto(task: &QueueTask) -> proto::QueueTask {
    let spec = &task.spec;
    proto::QueueTask {
        id: task.id,
        namespace: task.namespace.clone(),
        queue: spec.queue.clone(),
        idempotency_key: spec.idempotency_key.clone(),
        handler: spec.handler.clone(),
        handler_version: spec.handler_version.clone(),
        payload_version: spec.payload_version.clone(),
        payload: Vec::new(),
        concurrency_key: spec.concurrency_key.clone(),
        business_key: spec.business_key.clone(),
        max_attempts: spec.max_attempts,
        ttl_ms: spec.ttl_ms,
        state: task.state.as_str().to_string(),
        attempts: task.attempts.iter().map(attempt_to_proto).collect(),
        submitted_at_ms: task.submitted_at_ms,
        deadline_ms: task.deadline_ms,
        retry_at_ms: task.retry_at_ms,
        result: Vec::new(),
        last_error: task.last_error.clone(),
    }
}

/// A protobuf queue task as the state-machine value; an unknown state or attempt outcome is an
/// `INVALID_ARGUMENT` refusal.
pub fn queue_task_from_proto(task: proto::QueueTask) -> Result<QueueTask, Refusal> {
    Ok(QueueTask {
        state: queue_task_state_from_str("task.state", &task.state)?,
        attempts: task
            .attempts
            .into_iter()
            .map(attempt_from_proto)
            .collect::<Result<_, _>>()?,
        id: task.id,
        namespace: task.namespace,
        spec: QueueTaskSpec {
            queue: task.queue,
            idempotency_key: task.idempotency_key,
            handler: task.handler,
            handler_version: task.handler_version,
            payload_version: task.payload_version,
            payload: task.payload,
            concurrency_key: task.concurrency_key,
            business_key: task.business_key,
            max_attempts: task.max_attempts,
            ttl_ms: task.ttl_ms,
        },
        submitted_at_ms: task.submitted_at_ms,
        deadline_ms: task.deadline_ms,
        retry_at_ms: task.retry_at_ms,
        result: task.result,
        last_error: task.last_error,
    })
}

/// A submission as its protobuf request (the key travels as raw bytes).
pub fn submit_to_proto(header: proto::RequestHeader, spec: &QueueTaskSpec) -> proto::SubmitRequest {
    proto::SubmitRequest {
        header: Some(header),
        queue: spec.queue.clone(),
        idempotency_key: spec.idempotency_key.clone(),
        handler: spec.handler.clone(),
        handler_version: spec.handler_version.clone(),
        payload_version: spec.payload_version.clone(),
        payload: spec.payload.clone(),
        concurrency_key: spec.concurrency_key.as_bytes().to_vec(),
        business_key: spec.business_key.clone(),
        max_attempts: spec.max_attempts,
        ttl_ms: spec.ttl_ms,
    }
}

/// A protobuf submission as the state-machine spec. The concurrency key's bytes must be a valid
/// key (valid UTF-8 first), else an `INVALID_ARGUMENT` refusal naming `concurrency_key`; the
/// state machine validates everything else.
pub fn submit_from_proto(request: proto::SubmitRequest) -> Result<QueueTaskSpec, Refusal> {
    let concurrency_key = validate_concurrency_key_bytes(&request.concurrency_key)?;
    Ok(QueueTaskSpec {
        queue: request.queue,
        idempotency_key: request.idempotency_key,
        handler: request.handler,
        handler_version: request.handler_version,
        payload_version: request.payload_version,
        payload: request.payload,
        concurrency_key,
        business_key: request.business_key,
        max_attempts: request.max_attempts,
        ttl_ms: request.ttl_ms,
    })
}

/// An assignment as protobuf.
pub fn assignment_to_proto(assignment: &Assignment) -> proto::Assignment {
    proto::Assignment {
        task_id: assignment.task_id,
        attempt: assignment.attempt,
        queue: assignment.queue.clone(),
        namespace: assignment.namespace.clone(),
        handler: assignment.handler.clone(),
        handler_version: assignment.handler_version.clone(),
        payload_version: assignment.payload_version.clone(),
        payload: assignment.payload.clone(),
        concurrency_key: assignment.concurrency_key.clone(),
        concurrency_token: assignment.token,
        lease_until_ms: assignment.lease_until_ms,
    }
}

/// A protobuf assignment as the state-machine value. Nothing is rejected here: whether key and
/// token are consistent is the worker's protocol check to make (see [`crate::worker`]).
pub fn assignment_from_proto(assignment: proto::Assignment) -> Assignment {
    Assignment {
        task_id: assignment.task_id,
        attempt: assignment.attempt,
        queue: assignment.queue,
        namespace: assignment.namespace,
        handler: assignment.handler,
        handler_version: assignment.handler_version,
        payload_version: assignment.payload_version,
        payload: assignment.payload,
        concurrency_key: assignment.concurrency_key,
        token: assignment.concurrency_token,
        lease_until_ms: assignment.lease_until_ms,
    }
}

// ---------------------------------------------------------------- watch

/// The change at `(revision, index)` as a watch event.
pub fn change_to_proto(revision: u64, index: u32, change: &Change) -> proto::WatchEvent {
    let value = match &change.value {
        ChangeValue::Ticket(ticket) => EventValue::Ticket(ticket_to_proto(ticket)),
        ChangeValue::Task(task) => EventValue::Task(task_listing_to_proto(task)),
        ChangeValue::Action(view) => EventValue::Action(action_view_to_proto(view)),
        ChangeValue::Sink(sink) => EventValue::Sink(proto::SinkValue {
            seen_fence: sink.seen_fence,
            value: sink.value.clone(),
            writes: sink.writes,
        }),
        ChangeValue::Checkpoint(saved) => EventValue::Checkpoint(proto::CheckpointValue {
            seq: saved.seq,
            data: saved.data.clone(),
            saved_at_ms: saved.saved_at_ms,
        }),
        ChangeValue::QueueTask(task) => EventValue::QueueTask(queue_task_summary_to_proto(task)),
        ChangeValue::Queue(queue) => EventValue::Queue(queue_to_proto(queue)),
        ChangeValue::Worker(worker) => EventValue::Worker(worker_to_proto(worker)),
        ChangeValue::Permit(permit) => EventValue::Permit(proto::PermitValue {
            namespace: permit.namespace.clone(),
            key: permit.key.clone(),
            highest_token: permit.highest_token,
            queues: permit.queues.clone(),
        }),
    };
    proto::WatchEvent {
        revision,
        index,
        primitive: change.primitive.as_str().to_string(),
        kind: change.kind.as_str().to_string(),
        key: change.key.clone(),
        holder: change.holder.clone(),
        fence: change.fence,
        value: Some(value),
    }
}

/// A watch event as `(revision, index, change)`; an unknown primitive or kind, or a missing
/// value, is an `INVALID_ARGUMENT` refusal (the client reports it as a protocol error).
pub fn change_from_proto(event: proto::WatchEvent) -> Result<(u64, u32, Change), Refusal> {
    let primitive = Primitive::parse(&event.primitive)
        .ok_or_else(|| Refusal::invalid("event.primitive", "is not a known primitive"))?;
    let kind = ChangeKind::parse(&event.kind)
        .ok_or_else(|| Refusal::invalid("event.kind", "is not a known kind"))?;
    let value = match event
        .value
        .ok_or_else(|| Refusal::invalid("event.value", "is required"))?
    {
        EventValue::Ticket(ticket) => ChangeValue::Ticket(Box::new(ticket_from_proto(ticket))),
        EventValue::Task(task) => ChangeValue::Task(std::sync::Arc::new(task_from_proto(task))),
        EventValue::Action(view) => ChangeValue::Action(Box::new(action_view_from_proto(view)?)),
        EventValue::Sink(sink) => ChangeValue::Sink(SinkValue {
            seen_fence: sink.seen_fence,
            value: sink.value,
            writes: sink.writes,
        }),
        EventValue::Checkpoint(saved) => ChangeValue::Checkpoint(Checkpoint {
            seq: saved.seq,
            data: saved.data,
            saved_at_ms: saved.saved_at_ms,
        }),
        EventValue::QueueTask(task) => {
            ChangeValue::QueueTask(Box::new(queue_task_from_proto(task)?))
        }
        EventValue::Queue(queue) => ChangeValue::Queue(queue_from_proto(queue)),
        EventValue::Worker(worker) => ChangeValue::Worker(worker_from_proto(worker)),
        EventValue::Permit(permit) => ChangeValue::Permit(Permit {
            namespace: permit.namespace,
            key: permit.key,
            highest_token: permit.highest_token,
            queues: permit.queues,
        }),
    };
    let change = Change {
        primitive,
        key: event.key,
        kind,
        holder: event.holder,
        fence: event.fence,
        value,
    };
    Ok((event.revision, event.index, change))
}

/// A watch filter as protobuf.
pub fn filter_to_proto(filter: &ChangeFilter) -> proto::WatchFilter {
    proto::WatchFilter {
        primitive: filter
            .primitive
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
        key: filter.key.clone(),
        key_prefix: filter.key_prefix.clone(),
        ticket_to: filter.ticket_to.clone(),
        leasable_in: filter.leasable_in.clone(),
        holder: filter.holder.clone(),
        kinds: filter
            .kinds
            .iter()
            .map(|k| k.as_str().to_string())
            .collect(),
    }
}

/// A protobuf watch filter as a validated filter (a missing filter follows everything); an
/// unknown primitive or kind, or a contradictory filter, is an `INVALID_ARGUMENT` refusal.
pub fn filter_from_proto(filter: Option<proto::WatchFilter>) -> Result<ChangeFilter, Refusal> {
    let filter = filter.unwrap_or_default();
    let primitive = match filter.primitive.as_str() {
        "" => None,
        name => Some(Primitive::parse(name).ok_or_else(|| {
            Refusal::invalid(
                "filter.primitive",
                "must be one of handoff, board, effect, sink, checkpoint, queue",
            )
        })?),
    };
    let mut kinds: Vec<ChangeKind> = Vec::new();
    for name in &filter.kinds {
        let kind = ChangeKind::parse(name)
            .ok_or_else(|| Refusal::invalid("filter.kinds", format!("unknown kind {name:?}")))?;
        // Each kind once: every change of every stream is matched against this list, so a
        // request repeating kinds by the hundred thousand must not make it that long.
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    let filter = ChangeFilter {
        primitive,
        key: filter.key,
        key_prefix: filter.key_prefix,
        ticket_to: filter.ticket_to,
        leasable_in: filter.leasable_in,
        holder: filter.holder,
        kinds,
    };
    filter.validate()?;
    Ok(filter)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A watch filter keeps each kind once, however often the request repeats it.
    #[test]
    fn a_filter_keeps_each_kind_once() {
        let filter = proto::WatchFilter {
            kinds: vec!["offered".into(); 100_000]
                .into_iter()
                .chain(["taken".into()])
                .collect(),
            ..proto::WatchFilter::default()
        };
        let filter = filter_from_proto(Some(filter)).unwrap();
        assert_eq!(filter.kinds, [ChangeKind::Offered, ChangeKind::Taken]);
    }

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

    fn queue_task() -> QueueTask {
        QueueTask {
            id: 9,
            namespace: "ns".into(),
            spec: QueueTaskSpec {
                queue: "q".into(),
                idempotency_key: "op-1".into(),
                handler: "object.update".into(),
                handler_version: "v1".into(),
                payload_version: "v1".into(),
                payload: b"{}".to_vec(),
                concurrency_key: "object/42".into(),
                business_key: "b".into(),
                max_attempts: 3,
                ttl_ms: 60_000,
            },
            state: QueueTaskState::RetryWait,
            attempts: vec![Attempt {
                number: 1,
                worker: "w".into(),
                token: Some(u64::MAX),
                leased_at_ms: 1,
                lease_until_ms: 2,
                started_at_ms: Some(1),
                ended_at_ms: Some(2),
                outcome: AttemptOutcome::Failed,
                note: "boom".into(),
            }],
            submitted_at_ms: 1,
            deadline_ms: 60_001,
            retry_at_ms: Some(500),
            result: Vec::new(),
            last_error: "boom".into(),
        }
    }

    #[test]
    fn queue_tasks_survive_the_wire_with_u64_tokens_intact() {
        let task = queue_task();
        let wire = queue_task_to_proto(&task);
        assert_eq!(wire.attempts[0].concurrency_token, Some(u64::MAX));
        assert_eq!(queue_task_from_proto(wire).unwrap(), task);
        let summary = queue_task_summary_to_proto(&task);
        assert!(summary.payload.is_empty() && summary.result.is_empty());
        assert_eq!(summary.concurrency_key, "object/42");

        let mut odd = queue_task_to_proto(&task);
        odd.state = "SLEEPING".into();
        assert_eq!(invalid_field(queue_task_from_proto(odd)), "task.state");
        let mut odd = queue_task_to_proto(&task);
        odd.attempts[0].outcome = "MAYBE".into();
        assert_eq!(invalid_field(queue_task_from_proto(odd)), "attempt.outcome");
    }

    #[test]
    fn submissions_validate_the_key_bytes_and_keep_everything_else() {
        let spec = queue_task().spec;
        let header = proto::RequestHeader {
            client_id: 1,
            seq: 1,
            acked_below: 0,
            ..Default::default()
        };
        let wire = submit_to_proto(header, &spec);
        assert_eq!(wire.concurrency_key, b"object/42");
        assert_eq!(submit_from_proto(wire.clone()).unwrap(), spec);
        for bad in [&[0x6f, 0xff][..], b" lead", b"a\x00b"] {
            let mut request = wire.clone();
            request.concurrency_key = bad.to_vec();
            assert_eq!(
                invalid_field(submit_from_proto(request)),
                "concurrency_key",
                "{bad:?}"
            );
        }
        let mut none = wire;
        none.concurrency_key = Vec::new();
        assert_eq!(submit_from_proto(none).unwrap().concurrency_key, "");
    }

    #[test]
    fn assignments_keep_their_key_and_token_as_sent() {
        let assignment = Assignment {
            task_id: 1,
            attempt: 2,
            queue: "q".into(),
            namespace: "ns".into(),
            handler: "h".into(),
            handler_version: "v1".into(),
            payload_version: "v1".into(),
            payload: b"p".to_vec(),
            concurrency_key: String::new(),
            // Inconsistent on purpose: judging it is the worker's protocol check, not decoding's.
            token: Some(7),
            lease_until_ms: 3,
        };
        assert_eq!(
            assignment_from_proto(assignment_to_proto(&assignment)),
            assignment
        );
    }

    #[test]
    fn watch_events_and_filters_survive_the_wire() {
        let changes = [
            Change {
                primitive: Primitive::Queue,
                key: "17".into(),
                kind: ChangeKind::Lost,
                holder: "w".into(),
                fence: u64::MAX,
                value: ChangeValue::queue_task(&queue_task()),
            },
            Change {
                primitive: Primitive::Queue,
                key: "object/42".into(),
                kind: ChangeKind::KeyFreed,
                holder: "w".into(),
                fence: 3,
                value: ChangeValue::Permit(Permit {
                    namespace: "ns".into(),
                    key: "object/42".into(),
                    highest_token: 3,
                    queues: vec!["a".into(), "b".into()],
                }),
            },
            Change {
                primitive: Primitive::Sink,
                key: "r".into(),
                kind: ChangeKind::Written,
                holder: String::new(),
                fence: 4,
                value: ChangeValue::Sink(SinkValue {
                    seen_fence: 4,
                    value: b"v".to_vec(),
                    writes: 2,
                }),
            },
        ];
        for (i, change) in changes.iter().enumerate() {
            let event = change_to_proto(9, i as u32, change);
            assert_eq!(event.kind, change.kind.as_str());
            let (revision, index, back) = change_from_proto(event).unwrap();
            assert_eq!((revision, index), (9, i as u32));
            assert_eq!(&back, change);
        }
        let mut event = change_to_proto(1, 0, &changes[2]);
        event.kind = "exploded".into();
        assert!(change_from_proto(event).is_err());

        let filter = ChangeFilter::all()
            .primitive(Primitive::Handoff)
            .tickets_to("B")
            .kinds([ChangeKind::Offered, ChangeKind::Lost]);
        assert_eq!(
            filter_from_proto(Some(filter_to_proto(&filter))).unwrap(),
            filter
        );
        assert_eq!(filter_from_proto(None).unwrap(), ChangeFilter::all());
        let bad = proto::WatchFilter {
            primitive: "tickets".into(),
            ..Default::default()
        };
        assert_eq!(
            invalid_field(filter_from_proto(Some(bad))),
            "filter.primitive"
        );
        let bad = proto::WatchFilter {
            kinds: vec!["exploded".into()],
            ..Default::default()
        };
        assert_eq!(invalid_field(filter_from_proto(Some(bad))), "filter.kinds");
        let bad = proto::WatchFilter {
            key: Some("a".into()),
            key_prefix: Some("a".into()),
            ..Default::default()
        };
        assert_eq!(
            invalid_field(filter_from_proto(Some(bad))),
            "filter.key_prefix"
        );
    }
}
