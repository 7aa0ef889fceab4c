//! What an operator sees of a node: `/metrics` moves with the work done, `/livez` and `/readyz`
//! answer, gRPC health checking says SERVING (a health watch hears NOT_SERVING and ends when the
//! node stops) and reflection lists the services. A node cut off from its cluster stops being
//! ready.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_node::config::{NodeConfig, RaftTuning};
use baton_rpc::{Client, ClientConfig, Error};
use baton_statemachine::Refusal;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

mod support;
use support::{free_addr, http_get, offer, Cluster};

/// The value of the sample `name{labels}` (exactly as exported), or 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().unwrap())
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_the_work_done() {
    let http = free_addr();
    let cluster = Cluster::start_custom(|config| config.http = Some(http)).await;
    let c = &cluster.client;
    c.offer(offer("warm-up")).await.unwrap();

    let (status, before) = http_get(http, "/metrics").await;
    assert_eq!(status, 200);
    for key in ["k1", "k2", "k3"] {
        c.offer(offer(key)).await.unwrap();
    }
    c.take("k1", "b").await.unwrap();
    assert_eq!(
        c.take("nope", "b").await.unwrap_err().refusal(),
        Some(&Refusal::UnknownKey)
    );
    c.tickets().await.unwrap();
    let (_, after) = http_get(http, "/metrics").await;

    let moved = |series: &str| sample(&after, series) - sample(&before, series);
    assert_eq!(moved(r#"baton_commands_total{command="offer"}"#), 3.0);
    // The take of an unknown key is refused from state a read confirmed, without the log: not
    // a proposal.
    assert_eq!(moved(r#"baton_commands_total{command="take"}"#), 1.0);
    assert_eq!(
        moved(r#"baton_proposal_duration_seconds_count{command="offer"}"#),
        3.0
    );
    assert!(moved("baton_read_duration_seconds_count") >= 1.0);
    assert!(moved("baton_apply_duration_seconds_count") >= 1.0);
    assert!(moved("baton_applied_entries_total") >= 5.0);
    assert!(moved("baton_raft_applied_index") >= 5.0);
    assert_eq!(
        moved(r#"baton_grpc_errors_total{method="baton.v1.Handoff/Take",code="UNKNOWN_KEY"}"#),
        1.0,
        "{after}"
    );
    assert_eq!(
        moved(r#"baton_grpc_requests_total{method="baton.v1.Handoff/Offer"}"#),
        3.0
    );

    assert_eq!(sample(&after, "baton_raft_is_leader"), 1.0);
    assert_eq!(sample(&after, "baton_raft_leader_id"), 1.0);
    assert!(sample(&after, "baton_raft_term") >= 1.0);
    assert!(
        sample(&after, "baton_raft_commit_index") >= sample(&after, "baton_raft_applied_index")
    );
    assert_eq!(
        sample(&after, "baton_tickets_live"),
        4.0,
        "k1 accepted, 3 offered"
    );
    assert_eq!(sample(&after, "baton_grpc_in_flight_requests"), 0.0);
    assert!(
        sample(&after, "baton_grpc_client_connections") >= 1.0,
        "the client's connection is counted"
    );
    assert_eq!(sample(&after, "baton_grpc_connections_refused_total"), 0.0);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_leader_is_live_ready_and_serving() {
    let http = free_addr();
    let cluster = Cluster::start_custom(|config| config.http = Some(http)).await;

    let (status, body) = http_get(http, "/livez").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, body) = http_get(http, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready: leader"), "{body}");
    assert_eq!(http_get(http, "/nope").await.0, 404);

    let mut health = HealthClient::new(channel(&cluster.addr).await);
    for service in [
        "",
        "baton.v1.Handoff",
        "baton.v1.Queue",
        "baton.v1.Watch",
        "baton.v1.Batch",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "baton.v1.Nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    assert!(reflected_services(&cluster.addr)
        .await
        .contains(&"baton.v1.Handoff".to_string()));
    cluster.stop().await;
}

/// A gRPC health watch (what a gRPC client's own health checking opens, and never closes) hears
/// `NOT_SERVING` when the node begins to shut down, and then ends, telling why: left open, it
/// would hold its connection, and the node's shutdown, until the close limit cut it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_watch_hears_not_serving_and_ends_when_the_node_stops() {
    let cluster = Cluster::start().await;
    let mut health = HealthClient::new(channel(&cluster.addr).await);
    let mut stream = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    let (statuses, end) = cluster
        .stop_while(async move {
            let mut statuses = Vec::new();
            let end = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    match stream.message().await {
                        Ok(Some(response)) => statuses.push(response.status),
                        Ok(None) => break None,
                        Err(status) => break Some(status),
                    }
                }
            })
            .await
            .expect("the health watch ends when the node stops");
            (statuses, end)
        })
        .await;
    assert_eq!(statuses, [ServingStatus::NotServing as i32]);
    let end = end.expect("the stream ends with a status");
    assert_eq!(end.code(), tonic::Code::Unavailable, "{end:?}");
    assert!(end.message().contains("shutting down"), "{end:?}");
}

async fn channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// The services gRPC reflection lists.
async fn reflected_services(addr: &str) -> Vec<String> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let mut client = ServerReflectionClient::new(channel(addr).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    match answer.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

/// Three nodes in this process, each with its HTTP endpoint.
struct Three {
    /// The nodes' gRPC addresses, by node id less one.
    endpoints: Vec<String>,
    http: Vec<std::net::SocketAddr>,
    stops: Vec<Option<tokio::sync::oneshot::Sender<()>>>,
    servers: Vec<Option<tokio::task::JoinHandle<anyhow::Result<()>>>>,
    _dir: tempfile::TempDir,
}

impl Three {
    async fn start() -> Three {
        Three::start_secured(None).await
    }

    /// Three nodes that want a client token when `tokens` is given: the token file of each
    /// node (its accepted tokens), and the token this test's client presents.
    async fn start_secured(tokens: Option<([&str; 3], &str)>) -> Three {
        let dir = tempfile::tempdir().unwrap();
        let mut listeners = Vec::new();
        let mut members = Vec::new();
        for id in 1..=3u64 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            members.push((id, listener.local_addr().unwrap().to_string()));
            listeners.push(listener);
        }
        let mut three = Three {
            endpoints: members.iter().map(|(_, addr)| addr.clone()).collect(),
            http: Vec::new(),
            stops: Vec::new(),
            servers: Vec::new(),
            _dir: dir,
        };
        for ((id, _), listener) in members.iter().zip(listeners) {
            let http = free_addr();
            let mut config = NodeConfig::new(
                *id,
                listener.local_addr().unwrap(),
                three._dir.path().join(format!("node-{id}")),
            );
            config.raft = RaftTuning {
                heartbeat: Duration::from_millis(50),
                election_timeout: (Duration::from_millis(200), Duration::from_millis(400)),
                ..RaftTuning::default()
            };
            config.http = Some(http);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            three.http.push(http);
            three.stops.push(Some(stop));
            let security = baton_node::security::Security {
                tls: None,
                tokens: tokens.map(|(files, _)| {
                    baton_node::auth::Tokens::parse(files[*id as usize - 1]).unwrap()
                }),
            };
            three
                .servers
                .push(Some(tokio::spawn(baton_node::server::serve_secured(
                    config,
                    security,
                    listener,
                    async move {
                        let _ = stopped.await;
                    },
                ))));
        }
        let endpoints: Vec<&str> = members.iter().map(|(_, addr)| addr.as_str()).collect();
        let config = ClientConfig {
            deadline: Duration::from_secs(10),
            ..ClientConfig::default()
        };
        let security = baton_rpc::Security {
            token: tokens.map(|(_, client)| client.to_string()),
            tls: None,
        };
        let client = Client::new_with_security(&endpoints, config.clone(), security).unwrap();
        client.initialize(endpoints[0], &members).await.unwrap();
        client.discover_leader().await.unwrap();
        three
    }

    async fn stop(&mut self, node: usize) {
        let _ = self.stops[node].take().unwrap().send(());
        self.servers[node].take().unwrap().await.unwrap().unwrap();
    }
}

/// Polls `/readyz` of `http` until `want(status)` or about ten seconds pass; the last answer.
async fn readyz_until(http: std::net::SocketAddr, want: impl Fn(u16) -> bool) -> (u16, String) {
    let mut last = (0, String::new());
    for _ in 0..100 {
        last = http_get(http, "/readyz").await;
        if want(last.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_are_ready_until_cut_off_from_the_cluster() {
    let three = Three::start().await;
    followers_are_ready_until_cut_off(three).await;
}

/// A follower asks its leader how far it got as any client would: with a token when the
/// cluster wants one (before: without, so every follower of such a cluster stayed not ready).
/// Each node here lists a token of its own first and a shared one second, as in the middle of a
/// rotation: a follower tries its tokens until the leader accepts one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_of_a_cluster_that_wants_tokens_are_ready_too() {
    let files = [
        "node-1-only-token-1a2b\nshared-token-7f3a9c21\n",
        "node-2-only-token-3c4d\nshared-token-7f3a9c21\n",
        "node-3-only-token-5e6f\nshared-token-7f3a9c21\n",
    ];
    let three = Three::start_secured(Some((files, "shared-token-7f3a9c21"))).await;
    followers_are_ready_until_cut_off(three).await;
}

async fn followers_are_ready_until_cut_off(mut three: Three) {
    let mut roles = Vec::new();
    for http in three.http.clone() {
        let (status, body) = readyz_until(http, |status| status == 200).await;
        assert_eq!(status, 200, "{body}");
        roles.push(body);
    }
    assert_eq!(
        roles
            .iter()
            .filter(|body| body.starts_with("ready: follower"))
            .count(),
        2,
        "{roles:?}"
    );

    // Node 3 alone knows no leader once the others are gone, and says so.
    three.stop(0).await;
    three.stop(1).await;
    let (status, body) = readyz_until(three.http[2], |status| status == 503).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: "), "{body}");
    three.stop(2).await;
}

/// A node removed from the cluster stops being ready at once. Before: it asked the leader only
/// how far it had got, and the leader it still named (its term never moves: its pre-votes are
/// refused) answered, so it stayed ready, and got traffic it could only bounce, until the
/// cluster had written `ready_max_lag` entries past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_removed_from_the_cluster_is_not_ready() {
    let mut three = Three::start().await;
    for http in three.http.clone() {
        let (status, body) = readyz_until(http, |status| status == 200).await;
        assert_eq!(status, 200, "{body}");
    }
    let endpoints: Vec<&str> = three.endpoints.iter().map(String::as_str).collect();
    let client = Client::new(&endpoints, ClientConfig::default()).unwrap();
    let leader_addr = client.discover_leader().await.unwrap();
    let leader = client.node_info(&leader_addr).await.unwrap().id;
    let removed = (1..=3u64).find(|id| *id != leader).unwrap();
    client.remove_member(removed).await.unwrap();
    let http = three.http[removed as usize - 1];
    let (status, body) = readyz_until(http, |status| status == 503).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not a member"), "{body}");
    // The two left are ready on.
    for id in (1..=3u64).filter(|id| *id != removed) {
        let (status, body) =
            readyz_until(three.http[id as usize - 1], |status| status == 200).await;
        assert_eq!(status, 200, "node {id}: {body}");
    }
    for node in 0..3 {
        three.stop(node).await;
    }
}

/// A node that is shutting down is not ready from the moment it refuses new requests, although
/// its HTTP endpoint answers on while admitted requests drain (here one whose body never comes,
/// which holds the drain for its whole limit): a load balancer polling `/readyz` stops sending
/// it traffic at once. Before, it said 200 until the endpoint closed, after the whole drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_shutting_down_is_not_ready() {
    let http = free_addr();
    let cluster = Cluster::start_custom(|config| config.http = Some(http)).await;
    assert_eq!(readyz_until(http, |status| status == 200).await.0, 200);
    let held = request_without_a_body(&cluster.addr).await;
    let mut in_flight = 0.0;
    for _ in 0..100 {
        in_flight = sample(
            &http_get(http, "/metrics").await.1,
            "baton_grpc_in_flight_requests",
        );
        if in_flight == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(in_flight, 1.0, "the held request is admitted");
    let (status, body) = cluster
        .stop_while(async {
            let answer = readyz_until(http, |status| status != 200).await;
            drop(held);
            answer
        })
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("shutting down"), "{body}");
}

/// A gRPC request whose headers reach the node and whose body never follows, until the returned
/// handles are dropped.
async fn request_without_a_body(
    addr: &str,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    h2::SendStream<bytes::Bytes>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = tonic::codegen::http::Request::post(format!(
        "http://{addr}/baton.v1.Checkpoint/SaveIfNewer"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (_response, body) = client.send_request(request, false).unwrap();
    (client, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_is_counted_by_its_code_not_as_an_outage() {
    let http = free_addr();
    let cluster = Cluster::start_custom(|config| config.http = Some(http)).await;
    let err = cluster.client.load("never-saved").await.unwrap_err();
    assert!(matches!(err, Error::Refused(Refusal::NotFound)), "{err:?}");
    let (_, text) = http_get(http, "/metrics").await;
    assert_eq!(
        sample(
            &text,
            r#"baton_grpc_errors_total{method="baton.v1.Checkpoint/Load",code="NOT_FOUND"}"#
        ),
        1.0,
        "{text}"
    );
    cluster.stop().await;
}

/// A watch refused at its opening is counted like any refused request: before, watches were
/// never counted, so the overload alert on `OVERLOADED` missed streams turned away at
/// `watch.max_streams`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_at_its_opening_is_counted() {
    use baton_rpc::proto::watch_client::WatchClient;
    use baton_rpc::proto::WatchRequest;

    let http = free_addr();
    let cluster = Cluster::start_custom(|config| {
        config.http = Some(http);
        config.watch.max_streams = 1;
    })
    .await;
    let mut watches = WatchClient::new(channel(&cluster.addr).await);
    let _open = watches
        .watch(WatchRequest::default())
        .await
        .expect("the first watch opens");
    let refused = watches.watch(WatchRequest::default()).await.unwrap_err();
    let code = baton_rpc::error::detail_of(&refused).map(|detail| detail.code);
    assert_eq!(code.as_deref(), Some("OVERLOADED"), "{refused:?}");
    let (_, text) = http_get(http, "/metrics").await;
    let method = "baton.v1.Watch/Watch";
    assert_eq!(
        sample(
            &text,
            &format!(r#"baton_grpc_errors_total{{method="{method}",code="OVERLOADED"}}"#)
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!(r#"baton_grpc_requests_total{{method="{method}"}}"#)
        ),
        2.0,
        "{text}"
    );
    cluster.stop().await;
}

/// A write sent to a follower is turned away there (`NOT_LEADER`) and proposed by the leader:
/// only the leader counts and times it (the follower would be a second count here). Before, the follower counted it too, with a
/// sub-millisecond latency, pulling the latency quantiles down just when leadership moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_turned_away_by_a_follower_is_not_counted_as_a_proposal() {
    let mut three = Three::start().await;
    let endpoints: Vec<&str> = three.endpoints.iter().map(String::as_str).collect();
    let client = Client::new(&endpoints, ClientConfig::default()).unwrap();
    let leader_addr = client.discover_leader().await.unwrap();
    let leader = client.node_info(&leader_addr).await.unwrap().id as usize;
    let follower = (1..=3usize).find(|id| *id != leader).unwrap();
    // A client that knows only the follower: the follower refuses, naming the leader, and the
    // client follows the hint.
    let via_follower = Client::new(
        &[three.endpoints[follower - 1].as_str()],
        ClientConfig::default(),
    )
    .unwrap();
    via_follower.offer(offer("via-follower")).await.unwrap();
    via_follower
        .seed(&[baton_statemachine::board::TaskSpec {
            id: "via-follower".into(),
            deps: vec![],
        }])
        .await
        .unwrap();
    via_follower
        .claim("via-follower", "agent-1", 30_000)
        .await
        .unwrap();
    let series = |command: &str| format!(r#"baton_commands_total{{command="{command}"}}"#);
    let latency =
        |command: &str| format!(r#"baton_proposal_duration_seconds_count{{command="{command}"}}"#);
    // The three nodes share this process's metrics (each test is a process of its own): one
    // proposal each, not two.
    let (_, text) = http_get(three.http[leader - 1], "/metrics").await;
    for command in ["offer", "board.seed", "board.claim"] {
        assert_eq!(sample(&text, &series(command)), 1.0, "{command}: {text}");
        assert_eq!(sample(&text, &latency(command)), 1.0, "{command}: {text}");
    }
    for node in 0..3 {
        three.stop(node).await;
    }
}

/// Request paths come from clients; only methods Baton declares become `method` labels, so
/// made-up ones (in a batch or called directly) cannot grow the metrics without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_share_one_label() {
    use baton_rpc::proto::batch_client::BatchClient;
    use baton_rpc::proto::{self, BatchItem, BatchRequest};

    let http = free_addr();
    let cluster = Cluster::start_custom(|config| config.http = Some(http)).await;
    let (_, before) = http_get(http, "/metrics").await;
    let unknown = r#"baton_grpc_requests_total{method="unknown"}"#;

    let items = (0..20)
        .map(|i| BatchItem {
            method: format!("/baton.v1.Board/Made{i}"),
            request: vec![],
        })
        .collect();
    let answer = BatchClient::new(channel(&cluster.addr).await)
        .call(BatchRequest { items })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.results.len(), 20);

    let mut grpc = tonic::client::Grpc::new(channel(&cluster.addr).await);
    for i in 0..5 {
        grpc.ready().await.unwrap();
        let path = format!("/baton.v1.Board/Steal{i}");
        let status = grpc
            .unary(
                tonic::Request::new(proto::ClaimTaskRequest::default()),
                http::uri::PathAndQuery::try_from(path).unwrap(),
                tonic_prost::ProstCodec::<proto::ClaimTaskRequest, proto::ClaimTaskResponse>::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    }

    let (_, after) = http_get(http, "/metrics").await;
    assert!(
        !after.contains("Made") && !after.contains("Steal"),
        "a made-up method became a label:\n{after}"
    );
    assert_eq!(
        sample(&after, unknown) - sample(&before, unknown),
        25.0,
        "{after}"
    );
    cluster.stop().await;
}

/// A request the outer gate refuses (here: no token) never reaches a service, yet it is counted
/// with its code, so token guessing and gate refusals show on a dashboard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_at_the_gate_are_counted() {
    use baton_node::auth::Tokens;
    use baton_node::security::Security;

    let http = free_addr();
    let security = Security {
        tls: None,
        tokens: Some(Tokens::parse("gate-token-5d1e9a7c3b\n").unwrap()),
    };
    let client = baton_rpc::Security {
        token: Some("gate-token-5d1e9a7c3b".into()),
        tls: None,
    };
    let cluster = Cluster::start_secured(|config| config.http = Some(http), security, client).await;
    let addr = cluster.addr.clone();
    let anonymous = Client::new(&[addr.as_str()], ClientConfig::default()).unwrap();
    let err = anonymous.node_info(&addr).await.unwrap_err();
    assert!(
        matches!(&err, Error::Server { code, .. } if code == "UNAUTHENTICATED"),
        "{err:?}"
    );
    let err = anonymous.load("job").await.unwrap_err();
    assert!(
        matches!(&err, Error::Server { code, .. } if code == "UNAUTHENTICATED"),
        "{err:?}"
    );

    let (_, text) = http_get(http, "/metrics").await;
    for method in ["baton.v1.Cluster/NodeInfo", "baton.v1.Checkpoint/Load"] {
        let series =
            format!(r#"baton_grpc_errors_total{{method="{method}",code="UNAUTHENTICATED"}}"#);
        assert!(sample(&text, &series) >= 1.0, "{series} missing:\n{text}");
    }
    cluster.stop().await;
}

/// `baton_snapshots_installed_total` counts snapshots received from a leader; a node resuming
/// from its own snapshot at start-up only reports the snapshot's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_from_its_own_snapshot_is_not_an_install() {
    let dir = tempfile::tempdir().unwrap();
    let http = free_addr();
    let start = |listener: tokio::net::TcpListener| {
        let addr = listener.local_addr().unwrap();
        let mut config = NodeConfig::new(1, addr, dir.path().join("node-1"));
        config.http = Some(http);
        config.raft = RaftTuning {
            heartbeat: Duration::from_millis(50),
            election_timeout: (Duration::from_millis(150), Duration::from_millis(300)),
            snapshot_every: 5,
            ..RaftTuning::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(baton_node::server::serve(config, listener, async move {
            let _ = stopped.await;
        }));
        (addr.to_string(), stop, server)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, stop, server) = start(listener);
    let config = ClientConfig {
        deadline: Duration::from_secs(10),
        ..ClientConfig::default()
    };
    Client::new(&[addr.as_str()], config.clone())
        .unwrap()
        .initialize(&addr, &[(1, addr.clone())])
        .await
        .unwrap();
    let client = Client::connect_with(&[addr.as_str()], config.clone())
        .await
        .unwrap();
    for i in 0..20 {
        client.offer(offer(&format!("s{i}"))).await.unwrap();
    }
    metric_until(http, "baton_snapshots_built_total", |n| n >= 1.0).await;
    drop(client);
    let _ = stop.send(());
    server.await.unwrap().unwrap();

    let listener = tokio::net::TcpListener::bind(addr.as_str()).await.unwrap();
    let (_, stop, server) = start(listener);
    while tokio::net::TcpStream::connect(http).await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, text) = http_get(http, "/metrics").await;
    assert_eq!(
        sample(&text, "baton_snapshots_installed_total"),
        0.0,
        "{text}"
    );
    assert!(sample(&text, "baton_snapshot_size_bytes") > 0.0, "{text}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// Scrapes `/metrics` until `series` satisfies `want` (at most 10 s).
async fn metric_until(http: std::net::SocketAddr, series: &str, want: impl Fn(f64) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = http_get(http, "/metrics").await;
        if want(sample(&text, series)) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{series}:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
