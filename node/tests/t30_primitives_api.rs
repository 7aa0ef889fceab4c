//! Every board, side-effect, sink and checkpoint call through gRPC against an in-process
//! single-node cluster: typed results and typed refusals, end to end.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_node::stamp::wall_clock_ms;
use baton_rpc::judge;
use baton_rpc::proto::board_client::BoardClient;
use baton_rpc::proto::effect_client::EffectClient;
use baton_rpc::proto::handoff_client::HandoffClient;
use baton_rpc::{proto, Error};
use baton_statemachine::board::{TaskSpec, TaskState};
use baton_statemachine::effect::{
    Action, EffectLease, KeyStatus, Outcome, Resolution, Resolved, RetrySafety,
};
use baton_statemachine::handoff::OfferArgs;
use baton_statemachine::limits::MAX_PAYLOAD_BYTES;
use baton_statemachine::Refusal;

mod support;
use support::Cluster;

/// The contract refusal a call ended with (panics on success or on an infrastructure failure).
fn refusal<T: std::fmt::Debug>(result: Result<T, Error>) -> Refusal {
    match result {
        Err(Error::Refused(refusal)) => refusal,
        other => panic!("want a refusal, got {other:?}"),
    }
}

fn invalid_field<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    match refusal(result) {
        Refusal::Invalid { field, .. } => field,
        other => panic!("want Invalid, got {other:?}"),
    }
}

fn spec(id: &str, deps: &[&str]) -> TaskSpec {
    TaskSpec {
        id: id.into(),
        deps: deps.iter().map(|d| d.to_string()).collect(),
    }
}

fn action(key: &str, resource: &str, safety: RetrySafety) -> Action {
    Action {
        key: key.into(),
        resource: resource.into(),
        safety,
    }
}

fn granted(outcome: Outcome) -> EffectLease {
    match outcome {
        Outcome::Granted(lease) => lease,
        other => panic!("want granted, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_call_answers_typed_results_and_refusals() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;

    // ------------------------------------------------------------ board
    assert_eq!(
        c.seed(&[spec("a", &[]), spec("b", &["a"])]).await.unwrap(),
        2
    );
    assert_eq!(
        refusal(c.claim("b", "agent-1", 30_000).await),
        Refusal::Blocked
    );
    assert_eq!(
        refusal(c.claim("zz", "agent-1", 30_000).await),
        Refusal::UnknownTask
    );
    assert_eq!(invalid_field(c.claim("a", "agent-1", 0).await), "ttl");
    assert_eq!(invalid_field(c.seed(&[]).await), "tasks");

    let claimed = c.claim("a", "agent-1", 30_000).await.unwrap();
    assert_eq!(claimed.state, TaskState::Claimed);
    let lease = claimed.lease.clone().unwrap();
    assert_eq!((lease.agent.as_str(), lease.fence), ("agent-1", 1));
    assert_eq!(lease.token.len(), 32, "128-bit hex token");
    assert_eq!(
        refusal(c.claim("a", "agent-2", 30_000).await),
        Refusal::Taken
    );

    let listed = c.tasks().await.unwrap();
    assert!(listed.revision > 0);
    assert_eq!(listed.tasks.len(), 2);
    let a = &listed.tasks[0];
    let listed_lease = a.lease.as_ref().unwrap();
    assert_eq!(listed_lease.token, "", "a listing never shows the token");
    assert_eq!(
        (listed_lease.agent.as_str(), listed_lease.fence),
        ("agent-1", 1)
    );
    assert_eq!(a.max_fence, 1);

    let renewed = c.renew_task("a", &lease.token, 60_000).await.unwrap();
    let renewed_lease = renewed.lease.unwrap();
    assert_eq!(
        renewed_lease.token, lease.token,
        "renewal is not a takeover"
    );
    assert_eq!(renewed_lease.fence, lease.fence);
    assert!(renewed_lease.until_ms > lease.until_ms);
    assert_eq!(
        refusal(c.renew_task("a", "nope", 1_000).await),
        Refusal::LeaseLost
    );
    assert_eq!(
        refusal(c.release_task("a", "nope").await),
        Refusal::LeaseLost
    );

    c.release_task("a", &lease.token).await.unwrap();
    let second = c
        .claim("a", "agent-2", 30_000)
        .await
        .unwrap()
        .lease
        .unwrap();
    assert_eq!(second.fence, 2, "fences never go back");
    assert_eq!(
        refusal(c.complete_task("a", &lease.token).await),
        Refusal::LeaseLost
    );
    c.complete_task("a", &second.token).await.unwrap();
    assert_eq!(
        refusal(c.claim("a", "agent-3", 30_000).await),
        Refusal::AlreadyDone
    );
    let b = c.claim("b", "agent-3", 30_000).await.unwrap();
    assert_eq!(b.lease.unwrap().fence, 1, "dependency done: b is claimable");

    c.seed(&[spec("race", &[])]).await.unwrap();
    let agents: Vec<String> = (1..=4).map(|i| format!("racer-{i}")).collect();
    let race = judge::concurrent_claim(c, "race", &agents, Duration::from_secs(10)).await;
    race.verdict().unwrap();
    assert_eq!((race.winners.len(), race.losers), (1, 3));
    assert_eq!(judge::check_board(c).await.unwrap(), vec![]);

    // A take race where one taker is not the addressee: that taker never reached the race, so
    // the judgement fails even though exactly one addressee won.
    c.offer(OfferArgs {
        key: "race-ticket".into(),
        from: "src".into(),
        to: "dst".into(),
        payload: Vec::new(),
        reply_to: "src".into(),
        ttl_ms: 60_000,
    })
    .await
    .unwrap();
    let takers = vec!["dst".to_string(), "dst".to_string(), "stranger".to_string()];
    let race = judge::concurrent_take(c, "race-ticket", &takers, Duration::from_secs(10)).await;
    assert_eq!(race.winners.len(), 1, "{race:?}");
    assert_eq!(race.losers, 1, "{race:?}");
    assert_eq!(race.misses, vec![Refusal::NotAddressee], "{race:?}");
    assert!(race.verdict().is_err(), "a miss fails the judgement");

    // Cancel: only the source ("a"), only while offered; each refusal typed across the wire.
    for key in ["cancel-offered", "cancel-taken"] {
        c.offer(support::offer(key)).await.unwrap();
    }
    assert_eq!(
        refusal(c.cancel("cancel-nobody", "a").await),
        Refusal::UnknownKey
    );
    assert_eq!(
        refusal(c.cancel("cancel-offered", "b").await),
        Refusal::NotSource
    );
    c.cancel("cancel-offered", "a").await.unwrap();
    assert_eq!(
        refusal(c.cancel("cancel-offered", "a").await),
        Refusal::AlreadySettled
    );
    c.take("cancel-taken", "b").await.unwrap();
    assert_eq!(refusal(c.cancel("cancel-taken", "a").await), Refusal::Taken);

    // ------------------------------------------------------------ side-effect gate
    let email = action("email-1", "smtp", RetrySafety::Safe);
    assert_eq!(
        refusal(c.show_action("email-1").await),
        Refusal::UnknownAction
    );
    let first = granted(c.acquire(&email, 30_000).await.unwrap());
    assert_eq!(
        (first.fence, first.key.as_str(), first.resource.as_str()),
        (1, "email-1", "smtp")
    );
    assert_eq!(
        c.acquire(&email, 30_000).await.unwrap(),
        Outcome::InProgress
    );
    let other = action("email-2", "smtp", RetrySafety::Safe);
    assert_eq!(c.acquire(&other, 30_000).await.unwrap(), Outcome::Contended);
    assert_eq!(
        refusal(
            c.acquire(&action("email-1", "fax", RetrySafety::Safe), 30_000)
                .await
        ),
        Refusal::ResourceMismatch
    );
    assert_eq!(invalid_field(c.acquire(&other, -5).await), "ttl");

    let first = c.renew_effect(&email, &first, 60_000).await.unwrap();
    assert_eq!(first.fence, 1, "renewal keeps the fence");
    assert_eq!(
        invalid_field(c.renew_effect(&email, &first, 0).await),
        "ttl"
    );
    let stale = EffectLease {
        fence: 0,
        ..first.clone()
    };
    assert_eq!(
        refusal(c.complete_effect(&email, &stale, "x").await),
        Refusal::FenceStale
    );
    let impostor = EffectLease {
        holder: "impostor".into(),
        ..first.clone()
    };
    assert_eq!(
        refusal(c.complete_effect(&email, &impostor, "x").await),
        Refusal::NotHolder
    );
    // A lease on another resource (one whose latest fence happens to match) is a mismatch.
    let fax = granted(
        c.acquire(&action("fax-1", "fax", RetrySafety::Safe), 30_000)
            .await
            .unwrap(),
    );
    assert_eq!(fax.fence, first.fence);
    let elsewhere = EffectLease {
        resource: "fax".into(),
        ..first.clone()
    };
    assert_eq!(
        refusal(c.complete_effect(&email, &elsewhere, "x").await),
        Refusal::ResourceMismatch
    );
    assert_eq!(
        c.complete_effect(&email, &first, "sent").await.unwrap(),
        "sent"
    );
    assert_eq!(
        c.complete_effect(&email, &first, "again").await.unwrap(),
        "sent",
        "first completion wins"
    );
    assert_eq!(
        c.acquire(&email, 30_000).await.unwrap(),
        Outcome::Completed("sent".into())
    );
    let view = c.show_action("email-1").await.unwrap();
    assert_eq!(view.status, KeyStatus::Completed);
    assert_eq!(view.result.as_deref(), Some("sent"));
    assert_eq!(view.safety, RetrySafety::Safe);
    c.release_effect(&email, &first).await.unwrap();

    // An attempt whose outcome is unknown: uncertain, then reconciled.
    let second = granted(c.acquire(&other, 30_000).await.unwrap());
    assert_eq!(second.fence, 2, "the resource's next fence");
    c.mark_uncertain(&other, &second, "smtp timed out")
        .await
        .unwrap();
    assert_eq!(c.acquire(&other, 30_000).await.unwrap(), Outcome::Uncertain);
    let view = c.show_action("email-2").await.unwrap();
    assert_eq!(
        (view.status, view.reason.as_str()),
        (KeyStatus::Uncertain, "smtp timed out")
    );
    let slot = c.begin_reconcile(&other, 30_000).await.unwrap();
    assert_eq!(slot.token.len(), 32);
    assert_eq!(
        refusal(c.begin_reconcile(&other, 30_000).await),
        Refusal::ReconcileTaken
    );
    assert_eq!(
        refusal(c.begin_reconcile(&email, 30_000).await),
        Refusal::NotUncertain
    );
    let happened = Resolution {
        happened: true,
        result: "delivered".into(),
        force_retryable: false,
    };
    assert_eq!(
        c.resolve_uncertain(&other, &happened).await.unwrap(),
        Resolved::Completed("delivered".into())
    );
    let later = Resolution {
        result: "other".into(),
        ..happened.clone()
    };
    assert_eq!(
        c.resolve_uncertain(&other, &later).await.unwrap(),
        Resolved::Completed("delivered".into()),
        "first resolution wins"
    );
    c.release_effect(&other, &second).await.unwrap();

    // An unsafe action: "did not happen" needs an explicit force.
    let pay = action("pay-1", "bank", RetrySafety::Unsafe);
    let attempt = granted(c.acquire(&pay, 30_000).await.unwrap());
    c.mark_uncertain(&pay, &attempt, "no answer").await.unwrap();
    c.release_effect(&pay, &attempt).await.unwrap();
    let not_happened = Resolution {
        happened: false,
        result: String::new(),
        force_retryable: false,
    };
    assert_eq!(
        refusal(c.resolve_uncertain(&pay, &not_happened).await),
        Refusal::UnsafeNotRetryable
    );
    let forced = Resolution {
        force_retryable: true,
        ..not_happened
    };
    assert_eq!(
        c.resolve_uncertain(&pay, &forced).await.unwrap(),
        Resolved::Retryable
    );
    let retry = granted(c.acquire(&pay, 30_000).await.unwrap());
    assert_eq!(retry.fence, attempt.fence + 1);
    assert_eq!(
        refusal(c.abandon(&pay, &attempt, "old").await),
        Refusal::FenceStale
    );
    c.abandon(&pay, &retry, "changed my mind").await.unwrap();
    let view = c.show_action("pay-1").await.unwrap();
    assert_eq!(
        (view.status, view.safety),
        (KeyStatus::Idle, RetrySafety::Unsafe)
    );
    assert_eq!(
        refusal(c.mark_uncertain(&pay, &retry, "x").await),
        Refusal::NotHolder
    );

    // ------------------------------------------------------------ fenced sink
    assert_eq!(refusal(c.read_sink("db").await), Refusal::NotFound);
    assert_eq!(c.seen_fence("db").await.unwrap(), 0);
    let written = c.write_fenced("db", 2, b"v2").await.unwrap();
    assert_eq!((written.seen_fence, written.writes), (2, 1));
    assert_eq!(
        refusal(c.write_fenced("db", 1, b"v1").await),
        Refusal::FenceStale
    );
    c.write_fenced("db", 2, b"v2b").await.unwrap();
    assert_eq!(invalid_field(c.write_fenced("db", 0, b"v0").await), "fence");
    let read = c.read_sink("db").await.unwrap();
    assert_eq!(
        (read.seen_fence, read.value.as_slice(), read.writes),
        (2, &b"v2b"[..], 2)
    );
    assert_eq!(c.seen_fence("db").await.unwrap(), 2);

    // ------------------------------------------------------------ checkpoint
    assert_eq!(refusal(c.load("run-1").await), Refusal::NotFound);
    assert_eq!(
        invalid_field(c.save_if_newer("run-1", 0, b"zero").await),
        "seq"
    );
    c.save_if_newer("run-1", 2, b"two").await.unwrap();
    assert_eq!(
        refusal(c.save_if_newer("run-1", 1, b"one").await),
        Refusal::StaleSeq
    );
    assert_eq!(
        refusal(c.save_if_newer("run-1", 2, b"again").await),
        Refusal::StaleSeq
    );
    let saved = c.load("run-1").await.unwrap();
    assert_eq!((saved.seq, saved.data.as_slice()), (2, &b"two"[..]));

    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_state_read_larger_than_grpcs_default_limit_arrives_whole() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    // 30,000 tasks with 200-byte ids: a listing of about 6.4 MB, past gRPC's default 4 MiB.
    let n = 30_000;
    let id = |i: usize| format!("{i:0>200}");
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let specs: Vec<TaskSpec> = chunk.iter().map(|i| spec(&id(*i), &[])).collect();
        c.seed(&specs).await.unwrap();
    }
    let snapshot = c.tasks().await.unwrap();
    assert_eq!(snapshot.tasks.len(), n);
    assert!(snapshot.tasks.iter().all(|t| t.id.len() == 200));

    // Six tickets carrying 1 MiB each: a ticket listing (and `check`) of about 6 MiB.
    for i in 0..6 {
        c.offer(OfferArgs {
            key: format!("big-{i}"),
            from: "a".into(),
            to: "b".into(),
            payload: vec![b'x'; MAX_PAYLOAD_BYTES],
            reply_to: "a".into(),
            ttl_ms: 600_000,
        })
        .await
        .unwrap();
    }
    let tickets = c.tickets().await.unwrap().tickets;
    assert_eq!(tickets.len(), 6);
    assert!(tickets.iter().all(|t| t.payload.len() == MAX_PAYLOAD_BYTES));
    cluster.stop().await;
}

/// A claim of a held task is refused without a log entry on its first attempt, but a retry (the
/// client marks every attempt after the first) goes through the log: an earlier attempt may be in
/// the log unapplied, and only the session table knows its answer. The retry's refusal is then
/// recorded, so a later retry of the same request, after the task was released, gets that same
/// refusal rather than a win the caller would never hear of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_claim_is_judged_through_the_log_and_keeps_its_answer() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    c.seed(&[spec("t", &[])]).await.unwrap();
    let held = c.claim("t", "a", 60_000).await.unwrap();
    let token = held.lease.unwrap().token;
    let mut board = BoardClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let claim = |retry| proto::ClaimTaskRequest {
        header: Some(proto::RequestHeader {
            client_id: 4711,
            seq: 1,
            acked_below: 0,
            retry,
        }),
        id: "t".into(),
        agent: "b".into(),
        ttl_ms: 60_000,
    };
    let taken = |status: tonic::Status| {
        let detail = baton_rpc::error::detail_of(&status).unwrap();
        assert_eq!(detail.code, "TAKEN", "{status:?}");
    };

    let before = c.tasks().await.unwrap().revision;
    taken(board.claim(claim(false)).await.unwrap_err());
    let after_first = c.tasks().await.unwrap().revision;
    assert_eq!(
        after_first, before,
        "a first attempt's refusal needs no log entry"
    );
    taken(board.claim(claim(true)).await.unwrap_err());
    let after_retry = c.tasks().await.unwrap().revision;
    assert_eq!(
        after_retry,
        after_first + 1,
        "the retry went through the log"
    );

    c.release_task("t", &token).await.unwrap();
    taken(board.claim(claim(true)).await.unwrap_err());
    let task = c.tasks().await.unwrap().tasks.remove(0);
    assert!(task.lease.is_none(), "the retry did not win: {task:?}");
    cluster.stop().await;
}

/// A request whose client id and seq were already used for another request gets that request's
/// answer from the session table; where it does not fit, the request is refused SEQ_REUSED
/// naming the reply's kind only, not reported a success, and not shown what the other answer
/// carried. Before, a release under a claim's seq said OK while the task stayed held (and a
/// call that checks its reply's kind put the other reply, token included, in its message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seq_reused_for_another_request_is_not_taken_for_its_answer() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    c.seed(&[spec("t", &[]), spec("u", &[])]).await.unwrap();
    let held = c.claim("u", "a", 60_000).await.unwrap();
    let mut board = BoardClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let header = Some(proto::RequestHeader {
        client_id: 4712,
        seq: 1,
        acked_below: 0,
        retry: false,
    });
    let claimed = board
        .claim(proto::ClaimTaskRequest {
            header,
            id: "t".into(),
            agent: "b".into(),
            ttl_ms: 60_000,
        })
        .await
        .unwrap()
        .into_inner();
    let claim_token = claimed.task.unwrap().lease.unwrap().token;

    // The same client id and seq for a release of the other task.
    let status = board
        .release(proto::ReleaseTaskRequest {
            header,
            id: "u".into(),
            token: held.lease.clone().unwrap().token,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let detail = baton_rpc::error::detail_of(&status).unwrap();
    assert_eq!(detail.code, "SEQ_REUSED");
    assert!(status.message().contains("a Task reply"), "{status:?}");
    assert!(!status.message().contains(&claim_token), "{status:?}");
    let tasks = c.tasks().await.unwrap().tasks;
    let u = tasks.iter().find(|task| task.id == "u").unwrap();
    assert!(u.lease.is_some(), "the release did not run: {u:?}");

    cluster.stop().await;
}

/// A client that sets no `client_id` sends 0. Two such clients would share one session: the
/// second's offer, with the same seq as the first's, would be answered with the first's
/// remembered ticket and never applied. So 0 is refused, and the refused offer made nothing. So
/// is the last seq, which has no successor to raise the session's floor to once it is forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_without_a_client_id_or_with_the_last_seq_is_refused() {
    let cluster = Cluster::start().await;
    let mut handoff = HandoffClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let offer = |key: &str| proto::OfferRequest {
        header: Some(if key == "last" {
            proto::RequestHeader {
                client_id: 7,
                seq: u64::MAX,
                ..Default::default()
            }
        } else {
            proto::RequestHeader {
                seq: 1,
                ..Default::default()
            }
        }),
        key: key.into(),
        from: "a".into(),
        to: "b".into(),
        payload: b"p".to_vec(),
        reply_to: "r".into(),
        ttl_ms: 60_000,
    };
    for (key, field) in [
        ("first", "header.client_id"),
        ("second", "header.client_id"),
        ("last", "header.seq"),
    ] {
        let status = handoff.offer(offer(key)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let detail = baton_rpc::error::detail_of(&status).unwrap();
        assert_eq!(detail.field, field);
        assert_eq!(
            refusal(cluster.client.ticket(key).await),
            Refusal::UnknownKey,
            "the refused offer of {key:?} made no ticket"
        );
    }
    cluster.stop().await;
}

/// Bytes that are no message of the method's type are refused `Invalid` on `request`, as the
/// same bytes are inside a batch (gRPC's own answer is `INTERNAL` with no detail, which says
/// the node failed), and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_request_is_refused_as_invalid() {
    let cluster = Cluster::start().await;
    let mut grpc = support::raw_grpc(&cluster.addr).await;
    let before = cluster.client.tasks().await.unwrap().revision;
    let status = grpc
        .unary::<_, proto::ClaimTaskResponse, _>(
            tonic::Request::new(support::not_a_request()),
            tonic::codegen::http::uri::PathAndQuery::from_static("/baton.v1.Board/Claim"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let detail = baton_rpc::error::detail_of(&status).unwrap();
    assert_eq!(
        (detail.code.as_str(), detail.field.as_str()),
        ("INVALID_ARGUMENT", "request")
    );
    assert_eq!(cluster.client.tasks().await.unwrap().revision, before);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_wire_input_is_refused_with_the_field_it_broke() {
    let cluster = Cluster::start().await;
    let mut effect = EffectClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let header = |seq| proto::RequestHeader {
        client_id: 77,
        seq,
        acked_below: 0,
        ..Default::default()
    };
    let field_of = |status: tonic::Status| {
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let detail = baton_rpc::error::detail_of(&status).unwrap();
        assert_eq!(detail.code, "INVALID_ARGUMENT");
        detail.field
    };
    let bad_safety = proto::AcquireRequest {
        header: Some(header(1)),
        action: Some(proto::Action {
            key: "k".into(),
            resource: "r".into(),
            safety: "sometimes".into(),
        }),
        ttl_ms: 1_000,
    };
    let status = effect.acquire(bad_safety).await.unwrap_err();
    assert_eq!(field_of(status), "action.safety");
    let no_action = proto::AcquireRequest {
        header: Some(header(2)),
        action: None,
        ttl_ms: 1_000,
    };
    assert_eq!(
        field_of(effect.acquire(no_action).await.unwrap_err()),
        "action"
    );
    let no_header = proto::AcquireRequest {
        header: None,
        action: Some(proto::Action {
            key: "k".into(),
            resource: "r".into(),
            safety: "safe".into(),
        }),
        ttl_ms: 1_000,
    };
    assert_eq!(
        field_of(effect.acquire(no_header).await.unwrap_err()),
        "header"
    );
    let no_lease = proto::CompleteEffectRequest {
        header: Some(header(3)),
        action: Some(proto::Action {
            key: "k".into(),
            resource: "r".into(),
            safety: "safe".into(),
        }),
        lease: None,
        result: String::new(),
    };
    assert_eq!(
        field_of(effect.complete(no_lease).await.unwrap_err()),
        "lease"
    );
    let no_resolution = proto::ResolveUncertainRequest {
        header: Some(header(4)),
        action: Some(proto::Action {
            key: "k".into(),
            resource: "r".into(),
            safety: "unsafe".into(),
        }),
        resolution: None,
    };
    assert_eq!(
        field_of(effect.resolve_uncertain(no_resolution).await.unwrap_err()),
        "resolution"
    );
    cluster.stop().await;
}

/// A hold (board claim or renewal; side-effect acquire, renewal or reconcile) of more than a
/// day and a ticket of more than 30 days are refused `Invalid` on `ttl` before the log (a TTL of
/// years was a hold for good, or a handoff without a deadline), and the bound itself is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_past_their_bound_are_refused_before_the_log() {
    const DAY: i64 = 24 * 3600 * 1000;
    const TICKET_MAX: i64 = 30 * DAY;
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    let revision = || async { c.tasks().await.unwrap().revision };
    // Refused on `ttl`, with nothing written.
    macro_rules! refused_before_the_log {
        ($call:expr) => {{
            let before = revision().await;
            assert_eq!(invalid_field($call.await), "ttl");
            assert_eq!(revision().await, before, "refused before the log");
        }};
    }

    c.seed(&[spec("long", &[])]).await.unwrap();
    refused_before_the_log!(c.claim("long", "a", DAY + 1));
    let held = c.claim("long", "a", DAY).await.unwrap();
    let token = held.lease.unwrap().token;
    refused_before_the_log!(c.renew_task("long", &token, DAY + 1));
    c.renew_task("long", &token, DAY).await.unwrap();

    let act = action("long-effect", "r", RetrySafety::Safe);
    refused_before_the_log!(c.acquire(&act, DAY + 1));
    let lease = granted(c.acquire(&act, DAY).await.unwrap());
    refused_before_the_log!(c.renew_effect(&act, &lease, DAY + 1));
    let lease = c.renew_effect(&act, &lease, DAY).await.unwrap();
    c.mark_uncertain(&act, &lease, "crashed mid-call")
        .await
        .unwrap();
    refused_before_the_log!(c.begin_reconcile(&act, DAY + 1));
    c.begin_reconcile(&act, DAY).await.unwrap();

    let offer = |ttl_ms| {
        c.offer(OfferArgs {
            key: "long-ticket".into(),
            from: "src".into(),
            to: "dst".into(),
            payload: Vec::new(),
            reply_to: "src".into(),
            ttl_ms,
        })
    };
    refused_before_the_log!(offer(TICKET_MAX + 1));
    refused_before_the_log!(offer(i64::MAX));
    offer(TICKET_MAX).await.unwrap();
    cluster.stop().await;
}

/// A read naming a key no command could have written (empty, or over 512 bytes; a sink resource
/// over 2 KiB) is refused as invalid input, naming the field, rather than answered "not found"
/// (contract §0, Validation): `seen_fence("")` must not say 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_malformed_keys_are_refused_with_the_field() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    let long = "k".repeat(513);
    for key in ["", long.as_str()] {
        assert_eq!(invalid_field(c.ticket(key).await), "key");
        assert_eq!(invalid_field(c.show_action(key).await), "key");
        assert_eq!(invalid_field(c.load(key).await), "run");
    }
    let longer = "r".repeat(baton_statemachine::limits::MAX_RESOURCE_BYTES + 1);
    for resource in ["", longer.as_str()] {
        assert_eq!(invalid_field(c.read_sink(resource).await), "resource");
        assert_eq!(invalid_field(c.seen_fence(resource).await), "resource");
    }
    // A resource as long as a namespaced concurrency key may be read (and written, once the
    // cluster applies rules 1).
    assert_eq!(c.seen_fence(&"r".repeat(1_277)).await.unwrap(), 0);
    // Well-formed keys that were never written are still "not found".
    assert_eq!(refusal(c.ticket("none").await), Refusal::UnknownKey);
    assert_eq!(c.seen_fence("none").await.unwrap(), 0);
    cluster.stop().await;
}

/// Deadlines are `store clock + ttl`, and the store clock follows the leader's wall clock
/// (contract §0 "Store clock"): neither behind it nor ahead of it. The store clock is the largest
/// leader stamp so far, and the leader here shares this machine's wall clock, so a write's
/// store time lies between the wall clock before it was sent and after its answer came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_and_save_times_follow_the_store_clock() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    c.seed(&[spec("t", &[])]).await.unwrap();
    let before = wall_clock_ms();
    let lease = c.claim("t", "agent", 30_000).await.unwrap().lease.unwrap();
    let after = wall_clock_ms();
    assert!(
        (before + 30_000..=after + 30_000).contains(&lease.until_ms),
        "claim deadline {} is not store clock + ttl (wall clock went from {before} to {after})",
        lease.until_ms
    );
    let before = wall_clock_ms();
    let effect = granted(
        c.acquire(&action("k", "r", RetrySafety::Safe), 5_000)
            .await
            .unwrap(),
    );
    let after = wall_clock_ms();
    assert!(
        (before + 5_000..=after + 5_000).contains(&effect.until_ms),
        "intent until {} is not store clock + ttl (wall clock went from {before} to {after})",
        effect.until_ms
    );
    let before = wall_clock_ms();
    c.save_if_newer("run", 1, b"x").await.unwrap();
    let after = wall_clock_ms();
    let saved = c.load("run").await.unwrap();
    assert!(
        (before..=after).contains(&saved.saved_at_ms),
        "saved_at {} is not the store clock (wall clock went from {before} to {after})",
        saved.saved_at_ms
    );
    cluster.stop().await;
}

/// `Initialize` refuses a member list with a node listed twice or without a `host:port`
/// address, and the node stays uninitialised; before, the duplicate was kept with its last
/// address and an empty or portless address was taken as given (its node then unreachable for
/// good). A learner's address is held to the same rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_refuses_duplicate_and_addressless_members() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = baton_node::config::NodeConfig::new(
        1,
        listener.local_addr().unwrap(),
        dir.path().join("node-1"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(baton_node::server::serve(config, listener, async move {
        let _ = stopped.await;
    }));
    let client = baton_rpc::Client::new(
        &[addr.as_str()],
        baton_rpc::ClientConfig {
            deadline: std::time::Duration::from_secs(10),
            ..Default::default()
        },
    )
    .unwrap();
    let twice = [
        (1, addr.clone()),
        (2, "127.0.0.1:1".into()),
        (2, "127.0.0.1:2".into()),
    ];
    let addressless = [(1, addr.clone()), (2, " ".to_string())];
    let portless = [(1, addr.clone()), (2, "127.0.0.1".to_string())];
    for (members, why) in [
        (&twice[..], "node 2 is listed twice"),
        (&addressless[..], "node 2 has no address"),
        (
            &portless[..],
            "node 2's address: \"127.0.0.1\" is not host:port (e.g. 10.0.0.5:7001)",
        ),
    ] {
        match client.initialize(&addr, members).await {
            Err(Error::Refused(Refusal::Invalid { field, rule })) => {
                assert_eq!(field, "members");
                assert_eq!(rule, why);
            }
            other => panic!("{members:?}: {other:?}"),
        }
        let info = client.node_info(&addr).await.unwrap();
        assert!(!info.initialized, "{members:?}: initialised anyway");
    }
    client
        .initialize(&addr, &[(1, addr.clone())])
        .await
        .unwrap();
    let connected = baton_rpc::Client::connect_with(
        &[addr.as_str()],
        baton_rpc::ClientConfig {
            deadline: std::time::Duration::from_secs(10),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    match connected.add_learner(2, "10.0.0.2").await {
        Err(Error::Refused(Refusal::Invalid { field, .. })) => assert_eq!(field, "addr"),
        other => panic!("a portless learner: {other:?}"),
    }
    // A member's id at another address, a member's address under another id, or a voter
    // again (a rebuilt node under its old id) is refused: openraft would answer the unchanged
    // membership as if the node had been added.
    for (id, learner, says) in [
        (1, "127.0.0.1:9", "node 1 is already a member"),
        (2, addr.as_str(), "already the address of node 1"),
        (1, addr.as_str(), "node 1 is already a voter"),
    ] {
        match connected.add_learner(id, learner).await {
            Err(Error::Server { code, message }) => {
                assert_eq!(code, "MEMBERSHIP");
                assert!(message.contains(says), "{message}");
            }
            other => panic!("node {id} at {learner}: {other:?}"),
        }
    }
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// A reply whose receipt cannot be decoded (none, or an unknown status) is still told first why
/// it could not settle the ticket anyway, as the store judges a decoded one (contract §1: the
/// receipt is judged last); only a reply that could settle it hears about its receipt. Before,
/// every such reply was refused INVALID_ARGUMENT, whatever the ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_with_an_undecodable_receipt_is_judged_against_the_ticket_first() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    c.offer(support::offer("k")).await.unwrap();
    let handle = c.take("k", "b").await.unwrap();
    let mut handoff =
        proto::handoff_client::HandoffClient::connect(format!("http://{}", cluster.addr))
            .await
            .unwrap();
    let mut seq = 0;
    let mut reply = |key: &str, token: &str, receipt: Option<proto::Receipt>| {
        seq += 1;
        proto::ReplyRequest {
            header: Some(proto::RequestHeader {
                client_id: 4713,
                seq,
                acked_below: 0,
                retry: false,
            }),
            key: key.into(),
            token: token.into(),
            receipt,
        }
    };
    let bogus = Some(proto::Receipt {
        status: "bogus".into(),
        summary: "s".into(),
        ..Default::default()
    });
    for (request, want) in [
        (reply("nope", &handle.token, None), "UNKNOWN_KEY"),
        (reply("k", "not-a-token", bogus.clone()), "LEASE_LOST"),
        (reply("k", &handle.token, bogus.clone()), "INVALID_ARGUMENT"),
        (reply("k", &handle.token, None), "INVALID_ARGUMENT"),
    ] {
        let status = handoff.reply(request).await.unwrap_err();
        let detail = baton_rpc::error::detail_of(&status).unwrap();
        assert_eq!(detail.code, want, "{status:?}");
    }
    // Without a header it is told so first, whatever its receipt.
    let mut headless = reply("k", &handle.token, bogus.clone());
    headless.header = None;
    let status = handoff.reply(headless).await.unwrap_err();
    let detail = baton_rpc::error::detail_of(&status).unwrap();
    assert_eq!(detail.field, "header", "{status:?}");
    let ticket = c.ticket("k").await.unwrap();
    assert_eq!(
        ticket.state,
        baton_statemachine::handoff::TicketState::Accepted
    );
    cluster.stop().await;
}

/// Every token is fresh 128-bit randomness the leader drew for that one command (contract §0,
/// "minted by the store"): takes and claims sent at once, so that the client batches them and
/// the leader packs many into one Raft entry, each get a token of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_gets_its_own_token_even_within_one_entry() {
    const N: usize = 64;
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    let ids: Vec<String> = (0..N).map(|i| format!("task-{i}")).collect();
    let specs: Vec<TaskSpec> = ids.iter().map(|id| spec(id, &[])).collect();
    c.seed(&specs).await.unwrap();
    let offers = ids.iter().map(|key| {
        c.offer(OfferArgs {
            key: key.clone(),
            from: "src".into(),
            to: "dst".into(),
            payload: Vec::new(),
            reply_to: "src".into(),
            ttl_ms: 60_000,
        })
    });
    for offered in futures::future::join_all(offers).await {
        offered.unwrap();
    }

    let claims = futures::future::join_all(ids.iter().map(|id| c.claim(id, "agent", 60_000)));
    let takes = futures::future::join_all(ids.iter().map(|key| c.take(key, "dst")));
    let (claims, takes) = tokio::join!(claims, takes);
    let mut tokens: Vec<String> = claims
        .into_iter()
        .map(|claimed| claimed.unwrap().lease.unwrap().token)
        .collect();
    tokens.extend(takes.into_iter().map(|taken| taken.unwrap().token));

    for token in &tokens {
        assert_eq!(token.len(), 32, "128-bit hex: {token}");
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
    }
    let distinct: std::collections::BTreeSet<&String> = tokens.iter().collect();
    assert_eq!(distinct.len(), 2 * N, "tokens repeat: {tokens:?}");
    // Randomness, not a counter: a counter's tokens share all but their last few hex digits.
    let prefixes: std::collections::BTreeSet<&str> = tokens.iter().map(|t| &t[..8]).collect();
    assert!(prefixes.len() > N, "tokens look sequential: {tokens:?}");
    cluster.stop().await;
}
