//! How Raft messages travel between nodes: length-delimited frames on a TCP connection of their
//! own, which shares the node's port with gRPC.
//!
//! They used to travel as gRPC calls. On the two-core VMs we measure on, an AppendEntries round
//! trip took ~270 µs longer than the follower's handling of it (0.61–0.81 ms against 0.34–0.50
//! ms, and 0.29–0.33 ms against 0.04–0.06 ms for the empty ones that carry a commit index), most
//! of it HTTP/2 handing each call from task to task: the caller, the client's connection task,
//! the server's connection task, a task for the stream, and back. openraft 0.9 keeps one
//! AppendEntries in flight per follower, so that cost is paid in every replication round. Here a
//! caller holds a connection alone while it writes its request and reads the answer, and the
//! server answers each request on the task that read it.
//!
//! A connection opens with [`PREAMBLE`]. Its first byte starts neither a TLS handshake (0x16)
//! nor HTTP/2's connection preface (`PRI`), so the listener tells the two kinds of connection
//! apart by one peeked byte ([`is_raft_connection`]). When the node runs TLS, the handshake
//! follows the preamble. Then each request is one frame: a [`Kind`] byte, its [`Header`] (the
//! sender's cluster and the node it is meant for) and the message encoded by [`crate::codec`];
//! each answer is one frame: an [`Outcome`] byte and its body.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::cluster_id::ClusterId;
use crate::codec;
use crate::types::NodeId;

/// What a Raft connection starts with: a byte no TLS or HTTP/2 client sends first, the protocol's
/// name and its version (02: requests carry a [`Header`]).
pub const PREAMBLE: [u8; 8] = *b"\xB7BRAFT02";

/// Largest frame accepted or sent (append batches and snapshot chunks, plus their first byte).
pub const MAX_FRAME_BYTES: usize = (256 << 20) + 1;

/// Whether a connection whose first byte is `first` is a peer's Raft connection (and not gRPC).
pub fn is_raft_connection(first: u8) -> bool {
    first == PREAMBLE[0]
}

/// Sets a Raft connection's TCP options, on both sides: no Nagle delay (a small answer would
/// otherwise wait for the peer's delayed ACK, ~40 ms, whenever the connection is not busy);
/// keepalive probes after 2 s of silence, 1 s apart, 3 at most; and a 5 s limit on data left
/// unacknowledged (`TCP_USER_TIMEOUT`, which also ends the probing, since Linux sends no probes
/// while data is outstanding). A connection whose peer vanished (its host lost power, a network
/// dropped the connection) then fails within seconds, idle or not: one kept by the dialer
/// breaks within ~5 s of the peer's last sign of life, and the node stops serving one left
/// half-open, instead of either lasting the kernel's defaults (hours idle, ~15 minutes of
/// retransmissions). `TCP_USER_TIMEOUT` is Linux's; elsewhere keepalive alone applies.
pub fn tune(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let socket = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(2))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    if let Err(e) = socket.set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot set TCP keepalive");
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket.set_tcp_user_timeout(Some(Duration::from_secs(5))) {
        tracing::debug!(error = %e, "cannot set TCP_USER_TIMEOUT");
    }
}

/// A byte stream a Raft connection runs over: plain TCP or TLS over it.
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// A Raft connection, framed.
pub type Link = Framed<Box<dyn Stream>, LengthDelimitedCodec>;

/// Frames `stream` (whose preamble, and TLS handshake if any, are done).
pub fn link(stream: Box<dyn Stream>) -> Link {
    let codec = LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec();
    Framed::new(stream, codec)
}

/// The request a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    AppendEntries = 1,
    Vote = 2,
    InstallSnapshot = 3,
    /// Leadership handover: the leader asks its chosen successor to start an election now.
    TimeoutNow = 4,
    /// Pre-vote: would the peer vote for this node? (`crate::pre_vote`; changes nothing there.)
    PreVote = 5,
    /// Join the cluster the header names: a node initializing a cluster asks the new members
    /// before the first election (`crate::cluster_id`). No message.
    Join = 6,
    /// Does the peer's build apply these rules? The leader asks every member before it has the
    /// cluster adopt them (`crate::rules_adoption`); the answer is yes or, in words, no
    /// (`baton_statemachine::rules::known`). A build from before this request answers it
    /// `Failed` (an unknown kind), which counts as no.
    Rules = 7,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Self> {
        [
            Self::AppendEntries,
            Self::Vote,
            Self::InstallSnapshot,
            Self::TimeoutNow,
            Self::PreVote,
            Self::Join,
            Self::Rules,
        ]
        .into_iter()
        .find(|kind| *kind as u8 == byte)
    }
}

/// How a request ended, as its answer frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    /// The body is the encoded response.
    Answered = 0,
    /// The body is the encoded error Raft (or the handover) returned.
    Refused = 1,
    /// The request could not be handled at all (undecodable, unknown kind); the body is UTF-8
    /// text saying why, and the server closes the connection after it.
    Failed = 2,
}

impl Outcome {
    fn from_byte(byte: u8) -> Option<Self> {
        [Self::Answered, Self::Refused, Self::Failed]
            .into_iter()
            .find(|outcome| *outcome as u8 == byte)
    }
}

/// A frame that does not follow this format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("empty frame")]
    Empty,
    #[error("unknown request kind {0}")]
    UnknownKind(u8),
    #[error("unknown answer outcome {0}")]
    UnknownOutcome(u8),
    #[error("a request frame of {0} bytes is too short for its header")]
    NoHeader(usize),
}

/// Who a request is from and for, checked before its message is read: a node answers only
/// requests from its own cluster ([`crate::cluster_id`]) that are meant for it (a peer address
/// that leads to another member would otherwise have that member's answers counted as the
/// intended one's, towards a quorum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The sender's cluster (`None`: it has no id).
    pub cluster: Option<ClusterId>,
    /// The node the sender means to reach.
    pub to: NodeId,
}

/// Bytes of a [`Header`] on the wire: the cluster id, then the target's id (little-endian).
const HEADER_BYTES: usize = 16 + 8;

/// Encodes `value` behind a leading `tag` byte, in one buffer.
fn tagged<T: Serialize>(tag: u8, value: &T) -> Result<Bytes, bincode::error::EncodeError> {
    let mut frame = Vec::with_capacity(256);
    frame.push(tag);
    codec::encode_into(value, &mut frame)?;
    Ok(Bytes::from(frame))
}

/// The frame of a `kind` request carrying `header` and `message`.
pub fn request<T: Serialize>(
    kind: Kind,
    header: Header,
    message: &T,
) -> Result<Bytes, bincode::error::EncodeError> {
    let mut frame = Vec::with_capacity(256);
    frame.push(kind as u8);
    frame.extend_from_slice(&ClusterId::to_wire(header.cluster));
    frame.extend_from_slice(&header.to.to_le_bytes());
    codec::encode_into(message, &mut frame)?;
    Ok(Bytes::from(frame))
}

/// The kind of request a frame carries, its header and its message.
pub fn parse_request(mut frame: Bytes) -> Result<(Kind, Header, Bytes), WireError> {
    let first = *frame.first().ok_or(WireError::Empty)?;
    let kind = Kind::from_byte(first).ok_or(WireError::UnknownKind(first))?;
    if frame.len() < 1 + HEADER_BYTES {
        return Err(WireError::NoHeader(frame.len()));
    }
    let body = frame.split_off(1 + HEADER_BYTES);
    let mut cluster = [0u8; 16];
    cluster.copy_from_slice(&frame[1..17]);
    let mut to = [0u8; 8];
    to.copy_from_slice(&frame[17..]);
    let header = Header {
        cluster: ClusterId::from_wire(cluster),
        to: NodeId::from_le_bytes(to),
    };
    Ok((kind, header, body))
}

/// The answer frame of a request that Raft answered (`Ok`) or refused (`Err`).
pub fn answer<T: Serialize, E: Serialize>(
    result: &Result<T, E>,
) -> Result<Bytes, bincode::error::EncodeError> {
    match result {
        Ok(response) => tagged(Outcome::Answered as u8, response),
        Err(error) => tagged(Outcome::Refused as u8, error),
    }
}

/// The answer frame of a request that could not be handled, saying `why`.
pub fn failed(why: &str) -> Bytes {
    let mut frame = BytesMut::with_capacity(1 + why.len());
    frame.put_u8(Outcome::Failed as u8);
    frame.put_slice(why.as_bytes());
    frame.freeze()
}

/// How a request ended, and the answer's body.
pub fn parse_answer(mut frame: Bytes) -> Result<(Outcome, Bytes), WireError> {
    let first = *frame.first().ok_or(WireError::Empty)?;
    let outcome = Outcome::from_byte(first).ok_or(WireError::UnknownOutcome(first))?;
    Ok((outcome, frame.split_off(1)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_preamble_is_told_apart_from_tls_and_http2_by_its_first_byte() {
        assert!(is_raft_connection(PREAMBLE[0]));
        assert!(!is_raft_connection(0x16), "a TLS ClientHello");
        assert!(
            !is_raft_connection(b'P'),
            "HTTP/2's preface, PRI * HTTP/2.0"
        );
        for method in [b'G', b'H', b'D', b'O', b'C', b'T'] {
            assert!(!is_raft_connection(method), "an HTTP/1 request");
        }
    }

    #[tokio::test]
    async fn a_tuned_connection_has_no_nagle_delay_and_gives_up_on_a_silent_peer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        tune(&stream);
        assert!(stream.nodelay().unwrap());
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(2));
        assert_eq!(
            socket.tcp_keepalive_interval().unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), 3);
        #[cfg(any(target_os = "linux", target_os = "android"))]
        assert_eq!(
            socket.tcp_user_timeout().unwrap(),
            Some(Duration::from_secs(5))
        );
    }

    #[test]
    fn a_request_keeps_its_kind_and_message() {
        for kind in [
            Kind::AppendEntries,
            Kind::Vote,
            Kind::InstallSnapshot,
            Kind::TimeoutNow,
            Kind::PreVote,
            Kind::Join,
        ] {
            for cluster in [None, Some(ClusterId::random())] {
                let header = Header { cluster, to: 3 };
                let frame = request(kind, header, &(7u64, "seven")).unwrap();
                let (parsed, parsed_header, body) = parse_request(frame).unwrap();
                assert_eq!(parsed, kind);
                assert_eq!(parsed_header, header);
                assert_eq!(
                    codec::decode::<(u64, String)>(&body).unwrap(),
                    (7, "seven".to_string())
                );
            }
        }
    }

    #[test]
    fn a_request_too_short_for_its_header_is_refused() {
        let frame = request(
            Kind::Vote,
            Header {
                cluster: None,
                to: 1,
            },
            &(),
        )
        .unwrap();
        assert_eq!(
            parse_request(frame.slice(..frame.len() - 1)),
            Err(WireError::NoHeader(frame.len() - 1))
        );
    }

    #[test]
    fn an_answer_keeps_its_outcome_and_body() {
        let answered = answer::<u32, String>(&Ok(5)).unwrap();
        let (outcome, body) = parse_answer(answered).unwrap();
        assert_eq!(outcome, Outcome::Answered);
        assert_eq!(codec::decode::<u32>(&body).unwrap(), 5);

        let refused = answer::<u32, String>(&Err("no".into())).unwrap();
        let (outcome, body) = parse_answer(refused).unwrap();
        assert_eq!(outcome, Outcome::Refused);
        assert_eq!(codec::decode::<String>(&body).unwrap(), "no");

        let (outcome, body) = parse_answer(failed("garbage")).unwrap();
        assert_eq!(outcome, Outcome::Failed);
        assert_eq!(&body[..], b"garbage");
    }

    #[test]
    fn malformed_frames_are_refused() {
        assert_eq!(parse_request(Bytes::new()), Err(WireError::Empty));
        assert_eq!(
            parse_request(Bytes::from_static(&[9, 1, 2])),
            Err(WireError::UnknownKind(9))
        );
        assert_eq!(parse_answer(Bytes::new()), Err(WireError::Empty));
        assert_eq!(
            parse_answer(Bytes::from_static(&[3])),
            Err(WireError::UnknownOutcome(3))
        );
    }
}
