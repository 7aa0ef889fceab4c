//! `baton ticket ...` and `baton check`.

use std::time::Duration;

use baton_rpc::judge;
use baton_rpc::{Client, Error};
use baton_statemachine::handoff::{OfferArgs, Receipt, ReceiptStatus, Ticket, TicketState};
use baton_statemachine::{ChangeFilter, ChangeKind, ChangeValue, Primitive, Refusal};
use clap::{Subcommand, ValueEnum};
use futures::StreamExt;
use serde_json::json;

use super::{exit, rfc3339, ttl_ms};

/// How long `ticket wait` waits when `--timeout` is not given.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// `baton ticket ...`
#[derive(Subcommand, Debug)]
pub enum TicketCommand {
    /// Offer a ticket (a live ticket with the same key is returned unchanged).
    Offer {
        #[arg(long)]
        key: String,
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        #[arg(long)]
        reply_to: String,
        /// Time limit for taking and replying, e.g. 30s.
        #[arg(long, value_parser = super::ttl)]
        ttl: Duration,
        /// Payload text carried as-is.
        #[arg(long, default_value = "")]
        payload: String,
    },
    /// Take a ticket as its addressee; prints the token, fence and deadline.
    Take {
        #[arg(long)]
        key: String,
        #[arg(long)]
        to: String,
    },
    /// Settle a taken ticket with a receipt.
    Reply {
        #[arg(long)]
        key: String,
        #[arg(long)]
        token: String,
        #[arg(long, value_enum)]
        status: StatusArg,
        #[arg(long, default_value = "")]
        summary: String,
        #[arg(long, default_value = "")]
        failure: String,
        /// Artifact references (repeatable).
        #[arg(long = "artifact")]
        artifacts: Vec<String>,
    },
    /// Withdraw an offered ticket as its source.
    Cancel {
        #[arg(long)]
        key: String,
        #[arg(long)]
        by: String,
    },
    /// List every ticket (linearizable).
    List {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Block until a ticket is offered to an agent, then print it (exit 1 if none comes within
    /// --timeout, default 60s). A ticket already waiting for the agent is printed at once.
    Wait {
        /// The addressee.
        #[arg(long)]
        to: String,
        /// Print the ticket as a JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Offer KEY if needed, let N takers race for it, and judge the race (a key holding a
    /// ticket of anyone but the race itself is refused).
    Race {
        #[arg(long)]
        key: String,
        #[arg(long, default_value_t = 8)]
        takers: usize,
        /// Time limit of the ticket and of the whole judgement.
        #[arg(long, default_value = "30s", value_parser = super::ttl)]
        ttl: Duration,
    },
}

/// A receipt status on the command line.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum StatusArg {
    Done,
    Failed,
    Refused,
}

impl From<StatusArg> for ReceiptStatus {
    fn from(status: StatusArg) -> Self {
        match status {
            StatusArg::Done => ReceiptStatus::Done,
            StatusArg::Failed => ReceiptStatus::Failed,
            StatusArg::Refused => ReceiptStatus::Refused,
        }
    }
}

/// Runs a ticket command; `wait` bounds `ticket wait`.
pub async fn run(command: TicketCommand, client: &Client, wait: Duration) -> u8 {
    let result = match command {
        TicketCommand::Offer {
            key,
            from,
            to,
            reply_to,
            ttl,
            payload,
        } => {
            let args = OfferArgs {
                key,
                from,
                to,
                payload: payload.into_bytes(),
                reply_to,
                ttl_ms: ttl_ms(ttl),
            };
            return offer(client, args).await;
        }
        TicketCommand::Take { key, to } => client.take(&key, &to).await.map(|handle| {
            out!(
                "token={} fence={} until={}",
                handle.token,
                handle.fence,
                rfc3339(handle.until_ms)
            )
        }),
        TicketCommand::Reply {
            key,
            token,
            status,
            summary,
            failure,
            artifacts,
        } => {
            let receipt = Receipt {
                status: status.into(),
                summary,
                failure,
                artifacts,
            };
            client
                .reply(&key, &token, &receipt)
                .await
                .map(|()| out!("closed {key}"))
        }
        TicketCommand::Cancel { key, by } => client
            .cancel(&key, &by)
            .await
            .map(|()| out!("withdrawn {key}")),
        TicketCommand::List { json } => client.tickets().await.map(|snapshot| {
            if json {
                print_json(&snapshot.tickets)
            } else {
                print_table(&snapshot.tickets)
            }
        }),
        TicketCommand::Race { key, takers, ttl } => return race(client, key, takers, ttl).await,
        TicketCommand::Wait { to, json } => return wait_for(client, &to, wait, json).await,
    };
    match result {
        Ok(()) => exit::OK,
        Err(error) => exit::report(&error),
    }
}

/// `ticket offer`. A live ticket on the key is returned unchanged (seed 000: an offer is
/// idempotent), which for a retry of this very offer is success. A live ticket that differs from
/// this offer means the offer was not made — the addressee it names is not the one asked for —
/// so that is said, and the command exits as refused: `offer ... && tell-the-addressee` must
/// not go on.
async fn offer(client: &Client, args: OfferArgs) -> u8 {
    let ticket = match client.offer(args.clone()).await {
        Ok(ticket) => ticket,
        Err(error) => return exit::report(&error),
    };
    out!(
        "key={} generation={} state={} from={} to={} deadline={}",
        ticket.key,
        ticket.generation,
        ticket.state.as_str(),
        ticket.from,
        ticket.to,
        rfc3339(ticket.deadline_ms)
    );
    if is_this_offer(&ticket, &args) {
        return exit::OK;
    }
    eprintln!(
        "baton: key {} holds a live ticket (generation {}, from {} to {}) that differs from this \
         offer; it was returned unchanged and this offer was not made",
        ticket.key, ticket.generation, ticket.from, ticket.to
    );
    exit::REFUSED
}

/// Whether a ticket returned for an offer is that offer (made now or by an earlier sending).
fn is_this_offer(ticket: &Ticket, args: &OfferArgs) -> bool {
    ticket.from == args.from
        && ticket.to == args.to
        && ticket.reply_to == args.reply_to
        && ticket.payload == args.payload
        && ticket.ttl_ms == args.ttl_ms
}

fn print_table(tickets: &[Ticket]) {
    out!(
        "{:<24} {:<10} {:>4} {:<16} DEADLINE",
        "KEY",
        "STATE",
        "GEN",
        "HOLDER"
    );
    for t in tickets {
        out!(
            "{:<24} {:<10} {:>4} {:<16} {}",
            t.key,
            t.state.as_str(),
            t.generation,
            t.holder.as_deref().unwrap_or("-"),
            rfc3339(t.deadline_ms)
        );
    }
}

fn print_json(tickets: &[Ticket]) {
    let list: Vec<_> = tickets.iter().map(ticket_json).collect();
    out!("{}", serde_json::Value::Array(list));
}

/// A ticket as a JSON object. The payload is carried as it was offered: as text when it is
/// UTF-8, otherwise `null` with the bytes in `payload_base64` (never silently altered).
pub fn ticket_json(t: &Ticket) -> serde_json::Value {
    let mut value = json!({
        "key": t.key,
        "state": t.state.as_str(),
        "generation": t.generation,
        "holder": t.holder,
        "deadline": rfc3339(t.deadline_ms),
        "deadline_ms": t.deadline_ms,
        "from": t.from,
        "to": t.to,
        "reply_to": t.reply_to,
        "ttl_ms": t.ttl_ms,
        "receipt_at_ms": t.receipt_at_ms,
        "receipt": t.receipt.as_ref().map(|r| json!({
            "status": r.status.as_str(),
            "summary": r.summary,
            "failure": r.failure,
            "artifacts": r.artifacts,
        })),
    });
    super::put_bytes(&mut value, "payload", &t.payload);
    value
}

/// A payload for a `key=value` line: as it is when UTF-8, else `payload_base64=...`.
fn payload_field(payload: &[u8]) -> String {
    super::bytes_field("payload", payload)
}

/// `ticket wait`: a ticket already offered to `to` is printed at once; otherwise the tickets
/// addressed to `to` are watched from right after the snapshot just read, so an offer made in
/// between is not missed.
async fn wait_for(client: &Client, to: &str, limit: Duration, json: bool) -> u8 {
    let found = tokio::time::timeout(limit, next_offer(client, to)).await;
    match found {
        Ok(Ok(ticket)) => {
            if json {
                out!("{}", ticket_json(&ticket));
            } else {
                out!(
                    "key={} generation={} from={} reply_to={} deadline={} {}",
                    ticket.key,
                    ticket.generation,
                    ticket.from,
                    ticket.reply_to,
                    rfc3339(ticket.deadline_ms),
                    payload_field(&ticket.payload)
                );
            }
            exit::OK
        }
        Ok(Err(error)) => exit::report(&error),
        Err(_) => {
            eprintln!("no ticket was offered to {to} within {limit:?}");
            exit::FAILURE
        }
    }
}

async fn next_offer(client: &Client, to: &str) -> Result<Ticket, Error> {
    let snapshot = client.tickets().await?;
    if let Some(ticket) = snapshot
        .tickets
        .into_iter()
        .find(|t| t.to == to && t.state == TicketState::Offered && t.deadline_ms > snapshot.now_ms)
    {
        return Ok(ticket);
    }
    let filter = ChangeFilter::all()
        .primitive(Primitive::Handoff)
        .tickets_to(to)
        .kinds([ChangeKind::Offered]);
    let mut events = client.watch(filter, Some(snapshot.revision + 1)).await;
    while let Some(event) = events.next().await {
        if let ChangeValue::Ticket(ticket) = event?.change.value {
            return Ok(*ticket);
        }
    }
    Err(Error::Protocol("the watch ended without an error".into()))
}

/// Who offers the tickets `ticket race` races on.
const RACE_SOURCE: &str = "race-source";

fn not_a_race_ticket(key: &str, ticket: &Ticket) -> u8 {
    eprintln!(
        "baton: {key:?} holds a ticket from {:?} ({}): a race would take it; race a key of its own",
        ticket.from,
        ticket.state.as_str()
    );
    exit::USAGE
}

/// A race ticket still offered or taken is an earlier race's (its winner keeps it until the
/// deadline): the offer would answer with it as it stands, and every taker would lose to that
/// winner, which says nothing of the store.
fn race_still_live(key: &str, ticket: &Ticket) -> u8 {
    eprintln!(
        "baton: {key:?} holds an earlier race's ticket ({}, until {}): race again once it is \
         over, or race another key",
        ticket.state.as_str(),
        rfc3339(ticket.deadline_ms)
    );
    exit::USAGE
}

async fn race(client: &Client, key: String, takers: usize, ttl: Duration) -> u8 {
    if takers == 0 {
        eprintln!("baton: --takers must be at least 1");
        return exit::USAGE;
    }
    // A race takes the ticket under its addressee's name and keeps it taken: never someone
    // else's (an offer of a live key answers with the ticket as it stands, and one of a settled
    // key would start its next generation over the real one).
    match client.ticket(&key).await {
        Ok(ticket) if ticket.from != RACE_SOURCE => return not_a_race_ticket(&key, &ticket),
        Ok(_) | Err(Error::Refused(Refusal::UnknownKey)) => {}
        Err(error) => return exit::report(&error),
    }
    let offered = client
        .offer(OfferArgs {
            key: key.clone(),
            from: RACE_SOURCE.into(),
            to: "racer".into(),
            payload: Vec::new(),
            reply_to: RACE_SOURCE.into(),
            ttl_ms: ttl_ms(ttl),
        })
        .await;
    let ticket = match offered {
        Ok(ticket) if ticket.from != RACE_SOURCE => return not_a_race_ticket(&key, &ticket),
        Ok(ticket) if ticket.state != TicketState::Offered => {
            return race_still_live(&key, &ticket);
        }
        Ok(ticket) => ticket,
        Err(error) => return exit::report(&error),
    };
    let names = vec![ticket.to.clone(); takers];
    let outcome = judge::concurrent_take(client, &key, &names, ttl).await;
    super::report_race(&outcome)
}

pub async fn check(client: &Client) -> u8 {
    let snapshot = match client.tickets().await {
        Ok(snapshot) => snapshot,
        Err(error) => return exit::report(&error),
    };
    let problems = baton_statemachine::handoff::check(&snapshot.tickets, snapshot.now_ms);
    super::report_problems(
        "tickets",
        snapshot.tickets.len(),
        snapshot.revision,
        problems
            .iter()
            .map(|p| (p.key.as_str(), p.code.as_str(), p.text.as_str())),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ticket(payload: &[u8]) -> Ticket {
        Ticket {
            key: "k".into(),
            from: "a".into(),
            to: "b".into(),
            payload: payload.to_vec(),
            reply_to: "a".into(),
            ttl_ms: 1_000,
            generation: 1,
            deadline_ms: 2_000,
            state: TicketState::Offered,
            holder: None,
            receipt_at_ms: None,
            receipt: None,
        }
    }

    #[test]
    fn a_payload_is_printed_unaltered() {
        let text = ticket_json(&ticket(b"v1.2.3"));
        assert_eq!(text["payload"], "v1.2.3");
        assert!(text.get("payload_base64").is_none(), "{text}");
        assert_eq!(payload_field(b"v1.2.3"), "payload=v1.2.3");

        // Not UTF-8: the bytes themselves, never replacement characters.
        let binary = ticket_json(&ticket(&[0xff, 0x00, 0xfe]));
        assert!(binary["payload"].is_null(), "{binary}");
        assert_eq!(binary["payload_base64"], "/wD+");
        assert_eq!(payload_field(&[0xff, 0x00, 0xfe]), "payload_base64=/wD+");
    }

    #[test]
    fn only_the_same_offer_is_taken_for_this_one() {
        let args = OfferArgs {
            key: "k".into(),
            from: "a".into(),
            to: "b".into(),
            payload: b"p".to_vec(),
            reply_to: "a".into(),
            ttl_ms: 1_000,
        };
        assert!(is_this_offer(&ticket(b"p"), &args));
        assert!(!is_this_offer(&ticket(b"q"), &args));
        let mut other = ticket(b"p");
        other.to = "c".into();
        assert!(!is_this_offer(&other, &args));
        other = ticket(b"p");
        other.ttl_ms = 2_000;
        assert!(!is_this_offer(&other, &args));
    }
}
