//! etcd (a three-member cluster) in its best form for each step: one `Txn` per write step,
//! comparing the revision or value that makes the step safe, and the client's session lease
//! instead of a lease per claim (granting a lease is itself a Raft write).
//!
//! - permit claim: `If(create_revision(k) == 0) Then(Put(k, token+holder, lease))` — absent
//!   means free; the session lease (30 s TTL, kept alive) frees the permit if the holder dies.
//!   The fence is the revision of the put. Release: `If(value(k) == token+holder) Then(Delete(k))`.
//! - handoff: offer `If(create_revision(k) == 0) Then(Put)`, take `If(mod_revision(k) == offer's
//!   revision) Then(Put taken)`, reply `If(mod_revision(k) == take's revision) Then(Put done)`.
//! - queue-claim: etcd has no SKIP LOCKED, so a worker reads a window of queued keys
//!   (keys only, serializable, from where its last read started) and moves one of them,
//!   starting at its own share of the window, with
//!   `If(mod_revision(queue/k) == r) Then(Delete(queue/k), Put(leased/k, worker, lease))`,
//!   trying the next key of the window when a peer moved it first; complete moves `leased/k` to
//!   `done/k` under `If(mod_revision(leased/k) == the move's revision)`.
//! - reads: a plain (linearizable) range read of one key.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnResponse,
};
use tokio::task::JoinHandle;

use crate::driver::{Claim, Job, Peer};
use crate::error::Error;
use crate::meter::Meter;
use crate::workload::{
    agent, Plan, Workload, PERMIT_TTL_S, QUEUE_LEASE_TTL_S, READ_TICKETS, RECIPIENT, SENDER,
    SUMMARY, TICKET_TTL_S,
};

/// etcd's default `--max-txn-ops`: the most puts one seeding transaction may carry.
const MAX_TXN_OPS: u32 = 128;
/// Concurrent seeding transactions.
const SEEDERS: usize = 8;
/// How often a session lease is kept alive (a third of its TTL).
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);
/// Windows one `lease_next` may read (and try through) before it gives the turn back.
const MAX_WINDOW_READS: usize = 4;

/// One client's own connection (a balanced channel to the three members).
pub struct Etcd {
    client: Client,
    keys: Keys,
    agent: String,
    /// The session lease attached to claimed permits and leased tasks (0: none).
    lease: i64,
    keeper: Option<JoinHandle<()>>,
    /// Where the next read of the queue starts: every key before it was gone when last read.
    cursor: String,
    /// How many queued keys one read fetches.
    window_size: i64,
    /// This worker's number among `clients`: where in a window it starts.
    share: usize,
    clients: usize,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
    }
}

/// This run's key spaces, under one prefix so that clean-up is one range delete.
#[derive(Clone)]
struct Keys {
    prefix: String,
}

impl Keys {
    fn new(plan: &Plan) -> Self {
        Self {
            prefix: format!("bench/{:08x}/", plan.run_id),
        }
    }

    fn permit(&self, n: u32) -> String {
        format!("{}permit/{n}", self.prefix)
    }

    fn ticket(&self, key: &str) -> String {
        format!("{}ticket/{key}", self.prefix)
    }

    fn queue_dir(&self) -> String {
        format!("{}queue/", self.prefix)
    }

    fn queued(&self, id: i64) -> String {
        format!("{}queue/{id:010}", self.prefix)
    }

    fn leased(&self, id: i64) -> String {
        format!("{}leased/{id:010}", self.prefix)
    }

    fn done(&self, id: i64) -> String {
        format!("{}done/{id:010}", self.prefix)
    }
}

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn endpoints(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_string()
            } else {
                format!("http://{e}")
            }
        })
        .collect()
}

async fn open(list: &str) -> Result<Client, Error> {
    let endpoints = endpoints(list);
    if endpoints.is_empty() {
        return Err(Error::Setup("no etcd endpoints".into()));
    }
    Ok(Client::connect(endpoints, None).await?)
}

/// The revision a successful transaction wrote at.
fn revision(response: &TxnResponse) -> i64 {
    response.header().map(|h| h.revision()).unwrap_or_default()
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

/// What an offered ticket holds: sender, recipient, reply-to and the deadline for taking it.
fn offered_value() -> String {
    let deadline = now_ms() + u128::from(TICKET_TTL_S) * 1000;
    format!("offered {SENDER} {RECIPIENT} {SENDER} {deadline}")
}

/// Puts `items` as `(key, value)` in transactions of at most [`MAX_TXN_OPS`], several at once.
async fn put_all(client: &Client, items: Vec<(String, String)>) -> Result<(), Error> {
    let items = Arc::new(items);
    let next = Arc::new(AtomicU32::new(0));
    let mut seeders = Vec::new();
    for _ in 0..SEEDERS {
        let (mut client, items, next) = (client.clone(), items.clone(), next.clone());
        seeders.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(MAX_TXN_OPS, Ordering::Relaxed) as usize;
                if start >= items.len() {
                    return Ok::<(), Error>(());
                }
                let end = (start + MAX_TXN_OPS as usize).min(items.len());
                let puts: Vec<TxnOp> = items[start..end]
                    .iter()
                    .map(|(k, v)| TxnOp::put(k.as_str(), v.as_str(), None))
                    .collect();
                client.txn(Txn::new().and_then(puts)).await?;
            }
        }));
    }
    for seeder in seeders {
        seeder
            .await
            .map_err(|e| Error::Setup(format!("a seeding task failed: {e}")))??;
    }
    Ok(())
}

/// Keeps `lease` alive until the task is aborted (when its session is dropped).
async fn keep_alive(client: &mut Client, lease: i64) -> Result<JoinHandle<()>, Error> {
    let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
    Ok(tokio::spawn(async move {
        loop {
            tokio::time::sleep(KEEP_ALIVE_EVERY).await;
            if keeper.keep_alive().await.is_err() {
                return;
            }
            if !matches!(stream.message().await, Ok(Some(_))) {
                return;
            }
        }
    }))
}

impl Etcd {
    fn holder_value(&self, token: i64) -> String {
        format!("{token} {}", self.agent)
    }

    /// Reads a window of queued keys and their revisions, the one this worker tries first last.
    async fn read_window(&mut self, meter: &mut Meter) -> Result<Vec<(String, i64)>, Error> {
        // A serializable read (from the member, no quorum round) is enough: a stale window
        // only costs a failed transaction, whose revision compare keeps the move safe.
        let options = GetOptions::new()
            .with_range(prefix_end(&self.keys.queue_dir()))
            .with_limit(self.window_size)
            .with_keys_only()
            .with_serializable();
        let response = meter
            .time(self.client.get(self.cursor.as_str(), Some(options)))
            .await?;
        let mut window = Vec::with_capacity(response.kvs().len());
        for kv in response.kvs() {
            let key = kv.key_str()?.to_string();
            window.push((key, kv.mod_revision()));
        }
        if let Some((first, _)) = window.first() {
            self.cursor = first.clone();
        }
        // Workers reading at about the same time see about the same window: each starts at
        // its own share of it and goes on in key order, so they seldom try the same key.
        if !window.is_empty() {
            let start = self.share * window.len() / self.clients;
            let len = window.len();
            window.rotate_left(start % len);
        }
        window.reverse();
        Ok(window)
    }

    /// The task number at the end of a queued key.
    fn job_id(&self, key: &str) -> Result<i64, Error> {
        key.strip_prefix(&self.keys.queue_dir())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| Error::Setup(format!("unexpected queue key {key}")))
    }
}

impl Peer for Etcd {
    async fn prepare(list: &str, plan: &Plan) -> Result<(), Error> {
        let client = open(list).await?;
        let keys = Keys::new(plan);
        if plan.workload == Workload::MixedRead {
            let value = offered_value();
            let tickets = (0..READ_TICKETS)
                .map(|n| (keys.ticket(&plan.read_ticket(n)), value.clone()))
                .collect();
            put_all(&client, tickets).await?;
        }
        if plan.workload == Workload::QueueClaim {
            let tasks = (1..=i64::from(plan.queue_tasks))
                .map(|n| (keys.queued(n), String::new()))
                .collect();
            put_all(&client, tasks).await?;
        }
        Ok(())
    }

    async fn connect(list: &str, plan: &Plan, index: usize) -> Result<Self, Error> {
        let mut client = open(list).await?;
        let keys = Keys::new(plan);
        let (lease, keeper) = if plan.workload == Workload::Handoff {
            (0, None)
        } else {
            let ttl = if plan.workload == Workload::QueueClaim {
                QUEUE_LEASE_TTL_S
            } else {
                PERMIT_TTL_S
            };
            let lease = client.lease_grant(i64::from(ttl), None).await?.id();
            (lease, Some(keep_alive(&mut client, lease).await?))
        };
        let window_size = i64::try_from(plan.clients.saturating_mul(2).clamp(8, 256)).unwrap_or(8);
        Ok(Self {
            client,
            cursor: keys.queue_dir(),
            keys,
            agent: agent(index),
            lease,
            keeper,
            window_size,
            share: index,
            clients: plan.clients.max(1),
        })
    }

    async fn claim(
        &mut self,
        meter: &mut Meter,
        permit: u32,
        _holder: &str,
        token: i64,
    ) -> Result<Claim, Error> {
        let key = self.keys.permit(permit);
        let put = PutOptions::new().with_lease(self.lease);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                self.holder_value(token),
                Some(put),
            )]);
        let response = meter.time(self.client.txn(txn)).await?;
        Ok(if response.succeeded() {
            Claim::Granted {
                fence: revision(&response),
            }
        } else {
            Claim::Taken
        })
    }

    async fn release(&mut self, meter: &mut Meter, permit: u32, token: i64) -> Result<bool, Error> {
        let key = self.keys.permit(permit);
        let txn = Txn::new()
            .when([Compare::value(
                key.as_str(),
                CompareOp::Equal,
                self.holder_value(token),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        Ok(meter.time(self.client.txn(txn)).await?.succeeded())
    }

    async fn offer(&mut self, meter: &mut Meter, key: &str) -> Result<Option<i64>, Error> {
        let key = self.keys.ticket(key);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), offered_value(), None)]);
        let response = meter.time(self.client.txn(txn)).await?;
        Ok(response.succeeded().then(|| revision(&response)))
    }

    async fn take(
        &mut self,
        meter: &mut Meter,
        key: &str,
        offered: i64,
        token: i64,
    ) -> Result<Option<i64>, Error> {
        let key = self.keys.ticket(key);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                offered,
            )])
            .and_then([TxnOp::put(
                key.as_str(),
                format!("taken {token} {RECIPIENT}"),
                None,
            )]);
        let response = meter.time(self.client.txn(txn)).await?;
        Ok(response.succeeded().then(|| revision(&response)))
    }

    async fn reply(
        &mut self,
        meter: &mut Meter,
        key: &str,
        taken: i64,
        _token: i64,
    ) -> Result<bool, Error> {
        let key = self.keys.ticket(key);
        let txn = Txn::new()
            .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, taken)])
            .and_then([TxnOp::put(key.as_str(), format!("done {SUMMARY}"), None)]);
        Ok(meter.time(self.client.txn(txn)).await?.succeeded())
    }

    async fn lease_next(&mut self, meter: &mut Meter, worker: &str) -> Result<Option<Job>, Error> {
        for _ in 0..MAX_WINDOW_READS {
            let mut window = self.read_window(meter).await?;
            if window.is_empty() {
                return Ok(None);
            }
            while let Some((key, seen)) = window.pop() {
                let id = self.job_id(&key)?;
                let leased = self.keys.leased(id);
                let put = PutOptions::new().with_lease(self.lease);
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, seen)])
                    .and_then([
                        TxnOp::delete(key.as_str(), None),
                        TxnOp::put(leased.as_str(), worker, Some(put)),
                    ]);
                let response = meter.time(self.client.txn(txn)).await?;
                if response.succeeded() {
                    return Ok(Some(Job {
                        id,
                        handle: revision(&response),
                    }));
                }
            }
        }
        Ok(None)
    }

    async fn complete(
        &mut self,
        meter: &mut Meter,
        job: &Job,
        _worker: &str,
    ) -> Result<bool, Error> {
        let leased = self.keys.leased(job.id);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                leased.as_str(),
                CompareOp::Equal,
                job.handle,
            )])
            .and_then([
                TxnOp::delete(leased.as_str(), None),
                TxnOp::put(self.keys.done(job.id), "ok", None),
            ]);
        Ok(meter.time(self.client.txn(txn)).await?.succeeded())
    }

    async fn read(&mut self, meter: &mut Meter, key: &str) -> Result<bool, Error> {
        let key = self.keys.ticket(key);
        let response = meter.time(self.client.get(key, None)).await?;
        Ok(!response.kvs().is_empty())
    }

    async fn clean_up(list: &str, plan: &Plan) -> Result<(), Error> {
        let mut client = open(list).await?;
        let keys = Keys::new(plan);
        let deleted = client
            .delete(
                keys.prefix.as_str(),
                Some(DeleteOptions::new().with_prefix()),
            )
            .await?;
        // Compact the history the run wrote, so the next run starts from a small keyspace.
        if let Some(header) = deleted.header() {
            client.compact(header.revision(), None).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end("bench/queue/"), b"bench/queue0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }

    #[test]
    fn queued_keys_sort_by_task_number() {
        let plan = Plan {
            workload: Workload::QueueClaim,
            clients: 1,
            queue_tasks: 10,
            run_id: 1,
        };
        let keys = Keys::new(&plan);
        assert!(keys.queued(9) < keys.queued(10));
        assert!(keys.queued(10).starts_with(&keys.queue_dir()));
    }

    #[test]
    fn endpoints_get_a_scheme() {
        assert_eq!(
            endpoints("127.0.0.1:1, http://h:2"),
            vec!["http://127.0.0.1:1".to_string(), "http://h:2".to_string()]
        );
    }
}
