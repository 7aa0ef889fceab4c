//! The task-queue service (seed 004).
//!
//! Every write is one proposed command, except that `Lease` may first wait: a long poll holds the
//! request on the leader, reading the applied state (no log entries) until something is leasable
//! for this worker or `wait_ms` runs out, and only then proposes exactly one `Lease` command
//! under the request's header. A retried header therefore meets the session table and gets the
//! first answer, never a second lease.

use std::time::Duration;

use baton_rpc::proto::queue_server;
use baton_rpc::proto::{
    AttemptsRequest, AttemptsResponse, CancelQueueTaskRequest, CancelQueueTaskResponse,
    CompleteAttemptRequest, CompleteAttemptResponse, CreateQueueRequest, CreateQueueResponse,
    FailAttemptRequest, FailAttemptResponse, GetQueueTaskRequest, GetQueueTaskResponse,
    LeaseRequest, LeaseResponse, ListQueueTasksRequest, ListQueueTasksResponse, ListQueuesRequest,
    ListQueuesResponse, RegisterWorkerRequest, RegisterWorkerResponse, RenewAttemptRequest,
    RenewAttemptResponse, ReportUnknownRequest, ReportUnknownResponse, StartAttemptRequest,
    StartAttemptResponse, SubmitRequest, SubmitResponse,
};
use baton_rpc::{convert, MAX_LEASE_WAIT};
use baton_statemachine::queue::{
    Command, Queue, Task, TaskFilter, Worker, MAX_LEASE_BATCH, MAX_LEASE_QUEUES, MAX_LIST_PAGE,
    MAX_LIST_SCAN,
};
use baton_statemachine::{Command as Cmd, Origin, Refusal, Reply, SessionLookup};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::{
    now_ms, origin, refuse_unless_answered, refused, revision, unexpected, QUEUE_LEASE_TTL,
};
use crate::admission::Admission;
use crate::node::NodeRef;
use crate::stamp::wall_clock_ms;
use crate::store::Applied;

/// A waiting lease re-checks at least this often even when nothing is applied, so retries whose
/// back-off ends and leases that run out (both due with time, not with a log entry) are noticed.
const LEASE_RECHECK: Duration = Duration::from_secs(1);
/// Tasks in a listing page when the request leaves its limit at 0.
const DEFAULT_LIST_PAGE: u32 = 1_000;

/// Serves the task queue.
pub struct QueueService {
    node: NodeRef,
    admission: Admission,
}

impl QueueService {
    /// Serves `node`; a waiting lease gives up when `admission`'s gate closes.
    pub fn new(node: NodeRef, admission: Admission) -> Self {
        Self { node, admission }
    }

    async fn propose_task(&self, origin: Origin, command: Command) -> Result<Task, Status> {
        match self.node.propose(Some(origin), Cmd::Queue(command)).await? {
            Reply::QueueTask(task) => Ok(*task),
            other => Err(unexpected(other)),
        }
    }

    fn is_leader(&self) -> bool {
        self.node.raft.metrics().borrow().current_leader == Some(self.node.id)
    }

    /// Holds a lease request until proposing it is worthwhile: something is leasable for
    /// `request`'s worker, the request is a retry the session table already answered, the
    /// state machine would refuse it anyway, this node stopped leading, or `wait` ran out.
    /// Reads only; writes nothing. When the gate closes (a handover or a shutdown begins) it
    /// answers as the gate would a new request, retryably and without proposing: a long poll
    /// must neither hold the drain up nor append an entry while leadership moves.
    async fn wait_until_leasable(
        &self,
        origin: &Origin,
        request: &LeaseRequest,
        wait: Duration,
    ) -> Result<(), Status> {
        let until = Instant::now() + wait;
        // Subscribe before the first look, so no apply between the look and the wait is missed.
        let mut applied_index = self.node.state_machine.subscribe();
        // A linearizable first look: followers answer NOT_LEADER here, and the view includes
        // every write acknowledged before this request arrived.
        if self
            .node
            .read(|applied| worth_proposing(applied, origin, request))
            .await?
        {
            return Ok(());
        }
        loop {
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            let tick = (until - now).min(LEASE_RECHECK);
            tokio::select! {
                refusal = self.admission.closed() => return Err(refusal),
                changed = tokio::time::timeout(tick, applied_index.changed()) => match changed {
                    Ok(Ok(())) | Err(_) => {}
                    // The store is gone (shutting down): stop waiting, the proposal will say why.
                    Ok(Err(_)) => return Ok(()),
                },
            }
            if !self.is_leader() {
                return Ok(());
            }
            let ready = {
                let applied = self.node.state_machine.read();
                worth_proposing(&applied, origin, request)
            };
            if ready {
                return Ok(());
            }
        }
    }
}

/// Whether a lease should be proposed now rather than wait.
fn worth_proposing(applied: &Applied, origin: &Origin, request: &LeaseRequest) -> bool {
    let queue = &applied.state.queue;
    // A retry already applied (or too old to tell): the session table answers at once.
    if !matches!(applied.state.sessions.lookup(origin), SessionLookup::New) {
        return true;
    }
    // Anything the state machine would refuse is refused at once, not after the wait.
    let bad_input = request.limit == 0
        || request.limit > MAX_LEASE_BATCH
        || request.lease_ttl_ms <= 0
        || queue.worker(&request.worker_id).is_none()
        || request.queues.iter().any(|name| !queue.has_queue(name));
    bad_input || queue.has_leasable(now_ms(applied), &request.worker_id, &request.queues)
}

#[tonic::async_trait]
impl queue_server::Queue for QueueService {
    #[tracing::instrument(skip_all, fields(command = "queue.create"))]
    async fn create_queue(
        &self,
        request: Request<CreateQueueRequest>,
    ) -> Result<Response<CreateQueueResponse>, Status> {
        let r = request.into_inner();
        let command = Command::CreateQueue(Queue {
            name: r.name,
            namespace: r.namespace,
        });
        match self
            .node
            .propose(Some(origin(r.header)?), Cmd::Queue(command))
            .await?
        {
            Reply::Queue(queue) => Ok(Response::new(CreateQueueResponse {
                queue: Some(convert::queue_to_proto(&queue)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(query = "queue.list_queues"))]
    async fn list_queues(
        &self,
        _request: Request<ListQueuesRequest>,
    ) -> Result<Response<ListQueuesResponse>, Status> {
        let reply = self
            .node
            .read(|applied| ListQueuesResponse {
                queues: applied
                    .state
                    .queue
                    .queues()
                    .map(convert::queue_to_proto)
                    .collect(),
                revision: revision(applied),
            })
            .await?;
        Ok(Response::new(reply))
    }

    #[tracing::instrument(skip_all, fields(command = "queue.register_worker"))]
    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        let r = request.into_inner();
        let command = Command::RegisterWorker(Worker {
            id: r.worker_id,
            concurrency_keys: r.concurrency_keys,
        });
        match self
            .node
            .propose(Some(origin(r.header)?), Cmd::Queue(command))
            .await?
        {
            Reply::Worker(worker) => Ok(Response::new(RegisterWorkerResponse {
                worker: Some(convert::worker_to_proto(&worker)),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "queue.submit"))]
    async fn submit(
        &self,
        request: Request<SubmitRequest>,
    ) -> Result<Response<SubmitResponse>, Status> {
        let mut r = request.into_inner();
        let origin = origin(r.header.take())?;
        let spec = convert::submit_from_proto(r).map_err(refused)?;
        match self
            .node
            .propose(Some(origin), Cmd::Queue(Command::Submit(spec)))
            .await?
        {
            Reply::Submitted(receipt) => Ok(Response::new(SubmitResponse {
                task: Some(convert::queue_task_to_proto(&receipt.task)),
                replayed: receipt.replayed,
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(query = "queue.get_task"))]
    async fn get_task(
        &self,
        request: Request<GetQueueTaskRequest>,
    ) -> Result<Response<GetQueueTaskResponse>, Status> {
        let id = request.into_inner().id;
        let reply = self
            .node
            .read(|applied| {
                applied
                    .state
                    .queue
                    .get(id)
                    .map(|task| GetQueueTaskResponse {
                        task: Some(convert::queue_task_to_proto(task)),
                        now_ms: now_ms(applied),
                        revision: revision(applied),
                    })
            })
            .await?;
        reply
            .map(Response::new)
            .ok_or_else(|| refused(Refusal::UnknownTask))
    }

    #[tracing::instrument(skip_all, fields(query = "queue.list_tasks"))]
    async fn list_tasks(
        &self,
        request: Request<ListQueueTasksRequest>,
    ) -> Result<Response<ListQueueTasksResponse>, Status> {
        let r = request.into_inner();
        let state = r
            .state
            .as_deref()
            .map(|state| convert::queue_task_state_from_str("state", state))
            .transpose()
            .map_err(refused)?;
        let limit = match r.limit {
            0 => DEFAULT_LIST_PAGE,
            limit if limit <= MAX_LIST_PAGE => limit,
            _ => {
                return Err(refused(Refusal::invalid(
                    "limit",
                    format!("must be at most {MAX_LIST_PAGE} (0 means {DEFAULT_LIST_PAGE})"),
                )))
            }
        };
        let filter = TaskFilter {
            queue: r.queue,
            state,
            concurrency_key: r.concurrency_key,
        };
        // Pointers under the state lock, converted after it (applies wait while it is held).
        // An apply that changes a listed task meanwhile copies that one task instead of
        // sharing it: far less than copying every listed task under the lock.
        let (tasks, next_after, now_ms, revision) = self
            .node
            .read(|applied| {
                let page = applied.state.queue.list_page(
                    &filter,
                    r.after_id,
                    limit as usize,
                    MAX_LIST_SCAN,
                );
                let tasks: Vec<_> = page.tasks.into_iter().cloned().collect();
                (tasks, page.next_after, now_ms(applied), revision(applied))
            })
            .await?;
        Ok(Response::new(ListQueueTasksResponse {
            tasks: tasks
                .iter()
                .map(|task| convert::queue_task_summary_to_proto(task))
                .collect(),
            now_ms,
            revision,
            next_after_id: next_after.unwrap_or(0),
        }))
    }

    #[tracing::instrument(skip_all, fields(query = "queue.attempts"))]
    async fn attempts(
        &self,
        request: Request<AttemptsRequest>,
    ) -> Result<Response<AttemptsResponse>, Status> {
        let task_id = request.into_inner().task_id;
        let reply = self
            .node
            .read(|applied| {
                applied
                    .state
                    .queue
                    .get(task_id)
                    .map(|task| AttemptsResponse {
                        task_id,
                        concurrency_key: task.spec.concurrency_key.clone(),
                        attempts: task
                            .attempts
                            .iter()
                            .map(convert::attempt_to_proto)
                            .collect(),
                        revision: revision(applied),
                    })
            })
            .await?;
        reply
            .map(Response::new)
            .ok_or_else(|| refused(Refusal::UnknownTask))
    }

    #[tracing::instrument(skip_all, fields(command = "queue.cancel"))]
    async fn cancel_task(
        &self,
        request: Request<CancelQueueTaskRequest>,
    ) -> Result<Response<CancelQueueTaskResponse>, Status> {
        let r = request.into_inner();
        let task = self
            .propose_task(origin(r.header)?, Command::Cancel { task_id: r.id })
            .await?;
        Ok(Response::new(CancelQueueTaskResponse {
            task: Some(convert::queue_task_to_proto(&task)),
        }))
    }

    #[tracing::instrument(skip_all, fields(command = "queue.lease"))]
    async fn lease(
        &self,
        request: Request<LeaseRequest>,
    ) -> Result<Response<LeaseResponse>, Status> {
        let mut r = request.into_inner();
        // A retry is answered only from the session table or through the log (a worker settling
        // a lease whose answer it lost relies on that: see the client's `LeasePoll::settle`).
        let retry = r.header.as_ref().is_some_and(|header| header.retry);
        let origin = origin(r.header.take())?;
        let too_many_queues = (r.queues.len() > MAX_LEASE_QUEUES).then(|| {
            Refusal::invalid(
                "queues",
                format!("at most {MAX_LEASE_QUEUES} names (none: every queue)"),
            )
        });
        if let Some(refusal) = QUEUE_LEASE_TTL.refusal(r.lease_ttl_ms).or(too_many_queues) {
            refuse_unless_answered(&self.node, &origin, retry, refusal).await?;
        }
        // The wait is capped (MAX_LEASE_WAIT) so a request cannot pin a handler forever.
        let wait = Duration::from_millis(r.wait_ms).min(MAX_LEASE_WAIT);
        if !wait.is_zero() {
            self.wait_until_leasable(&origin, &r, wait).await?;
        }
        let command = Command::Lease {
            worker: r.worker_id,
            queues: r.queues,
            limit: r.limit,
            lease_ttl_ms: r.lease_ttl_ms,
        };
        match self
            .node
            .propose_attempt(Some(origin), retry, Cmd::Queue(command))
            .await?
        {
            Reply::Assignments(assignments) => Ok(Response::new(LeaseResponse {
                assignments: assignments
                    .iter()
                    .map(convert::assignment_to_proto)
                    .collect(),
                // Read after the apply: a replayed answer's leases are older than this clock,
                // and the worker counts what is left of them from here.
                now_ms: wall_clock_ms().max(self.node.state_machine.read().state.clock_ms),
            })),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(skip_all, fields(command = "queue.start"))]
    async fn start(
        &self,
        request: Request<StartAttemptRequest>,
    ) -> Result<Response<StartAttemptResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Start {
            task_id: r.task_id,
            attempt: r.attempt,
            worker: r.worker_id,
        };
        let task = self.propose_task(origin(r.header)?, command).await?;
        Ok(Response::new(StartAttemptResponse {
            task: Some(convert::queue_task_to_proto(&task)),
        }))
    }

    #[tracing::instrument(skip_all, fields(command = "queue.renew"))]
    async fn renew(
        &self,
        request: Request<RenewAttemptRequest>,
    ) -> Result<Response<RenewAttemptResponse>, Status> {
        let r = request.into_inner();
        let retry = r.header.as_ref().is_some_and(|header| header.retry);
        let origin = origin(r.header)?;
        QUEUE_LEASE_TTL
            .check(&self.node, &origin, retry, r.lease_ttl_ms)
            .await?;
        let command = Command::Renew {
            task_id: r.task_id,
            attempt: r.attempt,
            worker: r.worker_id,
            lease_ttl_ms: r.lease_ttl_ms,
        };
        let task = self.propose_task(origin, command).await?;
        Ok(Response::new(RenewAttemptResponse {
            task: Some(convert::queue_task_to_proto(&task)),
        }))
    }

    #[tracing::instrument(skip_all, fields(command = "queue.complete"))]
    async fn complete(
        &self,
        request: Request<CompleteAttemptRequest>,
    ) -> Result<Response<CompleteAttemptResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Complete {
            task_id: r.task_id,
            attempt: r.attempt,
            worker: r.worker_id,
            result: r.result,
        };
        let task = self.propose_task(origin(r.header)?, command).await?;
        Ok(Response::new(CompleteAttemptResponse {
            task: Some(convert::queue_task_to_proto(&task)),
        }))
    }

    #[tracing::instrument(skip_all, fields(command = "queue.fail"))]
    async fn fail(
        &self,
        request: Request<FailAttemptRequest>,
    ) -> Result<Response<FailAttemptResponse>, Status> {
        let r = request.into_inner();
        let command = Command::Fail {
            task_id: r.task_id,
            attempt: r.attempt,
            worker: r.worker_id,
            error: r.error,
            retryable: r.retryable,
        };
        let task = self.propose_task(origin(r.header)?, command).await?;
        Ok(Response::new(FailAttemptResponse {
            task: Some(convert::queue_task_to_proto(&task)),
        }))
    }

    #[tracing::instrument(skip_all, fields(command = "queue.report_unknown"))]
    async fn report_unknown(
        &self,
        request: Request<ReportUnknownRequest>,
    ) -> Result<Response<ReportUnknownResponse>, Status> {
        let r = request.into_inner();
        let command = Command::ReportUnknown {
            task_id: r.task_id,
            attempt: r.attempt,
            worker: r.worker_id,
            note: r.note,
        };
        let task = self.propose_task(origin(r.header)?, command).await?;
        Ok(Response::new(ReportUnknownResponse {
            task: Some(convert::queue_task_to_proto(&task)),
        }))
    }
}
