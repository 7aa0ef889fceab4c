//! Handoff tickets: offer, take, reply, cancel, and linearizable reads.

use baton_statemachine::handoff::{Handle, OfferArgs, Receipt, Ticket};

use super::{credential, Client, MAX_ANSWER_BYTES};
use crate::batch;
use crate::convert;
use crate::error::Error;
use crate::proto;
use crate::proto::handoff_client::HandoffClient;

/// A consistent view of every ticket.
#[derive(Debug, Clone)]
pub struct TicketSnapshot {
    /// Every ticket's current generation, ordered by key.
    pub tickets: Vec<Ticket>,
    /// The store's "now" for judging them.
    pub now_ms: u64,
    /// The Raft log index the view reflects.
    pub revision: u64,
}

impl Client {
    /// Offers a ticket; a live ticket with the same key is returned unchanged.
    pub async fn offer(&self, args: OfferArgs) -> Result<Ticket, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::OfferRequest {
                    header: Some(header),
                    key: args.key.clone(),
                    from: args.from.clone(),
                    to: args.to.clone(),
                    payload: args.payload.clone(),
                    reply_to: args.reply_to.clone(),
                    ttl_ms: args.ttl_ms,
                };
                channel.unary(batch::HANDOFF_OFFER, request)
            })
            .await?;
        reply
            .ticket
            .map(convert::ticket_from_proto)
            .ok_or_else(|| Error::Protocol("offer answered without a ticket".into()))
    }

    /// Takes a ticket as its addressee.
    pub async fn take(&self, key: &str, to: &str) -> Result<Handle, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::TakeRequest {
                    header: Some(header),
                    key: key.to_string(),
                    to: to.to_string(),
                };
                channel.unary(batch::HANDOFF_TAKE, request)
            })
            .await?;
        let handle = reply
            .handle
            .map(convert::handle_from_proto)
            .ok_or_else(|| Error::Protocol("take answered without a handle".into()))?;
        credential("take", &handle.token, handle.fence)?;
        Ok(handle)
    }

    /// Settles a taken ticket with a receipt, presenting the take's token.
    pub async fn reply(&self, key: &str, token: &str, receipt: &Receipt) -> Result<(), Error> {
        self.write(|header, channel| {
            let request = proto::ReplyRequest {
                header: Some(header),
                key: key.to_string(),
                token: token.to_string(),
                receipt: Some(convert::receipt_to_proto(receipt)),
            };
            channel.unary(batch::HANDOFF_REPLY, request)
        })
        .await
        .map(|_| ())
    }

    /// Withdraws an offered ticket as its source.
    pub async fn cancel(&self, key: &str, by: &str) -> Result<(), Error> {
        self.write(|header, channel| {
            let request = proto::CancelRequest {
                header: Some(header),
                key: key.to_string(),
                by: by.to_string(),
            };
            channel.unary(batch::HANDOFF_CANCEL, request)
        })
        .await
        .map(|_| ())
    }

    /// Linearizable read of every ticket.
    pub async fn tickets(&self) -> Result<TicketSnapshot, Error> {
        let reply = self
            .call_patiently(|channel| async move {
                HandoffClient::new(channel)
                    .max_decoding_message_size(MAX_ANSWER_BYTES)
                    .list(proto::ListTicketsRequest {})
                    .await
            })
            .await?;
        Ok(TicketSnapshot {
            tickets: reply
                .tickets
                .into_iter()
                .map(convert::ticket_from_proto)
                .collect(),
            now_ms: reply.now_ms,
            revision: reply.revision,
        })
    }

    /// Linearizable read of one ticket (`UnknownKey` when there is none).
    pub async fn ticket(&self, key: &str) -> Result<Ticket, Error> {
        let reply = self
            .call(|channel| {
                let request = proto::GetTicketRequest {
                    key: key.to_string(),
                };
                channel.unary(batch::HANDOFF_GET, request)
            })
            .await?;
        reply
            .ticket
            .map(convert::ticket_from_proto)
            .ok_or_else(|| Error::Protocol("get answered without a ticket".into()))
    }
}
