//! The client against a broken server: answers a Baton node never gives (an empty credential,
//! more than was asked for, a listing that goes back) are protocol errors, never results. And
//! the snapshot judges against a canned listing: they judge what was listed at the listing's "now".
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::marker::PhantomData;
use std::time::Duration;

use baton_statemachine::effect::{Action, RetrySafety};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;

use super::{Client, ClientConfig};
use crate::error::Error;
use crate::proto;

/// A request whose content is ignored (prost skips the fields it does not know).
#[derive(Clone, PartialEq, prost::Message)]
struct Ignored {}

/// A node whose service `S` answers every unary call with `answer`, whatever was asked.
struct Canned<M, S> {
    answer: M,
    service: PhantomData<fn() -> S>,
}

impl<M: Clone, S> Clone for Canned<M, S> {
    fn clone(&self) -> Self {
        Self {
            answer: self.answer.clone(),
            service: PhantomData,
        }
    }
}

impl<M, S: NamedService> NamedService for Canned<M, S> {
    const NAME: &'static str = S::NAME;
}

/// One call's answer: `M`, whatever the request.
struct Answer<M>(M);

impl<M: Clone + Send + 'static> tonic::server::UnaryService<Ignored> for Answer<M> {
    type Response = M;
    type Future = std::future::Ready<Result<tonic::Response<M>, tonic::Status>>;

    fn call(&mut self, _: tonic::Request<Ignored>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(self.0.clone())))
    }
}

impl<M, S> Service<http::Request<tonic::body::Body>> for Canned<M, S>
where
    M: prost::Message + Clone + Default + Send + Sync + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let answer = Answer(self.answer.clone());
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<M, Ignored>::default();
            Ok(tonic::server::Grpc::new(codec).unary(answer, request).await)
        })
    }
}

/// A client of a node on 127.0.0.1 whose service `S` answers every call with `answer`.
async fn client_of<M, S>(answer: M) -> Client
where
    M: prost::Message + Clone + Default + Send + Sync + 'static,
    S: NamedService + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let canned: Canned<M, S> = Canned {
        answer,
        service: PhantomData,
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(canned)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let config = ClientConfig {
        deadline: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    Client::new(&[addr], config).unwrap()
}

type Handoff = proto::handoff_server::HandoffServer<()>;
type Board = proto::board_server::BoardServer<()>;
type Effect = proto::effect_server::EffectServer<()>;
type Checkpoint = proto::checkpoint_server::CheckpointServer<()>;
type Queue = proto::queue_server::QueueServer<()>;

fn assert_protocol<T: std::fmt::Debug>(answer: Result<T, Error>, says: &str) {
    match answer {
        Err(Error::Protocol(message)) => assert!(message.contains(says), "{message}"),
        other => panic!("not a protocol error: {other:?}"),
    }
}

#[tokio::test]
async fn a_take_answered_without_a_token_is_a_protocol_error() {
    let empty = proto::TakeResponse {
        handle: Some(proto::Handle {
            token: String::new(),
            fence: 1,
            until_ms: 1,
        }),
    };
    let client = client_of::<_, Handoff>(empty).await;
    assert_protocol(client.take("k", "bob").await, "credential");
    let no_fence = proto::TakeResponse {
        handle: Some(proto::Handle {
            token: "t".into(),
            fence: 0,
            until_ms: 1,
        }),
    };
    let client = client_of::<_, Handoff>(no_fence).await;
    assert_protocol(client.take("k", "bob").await, "credential");
}

#[tokio::test]
async fn a_claim_answered_without_a_lease_is_a_protocol_error() {
    let unleased = proto::ClaimTaskResponse {
        task: Some(proto::Task {
            id: "t".into(),
            ..Default::default()
        }),
    };
    let client = client_of::<_, Board>(unleased).await;
    assert_protocol(client.claim("t", "agent", 1_000).await, "credential");
}

#[tokio::test]
async fn an_acquire_granted_without_a_holder_is_a_protocol_error() {
    let granted = proto::AcquireResponse {
        outcome: Some(proto::Outcome {
            outcome: "granted".into(),
            lease: Some(proto::EffectLease {
                key: "a".into(),
                resource: "r".into(),
                fence: 1,
                holder: String::new(),
                until_ms: 1,
            }),
            ..Default::default()
        }),
    };
    let client = client_of::<_, Effect>(granted).await;
    let action = Action {
        key: "a".into(),
        resource: "r".into(),
        safety: RetrySafety::Safe,
    };
    assert_protocol(client.acquire(&action, 1_000).await, "credential");
}

#[tokio::test]
async fn a_checkpoint_of_seq_0_is_a_protocol_error() {
    let client = client_of::<_, Checkpoint>(proto::LoadCheckpointResponse::default()).await;
    assert_protocol(client.load("run").await, "seq 0");
}

#[tokio::test]
async fn a_task_listing_that_goes_back_ends_instead_of_asking_for_ever() {
    // The same page after every page.
    let stuck = proto::ListQueueTasksResponse {
        next_after_id: 5,
        ..Default::default()
    };
    let client = client_of::<_, Queue>(stuck).await;
    let listed = tokio::time::timeout(
        Duration::from_secs(5),
        client.queue_tasks(&Default::default()),
    )
    .await
    .expect("the listing ends");
    assert_protocol(listed, "went back");
}

#[tokio::test]
async fn a_lease_answering_more_than_its_limit_is_a_protocol_error() {
    let assignment = |task_id| proto::Assignment {
        task_id,
        attempt: 1,
        queue: "q".into(),
        ..Default::default()
    };
    let two = proto::LeaseResponse {
        assignments: vec![assignment(1), assignment(2)],
        ..Default::default()
    };
    let client = client_of::<_, Queue>(two).await;
    let queues = ["q".to_string()];
    assert_protocol(
        client.lease("w", &queues, 1, 1_000, Duration::ZERO).await,
        "at most 1",
    );
}

/// A ticket listing at `now_ms` of one offered ticket whose deadline is 5,000.
fn offered_ticket_listed_at(now_ms: u64) -> proto::ListTicketsResponse {
    proto::ListTicketsResponse {
        tickets: vec![proto::Ticket {
            key: "late".into(),
            from: "alice".into(),
            to: "bob".into(),
            ttl_ms: 1_000,
            generation: 1,
            deadline_ms: 5_000,
            state: "offered".into(),
            ..Default::default()
        }],
        now_ms,
        revision: 7,
    }
}

/// The ticket judge judges what the store listed at the store's own "now": an offered ticket
/// listed past its deadline (a sweep not run yet, or a store that never expires) is reported
/// overdue, and the same ticket listed before its deadline is not.
#[tokio::test]
async fn the_ticket_judge_reports_an_offered_ticket_listed_past_its_deadline() {
    use baton_statemachine::handoff::ProblemCode;

    for now_ms in [10_000, 5_000] {
        let client = client_of::<_, Handoff>(offered_ticket_listed_at(now_ms)).await;
        let problems = crate::judge::check(&client).await.unwrap();
        let found: Vec<_> = problems.iter().map(|p| (p.key.as_str(), p.code)).collect();
        assert_eq!(
            found,
            [("late", ProblemCode::OverdueHolder)],
            "listed at {now_ms}: {problems:?}"
        );
    }
    let client = client_of::<_, Handoff>(offered_ticket_listed_at(4_999)).await;
    assert_eq!(crate::judge::check(&client).await.unwrap(), vec![]);
}

/// A board listing at `now_ms` of one claimed task whose lease ends at 5,000.
fn claimed_task_listed_at(now_ms: u64) -> proto::ListTasksResponse {
    proto::ListTasksResponse {
        tasks: vec![proto::Task {
            id: "late".into(),
            deps: vec![],
            state: "claimed".into(),
            lease: Some(proto::TaskLease {
                agent: "agent".into(),
                token: String::new(),
                fence: 1,
                until_ms: 5_000,
            }),
            max_fence: 1,
        }],
        now_ms,
        revision: 7,
    }
}

/// The board judge likewise: a claimed task listed past its lease's end is reported overdue,
/// and the same task listed before it is not.
#[tokio::test]
async fn the_board_judge_reports_a_lease_listed_past_its_end() {
    use baton_statemachine::board::BoardProblemCode;

    for now_ms in [10_000, 5_000] {
        let client = client_of::<_, Board>(claimed_task_listed_at(now_ms)).await;
        let problems = crate::judge::check_board(&client).await.unwrap();
        let found: Vec<_> = problems.iter().map(|p| (p.id.as_str(), p.code)).collect();
        assert_eq!(
            found,
            [("late", BoardProblemCode::OverdueLease)],
            "listed at {now_ms}: {problems:?}"
        );
    }
    let client = client_of::<_, Board>(claimed_task_listed_at(4_999)).await;
    assert_eq!(crate::judge::check_board(&client).await.unwrap(), vec![]);
}
