//! Claim: a queue worker never starts a handler on a lease the store may already have ended
//! (seed 004 §4: business code runs only on a confirmed attempt whose lease is this worker's).
//!
//! The worker reaches the node through a proxy whose way back is slow: requests arrive on time,
//! answers 3 s late, with a 5 s lease. The store grants the lease at T, the worker sees it at
//! T+3 s and sends its start, which the store applies at T+3 s (inside the lease, 2 s to spare
//! on a busy machine), and the confirmation reaches the worker at T+6 s — a second after the
//! store's lease ended. Counting the lease from the arrival of the lease answer would give the
//! handler until T+8 s; the start's answer shows only 2 s of lease were left when the start was
//! sent, so the handler must not run. A task handled with no delay first shows the same worker and handler run.
//!
//! Claim: a drain that times out stops the handlers still running, not an attempt whose handler
//! finished and whose answer is on its way: that answer is recorded (seed 004 §4: finished work
//! is reported, not recovered and done again).
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_cluster_test::proxy::Proxy;
use baton_cluster_test::{wait, wall_clock_ms, Cluster, Options};
use baton_rpc::worker::{AttemptEnd, Finished, Worker};
use baton_rpc::{Client, ClientConfig};
use baton_statemachine::queue::{Task, TaskSpec, TaskState};
use tokio::sync::mpsc;

const QUEUE: &str = "t46";
const LEASE_TTL: Duration = Duration::from_secs(5);
const ANSWER_DELAY: Duration = Duration::from_secs(3);

fn spec(name: &str) -> TaskSpec {
    TaskSpec {
        queue: QUEUE.into(),
        idempotency_key: name.into(),
        handler: "h".into(),
        handler_version: "v1".into(),
        payload_version: "v1".into(),
        payload: name.as_bytes().to_vec(),
        concurrency_key: String::new(),
        business_key: String::new(),
        max_attempts: 1,
        ttl_ms: 600_000,
    }
}

/// A one-node cluster with queue [`QUEUE`], a client straight to it, and one whose only way to
/// it is a proxy (no discovery, so no direct connection), for the worker.
struct Setup {
    _cluster: Cluster,
    direct: Client,
    proxy: Proxy,
    proxied: Client,
}

impl Setup {
    async fn start() -> Setup {
        let cluster = Cluster::start(1, Options::default()).await.unwrap();
        let direct = cluster.client().await.unwrap();
        direct.create_queue(QUEUE, "ns").await.unwrap();
        let proxy = Proxy::start(cluster.addr(1)).await.unwrap();
        // Patient enough for answers held up by the proxy.
        let config = ClientConfig {
            deadline: Duration::from_secs(20),
            attempt_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
        };
        let proxied = Client::new(&[proxy.addr().to_string()], config).unwrap();
        Setup {
            _cluster: cluster,
            direct,
            proxy,
            proxied,
        }
    }
}

/// A client through `proxy` that makes one attempt per call, cut by a 2 s deadline (a short
/// attempt timeout would also make the connection's keep-alive pings, answered late through a
/// slow proxy, drop it).
fn one_attempt_in_two_seconds(proxy: &Proxy) -> Client {
    let config = ClientConfig {
        deadline: Duration::from_secs(2),
        attempt_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(1),
    };
    Client::new(&[proxy.addr().to_string()], config).unwrap()
}

/// Waits (at most `limit`) until task `id` is in `state`.
async fn reaches(direct: &Client, id: u64, state: TaskState, limit: Duration) {
    wait::until(&format!("task {id} {state:?}"), limit, || async {
        match direct.queue_task(id).await {
            Ok(task) if task.state == state => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
}

/// Waits (at most `limit`) until task `id` is no longer RUNNING: its attempt was handed back
/// rather than left to its lease.
async fn handed_back(direct: &Client, id: u64, limit: Duration) -> Task {
    wait::until("the attempt handed back", limit, || async {
        let task = direct.queue_task(id).await.map_err(|e| e.to_string())?;
        if task.state == TaskState::Running {
            Err("still RUNNING (left to its lease)".to_string())
        } else {
            Ok(task)
        }
    })
    .await
    .unwrap()
}

/// A worker through `proxy` (one attempt per call, in 2 s) on [`QUEUE`], with a 20 s lease and a
/// 5 s long poll, whose handler only counts its runs; registered once started.
struct Counting {
    finished: mpsc::UnboundedReceiver<Finished>,
    stop: tokio::sync::oneshot::Sender<()>,
    ran: Arc<Mutex<u32>>,
    running: tokio::task::JoinHandle<Result<baton_rpc::worker::WorkerSummary, baton_rpc::Error>>,
}

impl Counting {
    /// Starts the worker and returns once it is registered and leasing. Its client gives a
    /// call 2 s, and on a loaded machine the registration's answer (the first call, on a fresh
    /// connection through the proxy) can take longer: the worker then stops at once with
    /// `Unavailable`, though the store may have registered it. Such a start is made again
    /// (registering again is harmless), up to three times.
    async fn start(direct: &Client, proxy: &Proxy, id: &str) -> Counting {
        for attempt in 1..=3 {
            let started = tokio::time::Instant::now();
            let counting = Self::spawn(proxy, id);
            // Registered (its answer must not be late): until then a lease under its id is
            // refused `UNKNOWN_WORKER`; after, it finds nothing (no task is submitted yet).
            wait::until("the worker registered", Duration::from_secs(20), || async {
                match direct
                    .lease(id, &[QUEUE.to_string()], 1, 1_000, Duration::ZERO)
                    .await
                {
                    Ok(leased) if leased.is_empty() => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await
            .unwrap();
            // By the end of its client's deadline the worker has its registration's answer, or
            // has stopped for want of it.
            tokio::time::sleep_until(started + Duration::from_millis(2_500)).await;
            if !counting.running.is_finished() {
                return counting;
            }
            let ended = counting.running.await;
            assert!(attempt < 3, "the worker stopped as it started: {ended:?}");
        }
        unreachable!("the third start returns or fails")
    }

    /// A worker through `proxy` that counts its handler's runs and reports each finished attempt.
    fn spawn(proxy: &Proxy, id: &str) -> Counting {
        let (finished_tx, finished) = mpsc::unbounded_channel::<Finished>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // A long poll gets its wait on top of the deadline: one answered at once (a task already
        // there when it arrives, or submitted just after) arrives in time; a start's late answer
        // does not.
        let worker = Worker::builder(one_attempt_in_two_seconds(proxy), id)
            .queue(QUEUE)
            .lease_ttl(Duration::from_secs(20))
            .poll_wait(Duration::from_secs(5))
            .on_finish(move |finished| {
                let _ = finished_tx.send(finished.clone());
            })
            .build()
            .unwrap();
        let ran: Arc<Mutex<u32>> = Arc::default();
        let handler_ran = ran.clone();
        let running = tokio::spawn(worker.run(
            move |_ctx| {
                *handler_ran.lock().unwrap() += 1;
                async { Ok(b"done".to_vec()) }
            },
            async {
                let _ = stopped.await;
            },
        ));
        Counting {
            finished,
            stop,
            ran,
            running,
        }
    }

    /// The next finished attempt (at most 30 s away).
    async fn finished(&mut self) -> Finished {
        tokio::time::timeout(Duration::from_secs(30), self.finished.recv())
            .await
            .expect("the attempt never finished")
            .unwrap()
    }

    /// How many times the handler ran.
    fn runs(&self) -> u32 {
        *self.ran.lock().unwrap()
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.running)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_a_start_confirmed_after_the_lease_ended_does_not_run_the_handler() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied,
    } = Setup::start().await;

    let ran: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let (finished_tx, mut finished_rx) = mpsc::unbounded_channel::<Finished>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::builder(proxied, "t46-worker")
        .queue(QUEUE)
        .lease_ttl(LEASE_TTL)
        .poll_wait(Duration::from_secs(2))
        .on_finish(move |finished| {
            let _ = finished_tx.send(finished.clone());
        })
        .build()
        .unwrap();
    let handler_ran = ran.clone();
    let running = tokio::spawn(worker.run(
        move |ctx| {
            let ran = handler_ran.clone();
            async move {
                ran.lock().unwrap().push(ctx.payload.clone());
                Ok(b"done".to_vec())
            }
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    let next_finished = async |rx: &mut mpsc::UnboundedReceiver<Finished>| {
        tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("no attempt finished within 30 s")
            .unwrap()
    };

    // No delay: the handler runs and its result is recorded.
    let prompt = direct.submit(&spec("prompt")).await.unwrap().task.id;
    let first = next_finished(&mut finished_rx).await;
    assert_eq!(
        (first.task_id, first.end),
        (prompt, AttemptEnd::Completed),
        "{first:?}"
    );
    assert_eq!(*ran.lock().unwrap(), vec![b"prompt".to_vec()]);

    // Answers 3 s late: the start is confirmed after the store's lease ended.
    proxy.slow_answers(ANSWER_DELAY);
    let late = direct.submit(&spec("late")).await.unwrap().task.id;
    let second = next_finished(&mut finished_rx).await;
    let seen_at_ms = wall_clock_ms();
    let _ = stop_tx.send(());
    let task = direct.queue_task(late).await.unwrap();
    let record = task.attempts.first().unwrap();
    assert!(
        record.started_at_ms.is_some(),
        "the store never confirmed the start, so the test showed nothing: {task:?}"
    );
    assert!(
        record.lease_until_ms < seen_at_ms,
        "the store's lease (until {}) had not ended when the worker finished the attempt \
         ({seen_at_ms}), so the test showed nothing",
        record.lease_until_ms
    );
    assert_eq!(
        (second.task_id, second.end),
        (late, AttemptEnd::LeaseLost),
        "{second:?}"
    );
    assert!(
        second.detail.contains("before its start was confirmed"),
        "{second:?}"
    );
    assert_eq!(
        *ran.lock().unwrap(),
        vec![b"prompt".to_vec()],
        "the handler ran on a lease the store had already ended"
    );

    proxy.slow_answers(Duration::ZERO);
    let summary = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((summary.completed, summary.lost), (1, 1), "{summary:?}");
}

/// A drain that times out stops handlers still running, not an attempt whose handler finished
/// and whose answer is on its way: with answers 3 s late and a 300 ms drain, the completion is
/// still recorded and counted (aborted, the finished work would be recovered and done again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_a_timed_out_drain_lets_a_finished_handler_s_answer_be_recorded() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied,
    } = Setup::start().await;
    proxy.slow_answers(ANSWER_DELAY);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<u64>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::builder(proxied, "t46-drainer")
        .queue(QUEUE)
        .lease_ttl(Duration::from_secs(20))
        .poll_wait(Duration::from_secs(2))
        .drain_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let running = tokio::spawn(worker.run(
        move |ctx| {
            let done = done_tx.clone();
            async move {
                let _ = done.send(ctx.task_id);
                Ok(b"done".to_vec())
            }
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    let id = direct.submit(&spec("drained")).await.unwrap().task.id;
    let handled = tokio::time::timeout(Duration::from_secs(30), done_rx.recv())
        .await
        .expect("the handler never ran")
        .unwrap();
    assert_eq!(handled, id);
    // Shut down while the completion's answer is on its way (3 s), beyond the 300 ms drain.
    let _ = stop_tx.send(());
    let summary = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (summary.completed, summary.lost),
        (1, 0),
        "the finished attempt was abandoned mid-report: {summary:?}"
    );
    let task = direct.queue_task(id).await.unwrap();
    assert_eq!(task.state, TaskState::Succeeded);
}

/// An attempt the drain has to abort (here: its completion cannot reach the cluster within the
/// drain and the grace after it) still reaches `on_finish`, as lost, with a detail that says why:
/// before, it was only counted, and a hook keeping its own books never heard of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_an_attempt_aborted_at_the_drain_s_end_reaches_on_finish() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied,
    } = Setup::start().await;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<u64>();
    let (finished_tx, mut finished_rx) = mpsc::unbounded_channel::<Finished>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let cut = Arc::new(tokio::sync::Notify::new());
    let worker = Worker::builder(proxied, "t46-aborted")
        .queue(QUEUE)
        .lease_ttl(Duration::from_secs(20))
        .poll_wait(Duration::from_secs(2))
        .drain_timeout(Duration::from_millis(300))
        .on_finish(move |finished| {
            let _ = finished_tx.send(finished.clone());
        })
        .build()
        .unwrap();
    let link_cut = cut.clone();
    let running = tokio::spawn(worker.run(
        move |ctx| {
            let (done, link_cut) = (done_tx.clone(), link_cut.clone());
            async move {
                let _ = done.send(ctx.task_id);
                // Finishes only once the link is cut: its completion is sent into the outage.
                link_cut.notified().await;
                Ok(b"done".to_vec())
            }
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    let id = direct.submit(&spec("aborted")).await.unwrap().task.id;
    let handled = tokio::time::timeout(Duration::from_secs(30), done_rx.recv())
        .await
        .expect("the handler never ran")
        .unwrap();
    assert_eq!(handled, id);
    proxy.cut();
    cut.notify_one();
    // The completion is resent while the lease lasts (20 s), past the 300 ms drain and the
    // grace after it, so the drain aborts the attempt.
    let _ = stop_tx.send(());
    let summary = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!summary.drained, "{summary:?}");
    assert_eq!((summary.completed, summary.lost), (0, 1), "{summary:?}");
    let finished = finished_rx
        .try_recv()
        .expect("on_finish never heard of the aborted attempt");
    assert_eq!(
        (finished.task_id, finished.end),
        (id, AttemptEnd::LeaseLost),
        "{finished:?}"
    );
    assert!(finished.detail.contains("timed-out drain"), "{finished:?}");
    assert!(finished_rx.try_recv().is_err(), "one attempt, one end");
}

/// An attempt stopped while its start is on its way (here: a drain that timed out) does not run
/// its handler once the start is confirmed, and says so to the store, which counts the attempt
/// as started: the attempt fails retryably at once ("did not run") instead of staying RUNNING
/// until its 20 s lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_an_attempt_stopped_during_its_start_does_not_run_and_hands_the_task_back() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied,
    } = Setup::start().await;
    proxy.slow_answers(ANSWER_DELAY);
    let ran: Arc<Mutex<Vec<u64>>> = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::builder(proxied, "t46-stopped")
        .queue(QUEUE)
        .lease_ttl(Duration::from_secs(20))
        .poll_wait(Duration::from_secs(2))
        .drain_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let handler_ran = ran.clone();
    let running = tokio::spawn(worker.run(
        move |ctx| {
            let ran = handler_ran.clone();
            async move {
                ran.lock().unwrap().push(ctx.task_id);
                Ok(b"done".to_vec())
            }
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    let mut spec = spec("stopped");
    spec.max_attempts = 3;
    let id = direct.submit(&spec).await.unwrap().task.id;
    // The store applied the start; its confirmation is 3 s away from the worker.
    wait::until("the attempt started", Duration::from_secs(30), || async {
        let task = direct.queue_task(id).await.map_err(|e| e.to_string())?;
        if task.state == TaskState::Running {
            Ok(())
        } else {
            Err(format!("{:?}", task.state))
        }
    })
    .await
    .unwrap();
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    assert!(
        ran.lock().unwrap().is_empty(),
        "the stopped attempt's handler ran"
    );
    let task = handed_back(&direct, id, Duration::from_secs(10)).await;
    let first = task.attempts.first().unwrap();
    assert!(
        first.note.contains("did not run"),
        "{:?} {first:?}",
        task.state
    );
}

/// A finished handler's result whose answer is lost to an outage longer than the client's
/// deadline is sent again while the lease lasts: here the handler runs 7 s on a 6 s lease kept
/// by renewals, the link is cut as it returns and healed 3.5 s later (the client gives up after
/// 2 s), before the lease its last renewal gave runs out (the first lease ended long before).
/// The completion is recorded and the work is not done again (seed 004 §4: finished work is
/// reported, not recovered and redone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_a_result_lost_to_an_outage_is_sent_again_while_the_lease_lasts() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied: _,
    } = Setup::start().await;
    let config = ClientConfig {
        deadline: Duration::from_secs(2),
        attempt_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_millis(500),
    };
    let impatient = Client::new(&[proxy.addr().to_string()], config).unwrap();
    let proxy = Arc::new(proxy);
    let (finished_tx, mut finished_rx) = mpsc::unbounded_channel::<Finished>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::builder(impatient, "t46-reporter")
        .queue(QUEUE)
        .lease_ttl(Duration::from_secs(6))
        .poll_wait(Duration::from_secs(1))
        .on_finish(move |finished| {
            let _ = finished_tx.send(finished.clone());
        })
        .build()
        .unwrap();
    let runs: Arc<Mutex<u32>> = Arc::default();
    let (handler_runs, link) = (runs.clone(), proxy.clone());
    let running = tokio::spawn(worker.run(
        move |_ctx| {
            *handler_runs.lock().unwrap() += 1;
            let link = link.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(7)).await;
                // The outage begins as the work ends: the completion cannot get through.
                link.cut();
                Ok(b"done".to_vec())
            }
        },
        async {
            let _ = stop_rx.await;
        },
    ));
    let mut spec = spec("reported");
    spec.max_attempts = 3;
    let id = direct.submit(&spec).await.unwrap().task.id;
    wait::until("the handler ran", Duration::from_secs(40), || async {
        if proxy.is_cut() {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    proxy.heal();

    let finished = tokio::time::timeout(Duration::from_secs(30), finished_rx.recv())
        .await
        .expect("the attempt never finished")
        .unwrap();
    let _ = stop_tx.send(());
    let summary = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(finished.end, AttemptEnd::Completed, "{finished:?}");
    let task = direct.queue_task(id).await.unwrap();
    assert_eq!(task.state, TaskState::Succeeded, "{task:?}");
    assert_eq!(task.attempts.len(), 1, "the work was done again: {task:?}");
    assert_eq!(*runs.lock().unwrap(), 1);
    assert_eq!((summary.completed, summary.lost), (1, 0), "{summary:?}");
}

/// A start whose confirmation never arrives (answers 2.5 s late, the client gives up after 2 s)
/// may have been applied: the store then counts the attempt as started. The worker says the
/// attempt failed harmlessly, so the task (here on its last attempt) ends failed at once — not
/// RUNNING until its 20 s lease runs out and then NEEDS_REVIEW for an effect that never happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_a_start_whose_answer_is_lost_is_failed_harmlessly() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied: _,
    } = Setup::start().await;
    let mut worker = Counting::start(&direct, &proxy, "t46-unconfirmed").await;
    proxy.slow_answers(Duration::from_millis(2_500));
    let id = direct.submit(&spec("unconfirmed")).await.unwrap().task.id;
    let finished = worker.finished().await;
    assert_eq!(finished.end, AttemptEnd::Unreported, "{finished:?}");
    assert!(
        finished.detail.contains("start not confirmed"),
        "{finished:?}"
    );
    let task = handed_back(&direct, id, Duration::from_secs(8)).await;
    let first = task.attempts.first().unwrap();
    assert!(
        first.started_at_ms.is_some(),
        "the start was not applied, so the test showed nothing: {task:?}"
    );
    assert_eq!(task.state, TaskState::Failed, "{task:?}");
    assert!(first.note.contains("did not run"), "{first:?}");
    assert_eq!(worker.runs(), 0, "the handler ran on an unconfirmed start");
    proxy.slow_answers(Duration::ZERO);
    worker.stop().await;
}

/// A start applied whose answer is lost, and the harmless failure sent into the same outage: the
/// failure is sent again once the link is back, while the lease lasts, so the task (on its last
/// attempt) ends FAILED ("did not run") soon after — not RUNNING until its 20 s lease ends and
/// then NEEDS_REVIEW for an effect that never happened, as when the failure was sent once and its
/// loss ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_a_harmless_failure_lost_to_an_outage_is_sent_again() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied: _,
    } = Setup::start().await;
    let mut worker = Counting::start(&direct, &proxy, "t46-fail-resent").await;
    proxy.slow_answers(Duration::from_millis(2_500));
    let id = direct.submit(&spec("fail-resent")).await.unwrap().task.id;
    // Once the start is applied (its answer still held by the proxy), the link goes down: the
    // answer is lost, and so is the first sending of the failure that follows.
    wait::until("the start applied", Duration::from_secs(10), || async {
        let task = direct.queue_task(id).await.map_err(|e| e.to_string())?;
        match task.attempts.first().and_then(|a| a.started_at_ms) {
            Some(_) => Ok(()),
            None => Err(format!("{task:?}")),
        }
    })
    .await
    .unwrap();
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let task = direct.queue_task(id).await.unwrap();
    assert_eq!(task.state, TaskState::Running, "{task:?}");
    proxy.slow_answers(Duration::ZERO);
    proxy.heal();
    let healed = std::time::Instant::now();
    reaches(&direct, id, TaskState::Failed, Duration::from_secs(10)).await;
    let task = direct.queue_task(id).await.unwrap();
    let first = task.attempts.first().unwrap();
    assert!(first.note.contains("did not run"), "{first:?}");
    let finished = worker.finished().await;
    assert_eq!(
        finished.end,
        AttemptEnd::Failed { retryable: true },
        "{finished:?}"
    );
    println!("failed {:?} after the link was healed", healed.elapsed());
    assert_eq!(worker.runs(), 0, "the handler ran on an unconfirmed start");
    worker.stop().await;
}

/// Claim: a worker never runs more than `slots` handlers at once, also when a lease is lost
/// under a handler that blocks its thread: the handler is stopped at its next await, and its
/// slot is free only then. Before, the slot was freed at once, and after an outage the worker
/// leased and ran the next task beside the one still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_a_handler_stopped_on_lease_loss_keeps_its_slot_until_it_has_stopped() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let Setup {
        _cluster,
        direct,
        proxy,
        proxied,
    } = Setup::start().await;
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::builder(proxied, "t46-one-slot")
        .queue(QUEUE)
        .slots(1)
        .lease_ttl(Duration::from_secs(1))
        .poll_wait(Duration::from_millis(200))
        .build()
        .unwrap();
    let (now, peak) = (running.clone(), most.clone());
    let worker = tokio::spawn(worker.run(
        move |ctx| {
            let (now, peak) = (now.clone(), peak.clone());
            async move {
                /// Counts a running handler until it is gone (finished or stopped).
                struct Running(Arc<AtomicUsize>);
                impl Drop for Running {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                let _running = Running(now);
                peak.fetch_max(at_once, Ordering::SeqCst);
                if ctx.payload == b"blocker" {
                    // Blocks its thread, well past the lease and the outage below; stopped at
                    // the await after.
                    std::thread::sleep(Duration::from_secs(8));
                    tokio::task::yield_now().await;
                }
                Ok(b"done".to_vec())
            }
        },
        async {
            let _ = stop_rx.await;
        },
    ));

    direct.submit(&spec("blocker")).await.unwrap();
    wait::until("the blocker runs", Duration::from_secs(20), || async {
        match running.load(Ordering::SeqCst) {
            0 => Err("not yet".to_string()),
            _ => Ok(()),
        }
    })
    .await
    .unwrap();
    // Renewals fail until the lease is lost; then the worker can lease again.
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    proxy.heal();
    let next = direct.submit(&spec("next")).await.unwrap().task.id;
    reaches(&direct, next, TaskState::Succeeded, Duration::from_secs(30)).await;
    let _ = stop_tx.send(());
    let summary = tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two handlers ran at once on one slot ({summary:?})"
    );
    assert_eq!((summary.completed, summary.lost), (1, 1), "{summary:?}");
}

/// Claim: `Client::lease` whose answer comes too late returns what its request leased, not an
/// outage, so that the caller can work on (or hand back) the task at once: the answer held up
/// past the 2 s deadline, the call learns under the request's own header what it leased. Before,
/// it returned `Unavailable` and the task stayed leased to nobody who knew it until its lease
/// (and any concurrency key's permit) ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_a_lease_whose_answer_is_late_returns_what_it_leased() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied: _,
    } = Setup::start().await;
    let impatient = one_attempt_in_two_seconds(&proxy);
    // Registered, and connected, before the answers slow down.
    impatient.register_worker("t46-late", false).await.unwrap();
    let id = direct.submit(&spec("late-lease")).await.unwrap().task.id;
    proxy.slow_answers(Duration::from_millis(2_500));
    let started = std::time::Instant::now();
    let lease = tokio::spawn({
        let impatient = impatient.clone();
        async move {
            impatient
                .lease("t46-late", &[QUEUE.to_string()], 1, 60_000, Duration::ZERO)
                .await
        }
    });
    // Once the lease is applied its answer is on its way (held for 2.5 s); the next answers are
    // not held up, but come after it on the same connection.
    reaches(&direct, id, TaskState::Leased, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.slow_answers(Duration::ZERO);
    let leased = tokio::time::timeout(Duration::from_secs(30), lease)
        .await
        .expect("the lease call never ended")
        .unwrap()
        .unwrap_or_else(|e| panic!("the lease was applied, its outcome learnt: {e}"));
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the lease's answer came in time, so the test showed nothing ({:?})",
        started.elapsed()
    );
    let task = direct.queue_task(id).await.unwrap();
    assert_eq!(task.state, TaskState::Leased, "{task:?}");
    assert_eq!(leased.len(), 1, "{leased:?}");
    assert_eq!(leased[0].task_id, id, "{leased:?}");
    assert_eq!(task.attempts.len(), 1, "leased once: {task:?}");

    // A lease refused when applied (its queue unknown), its answer late: the call answers the
    // refusal, not "nothing leased".
    proxy.slow_answers(Duration::from_millis(2_500));
    let started = std::time::Instant::now();
    let refused = tokio::spawn(async move {
        impatient
            .lease("t46-late", &["nope".to_string()], 1, 60_000, Duration::ZERO)
            .await
    });
    // Applied within the second (one node): its refusal is on its way, held.
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.slow_answers(Duration::ZERO);
    let refused = tokio::time::timeout(Duration::from_secs(30), refused)
        .await
        .expect("the lease call never ended")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the refusal came in time, so the test showed nothing ({:?})",
        started.elapsed()
    );
    match refused {
        Err(baton_rpc::Error::Refused(baton_statemachine::Refusal::UnknownQueue)) => {}
        other => panic!("a late refusal was taken for no lease: {other:?}"),
    }
}

/// Claim: a worker's lease whose answer is lost, and whose settling ask's answer is lost too, is
/// settled again once answers get through, before the worker numbers another: the task it
/// leased runs under that attempt at once. Before, the worker dropped it and numbered a new
/// request; once that was applied the store forgot the first one's answer, and the task stayed
/// leased to this worker, unrun, until its 20 s lease ran out, to run as a second attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t46_a_lease_whose_settling_ask_is_lost_too_is_settled_again() {
    let Setup {
        _cluster,
        direct,
        proxy,
        proxied: _,
    } = Setup::start().await;
    let mut worker = Counting::start(&direct, &proxy, "t46-unsettled").await;
    // From now on no answer gets back in time: the worker's long poll (a 5 s wait on a 2 s
    // deadline) leases the task submitted next, and neither its answer nor the settling ask's
    // reach the worker.
    proxy.slow_answers(Duration::from_secs(60));
    let id = direct.submit(&spec("unsettled")).await.unwrap().task.id;
    reaches(&direct, id, TaskState::Leased, Duration::from_secs(20)).await;
    // The long poll gives up at most 7 s after it was sent, its settling ask 2 s after that.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let task = direct.queue_task(id).await.unwrap();
    assert_eq!(
        task.state,
        TaskState::Leased,
        "the worker learnt of its lease while answers were held: {task:?}"
    );
    // Answers get through again, on new connections (the held bytes go with the old ones).
    proxy.slow_answers(Duration::ZERO);
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.heal();

    let finished = worker.finished().await;
    assert_eq!(
        (finished.task_id, finished.attempt, finished.end),
        (id, 1, AttemptEnd::Completed),
        "the first attempt was not run: {finished:?}"
    );
    let task = direct.queue_task(id).await.unwrap();
    assert_eq!(task.state, TaskState::Succeeded, "{task:?}");
    assert_eq!(task.attempts.len(), 1, "{task:?}");
    assert_eq!(worker.runs(), 1);
    worker.stop().await;
}
