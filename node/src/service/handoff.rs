//! The handoff service.

use baton_rpc::convert;
use baton_rpc::error::refusal_status;
use baton_rpc::proto::handoff_server;
use baton_rpc::proto::{
    CancelRequest, CancelResponse, GetTicketRequest, GetTicketResponse, ListTicketsRequest,
    ListTicketsResponse, OfferRequest, OfferResponse, ReplyRequest, ReplyResponse, TakeRequest,
    TakeResponse,
};
use baton_statemachine::handoff::{Command, OfferArgs};
use baton_statemachine::{read_key, Command as Cmd, Refusal, Reply};
use tonic::{Request, Response, Status};

use super::{done, is_retry, now_ms, origin, revision, unexpected, TICKET_TTL};
use crate::node::NodeRef;

/// Serves handoff tickets.
pub struct HandoffService {
    node: NodeRef,
}

impl HandoffService {
    /// Serves `node`.
    pub fn new(node: NodeRef) -> Self {
        Self { node }
    }
}

#[tonic::async_trait]
impl handoff_server::Handoff for HandoffService {
    #[tracing::instrument(skip_all, fields(command = "offer"))]
    async fn offer(
        &self,
        request: Request<OfferRequest>,
    ) -> Result<Response<OfferResponse>, Status> {
        let r = request.into_inner();
        let retry = is_retry(&r.header);
        let origin = origin(r.header)?;
        TICKET_TTL
            .check(&self.node, &origin, retry, r.ttl_ms)
            .await?;
        let command = Command::Offer(OfferArgs {
            key: r.key,
            from: r.from,
            to: r.to,
            payload: r.payload,
            reply_to: r.reply_to,
            ttl_ms: r.ttl_ms,
        });
        match self
            .node
            .propose(Some(origin), Cmd::Handoff(command))
            .await?
        {
            Reply::Ticket(ticket) => Ok(Response::new(OfferResponse {
                ticket: Some(convert::ticket_to_proto(&ticket)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "take"))]
    async fn take(&self, request: Request<TakeRequest>) -> Result<Response<TakeResponse>, Status> {
        let r = request.into_inner();
        let retry = r.header.as_ref().is_some_and(|header| header.retry);
        let command = Command::Take {
            key: r.key,
            to: r.to,
        };
        match self
            .node
            .propose_attempt(Some(origin(r.header)?), retry, Cmd::Handoff(command))
            .await?
        {
            Reply::Handle(handle) => Ok(Response::new(TakeResponse {
                handle: Some(convert::handle_to_proto(&handle)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "reply"))]
    async fn reply(
        &self,
        request: Request<ReplyRequest>,
    ) -> Result<Response<ReplyResponse>, Status> {
        let r = request.into_inner();
        // The header first, as for every write: a reply without one is told so, whatever its
        // receipt.
        let origin = origin(r.header)?;
        let receipt = match convert::receipt_from_proto(r.receipt) {
            Ok(receipt) => receipt,
            Err(undecodable) => {
                // Judged last, as the store judges a decoded one: a reply that could not settle
                // the ticket anyway (unknown, not the holder's, late, settled) is told so first.
                let (key, token) = (r.key, r.token);
                self.node
                    .read(|applied| {
                        applied
                            .state
                            .handoff
                            .judge_reply(now_ms(applied), &key, &token)
                    })
                    .await?
                    .map_err(|refusal| refusal_status(&refusal))?;
                return Err(refusal_status(&undecodable));
            }
        };
        let command = Command::Reply {
            key: r.key,
            token: r.token,
            receipt,
        };
        done(
            self.node
                .propose(Some(origin), Cmd::Handoff(command))
                .await?,
        )?;
        Ok(Response::new(ReplyResponse {}))
    }

    #[tracing::instrument(skip_all, fields(command = "cancel"))]
    async fn cancel(
        &self,
        request: Request<CancelRequest>,
    ) -> Result<Response<CancelResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Cancel {
            key: r.key,
            by: r.by,
        };
        done(
            self.node
                .propose(Some(origin(r.header)?), Cmd::Handoff(command))
                .await?,
        )?;
        Ok(Response::new(CancelResponse {}))
    }

    #[tracing::instrument(skip_all, fields(query = "list_tickets"))]
    async fn list(
        &self,
        _request: Request<ListTicketsRequest>,
    ) -> Result<Response<ListTicketsResponse>, Status> {
        // Pointers under the state lock, encoding after it: applies wait for the first only.
        let (tickets, now_ms, revision) = self
            .node
            .read(|applied| {
                let tickets: Vec<_> = applied.state.handoff.shared_tickets().cloned().collect();
                (tickets, now_ms(applied), revision(applied))
            })
            .await?;
        Ok(Response::new(ListTicketsResponse {
            tickets: tickets
                .iter()
                .map(|ticket| convert::ticket_to_proto(ticket))
                .collect(),
            now_ms,
            revision,
        }))
    }

    #[tracing::instrument(skip_all, fields(query = "get_ticket"))]
    async fn get(
        &self,
        request: Request<GetTicketRequest>,
    ) -> Result<Response<GetTicketResponse>, Status> {
        let key = request.into_inner().key;
        read_key("key", &key).map_err(|refusal| refusal_status(&refusal))?;
        let reply = self
            .node
            .read(|applied| {
                applied
                    .state
                    .handoff
                    .get(&key)
                    .map(|ticket| GetTicketResponse {
                        ticket: Some(convert::ticket_to_proto(ticket)),
                        now_ms: now_ms(applied),
                        revision: revision(applied),
                    })
            })
            .await?;
        reply
            .map(Response::new)
            .ok_or_else(|| refusal_status(&Refusal::UnknownKey))
    }
}
