//! Protection: an oversized request is refused with a clear error and changes nothing, and a
//! request beyond the in-flight limits is answered RESOURCE_EXHAUSTED (`OVERLOADED`) at once —
//! never queued — while the places already taken are served.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_rpc::error::{detail_of, infra};
use baton_rpc::proto::batch_client::BatchClient;
use baton_rpc::proto::batch_result::Outcome;
use baton_rpc::proto::checkpoint_client::CheckpointClient;
use baton_rpc::proto::queue_client::QueueClient;
use baton_rpc::proto::{
    BatchItem, BatchRequest, BatchResult, GetTicketRequest, LeaseRequest, LoadCheckpointRequest,
    RequestHeader,
};
use baton_rpc::{Client, ClientConfig, Error};
use baton_statemachine::handoff::OfferArgs;
use baton_statemachine::Refusal;
use prost::Message;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

mod support;
use support::{claim_item, Cluster};

fn offer(key: &str, payload: Vec<u8>) -> OfferArgs {
    OfferArgs {
        key: key.into(),
        from: "a".into(),
        to: "b".into(),
        payload,
        reply_to: "a@inbox".into(),
        ttl_ms: 60_000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_is_refused_clearly_and_changes_nothing() {
    let cluster = Cluster::start_custom(|config| config.limits.max_request_bytes = 64 << 10).await;
    let c = &cluster.client;

    let refused = c.offer(offer("big", vec![7; 100 << 10])).await.unwrap_err();
    match &refused {
        Error::Server { code, message } => {
            assert_eq!(code, infra::REQUEST_TOO_LARGE);
            assert!(
                message.contains("limits.max_request_bytes = 65536"),
                "{message}"
            );
        }
        other => panic!("want REQUEST_TOO_LARGE, got {other:?}"),
    }
    assert!(refused.is_infrastructure(), "not a contract refusal");
    assert_eq!(
        c.ticket("big").await.unwrap_err().refusal(),
        Some(&Refusal::UnknownKey),
        "nothing was offered"
    );
    c.offer(offer("small", vec![7; 1 << 10])).await.unwrap();
    cluster.stop().await;
}

async fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Starts a long-poll lease on `channel` that holds its request for `wait` (no task is ever
/// leasable), after creating the queue and the worker it needs, and returns once the node is
/// serving it: a request sent earlier could otherwise take the only place and leave the lease
/// refused.
async fn hold_a_request(
    cluster: &Cluster,
    channel: Channel,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<(), tonic::Status>> {
    cluster.client.create_queue("q", "ns").await.unwrap();
    cluster.client.register_worker("w", false).await.unwrap();
    let held = tokio::spawn(async move {
        let request = LeaseRequest {
            header: Some(RequestHeader {
                client_id: 77,
                seq: 1,
                acked_below: 1,
                ..Default::default()
            }),
            worker_id: "w".into(),
            queues: vec!["q".into()],
            limit: 1,
            lease_ttl_ms: 10_000,
            wait_ms: wait.as_millis() as u64,
        };
        QueueClient::new(channel).lease(request).await.map(|_| ())
    });
    let metrics = baton_node::metrics::metrics();
    for _ in 0..500 {
        if metrics.requests_in_flight() > 0 {
            return held;
        }
        assert!(
            !held.is_finished(),
            "the held lease ended early: {:?}",
            held.await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the held lease never reached the node");
}

/// Loads a checkpoint on `channel` until the answer is OVERLOADED (at most ~5 s of tries, as the
/// held request may not have arrived yet); returns the last status.
async fn load_until_overloaded(channel: &Channel) -> tonic::Status {
    let mut last = None;
    for _ in 0..250 {
        let status = CheckpointClient::new(channel.clone())
            .load(LoadCheckpointRequest { run: "r".into() })
            .await
            .unwrap_err();
        let overloaded = detail_of(&status).is_some_and(|d| d.code == infra::OVERLOADED);
        last = Some(status);
        if overloaded {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    last.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_node_limit_requests_are_refused_overloaded_not_queued() {
    let cluster = Cluster::start_custom(|config| config.limits.max_in_flight = 1).await;
    let held = hold_a_request(
        &cluster,
        channel(&cluster.addr).await,
        Duration::from_secs(3),
    )
    .await;

    let status = load_until_overloaded(&channel(&cluster.addr).await).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("limits.max_in_flight"),
        "{status:?}"
    );

    // The client library treats it as a transient failure: it backs off and retries until its
    // deadline, then reports the cluster unavailable (never a contract refusal).
    let impatient = Client::new(
        &[cluster.addr.as_str()],
        ClientConfig {
            deadline: Duration::from_millis(300),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    match impatient.load("r").await {
        Err(Error::Unavailable { last, .. }) => assert!(last.contains("OVERLOADED"), "{last}"),
        other => panic!("want Unavailable after retries, got {other:?}"),
    }

    held.await.unwrap().unwrap();
    assert_eq!(
        cluster.client.load("r").await.unwrap_err().refusal(),
        Some(&Refusal::NotFound),
        "the held place was given back"
    );
    cluster.stop().await;
}

/// A batch's calls take places on the node's limit: with 4 places, one held by a waiting lease
/// and one by the batch itself, a batch of 4 claims runs 3 and answers the 4th OVERLOADED
/// without running it (the client retries it). Admitted as one request, a batch would carry up
/// to 256 calls — and their answers, up to 1 MiB each — past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_runs_only_as_many_calls_as_there_are_places() {
    let cluster = Cluster::start_custom(|config| config.limits.max_in_flight = 4).await;
    let specs: Vec<_> = (0..4)
        .map(|i| baton_statemachine::board::TaskSpec {
            id: format!("b{i}"),
            deps: Vec::new(),
        })
        .collect();
    cluster.client.seed(&specs).await.unwrap();
    let held = hold_a_request(
        &cluster,
        channel(&cluster.addr).await,
        Duration::from_secs(5),
    )
    .await;
    let batches = BatchClient::new(channel(&cluster.addr).await);
    let overloaded = |result: &BatchResult| match &result.outcome {
        Some(Outcome::Status(status)) => status.message.contains("limits.max_in_flight"),
        _ => false,
    };
    // Reads that change nothing, until the held lease is known to hold its place here.
    let reads = || {
        (0..4)
            .map(|i| BatchItem {
                method: baton_rpc::batch::HANDOFF_GET.path.into(),
                request: GetTicketRequest {
                    key: format!("none-{i}"),
                }
                .encode_to_vec(),
            })
            .collect()
    };
    let mut seen = Vec::new();
    for _ in 0..250 {
        seen = batches
            .clone()
            .call(BatchRequest { items: reads() })
            .await
            .unwrap()
            .into_inner()
            .results;
        if seen.iter().any(overloaded) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        seen.iter().map(overloaded).collect::<Vec<_>>(),
        vec![false, false, false, true],
        "{seen:?}"
    );

    let claims = (0..4)
        .map(|i| claim_item(&format!("b{i}"), i + 1))
        .collect();
    let answered = batches
        .clone()
        .call(BatchRequest { items: claims })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(
        answered.iter().map(overloaded).collect::<Vec<_>>(),
        vec![false, false, false, true],
        "{answered:?}"
    );
    for i in 0..3 {
        assert!(
            matches!(answered[i].outcome, Some(Outcome::Response(_))),
            "{answered:?}"
        );
        let again = cluster
            .client
            .claim(&format!("b{i}"), "someone", 30_000)
            .await;
        assert!(
            again.as_ref().is_err_and(|e| e.refusal().is_some()),
            "b{i} should be held by the batch's claim: {again:?}"
        );
    }
    // The refused call did not run: its task is free.
    cluster.client.claim("b3", "someone", 30_000).await.unwrap();

    held.await.unwrap().unwrap();
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_refuses_only_the_busy_connection() {
    let cluster =
        Cluster::start_custom(|config| config.limits.max_in_flight_per_connection = 1).await;
    let busy = channel(&cluster.addr).await;
    let other = channel(&cluster.addr).await;
    connection_limit_refuses_only(cluster, busy, other).await;
}

/// With a request held on `busy`, the next one on `busy` is refused OVERLOADED, one on `other`
/// is served.
async fn connection_limit_refuses_only(cluster: Cluster, busy: Channel, other: Channel) {
    let held = hold_a_request(&cluster, busy.clone(), Duration::from_secs(3)).await;

    let status = load_until_overloaded(&busy).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("limits.max_in_flight_per_connection"),
        "{status:?}"
    );
    let other = CheckpointClient::new(other)
        .load(LoadCheckpointRequest { run: "r".into() })
        .await
        .unwrap_err();
    assert_eq!(
        other.code(),
        Code::NotFound,
        "another connection is served: {other:?}"
    );

    held.await.unwrap().unwrap();
    cluster.stop().await;
}

/// A stand-in node that answers every checkpoint read `OVERLOADED`, counting them.
struct Overloaded(std::sync::Arc<std::sync::atomic::AtomicUsize>);

#[tonic::async_trait]
impl baton_rpc::proto::checkpoint_server::Checkpoint for Overloaded {
    async fn save_if_newer(
        &self,
        _request: tonic::Request<baton_rpc::proto::SaveIfNewerRequest>,
    ) -> Result<tonic::Response<baton_rpc::proto::SaveIfNewerResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("reads only"))
    }

    async fn load(
        &self,
        _request: tonic::Request<baton_rpc::proto::LoadCheckpointRequest>,
    ) -> Result<tonic::Response<baton_rpc::proto::LoadCheckpointResponse>, tonic::Status> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(baton_rpc::error::infra_status(
            Code::ResourceExhausted,
            infra::OVERLOADED,
            "at the in-flight limit",
        ))
    }
}

/// A client told `OVERLOADED` backs off up to a second between attempts, not the tenth of a
/// second it uses to find a new leader quickly: asked ten times a second by every waiting call,
/// a busy node would spend itself answering refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_node_is_asked_again_after_longer_pauses() {
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(baton_rpc::proto::checkpoint_server::CheckpointServer::new(
                Overloaded(answered.clone()),
            ))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let config = ClientConfig {
        deadline: Duration::from_secs(3),
        attempt_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
    };
    let client = Client::new(&[addr], config).unwrap();
    let read = client.load("run").await;
    assert!(matches!(read, Err(Error::Unavailable { .. })), "{read:?}");
    let attempts = answered.load(std::sync::atomic::Ordering::SeqCst);
    // Pauses of 20, 40, ... ms doubling to 1 s (each jittered to 50-100 %): at most 12 in 3 s
    // (capped at 100 ms it was about 40).
    assert!((3..=12).contains(&attempts), "{attempts} attempts in 3 s");
}

/// Opens a gRPC health watch (which needs no token and never ends on its own) on `client`'s
/// connection; resolves when the node answers it.
fn health_watch(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: &str,
) -> h2::client::ResponseFuture {
    let request =
        tonic::codegen::http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Watch"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    // One gRPC message: uncompressed, 0 bytes long (a request for the whole server's health).
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    response
}

/// One connection cannot hold more HTTP/2 streams open at once than its in-flight limit plus the
/// node's watch streams: past that the peer's HTTP/2 stack waits for one of them to end. Streams
/// no limit counts — health watches here — would otherwise pile up on one connection without
/// bound. Another connection is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_holds_no_more_streams_than_its_limits_allow() {
    let cluster = Cluster::start_custom(|config| {
        config.limits.max_in_flight_per_connection = 2;
        config.watch.max_streams = 1;
    })
    .await;
    let tcp = tokio::net::TcpStream::connect(&cluster.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let mut open = Vec::new();
    for _ in 0..3 {
        let response = health_watch(&mut client, &cluster.addr).await.unwrap();
        assert_eq!(response.status(), 200);
        open.push(response);
    }
    assert_eq!(client.current_max_send_streams(), 3);
    let mut fourth = health_watch(&mut client, &cluster.addr);
    let waited = tokio::time::timeout(Duration::from_millis(500), &mut fourth).await;
    assert!(waited.is_err(), "a fourth stream was answered: {waited:?}");
    let other = cluster.client.load("never-saved").await;
    assert!(
        matches!(other, Err(Error::Refused(Refusal::NotFound))),
        "{other:?}"
    );
    // One watch ends (reset): the fourth opens and is answered.
    drop(open.pop());
    let answered = tokio::time::timeout(Duration::from_secs(10), fourth)
        .await
        .expect("the fourth stream is answered once a stream ended")
        .unwrap();
    assert_eq!(answered.status(), 200);
    // Ended, so that the node's shutdown does not wait for them.
    drop((open, answered, client));
    cluster.stop().await;
}

/// A call whose request body stops arriving gives its in-flight place back after
/// `BODY_IDLE_LIMIT` (30 s) without a byte, answered UNAVAILABLE; before, it held the place for
/// as long as its connection lived (which answers the node's pings), and a few such calls held
/// every place of the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_body_stops_arriving_gives_its_place_back() {
    let cluster = Cluster::start_custom(|config| config.limits.max_in_flight = 1).await;
    let tcp = tokio::net::TcpStream::connect(&cluster.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = tonic::codegen::http::Request::post(format!(
        "http://{}/baton.v1.Checkpoint/Load",
        cluster.addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    // Two bytes of a message's five-byte prefix, and then nothing.
    body.send_data(bytes::Bytes::from_static(&[0, 0]), false)
        .unwrap();
    // Sent: the node holds it (so that no other call takes the only place first).
    let metrics = baton_node::metrics::metrics();
    for _ in 0..500 {
        if metrics.requests_in_flight() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let status = load_until_overloaded(&channel(&cluster.addr).await).await;
    assert!(
        detail_of(&status).is_some_and(|d| d.code == infra::OVERLOADED),
        "the stalled call does not hold the only place: {status:?}"
    );

    // The stalled call is answered with an error once its body has been idle for the limit.
    let answer = tokio::time::timeout(baton_node::arriving::BODY_IDLE_LIMIT * 2, response)
        .await
        .expect("the stalled call was never answered")
        .unwrap();
    let grpc_status = answer
        .headers()
        .get("grpc-status")
        .map(|value| value.to_str().unwrap().to_string());
    assert_eq!(
        grpc_status.as_deref(),
        Some("14"),
        "not UNAVAILABLE: {answer:?}"
    );
    assert_eq!(
        cluster.client.load("r").await.unwrap_err().refusal(),
        Some(&Refusal::NotFound),
        "the place was given back"
    );
    drop((body, client));
    cluster.stop().await;
}
