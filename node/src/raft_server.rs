//! The server side of the Raft transport, and the node's one port, which it shares with gRPC.
//!
//! Every accepted connection is told apart by its first byte ([`raft_wire::is_raft_connection`]):
//! a peer's Raft connection is served here, on one task per connection that reads a request,
//! has the local Raft instance answer it and writes the answer; any other connection goes to the
//! gRPC server unread. So peers and clients keep reaching a node at one address, and the
//! membership, the configuration and firewalls name one port per node.

use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use openraft::error::RaftError;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest,
};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::client_connections::{ClientConnection, ClientConnections};
use crate::cluster_id::{OwnCluster, Standing};
use crate::node::{is_voter, is_voter_id};
use crate::pre_vote::{self, Contact};
use crate::raft_wire::{self, Header, Kind};
use crate::snapshot_chunks::ChunkIntake;
use crate::throttle::Throttle;
use crate::tls::{PeerAcceptor, TLS_REFUSAL};
use crate::types::{NodeId, Raft, TypeConfig};
use crate::{codec, handover, newer_log_stands, stalled_leader};

/// How long a new connection may take to send its first byte and then open (a peer its preamble
/// and TLS handshake, a plaintext gRPC client HTTP/2's preface, a TLS one its handshake) before
/// it is closed. gRPC clients, plain or TLS, speak first too.
pub const OPENING_LIMIT: Duration = Duration::from_secs(10);

/// The first byte of a TLS connection (a handshake record).
const TLS_HANDSHAKE: u8 = 0x16;

/// What an HTTP/2 client sends first on a plaintext connection.
const HTTP2_PREFACE_BYTES: usize = 24;

/// Whether `stream` holds HTTP/2's connection preface (or as many bytes of anything) before
/// `deadline`, peeked, not read.
async fn preface_arrives(stream: &TcpStream, deadline: Instant) -> bool {
    let mut preface = [0u8; HTTP2_PREFACE_BYTES];
    let mut pause = Duration::from_millis(5);
    loop {
        match stream.peek(&mut preface).await {
            Ok(HTTP2_PREFACE_BYTES) => return true,
            Ok(0) | Err(_) => return false,
            // Part of it: the rest is on its way (a peek would see the same bytes at once, so
            // wait, longer each time, for a client that may be stalling on purpose).
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Ok(_) => return false,
        }
    }
}

/// The connections of one port, split between gRPC and Raft.
pub struct Port {
    /// The connections for the gRPC server, unread, each holding its place.
    pub grpc: ReceiverStream<std::io::Result<ClientConnection>>,
    /// The task accepting connections; it stops, closing the listener, when `closed` turns true.
    pub acceptor: JoinHandle<()>,
}

/// What answers peers: the local Raft instance, and the election bookkeeping its answers feed
/// (when this node last heard from a leader) and pre-votes draw on.
#[derive(Clone)]
pub struct Local {
    /// This node's id: requests meant for another are refused.
    pub id: NodeId,
    /// This node's cluster: requests from another are refused.
    pub cluster: OwnCluster,
    /// Warnings of refused requests.
    pub warned: Throttle,
    /// Warnings of refused TLS handshakes (apart, so that a misplaced node's requests do not
    /// drown another peer's certificate trouble).
    pub tls_warned: Throttle,
    /// The local Raft instance.
    pub raft: Raft,
    /// Updated as leader messages are accepted; read by pre-votes and [`pre_vote::run`].
    pub contact: Contact,
    /// The election timings pre-votes are judged by.
    pub timing: pre_vote::Timing,
    /// The leader's progress, by which a stalled leader's messages are refused.
    pub progress: stalled_leader::LeaderWatch,
    /// How long a leader waits for an answer to an AppendEntries (`raft.heartbeat`).
    pub answer_deadline: Duration,
    /// What was received of the snapshot being streamed in, by which chunks are admitted.
    pub snapshot_chunks: ChunkIntake,
}

/// Accepts connections on `listener` until `closed` turns true: Raft connections are answered by
/// `local` (over TLS through `tls` when the node runs it), the others are handed on in
/// [`Port::grpc`] while `clients` has places for them. Raft connections are closed when `closed`
/// turns true.
pub fn split(
    listener: TcpListener,
    local: Local,
    tls: Option<PeerAcceptor>,
    clients: ClientConnections,
    closed: watch::Receiver<bool>,
) -> Port {
    let (grpc_tx, grpc_rx) = mpsc::channel(64);
    let acceptor = tokio::spawn(accept(listener, local, tls, clients, grpc_tx, closed));
    Port {
        grpc: ReceiverStream::new(grpc_rx),
        acceptor,
    }
}

async fn accept(
    listener: TcpListener,
    local: Local,
    tls: Option<PeerAcceptor>,
    clients: ClientConnections,
    grpc: mpsc::Sender<std::io::Result<ClientConnection>>,
    mut closed: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = closed.wait_for(|closed| *closed) => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: the connection waits in the backlog meanwhile.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (local, tls, clients, grpc) =
            (local.clone(), tls.clone(), clients.clone(), grpc.clone());
        let mut closed = closed.clone();
        tokio::spawn(async move {
            let mut first = [0u8; 1];
            let peeked = tokio::select! {
                peeked = tokio::time::timeout(OPENING_LIMIT, stream.peek(&mut first)) => peeked,
                _ = closed.wait_for(|closed| *closed) => return,
            };
            match peeked {
                Ok(Ok(1)) if raft_wire::is_raft_connection(first[0]) => {
                    raft_wire::tune(&stream);
                    serve_peer(local, stream, tls, closed).await;
                }
                // gRPC. A TLS client starts its handshake (bounded by the server's TLS timeout);
                // a plaintext one must have sent HTTP/2's whole preface by the opening limit.
                // The gRPC server waits for neither, so a connection stalled before either
                // would be held for good, and a few thousand of them would use up the node's
                // file descriptors, its peers' Raft connections with them.
                Ok(Ok(1)) => {
                    // A place first: one taken from here on is held through the opening too,
                    // so that the connections waiting to open are counted as well.
                    let Some(connection) = clients.admit(stream) else {
                        return;
                    };
                    let stream = connection.stream();
                    if first[0] != TLS_HANDSHAKE {
                        let opened = Instant::now() + OPENING_LIMIT;
                        let arrived = tokio::select! {
                            arrived = preface_arrives(stream, opened) => arrived,
                            _ = closed.wait_for(|closed| *closed) => false,
                        };
                        if !arrived {
                            return;
                        }
                    }
                    // Nagle's algorithm off: a small response split over writes would otherwise
                    // wait for the client's delayed ACK, ~40 ms, whenever it is not busy.
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                    }
                    let _ = grpc.send(Ok(connection)).await;
                }
                // Nothing within the opening limit, closed, or failed: dropped, which closes it.
                _ => {}
            }
        });
    }
}

/// Serves one peer's Raft connection: its preamble, its TLS handshake when the node runs TLS,
/// then its requests one at a time until it closes, sends something malformed, or `closed`
/// turns true.
async fn serve_peer(
    local: Local,
    mut stream: TcpStream,
    tls: Option<PeerAcceptor>,
    mut closed: watch::Receiver<bool>,
) {
    let peer = stream.peer_addr().ok();
    let opening = async {
        let mut preamble = [0u8; raft_wire::PREAMBLE.len()];
        stream
            .read_exact(&mut preamble)
            .await
            .map_err(|e| e.to_string())?;
        if preamble != raft_wire::PREAMBLE {
            return Err("not a Baton Raft connection (or another version)".to_string());
        }
        Ok::<Box<dyn raft_wire::Stream>, String>(match &tls {
            None => Box::new(stream),
            Some(tls) => Box::new(tls.accept(stream).await?),
        })
    };
    let opened = tokio::select! {
        opened = tokio::time::timeout(OPENING_LIMIT, opening) => opened,
        _ = closed.wait_for(|closed| *closed) => return,
    };
    let stream = match opened {
        Ok(Ok(stream)) => stream,
        // A node whose certificate the cluster's CA did not sign, or that lacks a node's
        // usages, follows no leader and wins no election: its operator must hear why.
        Ok(Err(why)) if tls.is_some() && why.starts_with(TLS_REFUSAL) && local.tls_warned.due() => {
            tracing::warn!(?peer, %why, "peer connection refused");
            return;
        }
        Ok(Err(why)) => {
            tracing::debug!(?peer, %why, "peer connection refused");
            return;
        }
        Err(_) => {
            tracing::debug!(?peer, "peer connection closed: it did not open in time");
            return;
        }
    };
    let mut link = raft_wire::link(stream);
    loop {
        let frame = tokio::select! {
            biased;
            _ = closed.wait_for(|closed| *closed) => return,
            frame = link.next() => frame,
        };
        let frame = match frame {
            None => return,
            Some(Ok(frame)) => frame.freeze(),
            Some(Err(e)) => {
                tracing::debug!(?peer, error = %e, "peer connection closed: unreadable frame");
                return;
            }
        };
        let (answer, keep_open) = match handle(&local, frame).await {
            Ok(answer) => (answer, true),
            Err(why) => {
                tracing::debug!(?peer, %why, "peer request refused");
                (raft_wire::failed(&why), false)
            }
        };
        if link.send(answer).await.is_err() || !keep_open {
            return;
        }
    }
}

impl Local {
    /// Where the sender of a request with `header` stands ([`crate::cluster_id`]); refuses one
    /// meant for another node or coming from another cluster: a misconfiguration an operator
    /// must hear of, so it is logged as a warning.
    fn check(&self, kind: Kind, header: &Header) -> Result<Standing, String> {
        let refused = if header.to != self.id {
            format!(
                "this is node {}, not node {} (the sender's address for node {} leads here)",
                self.id, header.to, header.to
            )
        } else {
            // The rules question changes nothing, and `members add` asks it before the node
            // joins: a new node answers it as it would an invitation, without taking one.
            let inviting = matches!(
                kind,
                Kind::AppendEntries | Kind::InstallSnapshot | Kind::Join | Kind::Rules
            );
            match self.cluster.admit(header.cluster, inviting) {
                Ok(standing) => return Ok(standing),
                Err(why) => format!("refused: {why}"),
            }
        };
        if self.warned.due() {
            tracing::warn!(request = ?kind, %refused, "peer request refused");
        }
        Err(refused)
    }
}

/// Has `local` answer one request frame; an error is a request that could not be handled.
async fn handle(local: &Local, frame: Bytes) -> Result<Bytes, String> {
    let (kind, header, body) = raft_wire::parse_request(frame).map_err(|e| e.to_string())?;
    let standing = local.check(kind, &header)?;
    // A new node joins the cluster that invites it only once Raft would act on the invitation
    // (a leader's entries or snapshot in a term at least its own), and before it does; the
    // invitation is held until the request is answered.
    let join_if_invited = |fit: bool| match standing {
        Standing::Invited(id) if fit => local.cluster.join(id).map(Some).map_err(|e| e.to_string()),
        Standing::Invited(_) => {
            Err("refused: an invitation from a leader this node would not follow".to_string())
        }
        Standing::Member | Standing::Unnamed => Ok(None),
    };
    let undecodable = |e: bincode::error::DecodeError| format!("undecodable {kind:?}: {e}");
    let raft = &local.raft;
    let answer = match kind {
        Kind::AppendEntries => {
            let request: AppendEntriesRequest<TypeConfig> =
                codec::decode(&body).map_err(undecodable)?;
            // Heard on arrival, as openraft's own lease clock counts it: a leader's entries
            // can take a long flush, and meanwhile this node must not say yes to a pre-vote.
            // Unless the leader has stalled: then it is not heard at all.
            let (from_leader, voter) = {
                let metrics = raft.metrics();
                let metrics = metrics.borrow();
                (
                    request.vote.is_committed() && request.vote >= metrics.vote,
                    is_voter(&metrics),
                )
            };
            let report = stalled_leader::Report {
                vote: request.vote,
                first: request.entries.first().map(|entry| entry.log_id.index),
                sent: request
                    .entries
                    .last()
                    .map(|entry| entry.log_id.index)
                    .or(request.prev_log_id.map(|id| id.index)),
                committed: request.leader_commit.map(|id| id.index),
            };
            let _invitation = join_if_invited(from_leader)?;
            let judged = from_leader && voter;
            if judged {
                // Refused like a request that cannot be handled: to the leader this node is
                // unreachable, as behind a cut link (it drops the connection and dials again
                // after a pause).
                local
                    .progress
                    .judge(&report, local.timing.lease)
                    .map_err(|stalled| stalled.to_string())?;
            }
            if from_leader {
                local.contact.heard_from_leader();
            }
            let arrived = Instant::now();
            let result = raft.append_entries(request).await;
            // A follower in openraft 0.9 answers `Success` or nothing it matched.
            if judged && matches!(result, Ok(AppendEntriesResponse::Success)) {
                local.progress.acknowledge(
                    &report.vote,
                    report.sent,
                    arrived.elapsed(),
                    local.answer_deadline,
                );
            }
            // Every answer but a higher vote means the sender leads this node's term.
            if matches!(
                result,
                Ok(AppendEntriesResponse::Success
                    | AppendEntriesResponse::PartialSuccess(_)
                    | AppendEntriesResponse::Conflict)
            ) {
                local.contact.heard_from_leader();
                // Following that leader: its cluster id (or none) is this node's for good.
                local.cluster.settle(header.cluster);
            }
            raft_wire::answer(&result)
        }
        Kind::Vote => {
            let request: VoteRequest<NodeId> = codec::decode(&body).map_err(undecodable)?;
            let result = raft.vote(request.clone()).await;
            if let Ok(response) = &result {
                // Votes are rare (elections only); the rule decides inside whether to act.
                let (raft, contact, response) =
                    (raft.clone(), local.contact.clone(), response.clone());
                tokio::spawn(async move {
                    newer_log_stands::after_vote(&raft, &contact, &request, &response).await;
                });
            }
            raft_wire::answer(&result)
        }
        Kind::InstallSnapshot => {
            let request: InstallSnapshotRequest<TypeConfig> =
                codec::decode(&body).map_err(undecodable)?;
            let vote = request.vote;
            if local.progress.refuses(&vote) {
                return Err("its leader has stalled; refused meanwhile".to_string());
            }
            let _invitation =
                join_if_invited(vote.is_committed() && vote >= raft.metrics().borrow().vote)?;
            let (admitted, result) = match local.snapshot_chunks.admit(&request) {
                Ok(admitted) => (Some(admitted), raft.install_snapshot(request).await),
                Err(mismatch) => (None, Err(RaftError::APIError(mismatch))),
            };
            // openraft writes a chunk unless this node's vote is newer than the sender's, and
            // answers with its vote as it was (the vote itself changes only with the last chunk).
            if let Some(admitted) = admitted {
                if result.as_ref().is_ok_and(|response| vote >= response.vote) {
                    local.snapshot_chunks.accepted(admitted);
                }
            }
            if result.as_ref().is_ok_and(|response| response.vote == vote) {
                local.contact.heard_from_leader();
                // Following that leader: its cluster id (or none) is this node's for good.
                local.cluster.settle(header.cluster);
            }
            raft_wire::answer(&result)
        }
        Kind::TimeoutNow => {
            let request = codec::decode(&body).map_err(undecodable)?;
            raft_wire::answer(&handover::on_timeout_now(raft, &local.contact, request).await)
        }
        Kind::PreVote => {
            let request: pre_vote::PreVote = codec::decode(&body).map_err(undecodable)?;
            // A voter that no longer hears a leader: a second witness of a stall this node saw.
            // (Not any peer: a removed node that still pre-votes would be one for good.)
            if is_voter_id(&raft.metrics().borrow(), request.from) {
                local.progress.corroborate(request.from, local.timing.lease);
            }
            raft_wire::answer(&pre_vote::on_pre_vote(
                raft,
                &local.contact,
                local.timing.lease,
                &request,
            ))
        }
        // Refused in words: the node initializing the cluster says who did not join.
        Kind::Join => raft_wire::answer::<(), String>(&join_if_invited(true).map(drop)),
        Kind::Rules => {
            let rules: u32 = codec::decode(&body).map_err(undecodable)?;
            raft_wire::answer::<(), String>(&baton_statemachine::rules::known(rules))
        }
    };
    answer.map_err(|e| format!("cannot encode the answer: {e}"))
}
