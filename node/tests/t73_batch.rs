//! `Batch.Call`: the client library sends concurrent calls to one node together, every item gets
//! exactly the answer it would have got alone, a bad item is refused alone and changes nothing,
//! and a client facing a node without the batch service falls back to direct calls.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_rpc::batch;
use baton_rpc::error::{detail_of, refusal_of};
use baton_rpc::proto::batch_client::BatchClient;
use baton_rpc::proto::batch_result::Outcome;
use baton_rpc::proto::board_server::{Board, BoardServer};
use baton_rpc::proto::{self, BatchItem, BatchRequest, RequestHeader};
use baton_rpc::{Client, ClientConfig, Error};
use baton_statemachine::board::TaskSpec;
use baton_statemachine::Refusal;
use tonic::transport::{Endpoint, Server};
use tonic::{Code, Request, Response, Status};

mod support;
use support::{claim_item, Cluster};

/// The node's request counts are the process's, and `cargo test` runs this file's tests on
/// threads of one process: every test that runs a node holds this for its whole run, so that the
/// requests a test counts (before and after) are its own.
static ONE_NODE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn specs(n: usize) -> Vec<TaskSpec> {
    (0..n)
        .map(|i| TaskSpec {
            id: format!("t{i}"),
            deps: vec![],
        })
        .collect()
}

/// Concurrent calls from one client travel to the node in shared batches (at least one, far
/// fewer than the calls), and each gets the answer it would have got alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_batches_and_each_gets_its_own_answer() {
    let _alone = ONE_NODE_AT_A_TIME.lock().await;
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    client.seed(&specs(32)).await.unwrap();
    let batches_before = baton_node::metrics::metrics().requests_of("baton.v1.Batch/Call");

    // Two claimers per task and a few claims of tasks that do not exist, all at once.
    let claims: Vec<_> = (0..72)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let id = format!("t{}", i % 36);
                let outcome = client.claim(&id, &format!("agent-{i}"), 30_000).await;
                (id, outcome)
            })
        })
        .collect();
    let mut winners = std::collections::BTreeMap::<String, usize>::new();
    for claim in claims {
        let (id, outcome) = claim.await.unwrap();
        match outcome {
            Ok(task) => {
                assert_eq!(task.id, id);
                assert!(task.lease.is_some(), "a won claim carries its lease");
                *winners.entry(id).or_default() += 1;
            }
            Err(error) if id[1..].parse::<usize>().unwrap() >= 32 => {
                assert_eq!(
                    error.refusal(),
                    Some(&Refusal::UnknownTask),
                    "{id}: {error:?}"
                );
            }
            Err(error) => assert_eq!(error.refusal(), Some(&Refusal::Taken), "{id}: {error:?}"),
        }
    }
    assert_eq!(
        winners.len(),
        32,
        "every seeded task was won once: {winners:?}"
    );
    assert!(winners.values().all(|n| *n == 1), "{winners:?}");

    let batches =
        baton_node::metrics::metrics().requests_of("baton.v1.Batch/Call") - batches_before;
    assert!(batches >= 1, "the calls travelled in batches");
    assert!(
        batches < 72,
        "72 concurrent calls should share batches, but took {batches}"
    );
    cluster.stop().await;
}

/// A batch's answers may add up to far more than any one answer: sixteen concurrent reads of
/// tickets with near-maximal payloads (about 1 MB each; with two calls in flight the others
/// queue and travel in batches of several, each answering well above the 4 MiB a gRPC client
/// decodes by default) all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_add_up_in_a_batch() {
    let _alone = ONE_NODE_AT_A_TIME.lock().await;
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let payload = |i: usize| vec![b'a' + i as u8; 1_000_000];
    for i in 0..16 {
        client
            .offer(baton_statemachine::handoff::OfferArgs {
                key: format!("big-{i}"),
                from: "src".into(),
                to: "dst".into(),
                payload: payload(i),
                reply_to: "src".into(),
                ttl_ms: 60_000,
            })
            .await
            .unwrap();
    }
    let batches_before = baton_node::metrics::metrics().requests_of("baton.v1.Batch/Call");
    let reads: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { (i, client.ticket(&format!("big-{i}")).await) })
        })
        .collect();
    for read in reads {
        let (i, ticket) = read.await.unwrap();
        let ticket = ticket.unwrap_or_else(|e| panic!("reading big-{i}: {e}"));
        assert!(ticket.payload == payload(i), "big-{i} came back changed");
    }
    let batches =
        baton_node::metrics::metrics().requests_of("baton.v1.Batch/Call") - batches_before;
    assert!(batches > 0, "the reads travelled in batches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_item_is_refused_alone_and_changes_nothing() {
    let _alone = ONE_NODE_AT_A_TIME.lock().await;
    let cluster = Cluster::start().await;
    cluster.client.seed(&specs(2)).await.unwrap();
    let channel = Endpoint::from_shared(format!("http://{}", cluster.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let garbage = BatchItem {
        method: batch::BOARD_CLAIM.path.into(),
        request: vec![0xff; 7],
    };
    let not_batchable = BatchItem {
        method: "/baton.v1.Board/Seed".into(),
        request: vec![],
    };
    let answer = BatchClient::new(channel)
        .call(BatchRequest {
            items: vec![
                claim_item("t0", 1),
                garbage,
                not_batchable,
                claim_item("t0", 2),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.results.len(), 4, "one result per item, in order");
    let outcomes: Vec<Outcome> = answer
        .results
        .into_iter()
        .map(|r| r.outcome.unwrap())
        .collect();

    // Items run concurrently: exactly one of the two claims of t0 wins, the other is TAKEN.
    let claim_answers = [&outcomes[0], &outcomes[3]];
    let won = claim_answers
        .iter()
        .filter(|o| matches!(o, Outcome::Response(_)))
        .count();
    assert_eq!(won, 1, "{claim_answers:?}");
    for outcome in claim_answers {
        if let Outcome::Status(status) = outcome {
            let status = batch::status_from_wire(status.clone());
            let detail = detail_of(&status).unwrap();
            assert_eq!(refusal_of(&detail), Some(Refusal::Taken), "{status:?}");
        }
    }
    let Outcome::Status(garbage) = &outcomes[1] else {
        panic!("garbage bytes were accepted: {:?}", outcomes[1]);
    };
    let garbage = batch::status_from_wire(garbage.clone());
    assert_eq!(garbage.code(), Code::InvalidArgument, "{garbage:?}");
    assert!(garbage.message().contains("Board/Claim"), "{garbage:?}");
    let Outcome::Status(seed) = &outcomes[2] else {
        panic!("a seed was run from a batch: {:?}", outcomes[2]);
    };
    assert_eq!(seed.code, Code::Unimplemented as i32, "{seed:?}");

    // Nothing but the one winning claim happened: t1 is free.
    cluster.client.claim("t1", "someone", 30_000).await.unwrap();
    cluster.stop().await;
}

/// The node admits a batch as one request, so it refuses one with more items than the client
/// library ever sends, before running any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_is_refused_whole() {
    let _alone = ONE_NODE_AT_A_TIME.lock().await;
    let cluster = Cluster::start().await;
    let n = batch::MAX_ITEMS + 1;
    cluster.client.seed(&specs(n)).await.unwrap();
    let channel = Endpoint::from_shared(format!("http://{}", cluster.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let items = (0..n)
        .map(|i| claim_item(&format!("t{i}"), i as u64 + 1))
        .collect();
    let status = BatchClient::new(channel)
        .call(BatchRequest { items })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("at most"), "{status:?}");
    // None of the claims ran: every task is still free.
    for i in [0, n / 2, n - 1] {
        cluster
            .client
            .claim(&format!("t{i}"), "someone", 30_000)
            .await
            .unwrap();
    }
    cluster.stop().await;
}

/// A node of an older version: a board that knows Claim (it counts them) but no batch service.
/// A flaky one answers the first attempt of every claim with a retryable NO_LEADER.
#[derive(Default)]
struct OldBoard {
    claims: Arc<AtomicUsize>,
    headers: Arc<std::sync::Mutex<Vec<RequestHeader>>>,
    flaky: bool,
    /// Every claim is answered with a retryable NO_LEADER.
    down: bool,
    /// Claims succeed, with an answer of about this many bytes (0: claims are refused).
    answer_bytes: usize,
}

#[tonic::async_trait]
impl Board for OldBoard {
    async fn seed(
        &self,
        _: Request<proto::SeedTasksRequest>,
    ) -> Result<Response<proto::SeedTasksResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn claim(
        &self,
        request: Request<proto::ClaimTaskRequest>,
    ) -> Result<Response<proto::ClaimTaskResponse>, Status> {
        let header = request.into_inner().header.unwrap_or_default();
        let mut headers = self.headers.lock().unwrap();
        let first_attempt = !headers.iter().any(|seen| seen.seq == header.seq);
        headers.push(header);
        self.claims.fetch_add(1, Ordering::SeqCst);
        if self.down || (self.flaky && first_attempt) {
            return Err(baton_rpc::error::infra_status(
                Code::Unavailable,
                baton_rpc::error::infra::NO_LEADER,
                "not yet",
            ));
        }
        if self.answer_bytes > 0 {
            let dep = "d".repeat(1_000);
            return Ok(Response::new(proto::ClaimTaskResponse {
                task: Some(proto::Task {
                    id: "x".into(),
                    deps: vec![dep; self.answer_bytes / 1_000],
                    state: "claimed".into(),
                    lease: Some(proto::TaskLease {
                        agent: "a".into(),
                        token: "t".into(),
                        fence: 1,
                        until_ms: 1,
                    }),
                    max_fence: 1,
                }),
            }));
        }
        Err(baton_rpc::error::refusal_status(&Refusal::Blocked))
    }
    async fn release(
        &self,
        _: Request<proto::ReleaseTaskRequest>,
    ) -> Result<Response<proto::ReleaseTaskResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn complete(
        &self,
        _: Request<proto::CompleteTaskRequest>,
    ) -> Result<Response<proto::CompleteTaskResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn renew(
        &self,
        _: Request<proto::RenewTaskRequest>,
    ) -> Result<Response<proto::RenewTaskResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn list(
        &self,
        _: Request<proto::ListTasksRequest>,
    ) -> Result<Response<proto::ListTasksResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

/// Serves `board` on a loopback port; a client of it, and the server's task.
async fn serve(
    board: OldBoard,
) -> (
    Client,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        Server::builder()
            .add_service(BoardServer::new(board))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let config = ClientConfig {
        deadline: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    (Client::new(&[addr.to_string()], config).unwrap(), server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_batch_service_is_called_directly() {
    let board = OldBoard::default();
    let claims = board.claims.clone();
    let (client, server) = serve(board).await;
    for round in 0..2 {
        match client.claim("x", "a", 1_000).await {
            Err(Error::Refused(Refusal::Blocked)) => {}
            other => panic!("round {round}: want the old node's own answer, got {other:?}"),
        }
        assert_eq!(claims.load(Ordering::SeqCst), round + 1, "served directly");
    }
    server.abort();
}

/// An answer over gRPC's default 4 MiB (a queue task with many attempts' notes can be one) is
/// decoded: a write whose answer the client cannot read was applied all the same, and reporting
/// it as a protocol failure would hide that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_four_mebibytes_is_decoded() {
    let board = OldBoard {
        answer_bytes: 6 << 20,
        ..OldBoard::default()
    };
    let (client, server) = serve(board).await;
    let task = client.claim("x", "a", 1_000).await.unwrap();
    assert_eq!(task.deps.len(), (6 << 20) / 1_000);
    server.abort();
}

/// A judgement that ran out of time stops its contenders: left running, they would go on
/// claiming after the verdict, and a late win would hold the task with nobody to release it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_past_its_time_limit_stops_its_contenders() {
    let board = OldBoard {
        down: true,
        ..OldBoard::default()
    };
    let claims = board.claims.clone();
    let (client, server) = serve(board).await;
    let agents: Vec<String> = ["a", "b", "c"].iter().map(|a| a.to_string()).collect();
    let race =
        baton_rpc::judge::concurrent_claim(&client, "x", &agents, Duration::from_millis(150)).await;
    assert!(race.verdict().is_err(), "nobody could win");
    let at_verdict = claims.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = claims.load(Ordering::SeqCst);
    // At most one attempt per contender was already on the wire when it was stopped.
    assert!(
        after - at_verdict <= agents.len(),
        "{} claims arrived after the verdict",
        after - at_verdict
    );
    server.abort();
}

/// Every attempt after the first of one request says it is a retry (the leader then judges it
/// through the log, where an earlier attempt may be waiting); a new request starts unmarked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_after_the_first_are_marked_as_retries() {
    let board = OldBoard {
        flaky: true,
        ..OldBoard::default()
    };
    let headers = board.headers.clone();
    let (client, server) = serve(board).await;
    for _ in 0..2 {
        match client.claim("x", "a", 1_000).await {
            Err(Error::Refused(Refusal::Blocked)) => {}
            other => panic!("want the answer to the retry, got {other:?}"),
        }
    }
    let seen: Vec<(u64, bool)> = headers
        .lock()
        .unwrap()
        .iter()
        .map(|header| (header.seq, header.retry))
        .collect();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0], (seen[0].0, false), "{seen:?}");
    assert_eq!(seen[1], (seen[0].0, true), "{seen:?}");
    assert_ne!(seen[2].0, seen[0].0, "{seen:?}");
    assert_eq!(seen[2], (seen[2].0, false), "{seen:?}");
    assert_eq!(seen[3], (seen[2].0, true), "{seen:?}");
    server.abort();
}

/// One client's batches leave room on its connection for the calls that never batch: with a
/// long poll waiting on the same connection, 600 claims at once all run the first time, none
/// bounced `OVERLOADED` by the node's per-connection limit (512 by default). Two batches of 256
/// in flight used to take the whole limit, so the poll pushed an item of every second batch
/// over it, to be retried after a pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_leave_room_on_the_connection_for_a_long_poll() {
    let _alone = ONE_NODE_AT_A_TIME.lock().await;
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    client.seed(&specs(600)).await.unwrap();
    client.create_queue("idle", "ns").await.unwrap();
    client.register_worker("w", false).await.unwrap();
    let poll = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lease(
                    "w",
                    &["idle".to_string()],
                    1,
                    60_000,
                    Duration::from_secs(5),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let claims_before = baton_node::metrics::metrics().requests_of("baton.v1.Board/Claim");
    let claims: Vec<_> = (0..600)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.claim(&format!("t{i}"), "agent", 30_000).await })
        })
        .collect();
    for claim in claims {
        claim.await.unwrap().unwrap();
    }
    let claims = baton_node::metrics::metrics().requests_of("baton.v1.Board/Claim") - claims_before;
    assert_eq!(
        claims, 600,
        "claims sent again after a refusal at the node's limit"
    );
    assert!(poll.await.unwrap().unwrap().is_empty());
    cluster.stop().await;
}
