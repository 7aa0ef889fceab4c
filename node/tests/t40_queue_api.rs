//! The keyed-concurrency task queue through gRPC against an in-process single-node cluster: every
//! client call with typed results and refusals, paged task listings, the long-poll lease, and the
//! worker runtime end to end.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_rpc::proto::queue_client::QueueClient;
use baton_rpc::worker::{TaskContext, TaskError, Worker, WorkerSummary};
use baton_rpc::{proto, Client, Error};
use baton_statemachine::queue::{
    AttemptOutcome, Task, TaskFilter, TaskSpec, TaskState, MAX_LIST_PAGE,
};
use baton_statemachine::Refusal;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

mod support;
use support::Cluster;

/// The longest lease or renewal the store grants (24 h).
const DAY_MS: i64 = 24 * 3600 * 1000;

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

fn spec(queue: &str, idempotency_key: &str, handler: &str, concurrency_key: &str) -> TaskSpec {
    TaskSpec {
        queue: queue.into(),
        idempotency_key: idempotency_key.into(),
        handler: handler.into(),
        handler_version: "v1".into(),
        payload_version: "v1".into(),
        payload: format!(r#"{{"op":"{idempotency_key}"}}"#).into_bytes(),
        concurrency_key: concurrency_key.into(),
        business_key: String::new(),
        max_attempts: 3,
        ttl_ms: 600_000,
    }
}

fn ids(tasks: &[Task]) -> Vec<u64> {
    tasks.iter().map(|t| t.id).collect()
}

/// The Raft log index the store has applied (via a linearizable board read).
async fn revision(client: &Client) -> u64 {
    client.tasks().await.unwrap().revision
}

/// Waits until the task reaches `state` (panics after `limit`).
async fn wait_for_state(client: &Client, id: u64, state: TaskState, limit: Duration) -> Task {
    let until = Instant::now() + limit;
    loop {
        let task = client.queue_task(id).await.unwrap();
        if task.state == state {
            return task;
        }
        assert!(
            Instant::now() < until,
            "task {id} is {} ({:?}), want {} within {limit:?}",
            task.state.as_str(),
            task.last_error,
            state.as_str()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_queue_call_answers_typed_results_and_refusals() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;

    // ------------------------------------------------------------ queues and workers
    let q1 = c.create_queue("q1", "ns").await.unwrap();
    assert_eq!((q1.name.as_str(), q1.namespace.as_str()), ("q1", "ns"));
    assert_eq!(c.create_queue("q1", "ns").await.unwrap(), q1, "idempotent");
    assert_eq!(
        refusal(c.create_queue("q1", "elsewhere").await),
        Refusal::StateConflict
    );
    assert_eq!(invalid_field(c.create_queue("", "ns").await), "queue.name");
    c.create_queue("q2", "ns").await.unwrap();
    let names: Vec<String> = c
        .queues()
        .await
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, vec!["q1", "q2"]);

    let keyed = c.register_worker("w-keys", true).await.unwrap();
    assert!(keyed.concurrency_keys);
    assert!(
        !c.register_worker("w-plain", false)
            .await
            .unwrap()
            .concurrency_keys
    );
    assert_eq!(
        refusal(c.register_worker("w-keys", false).await),
        Refusal::StateConflict,
        "the capability is fixed for the identity's life"
    );
    assert_eq!(invalid_field(c.register_worker("", true).await), "worker");

    // ------------------------------------------------------------ submit
    let a_spec = spec("q1", "op-a", "object.update", "object/1");
    let a = c.submit(&a_spec).await.unwrap();
    assert!(!a.replayed);
    assert_eq!(a.task.state, TaskState::Waiting);
    assert_eq!(a.task.namespace, "ns");
    assert_eq!(a.task.spec, a_spec);
    let again = c.submit(&a_spec).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.task.id, a.task.id, "the original receipt");
    let mut other_key = a_spec.clone();
    other_key.concurrency_key = "object/2".into();
    assert_eq!(
        refusal(c.submit(&other_key).await),
        Refusal::IdempotencyConflict
    );
    assert_eq!(
        refusal(c.submit(&spec("nope", "op-x", "h", "")).await),
        Refusal::UnknownQueue
    );
    assert_eq!(
        invalid_field(c.submit(&spec("q1", "op-ws", "h", " object/1")).await),
        "concurrency_key"
    );
    let mut zero_attempts = spec("q1", "op-z", "h", "");
    zero_attempts.max_attempts = 0;
    assert_eq!(
        invalid_field(c.submit(&zero_attempts).await),
        "max_attempts"
    );

    let b = c
        .submit(&spec("q2", "op-b", "object.update", "object/1"))
        .await
        .unwrap()
        .task;
    let u = c
        .submit(&spec("q1", "op-u", "plain", ""))
        .await
        .unwrap()
        .task;
    let a = a.task;

    // ------------------------------------------------------------ reads
    let got = c.queue_task(a.id).await.unwrap();
    assert_eq!(
        got.spec.payload, a_spec.payload,
        "the task read carries the payload"
    );
    assert_eq!(refusal(c.queue_task(9_999).await), Refusal::UnknownTask);
    let by_key = TaskFilter {
        concurrency_key: Some("object/1".into()),
        ..TaskFilter::default()
    };
    assert_eq!(
        ids(&c.queue_tasks(&by_key).await.unwrap()),
        vec![a.id, b.id]
    );
    let by_queue = TaskFilter {
        queue: Some("q1".into()),
        ..TaskFilter::default()
    };
    let listed = c.queue_tasks(&by_queue).await.unwrap();
    assert_eq!(ids(&listed), vec![a.id, u.id]);
    assert!(
        listed.iter().all(|t| t.spec.payload.is_empty()),
        "listings are summaries"
    );
    let waiting = TaskFilter {
        state: Some(TaskState::Waiting),
        ..TaskFilter::default()
    };
    assert_eq!(
        ids(&c.queue_tasks(&waiting).await.unwrap()),
        vec![a.id, b.id, u.id]
    );
    assert_eq!(
        c.attempts(a.id).await.unwrap().attempts,
        vec![],
        "no attempt yet"
    );
    assert_eq!(refusal(c.attempts(9_999).await), Refusal::UnknownTask);

    // ------------------------------------------------------------ lease
    let queues = vec!["q1".to_string(), "q2".to_string()];
    let plain = c
        .lease("w-plain", &queues, 10, 30_000, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        plain.len(),
        1,
        "a worker without keys never gets keyed tasks"
    );
    assert_eq!((plain[0].task_id, plain[0].token), (u.id, None));
    assert_eq!(
        refusal(
            c.lease("w-ghost", &queues, 10, 30_000, Duration::ZERO)
                .await
        ),
        Refusal::UnknownWorker
    );
    assert_eq!(
        refusal(
            c.lease(
                "w-keys",
                &["nope".to_string()],
                10,
                30_000,
                Duration::from_secs(5)
            )
            .await
        ),
        Refusal::UnknownQueue,
        "refused at once, not after the wait"
    );
    assert_eq!(
        invalid_field(c.lease("w-keys", &queues, 0, 30_000, Duration::ZERO).await),
        "limit"
    );
    assert_eq!(
        invalid_field(c.lease("w-keys", &queues, 10, 0, Duration::ZERO).await),
        "ttl"
    );
    // A long poll is judged again at every apply: its list of queues is bounded.
    let too_many = vec![queues[0].clone(); 257];
    assert_eq!(
        invalid_field(
            c.lease("w-keys", &too_many, 10, 30_000, Duration::ZERO)
                .await
        ),
        "queues"
    );
    // A lease outlives a crashed worker and holds its key: a day at most, and the refused
    // lease took nothing (the next one gets the task).
    assert_eq!(
        invalid_field(
            c.lease("w-keys", &queues, 10, DAY_MS + 1, Duration::ZERO)
                .await
        ),
        "ttl"
    );
    let first = c
        .lease("w-keys", &queues, 10, 30_000, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(first.len(), 1, "one active attempt per key across queues");
    assert_eq!(first[0].task_id, a.id);
    assert_eq!(first[0].concurrency_key, "object/1");
    let t1 = first[0].token.unwrap();
    assert!(t1 > 0);

    // ------------------------------------------------------------ attempt lifecycle
    assert_eq!(
        refusal(c.complete_attempt(a.id, 1, "w-keys", b"r").await),
        Refusal::NotStarted
    );
    assert_eq!(
        refusal(c.report_unknown(a.id, 1, "w-keys", "?").await),
        Refusal::NotStarted
    );
    assert_eq!(
        refusal(c.start_attempt(a.id, 1, "w-plain").await),
        Refusal::LeaseLost
    );
    assert_eq!(
        refusal(c.start_attempt(9_999, 1, "w-keys").await),
        Refusal::UnknownTask
    );
    let running = c.start_attempt(a.id, 1, "w-keys").await.unwrap();
    assert_eq!(running.state, TaskState::Running);
    assert_eq!(
        c.start_attempt(a.id, 1, "w-keys").await.unwrap().state,
        TaskState::Running,
        "a resume of the same attempt"
    );
    assert_eq!(refusal(c.cancel_task(a.id).await), Refusal::AlreadyStarted);
    let renewed = c.renew_attempt(a.id, 1, "w-keys", 60_000).await.unwrap();
    let attempt = renewed.attempts.last().unwrap();
    assert_eq!(attempt.token, Some(t1), "renewal keeps the token");
    assert!(attempt.lease_until_ms > first[0].lease_until_ms);
    assert_eq!(
        refusal(c.renew_attempt(a.id, 2, "w-keys", 60_000).await),
        Refusal::LeaseLost
    );
    assert_eq!(
        invalid_field(c.renew_attempt(a.id, 1, "w-keys", 0).await),
        "ttl"
    );
    let before = revision(c).await;
    assert_eq!(
        invalid_field(c.renew_attempt(a.id, 1, "w-keys", DAY_MS + 1).await),
        "ttl"
    );
    assert_eq!(revision(c).await, before, "refused before the log");
    let day = c.renew_attempt(a.id, 1, "w-keys", DAY_MS).await.unwrap();
    let lease_until = day.attempts.last().unwrap().lease_until_ms;
    assert!(lease_until >= attempt.lease_until_ms + DAY_MS as u64 - 60_000);
    assert!(
        c.lease("w-keys", &queues, 10, 30_000, Duration::ZERO)
            .await
            .unwrap()
            .is_empty(),
        "the key stays busy while its attempt runs"
    );
    let done = c.complete_attempt(a.id, 1, "w-keys", b"ok").await.unwrap();
    assert_eq!(done.state, TaskState::Succeeded);
    assert_eq!(done.result, b"ok");
    assert_eq!(
        c.complete_attempt(a.id, 1, "w-keys", b"ok")
            .await
            .unwrap()
            .state,
        TaskState::Succeeded,
        "a repeated completion answers the task unchanged"
    );

    // The key's permit is free again: B (the other queue) gets a larger token.
    let second = c
        .lease("w-keys", &queues, 10, 30_000, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].task_id, b.id);
    let t2 = second[0].token.unwrap();
    assert!(t2 > t1, "tokens strictly increase: {t1} then {t2}");
    c.start_attempt(b.id, 1, "w-keys").await.unwrap();
    let retry = c
        .fail_attempt(b.id, 1, "w-keys", "try again", true)
        .await
        .unwrap();
    assert_eq!(retry.state, TaskState::RetryWait);
    assert_eq!(retry.last_error, "try again");

    // U: unknown effect -> needs review.
    c.start_attempt(u.id, 1, "w-plain").await.unwrap();
    let review = c
        .report_unknown(u.id, 1, "w-plain", "the call timed out")
        .await
        .unwrap();
    assert_eq!(review.state, TaskState::NeedsReview);

    // B retries after its back-off (the permit was released meanwhile), with a larger token;
    // a non-retryable failure ends it.
    let retried = c
        .lease("w-keys", &queues, 10, 30_000, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(retried.len(), 1);
    assert_eq!((retried[0].task_id, retried[0].attempt), (b.id, 2));
    let t3 = retried[0].token.unwrap();
    assert!(t3 > t2);
    c.start_attempt(b.id, 2, "w-keys").await.unwrap();
    let failed = c
        .fail_attempt(b.id, 2, "w-keys", "bad payload", false)
        .await
        .unwrap();
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(
        refusal(c.fail_attempt(b.id, 1, "w-keys", "late", true).await),
        Refusal::LeaseLost,
        "an old attempt's late report"
    );

    // Attempt history with tokens.
    let history = c.attempts(b.id).await.unwrap();
    assert_eq!(history.concurrency_key, "object/1");
    let summary: Vec<_> = history
        .attempts
        .iter()
        .map(|a| (a.number, a.worker.as_str(), a.token, a.outcome))
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, "w-keys", Some(t2), AttemptOutcome::Failed),
            (2, "w-keys", Some(t3), AttemptOutcome::Failed),
        ]
    );
    let unkeyed = c.attempts(u.id).await.unwrap();
    assert_eq!(unkeyed.attempts[0].token, None);
    assert_eq!(unkeyed.attempts[0].outcome, AttemptOutcome::Unknown);

    // ------------------------------------------------------------ cancel
    let d = c
        .submit(&spec("q2", "op-d", "h", "object/9"))
        .await
        .unwrap()
        .task;
    let cancelled = c.cancel_task(d.id).await.unwrap();
    assert_eq!(cancelled.state, TaskState::Cancelled);
    assert_eq!(refusal(c.cancel_task(d.id).await), Refusal::AlreadySettled);
    assert_eq!(refusal(c.cancel_task(9_999).await), Refusal::UnknownTask);
    // Cancelling a leased (not started) attempt frees its permit.
    let e = c
        .submit(&spec("q2", "op-e", "h", "object/9"))
        .await
        .unwrap()
        .task;
    let leased = c
        .lease("w-keys", &queues, 10, 30_000, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(leased[0].task_id, e.id);
    assert_eq!(
        c.cancel_task(e.id).await.unwrap().state,
        TaskState::Cancelled
    );
    assert_eq!(
        refusal(c.start_attempt(e.id, 1, "w-keys").await),
        Refusal::LeaseLost
    );

    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_wire_input_is_refused_with_the_field_it_broke() {
    let cluster = Cluster::start().await;
    cluster.client.create_queue("q", "ns").await.unwrap();
    let mut queue = QueueClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let header = |seq| proto::RequestHeader {
        client_id: 78,
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
    let submit = |seq, key: &[u8]| proto::SubmitRequest {
        header: Some(header(seq)),
        queue: "q".into(),
        idempotency_key: format!("op-{seq}"),
        handler: "h".into(),
        handler_version: "v1".into(),
        payload_version: "v1".into(),
        payload: b"{}".to_vec(),
        concurrency_key: key.to_vec(),
        business_key: String::new(),
        max_attempts: 3,
        ttl_ms: 60_000,
    };
    // Invalid UTF-8 in the key is a typed INVALID_ARGUMENT, not a decoding failure.
    let status = queue
        .submit(submit(1, &[b'o', 0xff, b'k']))
        .await
        .unwrap_err();
    assert_eq!(field_of(status), "concurrency_key");
    let status = queue.submit(submit(2, b"a\nb")).await.unwrap_err();
    assert_eq!(field_of(status), "concurrency_key");
    let ok = queue
        .submit(submit(3, "caf\u{e9}".as_bytes()))
        .await
        .unwrap();
    assert_eq!(ok.into_inner().task.unwrap().concurrency_key, "caf\u{e9}");

    let bad_state = proto::ListQueueTasksRequest {
        state: Some("SLEEPING".into()),
        ..Default::default()
    };
    assert_eq!(
        field_of(queue.list_tasks(bad_state).await.unwrap_err()),
        "state"
    );
    let status = queue
        .get_task(proto::GetQueueTaskRequest { id: 42 })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert_eq!(
        baton_rpc::error::detail_of(&status).unwrap().code,
        "UNKNOWN_TASK"
    );
    let no_header = proto::LeaseRequest {
        header: None,
        worker_id: "w".into(),
        queues: vec![],
        limit: 1,
        lease_ttl_ms: 1_000,
        wait_ms: 0,
    };
    assert_eq!(
        field_of(queue.lease(no_header).await.unwrap_err()),
        "header"
    );

    cluster.stop().await;
}

/// The edge's own limits (a lease's TTL and queue count) never refuse a retry the store has
/// already answered: a node of an earlier version may have applied it, and a lease whose answer
/// was lost must learn what it leased. Here the store answered the first attempt (a lease within
/// the limits); its retry, past them, gets that same answer. A first attempt past them is
/// refused, and so is a retry the store never saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_the_store_answered_is_not_refused_by_the_edge_limits() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    c.create_queue("q", "ns").await.unwrap();
    c.register_worker("w", false).await.unwrap();
    let task = c.submit(&spec("q", "op", "h", "")).await.unwrap().task;
    let mut queue = QueueClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let lease = |seq, retry, lease_ttl_ms| proto::LeaseRequest {
        header: Some(proto::RequestHeader {
            client_id: 79,
            seq,
            acked_below: 0,
            retry,
        }),
        worker_id: "w".into(),
        queues: vec!["q".into()],
        limit: 1,
        lease_ttl_ms,
        wait_ms: 0,
    };
    let refused_field = |status: tonic::Status| {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        baton_rpc::error::detail_of(&status).unwrap().field
    };
    let first = queue.lease(lease(1, false, 30_000)).await.unwrap();
    let leased = first.into_inner().assignments;
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].task_id, task.id);

    let retry = queue.lease(lease(1, true, DAY_MS * 2)).await.unwrap();
    assert_eq!(
        retry.into_inner().assignments,
        leased,
        "the retry gets the answer the store gave"
    );
    let mut many = lease(1, true, 30_000);
    many.queues = vec!["q".into(); 257];
    assert_eq!(
        queue.lease(many).await.unwrap().into_inner().assignments,
        leased
    );

    let new = queue.lease(lease(2, false, DAY_MS * 2)).await.unwrap_err();
    assert_eq!(refused_field(new), "ttl");
    let unseen_retry = queue.lease(lease(3, true, DAY_MS * 2)).await.unwrap_err();
    assert_eq!(refused_field(unseen_retry), "ttl");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_listings_come_in_pages_that_add_up_to_every_task_once() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    c.create_queue("a", "ns").await.unwrap();
    c.create_queue("b", "ns").await.unwrap();
    // More than one page of the client's own size, so `queue_tasks` has to go on.
    let n = MAX_LIST_PAGE as usize + 50;
    let mut submitters = tokio::task::JoinSet::new();
    for lane in 0..32 {
        let c = c.clone();
        submitters.spawn(async move {
            for i in (lane..n).step_by(32) {
                let queue = if i % 10 == 0 { "b" } else { "a" };
                c.submit(&spec(queue, &format!("t{i}"), "h", ""))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = submitters.join_next().await {
        done.unwrap();
    }

    let all = TaskFilter::default();
    let listed = ids(&c.queue_tasks(&all).await.unwrap());
    assert_eq!(listed.len(), n, "every task once");
    assert!(listed.windows(2).all(|w| w[0] < w[1]), "by id, no repeats");

    // Small pages of one queue chain up to the same tasks as one filtered listing.
    let in_b = TaskFilter {
        queue: Some("b".into()),
        ..TaskFilter::default()
    };
    let mut paged = Vec::new();
    let mut after_id = 0;
    loop {
        let page = c.queue_tasks_page(&in_b, after_id, 300).await.unwrap();
        assert!(page.tasks.len() <= 300);
        assert!(page.tasks.iter().all(|t| t.spec.queue == "b"));
        paged.extend(ids(&page.tasks));
        match page.next_after_id {
            Some(next) => after_id = next,
            None => break,
        }
    }
    assert_eq!(paged.len(), n.div_ceil(10));
    assert_eq!(paged, ids(&c.queue_tasks(&in_b).await.unwrap()));

    // On the wire: 0 is the default page, too large a page is refused naming the field.
    let mut queue = QueueClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let page = |after_id, limit| proto::ListQueueTasksRequest {
        after_id,
        limit,
        ..Default::default()
    };
    let first = queue.list_tasks(page(0, 0)).await.unwrap().into_inner();
    assert_eq!(first.tasks.len(), 1_000);
    assert_eq!(first.next_after_id, first.tasks[999].id);
    let last = queue
        .list_tasks(page(listed[n - 2], 10))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(last.tasks.len(), 1);
    assert_eq!(last.next_after_id, 0, "the last page says so");
    let status = queue
        .list_tasks(page(0, MAX_LIST_PAGE + 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(baton_rpc::error::detail_of(&status).unwrap().field, "limit");

    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_long_poll_lease_waits_without_writing_and_wakes_on_a_submission() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    c.create_queue("lp", "ns").await.unwrap();
    c.register_worker("poller", true).await.unwrap();
    let queues = vec!["lp".to_string()];

    // Nothing to lease: the call waits out wait_ms and answers empty, having written only the
    // one lease at the end (no busy polling through the log).
    let before = revision(&c).await;
    let started = Instant::now();
    let empty = c
        .lease("poller", &queues, 4, 30_000, Duration::from_millis(800))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(empty.is_empty());
    assert!(
        waited >= Duration::from_millis(750),
        "answered after {waited:?}"
    );
    // Ten times the wait, and short of the client's 10.8 s deadline for the call (a lease that
    // ignored wait_ms would wait the 30 s cap and fail there).
    assert!(waited < Duration::from_secs(8), "answered after {waited:?}");
    let written = revision(&c).await - before;
    assert!(
        (1..=2).contains(&written),
        "{written} log entries for one idle long poll (the lease, maybe a sweep)"
    );

    // A submission while the lease waits wakes it well before wait_ms.
    let poll = {
        let c = c.clone();
        let queues = queues.clone();
        tokio::spawn(async move {
            let leased = c
                .lease("poller", &queues, 4, 30_000, Duration::from_secs(20))
                .await;
            (leased, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let submitted_at = Instant::now();
    let task = c
        .submit(&spec("lp", "wake-up", "h", "object/lp"))
        .await
        .unwrap()
        .task;
    let (leased, answered_at) = poll.await.unwrap();
    let leased = leased.unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].task_id, task.id);
    let latency = answered_at - submitted_at;
    // Half the 20 s wait_ms it would otherwise have waited out.
    assert!(
        latency < Duration::from_secs(10),
        "the waiting lease answered {latency:?} after the submission"
    );

    // A retried header gets the first answer from the session table, at once, even with a long
    // wait and nothing left to lease.
    let mut raw = QueueClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let second = c
        .submit(&spec("lp", "retried", "h", ""))
        .await
        .unwrap()
        .task;
    let request = || proto::LeaseRequest {
        header: Some(proto::RequestHeader {
            client_id: 4242,
            seq: 1,
            acked_below: 0,
            ..Default::default()
        }),
        worker_id: "poller".into(),
        queues: queues.clone(),
        limit: 4,
        lease_ttl_ms: 30_000,
        wait_ms: 20_000,
    };
    let answer = raw.lease(request()).await.unwrap().into_inner();
    let first = answer.assignments;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].task_id, second.id);
    // The answer says what is left of the lease: all of it, as it was just granted.
    let left = first[0].lease_until_ms.saturating_sub(answer.now_ms);
    assert!(
        (29_000..=30_000).contains(&left),
        "{left} ms of a fresh 30 s lease left"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let started = Instant::now();
    let replayed = raw.lease(request()).await.unwrap().into_inner();
    assert_eq!(
        replayed.assignments, first,
        "the same assignments, not a second lease"
    );
    // Half the 20 s a replay that waited again for something to lease would take.
    let replay_took = started.elapsed();
    assert!(
        replay_took < Duration::from_secs(10),
        "the replayed answer came after {replay_took:?}"
    );
    // A replayed answer is made now: what is left of the lease is less by the time since the
    // grant, so a worker that got only this answer does not count the whole TTL from its arrival.
    let left = first[0].lease_until_ms.saturating_sub(replayed.now_ms);
    assert!(
        left <= 29_400,
        "{left} ms left of a 30 s lease granted 600 ms before the replay"
    );

    cluster.stop().await;
}

/// Tasks with payloads near the largest allowed, as many as the worker has slots: every lease
/// answer reaches the worker (the store hands out no more than an answer can carry), and tasks
/// it did not hand out stay waiting instead of being held by attempts nobody runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_large_tasks_reach_the_worker() {
    let cluster = Cluster::start().await;
    let c = &cluster.client;
    c.create_queue("big", "ns").await.unwrap();
    c.register_worker("w-big", false).await.unwrap();
    let mut waiting = Vec::new();
    for i in 0..5 {
        let mut task = spec("big", &format!("big-{i}"), "h", "");
        task.payload = vec![b'0' + i as u8; 900_000];
        waiting.push(c.submit(&task).await.unwrap().task.id);
    }
    while !waiting.is_empty() {
        let leased = c
            .lease("w-big", &[], 5, 60_000, Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("a lease answer failed to arrive: {e}"));
        assert!(!leased.is_empty(), "nothing leased; waiting {waiting:?}");
        for a in &leased {
            assert_eq!(a.payload.len(), 900_000);
            let pos = waiting.iter().position(|id| *id == a.task_id).unwrap();
            waiting.remove(pos);
        }
        for id in &waiting {
            let task = c.queue_task(*id).await.unwrap();
            assert_eq!(task.state, TaskState::Waiting, "task {id} held unseen");
        }
    }
    cluster.stop().await;
}

/// A long poll held while the same client makes more writes than the store remembers answers
/// for (4,096 per client) still leases when work arrives: polls are numbered apart from the
/// client's other writes, so the flood cannot push the waiting poll out of the session window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_outlives_thousands_of_writes_from_the_same_client() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    c.create_queue("flood", "ns").await.unwrap();
    c.register_worker("patient", false).await.unwrap();
    let poll = {
        let c = c.clone();
        tokio::spawn(async move {
            c.lease(
                "patient",
                &["flood".to_string()],
                1,
                30_000,
                Duration::from_secs(30),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let writers: Vec<_> = (0..32)
        .map(|w| {
            let c = c.clone();
            tokio::spawn(async move {
                for seq in 1..=150u64 {
                    c.save_if_newer(&format!("flood-{w}"), seq, b"x")
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    assert!(
        !poll.is_finished(),
        "the poll waits while nothing is leasable"
    );
    let task = c
        .submit(&spec("flood", "late", "h", ""))
        .await
        .unwrap()
        .task;
    let leased = poll.await.unwrap();
    match leased {
        Ok(assignments) => {
            assert_eq!(assignments.len(), 1);
            assert_eq!(assignments[0].task_id, task.id);
        }
        Err(error) => panic!("the waiting poll was lost to the flood of writes: {error}"),
    }
    cluster.stop().await;
}

/// What the test handler saw, per concurrency key: (token, start, end) of each execution.
type Executions = Arc<Mutex<BTreeMap<String, Vec<(u64, Instant, Instant)>>>>;

/// The test handler: keyed tasks write the fenced sink with their token. Handler names steer the
/// outcome: `slow` runs past the lease TTL (renewals must keep it alive), `flaky` fails its
/// first attempt retryably, `broken` fails for good, `murky` reports an unknown effect.
async fn handle(client: Client, seen: Executions, ctx: TaskContext) -> Result<Vec<u8>, TaskError> {
    let began = Instant::now();
    let pause = match ctx.handler.as_str() {
        "slow" => Duration::from_millis(1_500),
        _ => Duration::from_millis(100),
    };
    tokio::time::sleep(pause).await;
    match (ctx.handler.as_str(), ctx.attempt) {
        ("flaky", 1) => return Err(TaskError::retryable("first try fails")),
        ("broken", _) => return Err(TaskError::non_retryable("cannot ever work")),
        ("murky", _) => return Err(TaskError::unknown_effect("the call timed out")),
        _ => {}
    }
    if let (Some(key), Some(token)) = (&ctx.concurrency_key, ctx.token) {
        client
            .write_fenced(key, token, format!("task {}", ctx.task_id).as_bytes())
            .await
            .map_err(TaskError::unknown_effect)?;
        seen.lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .push((token, began, Instant::now()));
    }
    Ok(format!("done {}", ctx.task_id).into_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_run_keyed_and_unkeyed_tasks_with_increasing_tokens_and_drain() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    for q in ["wa", "wb"] {
        c.create_queue(q, "ns").await.unwrap();
    }
    // Keyed tasks spread over both queues, unkeyed ones, and the error paths.
    let mut plan = Vec::new();
    for i in 0..3 {
        let queue = if i % 2 == 0 { "wa" } else { "wb" };
        plan.push(spec(queue, &format!("k1-{i}"), "ok", "object/k1"));
    }
    plan.push(spec("wb", "k2-0", "slow", "object/k2"));
    plan.push(spec("wa", "k2-1", "ok", "object/k2"));
    for i in 0..3 {
        plan.push(spec("wa", &format!("plain-{i}"), "ok", ""));
    }
    plan.push(spec("wb", "flaky", "flaky", "object/k1"));
    let mut succeed = Vec::new();
    for s in &plan {
        succeed.push(c.submit(s).await.unwrap().task.id);
    }
    let broken = c
        .submit(&spec("wa", "broken", "broken", ""))
        .await
        .unwrap()
        .task
        .id;
    let murky = c
        .submit(&spec("wb", "murky", "murky", "object/k3"))
        .await
        .unwrap()
        .task
        .id;

    let seen: Executions = Arc::default();
    let (stop, stopped) = watch::channel(false);
    let mut workers = Vec::new();
    for i in 1..=2 {
        let worker = Worker::builder(c.clone(), format!("worker-{i}"))
            .queues(["wa", "wb"])
            .concurrency_keys(true)
            .slots(3)
            .lease_ttl(Duration::from_millis(900))
            .poll_wait(Duration::from_secs(2))
            .drain_timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let handler = {
            let c = c.clone();
            let seen = seen.clone();
            move |ctx| handle(c.clone(), seen.clone(), ctx)
        };
        let mut stopped = stopped.clone();
        workers.push(tokio::spawn(worker.run(handler, async move {
            let _ = stopped.wait_for(|s| *s).await;
        })));
    }

    for &id in &succeed {
        let task = wait_for_state(&c, id, TaskState::Succeeded, Duration::from_secs(20)).await;
        assert_eq!(task.result, format!("done {id}").into_bytes());
    }
    let flaky = c.attempts(*succeed.last().unwrap()).await.unwrap();
    assert_eq!(
        flaky.attempts.len(),
        2,
        "the flaky task succeeded on its retry"
    );
    assert_eq!(flaky.attempts[0].outcome, AttemptOutcome::Failed);
    assert!(flaky.attempts[0].token < flaky.attempts[1].token);
    wait_for_state(&c, broken, TaskState::Failed, Duration::from_secs(5)).await;
    wait_for_state(&c, murky, TaskState::NeedsReview, Duration::from_secs(5)).await;

    // Per key: tokens strictly increase in lease order, attempts never overlap, and the fenced
    // sink saw every write.
    let mut by_key: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for id in succeed.iter().chain([&broken, &murky]) {
        let history = c.attempts(*id).await.unwrap();
        if history.concurrency_key.is_empty() {
            assert!(history.attempts.iter().all(|a| a.token.is_none()));
            continue;
        }
        by_key
            .entry(history.concurrency_key.clone())
            .or_default()
            .extend(history.attempts);
    }
    for (key, attempts) in &mut by_key {
        attempts.sort_by_key(|a| (a.leased_at_ms, a.token));
        for pair in attempts.windows(2) {
            assert!(
                pair[0].token < pair[1].token,
                "{key}: tokens {:?} then {:?}",
                pair[0].token,
                pair[1].token
            );
            assert!(
                pair[0].ended_at_ms.unwrap() <= pair[1].leased_at_ms,
                "{key}: an attempt was leased before the previous one ended"
            );
        }
    }
    let seen_now = seen.lock().unwrap().clone();
    for (key, runs) in &seen_now {
        let mut runs = runs.clone();
        runs.sort_by_key(|r| r.1);
        for pair in runs.windows(2) {
            assert!(pair[0].2 <= pair[1].1, "{key}: two handlers ran at once");
            assert!(pair[0].0 < pair[1].0, "{key}: tokens out of order");
        }
        let sink = c.read_sink(key).await.unwrap();
        assert_eq!(sink.writes, runs.len() as u64, "{key}");
        assert_eq!(sink.seen_fence, runs.last().unwrap().0);
    }
    assert_eq!(seen_now["object/k1"].len(), 4);
    assert_eq!(seen_now["object/k2"].len(), 2);

    // Drain: a task in flight when shutdown starts still finishes, then both workers return.
    let last = c
        .submit(&spec("wa", "in-flight", "slow", "object/k2"))
        .await
        .unwrap()
        .task
        .id;
    wait_for_state(&c, last, TaskState::Running, Duration::from_secs(5)).await;
    let _ = stop.send(true);
    let mut total = WorkerSummary::default();
    for worker in workers {
        let summary = worker.await.unwrap().unwrap();
        assert!(summary.drained, "{summary:?}");
        total.completed += summary.completed;
        total.failed += summary.failed;
        total.unknown += summary.unknown;
        total.lost += summary.lost;
        total.protocol_errors += summary.protocol_errors;
    }
    assert_eq!(
        c.queue_task(last).await.unwrap().state,
        TaskState::Succeeded,
        "the in-flight task finished during the drain"
    );
    assert_eq!(total.completed, succeed.len() as u64 + 1);
    assert_eq!(total.failed, 2, "flaky's first attempt and broken");
    assert_eq!(total.unknown, 1);
    assert_eq!(total.lost, 0, "renewals kept the slow attempts alive");
    assert_eq!(total.protocol_errors, 0);

    cluster.stop().await;
}

/// What a worker's settling of a lease rests on (`LeasePoll::settle` in the client): a lease
/// asked again under its own `(client_id, seq)`, marked a retry, with a limit of zero, answers
/// the lease's own assignments when the lease was applied; asked before the lease arrives, it
/// is refused, and the lease under that seq, arriving after, gets the same refusal and leases
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_asked_again_with_no_limit_answers_what_it_leased_or_makes_it_lease_nothing() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    c.create_queue("s", "ns").await.unwrap();
    c.register_worker("w", false).await.unwrap();
    for i in 0..4 {
        c.submit(&spec("s", &format!("t{i}"), "h", ""))
            .await
            .unwrap();
    }
    let mut queue = QueueClient::connect(format!("http://{}", cluster.addr))
        .await
        .unwrap();
    let lease = |seq, limit, retry| proto::LeaseRequest {
        header: Some(proto::RequestHeader {
            client_id: 4_040,
            seq,
            acked_below: 0,
            retry,
        }),
        worker_id: "w".into(),
        queues: vec!["s".into()],
        limit,
        lease_ttl_ms: 60_000,
        wait_ms: 0,
    };
    let tasks = |reply: proto::LeaseResponse| -> Vec<u64> {
        reply.assignments.iter().map(|a| a.task_id).collect()
    };

    // Applied first: asked again, the lease's own answer comes back, and nothing more is leased.
    let first = tasks(queue.lease(lease(1, 2, false)).await.unwrap().into_inner());
    assert_eq!(first.len(), 2);
    let settled = tasks(queue.lease(lease(1, 0, true)).await.unwrap().into_inner());
    assert_eq!(settled, first);

    // Settled first: refused, and the lease arriving after it under that seq leases nothing.
    let refused = queue.lease(lease(2, 0, true)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    let late = queue.lease(lease(2, 2, false)).await.unwrap_err();
    assert_eq!(late.code(), tonic::Code::InvalidArgument, "{late:?}");
    let leased = c
        .queue_tasks(&TaskFilter {
            queue: Some("s".into()),
            state: Some(TaskState::Leased),
            concurrency_key: None,
        })
        .await
        .unwrap();
    assert_eq!(ids(&leased), first, "only the first lease holds tasks");
    // The other two are still there for a lease of its own.
    let next = tasks(queue.lease(lease(3, 4, false)).await.unwrap().into_inner());
    assert_eq!(next.len(), 2);
    cluster.stop().await;
}

/// A worker stopped while a lease of its is on its way leaves nothing leased to it: it learns
/// what that lease got (see the test above) and hands it back unstarted. Stopped at many points
/// of a busy queue (handlers that finish at once keep a lease in flight nearly all the time),
/// some stops fall between a lease's proposal and its answer; the answer used to be dropped,
/// and its tasks — with their concurrency keys — stayed leased to the gone worker until the
/// lease TTL (here 30 s) ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_mid_lease_leaves_nothing_leased_to_it() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    c.create_queue("busy", "ns").await.unwrap();
    const TASKS: usize = 400;
    for i in 0..TASKS {
        let key = if i % 2 == 0 {
            format!("k{}", i % 40)
        } else {
            String::new()
        };
        c.submit(&spec("busy", &format!("t{i}"), "h", &key))
            .await
            .unwrap();
    }
    let leased_to = |id: String| {
        let c = c.clone();
        async move {
            c.queue_tasks(&TaskFilter {
                queue: Some("busy".into()),
                state: Some(TaskState::Leased),
                concurrency_key: None,
            })
            .await
            .unwrap()
            .into_iter()
            .filter(|task| task.attempts.last().is_some_and(|a| a.worker == id))
            .map(|task| task.id)
            .collect::<Vec<_>>()
        }
    };
    let worker = |id: &str| {
        Worker::builder(c.clone(), id)
            .queue("busy")
            .concurrency_keys(true)
            .slots(2)
            .lease_ttl(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let mut handed_back = 0;
    let mut rounds = 0u64;
    // Until some stop has fallen on a lease in flight (most runs: the second or third).
    while handed_back == 0 && rounds < 40 {
        let id = format!("w{rounds}");
        let stop_after = Duration::from_millis(20 + (rounds * 17) % 60);
        // The timer starts when the worker first looks at it, as it registers.
        let stop = async move { tokio::time::sleep(stop_after).await };
        let summary = worker(&id)
            .run(|_ctx| async { Ok(Vec::new()) }, stop)
            .await
            .unwrap();
        handed_back += summary.handed_back;
        // A handed-back lease ends a millisecond later; the leader's sweep materialises that
        // expiry moments after (a listing right away may still show it leased). A stranded one
        // would stay for its 30 s.
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let stranded = leased_to(id.clone()).await;
            if stranded.is_empty() {
                break;
            }
            assert!(
                Instant::now() < until,
                "round {rounds}: tasks {stranded:?} are still leased to {id}, which stopped \
                 5 s ago ({summary:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rounds += 1;
    }
    println!("{handed_back} attempts handed back by the stop of round {rounds}");
    assert!(
        handed_back > 0,
        "no stop in {rounds} rounds fell on a lease"
    );

    // What was handed back waits again at once: one more worker finishes every task well
    // inside the 30 s a stranded lease would hold its task.
    let (stop, stopped) = oneshot::channel::<()>();
    let last = tokio::spawn(
        worker("last").run(|_ctx| async { Ok(Vec::new()) }, async move {
            let _ = stopped.await;
        }),
    );
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let done = c
            .queue_tasks(&TaskFilter {
                queue: Some("busy".into()),
                state: Some(TaskState::Succeeded),
                concurrency_key: None,
            })
            .await
            .unwrap()
            .len();
        if done == TASKS {
            break;
        }
        assert!(Instant::now() < until, "{done} of {TASKS} tasks finished");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    last.await.unwrap().unwrap();
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_times_out_says_so_and_a_conflicting_registration_fails_the_run() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    c.create_queue("dq", "ns").await.unwrap();
    let id = c
        .submit(&spec("dq", "stuck", "h", ""))
        .await
        .unwrap()
        .task
        .id;
    let worker = Worker::builder(c.clone(), "stubborn")
        .queue("dq")
        .lease_ttl(Duration::from_secs(10))
        .drain_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(
        |_ctx| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Vec::new())
        },
        async move {
            let _ = stopped.await;
        },
    ));
    wait_for_state(&c, id, TaskState::Running, Duration::from_secs(5)).await;
    let _ = stop.send(());
    let started = Instant::now();
    let summary = run.await.unwrap().unwrap();
    assert!(!summary.drained);
    // Expected: the 300 ms drain timeout, then the stopped handler ends at once. A drain that
    // waited for the handler would take 60 s, and one that waited out the 5 s REPORT_GRACE for
    // a handler stopped mid-sleep 5.3 s: the bound sits between.
    let drain_took = started.elapsed();
    assert!(
        drain_took < Duration::from_secs(4),
        "the run ended {drain_took:?} after the stop"
    );
    println!("the run ended {drain_took:?} after the stop, its drain timed out at 300 ms");
    assert_eq!(summary.completed, 0);

    // The same identity with another capability is refused at registration.
    let conflicting = Worker::builder(c.clone(), "stubborn")
        .queue("dq")
        .concurrency_keys(false)
        .build()
        .unwrap();
    // Never told to stop: a stop while registering would end the run before the refusal.
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        conflicting.run(|_ctx| async { Ok(Vec::new()) }, std::future::pending()),
    )
    .await
    .expect("the refused registration ends the run");
    assert_eq!(refusal(result), Refusal::StateConflict);
    assert!(Worker::builder(c.clone(), "w").slots(0).build().is_err());
    // A near-zero long poll would make an idle worker a stream of log entries; a lease of years
    // would hold a crashed worker's task for good.
    for (builder, names) in [
        (
            Worker::builder(c.clone(), "w").poll_wait(Duration::ZERO),
            "poll wait",
        ),
        (
            Worker::builder(c.clone(), "w").lease_ttl(Duration::from_secs(25 * 3600)),
            "lease TTL",
        ),
        (
            Worker::builder(c.clone(), "w").queues((0..257).map(|n| format!("q{n}"))),
            "queues",
        ),
    ] {
        match builder.build() {
            Err(Error::Config(message)) => assert!(message.contains(names), "{message}"),
            other => panic!("{names}: {:?}", other.map(|_| ())),
        }
    }

    cluster.stop().await;
}

/// A handler that panics before it returns its future (in the closure's synchronous part, e.g.
/// a payload that does not parse) is reported like one that panics inside it: the attempt's
/// effect is unknown, so the task needs review — not left to its lease and retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_before_its_future_exists_is_reported_unknown() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    c.create_queue("pq", "ns").await.unwrap();
    let id = c
        .submit(&spec("pq", "panics", "h", ""))
        .await
        .unwrap()
        .task
        .id;
    let worker = Worker::builder(c.clone(), "panicky")
        .queue("pq")
        .lease_ttl(Duration::from_secs(20))
        .poll_wait(Duration::from_millis(200))
        .build()
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(
        |ctx: TaskContext| {
            assert!(ctx.payload.is_empty(), "the payload does not parse");
            async { Ok(Vec::new()) }
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let task = wait_for_state(&c, id, TaskState::NeedsReview, Duration::from_secs(10)).await;
    let _ = stop.send(());
    let summary = run.await.unwrap().unwrap();
    assert_eq!(task.attempts.len(), 1, "{task:?}");
    assert_eq!(task.attempts[0].outcome, AttemptOutcome::Unknown);
    assert!(
        task.attempts[0].note.contains("panicked"),
        "{:?}",
        task.attempts[0].note
    );
    assert_eq!((summary.unknown, summary.completed), (1, 0), "{summary:?}");

    cluster.stop().await;
}

/// A panicking `on_finish` hook is logged; the worker goes on running and reporting attempts
/// (it used to unwind `run`, aborting every attempt still running, unreported).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_finish_hook_does_not_stop_the_worker() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    c.create_queue("hq", "ns").await.unwrap();
    let worker = Worker::builder(c.clone(), "hooked")
        .queue("hq")
        .poll_wait(Duration::from_millis(200))
        .on_finish(|finished| panic!("hook failed for task {}", finished.task_id))
        .build()
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(
        |_ctx: TaskContext| async { Ok(b"ok".to_vec()) },
        async move {
            let _ = stopped.await;
        },
    ));
    for name in ["first", "second"] {
        let id = c.submit(&spec("hq", name, "h", "")).await.unwrap().task.id;
        wait_for_state(&c, id, TaskState::Succeeded, Duration::from_secs(10)).await;
    }
    let _ = stop.send(());
    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.completed, 2, "{summary:?}");

    cluster.stop().await;
}

/// A handler's result larger than the store keeps fails its attempt for good, at once, with the
/// reason in the attempt's note: retrying would only run the handler (and its effects) again.
/// Both sizes: over the store's payload limit (refused by the store), and over the node's
/// request limit too (refused before the store sees it; this one used to be left to its lease,
/// so the handler ran again on every attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_larger_than_the_store_keeps_fails_the_attempt_once() {
    let cluster = Cluster::start().await;
    let c = cluster.client.clone();
    c.create_queue("big", "ns").await.unwrap();
    let mut sizes = BTreeMap::new();
    for (name, size) in [("over-payload", 2usize << 20), ("over-request", 5 << 20)] {
        let id = c.submit(&spec("big", name, "h", "")).await.unwrap().task.id;
        sizes.insert(id, size);
    }
    let ids: Vec<u64> = sizes.keys().copied().collect();
    let calls = Arc::new(Mutex::new(BTreeMap::<u64, u32>::new()));
    let worker = Worker::builder(c.clone(), "generous")
        .queue("big")
        .lease_ttl(Duration::from_secs(1))
        .poll_wait(Duration::from_millis(200))
        .build()
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let counted = calls.clone();
    let run = tokio::spawn(worker.run(
        move |ctx: TaskContext| {
            *counted.lock().unwrap().entry(ctx.task_id).or_default() += 1;
            let size = sizes[&ctx.task_id];
            async move { Ok(vec![7u8; size]) }
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let mut ended = Vec::new();
    for id in ids {
        ended.push(wait_for_state(&c, id, TaskState::Failed, Duration::from_secs(10)).await);
    }
    // Long enough for a lease left to run out to be leased again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = stop.send(());
    let summary = run.await.unwrap().unwrap();
    for task in &ended {
        assert_eq!(task.attempts.len(), 1, "{task:?}");
        assert_eq!(task.attempts[0].outcome, AttemptOutcome::Failed);
        assert!(
            task.attempts[0].note.contains("result"),
            "{:?}",
            task.attempts[0].note
        );
    }
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.values().copied().collect::<Vec<_>>(),
        vec![1, 1],
        "{calls:?}"
    );
    assert_eq!((summary.failed, summary.lost), (2, 0), "{summary:?}");

    cluster.stop().await;
}
