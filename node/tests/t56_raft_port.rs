//! Claim: a node's one port serves clients' gRPC and peers' Raft connections side by side, and
//! garbage on a Raft connection gets a clear refusal (or the connection closed) and changes
//! nothing: no vote, no term, no write.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_node::cluster_id::ClusterId;
use baton_node::raft_wire::{self, Header, Kind, Link, Outcome};
use baton_node::types::{NodeId, TypeConfig};
use futures::{SinkExt, StreamExt};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest, VoteResponse};
use openraft::SnapshotMeta;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod support;
use support::{offer, Cluster};

/// A Raft connection to `addr`, opened as a peer opens one.
async fn raft_link(addr: &str) -> Link {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(&raft_wire::PREAMBLE).await.unwrap();
    raft_wire::link(Box::new(stream))
}

/// What the node's peers put in front of their requests: its cluster and its id.
async fn header_of(cluster: &Cluster) -> Header {
    let info = cluster.client.node_info(&cluster.addr).await.unwrap();
    Header {
        cluster: Some(ClusterId::parse(&info.cluster_id).unwrap()),
        to: info.id,
    }
}

/// The next frame on `link`, or `None` once the node closed it.
async fn next_answer(link: &mut Link) -> Option<(Outcome, bytes::Bytes)> {
    let frame = tokio::time::timeout(Duration::from_secs(10), link.next())
        .await
        .expect("the node neither answered nor closed the connection")?;
    Some(raft_wire::parse_answer(frame.ok()?.freeze()).unwrap())
}

/// Whether the node closes `stream` (reading gives end of file) without sending anything.
async fn closed_silently(mut stream: TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_port_serves_grpc_and_raft_and_refuses_garbage_on_raft_connections() {
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    client.offer(offer("before")).await.unwrap();
    let term = client.node_info(&cluster.addr).await.unwrap().term;
    let header = header_of(&cluster).await;

    // A real vote request from a stale candidate, on a Raft connection next to the gRPC one:
    // answered (and not granted), and the connection stays open for more.
    let mut link = raft_link(&cluster.addr).await;
    for _ in 0..2 {
        let stale: VoteRequest<NodeId> = VoteRequest::new(openraft::Vote::new(0, 2), None);
        link.send(raft_wire::request(Kind::Vote, header, &stale).unwrap())
            .await
            .unwrap();
        let (outcome, body) = next_answer(&mut link).await.expect("an answer");
        assert_eq!(outcome, Outcome::Answered);
        let response: VoteResponse<NodeId> = baton_node::codec::decode(&body).unwrap();
        assert!(!response.vote_granted, "a stale candidate gets no vote");
    }

    // An AppendEntries whose body is not one: refused, saying why, and the connection closed.
    link.send(raft_wire::request(Kind::AppendEntries, header, &"garbage").unwrap())
        .await
        .unwrap();
    let (outcome, why) = next_answer(&mut link).await.expect("a refusal");
    assert_eq!(outcome, Outcome::Failed);
    let why = String::from_utf8(why.to_vec()).unwrap();
    assert!(why.contains("undecodable AppendEntries"), "{why}");
    assert!(next_answer(&mut link).await.is_none(), "closed after it");

    // A snapshot chunk whose snapshot id states a length of 2^62 bytes in a frame of a few
    // dozen: refused as undecodable, where bincode's allocation by that length used to abort
    // the node (and this test with it).
    let chunk = InstallSnapshotRequest::<TypeConfig> {
        vote: openraft::Vote::new(0, 2),
        meta: SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: "ZZZZ".into(),
        },
        offset: 0,
        data: vec![],
        done: true,
    };
    let mut body = baton_node::codec::encode(&chunk).unwrap();
    let at = body
        .windows(5)
        .position(|w| w == [4, b'Z', b'Z', b'Z', b'Z'])
        .unwrap();
    body.splice(at..=at, [0xfd, 0, 0, 0, 0, 0, 0, 0, 0x40]);
    let mut link = raft_link(&cluster.addr).await;
    let empty = raft_wire::request(Kind::InstallSnapshot, header, &()).unwrap();
    let frame = [&empty[..], &body].concat();
    link.send(bytes::Bytes::from(frame)).await.unwrap();
    let (outcome, why) = next_answer(&mut link).await.expect("a refusal");
    assert_eq!(outcome, Outcome::Failed);
    let why = String::from_utf8(why.to_vec()).unwrap();
    assert!(why.contains("undecodable InstallSnapshot"), "{why}");

    // A request kind that does not exist.
    let mut link = raft_link(&cluster.addr).await;
    link.send(bytes::Bytes::from_static(&[9, 1, 2, 3]))
        .await
        .unwrap();
    let (outcome, why) = next_answer(&mut link).await.expect("a refusal");
    assert_eq!(outcome, Outcome::Failed);
    assert_eq!(&why[..], b"unknown request kind 9");
    assert!(next_answer(&mut link).await.is_none(), "closed after it");

    // A frame longer than any Raft message: closed without an answer.
    let mut stream = TcpStream::connect(&cluster.addr).await.unwrap();
    stream.write_all(&raft_wire::PREAMBLE).await.unwrap();
    stream.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    assert!(closed_silently(stream).await);

    // The preamble's first byte but not the rest (another protocol version, say): closed.
    let mut stream = TcpStream::connect(&cluster.addr).await.unwrap();
    stream.write_all(b"\xB7BRAFT99").await.unwrap();
    assert!(closed_silently(stream).await);

    // Nothing changed, and gRPC still works on the same port.
    let info = client.node_info(&cluster.addr).await.unwrap();
    assert_eq!(info.term, term, "no election, no new term");
    client.offer(offer("after")).await.unwrap();
    assert!(client.ticket("before").await.is_ok());
    cluster.stop().await;
}

/// Claim: a node answers Raft requests only from its own cluster and only when they are meant
/// for it. An AppendEntries from a leader of a later term, which the node would follow (raising
/// its term), is refused (the connection closed, the node's term unchanged) when it names
/// another cluster, no cluster, or another node; named properly, it is followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_from_another_cluster_or_for_another_node_are_refused() {
    let cluster = Cluster::start().await;
    let info = cluster.client.node_info(&cluster.addr).await.unwrap();
    assert_eq!(info.cluster_id.len(), 32, "initializing minted an id");
    let own = header_of(&cluster).await;
    let later = AppendEntriesRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(info.term + 5, 2),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let refusals = [
        (
            Header {
                cluster: Some(ClusterId::random()),
                ..own
            },
            format!("this node to cluster {}", info.cluster_id),
        ),
        (
            Header {
                cluster: None,
                ..own
            },
            "it has no cluster id".to_string(),
        ),
        (
            Header { to: 2, ..own },
            "this is node 1, not node 2".to_string(),
        ),
    ];
    for (header, expected) in refusals {
        let mut link = raft_link(&cluster.addr).await;
        link.send(raft_wire::request(Kind::AppendEntries, header, &later).unwrap())
            .await
            .unwrap();
        let (outcome, why) = next_answer(&mut link).await.expect("a refusal");
        assert_eq!(outcome, Outcome::Failed, "{header:?}");
        let why = String::from_utf8(why.to_vec()).unwrap();
        assert!(why.contains(&expected), "{header:?}: {why}");
        assert!(next_answer(&mut link).await.is_none(), "closed after it");
        let now = cluster.client.node_info(&cluster.addr).await.unwrap();
        assert_eq!(now.term, info.term, "{header:?}: the term moved");
    }
    let mut link = raft_link(&cluster.addr).await;
    link.send(raft_wire::request(Kind::AppendEntries, own, &later).unwrap())
        .await
        .unwrap();
    let (outcome, _) = next_answer(&mut link).await.expect("an answer");
    assert_eq!(outcome, Outcome::Answered);
    // The node's metrics follow its state a moment later.
    let mut now = cluster.client.node_info(&cluster.addr).await.unwrap();
    for _ in 0..50 {
        if now.term >= info.term + 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = cluster.client.node_info(&cluster.addr).await.unwrap();
    }
    assert!(
        now.term >= info.term + 5,
        "its own cluster's request is acted on: term {} after {}",
        now.term,
        info.term
    );
    cluster.stop().await;
}

/// Claim: a snapshot chunk that starts past what was received of its snapshot is refused as a
/// mismatch (on which a leader sends the snapshot again from its start), and nothing is written.
/// Before, the node wrote it at the offset it stated: the buffer grew to a terabyte and the
/// allocation aborted the node (and this test with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_chunk_past_what_was_received_is_refused() {
    let cluster = Cluster::start().await;
    let term = cluster.client.node_info(&cluster.addr).await.unwrap().term;
    let header = header_of(&cluster).await;
    // From a leader of a later term, so the node takes the chunks.
    let vote = openraft::Vote::new_committed(term + 1, 2);
    let chunk = |offset: u64| InstallSnapshotRequest::<TypeConfig> {
        vote,
        meta: SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: "far".into(),
        },
        offset,
        data: vec![1, 2, 3],
        done: false,
    };
    let mut link = raft_link(&cluster.addr).await;
    link.send(raft_wire::request(Kind::InstallSnapshot, header, &chunk(0)).unwrap())
        .await
        .unwrap();
    let (outcome, _) = next_answer(&mut link).await.expect("an answer");
    assert_eq!(outcome, Outcome::Answered, "the first chunk is taken");

    for far in [4, 1 << 40] {
        link.send(raft_wire::request(Kind::InstallSnapshot, header, &chunk(far)).unwrap())
            .await
            .unwrap();
        let (outcome, body) = next_answer(&mut link).await.expect("an answer");
        assert_eq!(outcome, Outcome::Refused, "offset {far}");
        let refusal: openraft::error::RaftError<NodeId, openraft::error::InstallSnapshotError> =
            baton_node::codec::decode(&body).unwrap();
        let openraft::error::RaftError::APIError(
            openraft::error::InstallSnapshotError::SnapshotMismatch(mismatch),
        ) = refusal
        else {
            panic!("offset {far}: {refusal:?}");
        };
        assert_eq!((mismatch.expect.offset, mismatch.got.offset), (3, far));
    }
    // The chunk that follows the first is taken, and the node answers as before.
    link.send(raft_wire::request(Kind::InstallSnapshot, header, &chunk(3)).unwrap())
        .await
        .unwrap();
    let (outcome, _) = next_answer(&mut link).await.expect("an answer");
    assert_eq!(outcome, Outcome::Answered);
    cluster.client.node_info(&cluster.addr).await.unwrap();
    cluster.stop().await;
}

/// Claim: a `TimeoutNow` is acted on only when it comes from the leader the node follows in that
/// term; one naming another node, or the node itself, is refused and starts no election. Before,
/// any `TimeoutNow` in the node's term made it campaign, deposing the leader it followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_now_from_a_node_that_does_not_lead_is_refused() {
    let cluster = Cluster::start().await;
    let term = cluster.client.node_info(&cluster.addr).await.unwrap().term;
    let header = header_of(&cluster).await;
    let mut link = raft_link(&cluster.addr).await;
    // Node 1 is the one member and leads; node 2 does not exist.
    for from in [2, 1] {
        let message = baton_node::handover::TimeoutNow {
            from,
            term,
            last_log: None,
            after_ms: 0,
        };
        link.send(raft_wire::request(Kind::TimeoutNow, header, &message).unwrap())
            .await
            .unwrap();
        let (outcome, body) = next_answer(&mut link).await.expect("an answer");
        assert_eq!(outcome, Outcome::Refused, "from node {from}");
        let why: String = baton_node::codec::decode(&body).unwrap();
        assert!(why.contains("does not follow"), "from node {from}: {why}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let info = cluster.client.node_info(&cluster.addr).await.unwrap();
    assert_eq!(info.term, term, "no election");
    cluster.stop().await;
}

/// Whether the node closes `stream` within `limit`, reading and dropping whatever it sends.
async fn closed_within(mut stream: TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Claim: a connection that has not opened by the opening limit is closed — one that sends
/// nothing, one that starts HTTP/2's preface and stalls, one that starts a TLS handshake and
/// stalls. Before, the first two were handed to the gRPC server and the third held in the TLS
/// handshake, each for good: a few thousand such sockets used up the node's file descriptors,
/// and its peers' Raft connections with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_finish_opening_are_closed() {
    let plain = Cluster::start().await;
    let certs = tempfile::tempdir().unwrap();
    let (security, client) = support::tls(certs.path());
    let secure = Cluster::start_secured(|_| {}, security, client).await;
    let silent = TcpStream::connect(&plain.addr).await.unwrap();
    let mut half_preface = TcpStream::connect(&plain.addr).await.unwrap();
    half_preface.write_all(b"PRI * HTTP/2.0").await.unwrap();
    let mut half_handshake = TcpStream::connect(&secure.addr).await.unwrap();
    half_handshake.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let limit = baton_node::raft_server::OPENING_LIMIT * 2;
    for (what, stream) in [
        ("silent", silent),
        ("half a preface", half_preface),
        ("half a TLS handshake", half_handshake),
    ] {
        assert!(closed_within(stream, limit).await, "{what}: still open");
    }
    // Clients that open properly are served as ever.
    plain.client.offer(offer("plain")).await.unwrap();
    secure.client.offer(offer("tls")).await.unwrap();
    plain.stop().await;
    secure.stop().await;
}

/// Claim: a node that stops closes every Raft connection it holds, also those that have not
/// yet said what they are or finished their opening, instead of leaving them to the 10 s
/// opening limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_closes_raft_connections_at_every_stage() {
    let cluster = Cluster::start().await;
    let opened = std::time::Instant::now();
    // Silent: not a byte yet, so not known to be Raft or gRPC.
    let silent = TcpStream::connect(&cluster.addr).await.unwrap();
    // Half a preamble: known to be Raft, still opening.
    let mut opening = TcpStream::connect(&cluster.addr).await.unwrap();
    opening.write_all(&raft_wire::PREAMBLE[..1]).await.unwrap();
    // Opened and answered once, then idle.
    let mut open = raft_link(&cluster.addr).await;
    let stale: VoteRequest<NodeId> = VoteRequest::new(openraft::Vote::new(0, 2), None);
    let header = header_of(&cluster).await;
    open.send(raft_wire::request(Kind::Vote, header, &stale).unwrap())
        .await
        .unwrap();
    assert!(next_answer(&mut open).await.is_some());

    cluster.stop().await;
    let soon = Duration::from_secs(3);
    for (stage, stream) in [("silent", silent), ("opening", opening)] {
        let mut buf = [0u8; 8];
        let mut stream = stream;
        let read = tokio::time::timeout(soon, stream.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "{stage} connection still open: {read:?}"
        );
        // Closed by the stop, not by the 10 s opening limit (the stop itself may take a while).
        assert!(
            opened.elapsed() < Duration::from_secs(9),
            "{stage}: closed late"
        );
    }
    let read = tokio::time::timeout(soon, open.next()).await;
    assert!(
        matches!(read, Ok(None) | Ok(Some(Err(_)))),
        "open connection still open"
    );
}

/// A Raft peer whose new connections take `delay` before the TLS handshake starts (a slow link:
/// a new TLS connection costs several round trips), and which then answers every request at once
/// with the refusal "no, thanks". Returns its address and the directory of its certificates.
async fn slow_to_connect_peer(delay: Duration) -> (String, tempfile::TempDir) {
    let certs = tempfile::tempdir().unwrap();
    let (security, _) = support::tls(certs.path());
    let tls = baton_node::tls::NodeTls::load(&security.tls.unwrap()).unwrap();
    let acceptor = tls.peer_acceptor();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let mut preamble = [0u8; raft_wire::PREAMBLE.len()];
                stream.read_exact(&mut preamble).await.unwrap();
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let mut link = raft_wire::link(Box::new(tls));
                while let Some(Ok(_request)) = link.next().await {
                    let no = raft_wire::answer::<(), String>(&Err("no, thanks".into())).unwrap();
                    if link.send(no).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, certs)
}

/// A peer that takes longer to connect to than a call may wait (TLS across a slow link, calls
/// limited to a heartbeat) is still reached: the connection a call gave up on is finished in
/// the background and kept for the next call. Dialing only within calls failed every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_slower_to_connect_than_a_call_may_wait_is_reached_by_a_later_call() {
    let (addr, certs) = slow_to_connect_peer(Duration::from_millis(300)).await;
    let read = |name: &str| std::fs::read(certs.path().join(name)).unwrap();
    let (ca, cert, key) = (read("ca.pem"), read("node.pem"), read("node-key.pem"));
    let connector =
        baton_node::tls::PeerConnector::from_pem(&ca, Some((cert.as_slice(), key.as_slice())))
            .unwrap();
    let network = baton_node::network::Network::new(Default::default(), Default::default())
        .with_tls(connector);
    let question = baton_node::pre_vote::PreVote {
        from: 1,
        last_log: None,
    };
    let mut answers = Vec::new();
    for _ in 0..10 {
        match network
            .pre_vote(2, &addr, &question, Duration::from_millis(100))
            .await
        {
            Err(baton_node::network::Declined::Refused(why)) if why == "no, thanks" => return,
            other => answers.push(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the peer was never reached: {answers:#?}");
}

/// HTTP/2's connection preface, which a plaintext gRPC client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection to `addr` that sent HTTP/2's preface and got the gRPC server's settings back
/// (so it holds a client place), or `None` when the node closed it without a byte.
async fn preface_answered(addr: &str) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(PREFACE).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .expect("the node neither answered the preface nor closed the connection");
    match read {
        Ok(n) if n > 0 => Some(stream),
        _ => None,
    }
}

/// Claim: a node holds at most `limits.max_connections` client connections. One more is closed
/// at once, without a byte, and counted; the client library takes that for a node it cannot
/// reach (it tries the other nodes, then says `Unavailable`), while the connections already
/// held go on being served; peers' Raft connections are never counted, so a node at its limit
/// still answers them; a closed connection gives its place back. Before, every connection was
/// served, and enough of them used up the descriptors the node's peers and store need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_connection_limit_clients_are_closed_and_peers_still_served() {
    const MAX: usize = 4;
    let cluster = Cluster::start_custom(|config| config.limits.max_connections = MAX).await;
    cluster.client.offer(offer("before")).await.unwrap();
    let header = header_of(&cluster).await;

    // The cluster's own client holds a place or more; the rest are taken here.
    let mut held = Vec::new();
    while let Some(stream) = preface_answered(&cluster.addr).await {
        held.push(stream);
        assert!(
            held.len() < MAX,
            "more than {MAX} client connections served"
        );
    }
    assert!(
        !held.is_empty(),
        "no connection was served before the limit"
    );
    let refused_before = baton_node::metrics::metrics().connections_refused();
    assert!(refused_before >= 1, "the refusal is counted");

    let config = baton_rpc::ClientConfig {
        deadline: Duration::from_secs(1),
        ..Default::default()
    };
    let late = baton_rpc::Client::new(&[cluster.addr.as_str()], config).unwrap();
    match late.ticket("before").await {
        Err(error @ baton_rpc::Error::Unavailable { .. }) => {
            assert!(error.is_infrastructure(), "{error:?}")
        }
        other => panic!("a client past the limit was served: {other:?}"),
    }

    cluster.client.offer(offer("at the limit")).await.unwrap();
    let mut link = raft_link(&cluster.addr).await;
    let stale: VoteRequest<NodeId> = VoteRequest::new(openraft::Vote::new(0, 2), None);
    link.send(raft_wire::request(Kind::Vote, header, &stale).unwrap())
        .await
        .unwrap();
    let (outcome, _) = next_answer(&mut link).await.expect("a peer is answered");
    assert_eq!(outcome, Outcome::Answered);

    drop(held.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(stream) = preface_answered(&cluster.addr).await {
            held.push(stream);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a closed connection's place was never given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop().await;
}

/// Node `id` started without a cluster (as `baton members add` finds one), stopped through the
/// sender: its address, the server and the data dir.
async fn bare_node(
    id: NodeId,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = baton_node::config::NodeConfig::new(
        id,
        listener.local_addr().unwrap(),
        dir.path().join(format!("node-{id}")),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(baton_node::server::serve(config, listener, async move {
        let _ = stopped.await;
    }));
    (addr, stop, server, dir)
}

/// Asks the node at `addr` over a fresh Raft connection whether its build applies `rules`.
async fn ask_rules(addr: &str, header: Header, rules: u32) -> (Outcome, bytes::Bytes) {
    let mut link = raft_link(addr).await;
    link.send(raft_wire::request(Kind::Rules, header, &rules).unwrap())
        .await
        .unwrap();
    next_answer(&mut link).await.expect("an answer")
}

/// Claim: a node not in a cluster yet answers the apply rules question from a cluster it has not
/// joined (`members add` asks it before the node joins) and joins nothing by it; a member of
/// another cluster still refuses the question. Before, the new node refused it as from a cluster
/// it had not joined, and a node whose build could not follow was added all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_answers_the_rules_question_before_it_joins() {
    use baton_statemachine::rules::RULES;
    let (addr, stop, server, _dir) = bare_node(1).await;
    let client = baton_rpc::Client::new(&[addr.as_str()], Default::default()).unwrap();
    let inviting = Header {
        cluster: Some(ClusterId::random()),
        to: 1,
    };
    let (outcome, _) = ask_rules(&addr, inviting, RULES).await;
    assert_eq!(
        outcome,
        Outcome::Answered,
        "its build applies rules {RULES}"
    );
    let (outcome, why) = ask_rules(&addr, inviting, RULES + 1).await;
    assert_eq!(outcome, Outcome::Refused);
    let why: String = baton_node::codec::decode(&why).unwrap();
    assert!(
        why.contains(&format!("up to {RULES}, not {}", RULES + 1)),
        "{why}"
    );
    let info = client.node_info(&addr).await.unwrap();
    assert!(!info.initialized);
    assert_eq!(info.cluster_id, "", "the question invited it into nothing");
    let _ = stop.send(());
    server.await.unwrap().unwrap();

    let cluster = Cluster::start().await;
    let foreign = Header {
        cluster: Some(ClusterId::random()),
        ..header_of(&cluster).await
    };
    let (outcome, why) = ask_rules(&cluster.addr, foreign, RULES).await;
    assert_eq!(outcome, Outcome::Failed);
    let why = String::from_utf8(why.to_vec()).unwrap();
    assert!(why.contains("refused"), "{why}");
    let (outcome, _) = ask_rules(&cluster.addr, header_of(&cluster).await, RULES).await;
    assert_eq!(outcome, Outcome::Answered, "its own cluster's question");
    cluster.stop().await;
}

/// A stand-in for a node being added that answers every Raft request with `answer` and closes
/// the connection: its address.
async fn answering_stand_in(answer: bytes::Bytes) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut preamble = [0u8; raft_wire::PREAMBLE.len()];
                if stream.read_exact(&mut preamble).await.is_err() {
                    return;
                }
                let mut link = raft_wire::link(Box::new(stream));
                if let Some(Ok(_request)) = link.next().await {
                    let _ = link.send(answer).await;
                }
            });
        }
    });
    addr
}

/// Claim: `AddLearner` refuses (`MEMBERSHIP`) a node whose build does not apply the cluster's
/// apply rules — one from before versioned rules fails the question as an unknown request, a
/// newer one under older rules says no — naming why, and the membership stays as it was. A node
/// whose build applies them is added, and so is one that cannot be asked. Before, all were
/// added, the first two to stop or fall behind at their first entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_node_whose_build_cannot_follow_the_rules_is_refused() {
    use baton_statemachine::rules::RULES;
    let cluster = Cluster::start().await;
    let client = &cluster.client;
    let older = raft_wire::failed("unknown request kind 7");
    let no = raft_wire::answer::<(), String>(&Err(format!(
        "this build applies rules up to {}, not {RULES}: run a newer build",
        RULES - 1
    )))
    .unwrap();
    for (answer, says) in [
        (
            older.clone(),
            "from before versioned apply rules".to_string(),
        ),
        (no, format!("this build applies rules up to {}", RULES - 1)),
    ] {
        let addr = answering_stand_in(answer).await;
        match client.add_learner(2, &addr).await {
            Err(baton_rpc::Error::Server { code, message }) => {
                assert_eq!(code, "MEMBERSHIP");
                assert!(message.contains(&says), "{message}");
                assert!(message.contains(&format!("node 2 at {addr}")), "{message}");
            }
            other => panic!("{says}: {other:?}"),
        }
        let info = client.node_info(&cluster.addr).await.unwrap();
        assert_eq!(info.members.len(), 1, "{says}: {:?}", info.members);
    }
    // A node that cannot be asked (not started yet) is added as before.
    let unstarted = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let added = client.add_learner(3, &unstarted).await.unwrap();
    assert_eq!(added.members.len(), 2, "{:?}", added.members);
    assert!(added.unasked.contains("cannot connect"), "{added:?}");
    let (addr, stop, server, _dir) = bare_node(2).await;
    let added = client.add_learner(2, &addr).await.unwrap();
    assert_eq!(added.members.len(), 3, "{:?}", added.members);
    assert_eq!(added.unasked, "", "it was asked");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    cluster.stop().await;
}
