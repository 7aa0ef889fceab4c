//! The keyed-concurrency task queue (seed 004): queues, workers, submissions, long-poll leases
//! and the attempt lifecycle (start, renew, complete, fail, report unknown).
//!
//! Most programs do not drive the attempt calls by hand: [`crate::worker::Worker`] does it for
//! them, with the protocol checks, renewals and graceful draining the seed asks for.

use std::time::Duration;

use tokio::time::Instant;

use baton_statemachine::queue::{
    Assignment, Attempt, Queue, SubmitReceipt, Task, TaskFilter, TaskSpec, Worker, MAX_LEASE_BATCH,
    MAX_LIST_PAGE,
};
use baton_statemachine::Refusal;

use super::{answered, decoded, Client, MAX_ANSWER_BYTES};
use crate::batch;
use crate::convert;
use crate::error::Error;
use crate::proto;
use crate::proto::queue_client::QueueClient;

/// The longest a lease long-poll waits on the server; longer waits are capped to it.
pub const MAX_LEASE_WAIT: Duration = Duration::from_secs(30);

/// One page of a task listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTaskPage {
    /// The matching tasks, by id, as summaries (payload and result empty).
    pub tasks: Vec<Task>,
    /// Where the next page starts (its `after_id`); `None` when no task is left.
    pub next_after_id: Option<u64>,
    /// The Raft log index this page reflects.
    pub revision: u64,
}

/// A task's attempt history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptHistory {
    /// The task.
    pub task_id: u64,
    /// Its concurrency key (empty = none).
    pub concurrency_key: String,
    /// Every attempt, oldest first, with its permit token (keyed tasks only).
    pub attempts: Vec<Attempt>,
    /// The Raft log index the view reflects.
    pub revision: u64,
}

fn task_of(task: Option<proto::QueueTask>, call: &str) -> Result<Task, Error> {
    let task = answered(task, call, "a task")?;
    decoded(convert::queue_task_from_proto(task), call)
}

impl Client {
    /// Creates a queue in `namespace` (the same name and namespace again returns it unchanged;
    /// the same name in another namespace is refused `StateConflict`).
    pub async fn create_queue(&self, name: &str, namespace: &str) -> Result<Queue, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::CreateQueueRequest {
                    header: Some(header),
                    name: name.to_string(),
                    namespace: namespace.to_string(),
                };
                async move { QueueClient::new(channel).create_queue(request).await }
            })
            .await?;
        answered(reply.queue, "create_queue", "a queue").map(convert::queue_from_proto)
    }

    /// Linearizable list of every queue, by name.
    pub async fn queues(&self) -> Result<Vec<Queue>, Error> {
        let reply = self
            .call(|channel| async move {
                // Every queue in one answer: thousands of long names pass gRPC's 4 MiB default.
                QueueClient::new(channel)
                    .max_decoding_message_size(MAX_ANSWER_BYTES)
                    .list_queues(proto::ListQueuesRequest {})
                    .await
            })
            .await?;
        Ok(reply
            .queues
            .into_iter()
            .map(convert::queue_from_proto)
            .collect())
    }

    /// Registers a worker identity with its concurrency-key support. The support is fixed for the
    /// identity's life: registering it again with another answer is refused `StateConflict`.
    pub async fn register_worker(&self, id: &str, concurrency_keys: bool) -> Result<Worker, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::RegisterWorkerRequest {
                    header: Some(header),
                    worker_id: id.to_string(),
                    concurrency_keys,
                };
                async move { QueueClient::new(channel).register_worker(request).await }
            })
            .await?;
        answered(reply.worker, "register_worker", "a worker").map(convert::worker_from_proto)
    }

    /// Submits a task. The same idempotency key with the same content answers the original
    /// receipt (`replayed`); with other content (including another concurrency key) it is refused
    /// `IdempotencyConflict`. `UnknownQueue` for a queue that does not exist.
    pub async fn submit(&self, spec: &TaskSpec) -> Result<SubmitReceipt, Error> {
        let reply = self
            .write(|header, channel| {
                let request = convert::submit_to_proto(header, spec);
                channel.unary(batch::QUEUE_SUBMIT, request)
            })
            .await?;
        Ok(SubmitReceipt {
            task: task_of(reply.task, "submit")?,
            replayed: reply.replayed,
        })
    }

    /// Linearizable read of one queue task with its attempts (`UnknownTask` when there is none).
    pub async fn queue_task(&self, id: u64) -> Result<Task, Error> {
        let reply = self
            .call(|channel| channel.unary(batch::QUEUE_GET_TASK, proto::GetQueueTaskRequest { id }))
            .await?;
        task_of(reply.task, "get_task")
    }

    /// Every queue task matching `filter`, by id, read page by page with
    /// [`Client::queue_tasks_page`]. These are summaries: each task's payload and result are
    /// empty ([`Client::queue_task`] has them). Each page is a linearizable read of its own, so
    /// every task is listed once, as it stood when its page was read; a task submitted while the
    /// listing runs shows up only if its page comes later.
    pub async fn queue_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>, Error> {
        let mut tasks = Vec::new();
        let mut after_id = 0;
        loop {
            let page = self
                .queue_tasks_page(filter, after_id, MAX_LIST_PAGE)
                .await?;
            tasks.extend(page.tasks);
            match page.next_after_id {
                Some(next) if next > after_id => after_id = next,
                // Pages only go forward: a node that says otherwise would be asked for ever.
                Some(next) => {
                    return Err(Error::Protocol(format!(
                        "the task listing went back from id {after_id} to {next}"
                    )))
                }
                None => return Ok(tasks),
            }
        }
    }

    /// Linearizable read of one page of the queue tasks matching `filter`: those with an id
    /// above `after_id` (0 for the first page), at most `limit` of them (0 = the node's default,
    /// 1,000; at most [`MAX_LIST_PAGE`]). A page also ends after the node has looked at 100,000
    /// tasks, so a filter that matches few tasks can give a short or empty page that is not the
    /// last: go on while [`QueueTaskPage::next_after_id`] is `Some`.
    pub async fn queue_tasks_page(
        &self,
        filter: &TaskFilter,
        after_id: u64,
        limit: u32,
    ) -> Result<QueueTaskPage, Error> {
        let reply = self
            .call(|channel| {
                let request = proto::ListQueueTasksRequest {
                    queue: filter.queue.clone(),
                    state: filter.state.map(|s| s.as_str().to_string()),
                    concurrency_key: filter.concurrency_key.clone(),
                    after_id,
                    limit,
                };
                async move {
                    QueueClient::new(channel)
                        .max_decoding_message_size(MAX_ANSWER_BYTES)
                        .list_tasks(request)
                        .await
                }
            })
            .await?;
        let tasks = reply
            .tasks
            .into_iter()
            .map(|task| decoded(convert::queue_task_from_proto(task), "list_tasks"))
            .collect::<Result<_, _>>()?;
        Ok(QueueTaskPage {
            tasks,
            next_after_id: (reply.next_after_id != 0).then_some(reply.next_after_id),
            revision: reply.revision,
        })
    }

    /// A task's attempt history with permit tokens (`UnknownTask` when there is none). The
    /// tokens are for checking; they grant nothing.
    pub async fn attempts(&self, task_id: u64) -> Result<AttemptHistory, Error> {
        let reply = self
            .call(|channel| async move {
                QueueClient::new(channel)
                    .max_decoding_message_size(MAX_ANSWER_BYTES)
                    .attempts(proto::AttemptsRequest { task_id })
                    .await
            })
            .await?;
        let attempts = reply
            .attempts
            .into_iter()
            .map(|a| decoded(convert::attempt_from_proto(a), "attempts"))
            .collect::<Result<_, _>>()?;
        Ok(AttemptHistory {
            task_id: reply.task_id,
            concurrency_key: reply.concurrency_key,
            attempts,
            revision: reply.revision,
        })
    }

    /// Cancels a task that has not started (a leased attempt is cancelled and its permit freed):
    /// `AlreadyStarted` once it runs, `AlreadySettled` when it is finished.
    pub async fn cancel_task(&self, id: u64) -> Result<Task, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::CancelQueueTaskRequest {
                    header: Some(header),
                    id,
                };
                async move {
                    QueueClient::new(channel)
                        .max_decoding_message_size(MAX_ANSWER_BYTES)
                        .cancel_task(request)
                        .await
                }
            })
            .await?;
        task_of(reply.task, "cancel_task")
    }

    /// Leases up to `limit` tasks from `queues` (every queue when empty) for `lease_ttl_ms`.
    ///
    /// When nothing is leasable the leader holds the call for up to `wait` (capped at
    /// [`MAX_LEASE_WAIT`]) without writing anything, and leases as soon as something becomes
    /// leasable; the answer may still be empty (the wait ran out, or another worker won). A
    /// retry after a lost answer carries the same request header, so it gets the same
    /// assignments. When no answer came before the deadline, the call asks once more under that
    /// header, with a limit of zero that leases nothing new, what the request leased, and returns
    /// that: tasks it leased would otherwise wait for their leases to run out, their concurrency
    /// keys held. Only when that fails too does it return an error: the outcome still unknown,
    /// or the request's own refusal (an unknown queue, say) whose answer was late. A `limit`
    /// outside 1–1,000 is refused here, as the store would refuse it.
    pub async fn lease(
        &self,
        worker: &str,
        queues: &[String],
        limit: u32,
        lease_ttl_ms: i64,
        wait: Duration,
    ) -> Result<Vec<Assignment>, Error> {
        let poll = self
            .lease_poll(worker, queues, limit, lease_ttl_ms, wait)
            .await?;
        let leased = match poll.send().await {
            Err(error) if error.outcome_unknown() => poll.settle().await?,
            sent => sent?,
        };
        Ok(leased.assignments)
    }

    /// Numbers a lease request (in the long polls' session) without sending it: see
    /// [`LeasePoll`].
    pub(crate) async fn lease_poll(
        &self,
        worker: &str,
        queues: &[String],
        limit: u32,
        lease_ttl_ms: i64,
        wait: Duration,
    ) -> Result<LeasePoll<'_>, Error> {
        // Refused before it is sent: the settling ask is told its own limit is refused, and a
        // request refused for its limit would answer a settling ask just the same.
        if limit == 0 || limit > MAX_LEASE_BATCH {
            return Err(Error::Refused(Refusal::invalid(
                "limit",
                format!("must be 1-{MAX_LEASE_BATCH}"),
            )));
        }
        let wait = wait.min(MAX_LEASE_WAIT);
        let started = std::time::Instant::now();
        Ok(LeasePoll {
            client: self,
            number: self.number(wait, started).await?,
            started,
            worker: worker.to_string(),
            queues: queues.to_vec(),
            limit,
            lease_ttl_ms,
            wait,
        })
    }

    /// Confirms the start of a leased attempt; business code may run only after this succeeds.
    /// `LeaseLost` when the attempt is no longer this worker's.
    pub async fn start_attempt(
        &self,
        task_id: u64,
        attempt: u32,
        worker: &str,
    ) -> Result<Task, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::StartAttemptRequest {
                    header: Some(header),
                    task_id,
                    attempt,
                    worker_id: worker.to_string(),
                };
                channel.unary(batch::QUEUE_START, request)
            })
            .await?;
        task_of(reply.task, "start")
    }

    /// Extends an active attempt's lease (and its permit) to now + `lease_ttl_ms`; the token
    /// stays the same. `LeaseLost` when the attempt is no longer this worker's.
    pub async fn renew_attempt(
        &self,
        task_id: u64,
        attempt: u32,
        worker: &str,
        lease_ttl_ms: i64,
    ) -> Result<Task, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::RenewAttemptRequest {
                    header: Some(header),
                    task_id,
                    attempt,
                    worker_id: worker.to_string(),
                    lease_ttl_ms,
                };
                channel.unary(batch::QUEUE_RENEW, request)
            })
            .await?;
        task_of(reply.task, "renew")
    }

    /// Finishes a running attempt successfully with `result` (`NotStarted` before its start,
    /// `LeaseLost` when it is no longer this worker's; a repeat answers the task unchanged).
    pub async fn complete_attempt(
        &self,
        task_id: u64,
        attempt: u32,
        worker: &str,
        result: &[u8],
    ) -> Result<Task, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::CompleteAttemptRequest {
                    header: Some(header),
                    task_id,
                    attempt,
                    worker_id: worker.to_string(),
                    result: result.to_vec(),
                };
                channel.unary(batch::QUEUE_COMPLETE, request)
            })
            .await?;
        task_of(reply.task, "complete")
    }

    /// Fails an active attempt. A `retryable` failure with attempts and time left backs off and
    /// retries (the permit is released meanwhile); anything else fails the task for good.
    pub async fn fail_attempt(
        &self,
        task_id: u64,
        attempt: u32,
        worker: &str,
        error: &str,
        retryable: bool,
    ) -> Result<Task, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::FailAttemptRequest {
                    header: Some(header),
                    task_id,
                    attempt,
                    worker_id: worker.to_string(),
                    error: error.to_string(),
                    retryable,
                };
                channel.unary(batch::QUEUE_FAIL, request)
            })
            .await?;
        task_of(reply.task, "fail")
    }

    /// Reports that a running attempt's effect is unknown: the task needs review, its permit is
    /// released and its history kept (`NotStarted` before its start).
    pub async fn report_unknown(
        &self,
        task_id: u64,
        attempt: u32,
        worker: &str,
        note: &str,
    ) -> Result<Task, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::ReportUnknownRequest {
                    header: Some(header),
                    task_id,
                    attempt,
                    worker_id: worker.to_string(),
                    note: note.to_string(),
                };
                async move {
                    QueueClient::new(channel)
                        .max_decoding_message_size(MAX_ANSWER_BYTES)
                        .report_unknown(request)
                        .await
                }
            })
            .await?;
        task_of(reply.task, "report_unknown")
    }
}

/// One lease request, numbered: [`LeasePoll::send`] sends it (a long poll); when that call is
/// dropped — the worker stops while the answer is on its way — [`LeasePoll::settle`] learns what
/// the request leased, if anything, so that those attempts do not stay leased to a worker that
/// is gone until their leases run out.
pub(crate) struct LeasePoll<'a> {
    client: &'a Client,
    number: super::InFlight<'a>,
    started: std::time::Instant,
    worker: String,
    queues: Vec<String>,
    limit: u32,
    lease_ttl_ms: i64,
    wait: Duration,
}

impl LeasePoll<'_> {
    /// Sends the request and waits for its answer (at most its wait beyond the deadline).
    pub(crate) async fn send(&self) -> Result<Leased, Error> {
        let reply = self.ask(self.limit, self.wait, false, self.started).await?;
        self.within_limit(Leased::from_reply(reply))
    }

    /// `leased`, unless it holds more than the request's limit: a worker runs one handler per
    /// assignment, and its limit is what keeps them within its slots.
    fn within_limit(&self, leased: Leased) -> Result<Leased, Error> {
        if leased.assignments.len() > self.limit as usize {
            return Err(Error::Protocol(format!(
                "lease answered {} assignments to a request for at most {}",
                leased.assignments.len(),
                self.limit
            )));
        }
        Ok(leased)
    }

    /// What the request leased, whether or not an earlier [`LeasePoll::send`] of it got there
    /// (its call dropped, or failed for want of an answer): it is asked again under its own seq
    /// (marked a retry, without waiting) with a limit of zero, which the store refuses. Applied
    /// before, the request's own answer comes back; not yet, the refusal is recorded as its
    /// answer, and the request, should it still arrive, gets that refusal and leases nothing.
    /// A request refused when it was applied (an unknown queue) answers its own refusal.
    /// (A client the session table no longer knows at all would be told nothing was leased; it
    /// forgets a client only once idle for 5 minutes, far beyond a settling ask.)
    pub(crate) async fn settle(&self) -> Result<Leased, Error> {
        let asked = self
            .ask(0, Duration::ZERO, true, std::time::Instant::now())
            .await;
        match asked {
            Ok(reply) => self.within_limit(Leased::from_reply(reply)),
            // The settling limit refused: the first request was not applied, and leases nothing.
            Err(Error::Refused(Refusal::Invalid { field, .. })) if field == "limit" => Ok(Leased {
                assignments: Vec::new(),
                arrived: Instant::now(),
                store_now_ms: 0,
            }),
            // Unreachable again, or the first request's own refusal (an unknown queue, say),
            // which its caller is to hear.
            Err(error) => Err(error),
        }
    }

    async fn ask(
        &self,
        limit: u32,
        wait: Duration,
        retry: bool,
        started: std::time::Instant,
    ) -> Result<proto::LeaseResponse, Error> {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.client
            .send_numbered(&self.number, started, wait, retry, |header, channel| {
                let request = proto::LeaseRequest {
                    header: Some(header),
                    worker_id: self.worker.clone(),
                    queues: self.queues.clone(),
                    limit,
                    lease_ttl_ms: self.lease_ttl_ms,
                    wait_ms,
                };
                async move {
                    QueueClient::new(channel)
                        .max_decoding_message_size(MAX_ANSWER_BYTES)
                        .lease(request)
                        .await
                }
            })
            .await
    }
}

/// A lease answer and when it arrived, so that a lease's end can be told on this machine's clock.
pub(crate) struct Leased {
    /// The leased attempts.
    pub(crate) assignments: Vec<Assignment>,
    /// When the answer arrived here.
    pub(crate) arrived: Instant,
    /// The store's clock when the answer was made (0 from a node that does not say).
    pub(crate) store_now_ms: u64,
}

impl Leased {
    fn from_reply(reply: proto::LeaseResponse) -> Self {
        Self {
            arrived: Instant::now(),
            store_now_ms: reply.now_ms,
            assignments: reply
                .assignments
                .into_iter()
                .map(convert::assignment_from_proto)
                .collect(),
        }
    }

    /// When `assignment`'s lease ends by this machine's clock, were it leased for `ttl`: what was
    /// left of it when the answer was made, counted from the answer's arrival.
    ///
    /// Counting the whole TTL from the arrival is right only for an answer made the moment the
    /// lease was granted. An answer replayed to a retry (the first one lost in a failover) can
    /// arrive seconds after the grant; a handler trusting the whole TTL would run on after the
    /// store had handed the task to another worker.
    pub(crate) fn local_end(&self, assignment: &Assignment, ttl: Duration) -> Instant {
        if self.store_now_ms == 0 {
            return self.arrived + ttl;
        }
        let left = assignment.lease_until_ms.saturating_sub(self.store_now_ms);
        self.arrived + Duration::from_millis(left).min(ttl)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::client::ClientConfig;

    /// A lease whose limit the store would refuse is refused before it is sent (no node listens
    /// at the address: a request sent would end `Unavailable`). Sent and its answer lost, the settling ask
    /// would get that refusal back and take it for its own: "nothing was leased".
    #[tokio::test]
    async fn a_lease_limit_the_store_refuses_is_refused_before_it_is_sent() {
        let config = ClientConfig {
            deadline: Duration::from_millis(200),
            ..ClientConfig::default()
        };
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let client = Client::new(&[closed.to_string()], config).unwrap();
        for limit in [0, MAX_LEASE_BATCH + 1] {
            match client.lease("w", &[], limit, 1_000, Duration::ZERO).await {
                Err(Error::Refused(Refusal::Invalid { field, .. })) => assert_eq!(field, "limit"),
                other => panic!("limit {limit}: {other:?}"),
            }
        }
        assert!(matches!(
            client.lease("w", &[], 1, 1_000, Duration::ZERO).await,
            Err(Error::Unavailable { .. })
        ));
    }
}
