//! The task board: seed, claim, release, complete, renew, and a linearizable listing.

use baton_statemachine::board::{Task, TaskSpec};

use super::{answered, credential, Client, MAX_ANSWER_BYTES};
use crate::batch;
use crate::convert;
use crate::error::Error;
use crate::proto;
use crate::proto::board_client::BoardClient;

/// A consistent view of every task. Lease tokens are withheld (empty): only the claimer sees its
/// token, in the answer to its claim or renew.
#[derive(Debug, Clone)]
pub struct TaskSnapshot {
    /// Every task, ordered by id.
    pub tasks: Vec<Task>,
    /// The store's "now" for judging them.
    pub now_ms: u64,
    /// The Raft log index the view reflects.
    pub revision: u64,
}

impl Client {
    /// Seeds (or re-seeds) tasks: the same id overwrites the dependencies and clears the lease.
    /// Returns how many tasks were written.
    pub async fn seed(&self, tasks: &[TaskSpec]) -> Result<u64, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::SeedTasksRequest {
                    header: Some(header),
                    tasks: tasks.iter().map(convert::task_spec_to_proto).collect(),
                };
                async move { BoardClient::new(channel).seed(request).await }
            })
            .await?;
        Ok(reply.tasks)
    }

    /// Claims a task for `agent` for `ttl_ms`; the returned task's lease carries the token and
    /// fence. `Taken` when a live lease holds it, `Blocked` while a dependency is not done.
    pub async fn claim(&self, id: &str, agent: &str, ttl_ms: i64) -> Result<Task, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::ClaimTaskRequest {
                    header: Some(header),
                    id: id.to_string(),
                    agent: agent.to_string(),
                    ttl_ms,
                };
                channel.unary(batch::BOARD_CLAIM, request)
            })
            .await?;
        let task = answered(reply.task, "claim", "a task").map(convert::task_from_proto)?;
        let lease = task.lease.as_ref();
        credential(
            "claim",
            lease.map_or("", |l| l.token.as_str()),
            lease.map_or(0, |l| l.fence),
        )?;
        Ok(task)
    }

    /// Gives a live claim back (`LeaseLost` unless `token` is the current one).
    pub async fn release_task(&self, id: &str, token: &str) -> Result<(), Error> {
        self.write(|header, channel| {
            let request = proto::ReleaseTaskRequest {
                header: Some(header),
                id: id.to_string(),
                token: token.to_string(),
            };
            channel.unary(batch::BOARD_RELEASE, request)
        })
        .await
        .map(|_| ())
    }

    /// Marks a claimed task done with its live claim (`LeaseLost` unless `token` is current).
    pub async fn complete_task(&self, id: &str, token: &str) -> Result<(), Error> {
        self.write(|header, channel| {
            let request = proto::CompleteTaskRequest {
                header: Some(header),
                id: id.to_string(),
                token: token.to_string(),
            };
            channel.unary(batch::BOARD_COMPLETE, request)
        })
        .await
        .map(|_| ())
    }

    /// Extends a live claim to now + `ttl_ms`; token and fence stay the same.
    pub async fn renew_task(&self, id: &str, token: &str, ttl_ms: i64) -> Result<Task, Error> {
        let reply = self
            .write(|header, channel| {
                let request = proto::RenewTaskRequest {
                    header: Some(header),
                    id: id.to_string(),
                    token: token.to_string(),
                    ttl_ms,
                };
                channel.unary(batch::BOARD_RENEW, request)
            })
            .await?;
        answered(reply.task, "renew", "a task").map(convert::task_from_proto)
    }

    /// Linearizable read of every task (tokens withheld).
    pub async fn tasks(&self) -> Result<TaskSnapshot, Error> {
        let reply = self
            .call_patiently(|channel| async move {
                BoardClient::new(channel)
                    .max_decoding_message_size(MAX_ANSWER_BYTES)
                    .list(proto::ListTasksRequest {})
                    .await
            })
            .await?;
        Ok(TaskSnapshot {
            tasks: reply
                .tasks
                .into_iter()
                .map(convert::task_from_proto)
                .collect(),
            now_ms: reply.now_ms,
            revision: reply.revision,
        })
    }
}
