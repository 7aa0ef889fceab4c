//! `baton watch`: follow committed changes, one line per change.

use std::io::Write;

use baton_rpc::{Client, Event};
use baton_statemachine::{ChangeFilter, ChangeKind, ChangeValue, Primitive};
use clap::{ArgGroup, Args};
use futures::StreamExt;
use serde_json::json;

use super::ticket::ticket_json;
use super::{exit, rfc3339};

/// `baton watch ...`
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("keys").args(["key", "prefix"])))]
pub struct WatchArgs {
    /// Only this primitive: handoff, board, effect, sink, checkpoint or queue.
    #[arg(long, value_parser = parse_primitive)]
    primitive: Option<Primitive>,
    /// Only this exact key.
    #[arg(long)]
    key: Option<String>,
    /// Only keys starting with this prefix.
    #[arg(long)]
    prefix: Option<String>,
    /// Only tickets addressed to this agent.
    #[arg(long)]
    to: Option<String>,
    /// Only queue tasks becoming leasable in this queue.
    #[arg(long)]
    leasable_in: Option<String>,
    /// Only changes naming this holder (claims, takes, attempts, and their `lost`).
    #[arg(long)]
    holder: Option<String>,
    /// Only these kinds (repeatable): offered, taken, lost, leasable, ...
    #[arg(long = "kind", value_parser = parse_kind)]
    kinds: Vec<ChangeKind>,
    /// Start at this revision (a Raft log index; e.g. a List's revision + 1) instead of now.
    #[arg(long = "from")]
    from: Option<u64>,
    /// Print one JSON object per line.
    #[arg(long)]
    json: bool,
    /// Stop after this many changes.
    #[arg(long)]
    count: Option<u64>,
}

fn parse_primitive(name: &str) -> Result<Primitive, String> {
    Primitive::parse(name).ok_or_else(|| {
        let names: Vec<&str> = Primitive::ALL.iter().map(Primitive::as_str).collect();
        format!("expected one of {}", names.join(", "))
    })
}

fn parse_kind(name: &str) -> Result<ChangeKind, String> {
    ChangeKind::parse(name).ok_or_else(|| {
        let names: Vec<&str> = ChangeKind::ALL.iter().map(ChangeKind::as_str).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// Follows changes until interrupted, `--count` changes were printed, or the watch fails.
pub async fn run(args: WatchArgs, client: &Client) -> u8 {
    let filter = ChangeFilter {
        primitive: args.primitive,
        key: args.key,
        key_prefix: args.prefix,
        ticket_to: args.to,
        leasable_in: args.leasable_in,
        holder: args.holder,
        kinds: args.kinds,
    };
    let mut events = client.watch(filter, args.from).await;
    let mut printed = 0;
    // One for the whole watch: a signal between two events is not lost.
    let shutdown = super::shutdown_signal();
    tokio::pin!(shutdown);
    while args.count.is_none_or(|count| printed < count) {
        let event = tokio::select! {
            event = events.next() => event,
            _ = &mut shutdown => return exit::OK,
        };
        match event {
            Some(Ok(event)) => {
                let line = if args.json {
                    event_json(&event).to_string()
                } else {
                    event_line(&event)
                };
                if let Err(error) = writeln!(std::io::stdout().lock(), "{line}") {
                    // The reader went away (`baton watch | head -1`): done, like any filter.
                    if error.kind() == std::io::ErrorKind::BrokenPipe {
                        return exit::OK;
                    }
                    eprintln!("baton watch: cannot print: {error}");
                    return exit::FAILURE;
                }
                printed += 1;
            }
            Some(Err(error)) => return exit::report(&error),
            None => return exit::OK,
        }
    }
    exit::OK
}

/// `REV.INDEX PRIMITIVE KIND KEY [holder=H] [fence=F] details`.
fn event_line(event: &Event) -> String {
    let change = &event.change;
    let mut line = format!(
        "{}.{} {} {} {}",
        event.revision,
        event.index,
        change.primitive.as_str(),
        change.kind.as_str(),
        change.key
    );
    if !change.holder.is_empty() {
        line.push_str(&format!(" holder={}", change.holder));
    }
    if change.fence > 0 {
        line.push_str(&format!(" fence={}", change.fence));
    }
    line.push(' ');
    line.push_str(&details(&change.value));
    line
}

fn details(value: &ChangeValue) -> String {
    match value {
        ChangeValue::Ticket(t) => format!(
            "state={} from={} to={} generation={} deadline={}",
            t.state.as_str(),
            t.from,
            t.to,
            t.generation,
            rfc3339(t.deadline_ms)
        ),
        ChangeValue::Task(t) => match &t.lease {
            Some(lease) => format!(
                "state={} agent={} until={}",
                t.state.as_str(),
                lease.agent,
                rfc3339(lease.until_ms)
            ),
            None => format!("state={}", t.state.as_str()),
        },
        ChangeValue::Action(a) => format!(
            "status={} resource={} reason={:?}",
            a.status.as_str(),
            a.resource,
            a.reason
        ),
        ChangeValue::Sink(s) => format!(
            "seen_fence={} writes={} bytes={}",
            s.seen_fence,
            s.writes,
            s.value.len()
        ),
        ChangeValue::Checkpoint(c) => format!("seq={} bytes={}", c.seq, c.data.len()),
        ChangeValue::QueueTask(t) => {
            let mut text = format!("state={} queue={}", t.state.as_str(), t.spec.queue);
            if !t.spec.concurrency_key.is_empty() {
                text.push_str(&format!(" concurrency_key={}", t.spec.concurrency_key));
            }
            text
        }
        ChangeValue::Queue(q) => format!("namespace={}", q.namespace),
        ChangeValue::Worker(w) => format!("concurrency_keys={}", w.concurrency_keys),
        ChangeValue::Permit(p) => format!(
            "namespace={} highest_token={} queues={}",
            p.namespace,
            p.highest_token,
            p.queues.join(",")
        ),
    }
}

/// One change as a JSON object: `revision`, `index`, `primitive`, `kind`, `key`, `holder`,
/// `fence` and the new `value`.
fn event_json(event: &Event) -> serde_json::Value {
    let change = &event.change;
    json!({
        "revision": event.revision,
        "index": event.index,
        "primitive": change.primitive.as_str(),
        "kind": change.kind.as_str(),
        "key": change.key,
        "holder": change.holder,
        "fence": change.fence,
        "value": value_json(&change.value),
    })
}

fn value_json(value: &ChangeValue) -> serde_json::Value {
    match value {
        ChangeValue::Ticket(t) => ticket_json(t),
        ChangeValue::Task(t) => json!({
            "id": t.id,
            "deps": t.deps,
            "state": t.state.as_str(),
            "max_fence": t.max_fence,
            "lease": t.lease.as_ref().map(|l| json!({
                "agent": l.agent,
                "fence": l.fence,
                "until_ms": l.until_ms,
            })),
        }),
        ChangeValue::Action(a) => json!({
            "key": a.key,
            "resource": a.resource,
            "safety": a.safety.as_str(),
            "status": a.status.as_str(),
            "fence": a.fence,
            "intent_until_ms": a.intent_until_ms,
            "result": a.result,
            "reason": a.reason,
            "reconcile_until_ms": a.reconcile_until_ms,
        }),
        ChangeValue::Sink(s) => json!({
            "seen_fence": s.seen_fence,
            "writes": s.writes,
            "value": String::from_utf8_lossy(&s.value),
        }),
        ChangeValue::Checkpoint(c) => json!({
            "seq": c.seq,
            "saved_at_ms": c.saved_at_ms,
            "data": String::from_utf8_lossy(&c.data),
        }),
        ChangeValue::QueueTask(t) => json!({
            "id": t.id,
            "namespace": t.namespace,
            "queue": t.spec.queue,
            "idempotency_key": t.spec.idempotency_key,
            "handler": t.spec.handler,
            "concurrency_key": t.spec.concurrency_key,
            "business_key": t.spec.business_key,
            "state": t.state.as_str(),
            "attempts": t.attempts.iter().map(|a| json!({
                "number": a.number,
                "worker": a.worker,
                "token": a.token,
                "outcome": a.outcome.as_str(),
                "lease_until_ms": a.lease_until_ms,
                "note": a.note,
            })).collect::<Vec<_>>(),
            "deadline_ms": t.deadline_ms,
            "retry_at_ms": t.retry_at_ms,
            "last_error": t.last_error,
        }),
        ChangeValue::Queue(q) => json!({ "name": q.name, "namespace": q.namespace }),
        ChangeValue::Worker(w) => json!({ "id": w.id, "concurrency_keys": w.concurrency_keys }),
        ChangeValue::Permit(p) => json!({
            "namespace": p.namespace,
            "key": p.key,
            "highest_token": p.highest_token,
            "queues": p.queues,
        }),
    }
}
