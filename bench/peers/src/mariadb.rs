//! MariaDB in its best form for each step: one autocommit conditional statement per step (a
//! claim that changes nothing is answered without writing), server-side prepared statements, and
//! `SELECT ... FOR UPDATE SKIP LOCKED` in a READ COMMITTED transaction for the queue.
//!
//! Connections go over TCP on loopback (never the Unix socket), like every other system measured.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder, Params, Value};

use crate::driver::{Claim, Job, Peer};
use crate::error::Error;
use crate::meter::Meter;
use crate::workload::{Plan, Workload, READ_TICKETS, RECIPIENT, SENDER, SUMMARY, TICKET_TTL_S};

/// Claim: granted only if free or expired. `LAST_INSERT_ID(expr)` hands the new fence back in
/// the OK packet, so the claim needs no second round trip to learn it.
const CLAIM: &str = "UPDATE permits SET holder = ?, token = ?, fence = LAST_INSERT_ID(fence + 1), \
     expires_at = NOW(6) + INTERVAL 30 SECOND \
     WHERE id = ? AND (holder IS NULL OR expires_at < NOW(6))";
const RELEASE: &str =
    "UPDATE permits SET holder = NULL, token = NULL, expires_at = NULL WHERE id = ? AND token = ?";
const OFFER: &str =
    "INSERT INTO tickets (k, sender, recipient, reply_to, payload, state, expires_at) \
     VALUES (?, ?, ?, ?, '', 0, NOW(6) + INTERVAL 600 SECOND)";
const TAKE: &str = "UPDATE tickets SET state = 1, token = ? \
     WHERE k = ? AND recipient = ? AND state = 0 AND expires_at > NOW(6)";
const REPLY: &str =
    "UPDATE tickets SET state = 2, summary = ? WHERE k = ? AND token = ? AND state = 1";
const READ: &str = "SELECT state FROM tickets WHERE k = ?";
const NEXT_JOB: &str =
    "SELECT id FROM jobs WHERE state = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";
const LEASE_JOB: &str = "UPDATE jobs SET state = 1, worker = ?, \
     lease_expires = NOW(6) + INTERVAL 30 SECOND WHERE id = ?";
const COMPLETE_JOB: &str =
    "UPDATE jobs SET state = 2, result = 'ok' WHERE id = ? AND state = 1 AND worker = ?";

const CREATE_PERMITS: &str = "CREATE TABLE permits (
    id INT UNSIGNED PRIMARY KEY,
    holder VARCHAR(64) NULL,
    token BIGINT NULL,
    fence BIGINT NOT NULL DEFAULT 0,
    expires_at DATETIME(6) NULL
) ENGINE = InnoDB";
const CREATE_TICKETS: &str = "CREATE TABLE tickets (
    k VARCHAR(96) PRIMARY KEY,
    sender VARCHAR(64) NOT NULL,
    recipient VARCHAR(64) NOT NULL,
    reply_to VARCHAR(64) NOT NULL,
    payload VARBINARY(1024) NOT NULL,
    state TINYINT NOT NULL,
    token BIGINT NULL,
    expires_at DATETIME(6) NOT NULL,
    summary VARCHAR(255) NULL
) ENGINE = InnoDB";
/// `by_state` lets the claim find the first queued task without scanning the done ones.
const CREATE_JOBS: &str = "CREATE TABLE jobs (
    id BIGINT PRIMARY KEY,
    state TINYINT NOT NULL DEFAULT 0,
    worker VARCHAR(64) NULL,
    lease_expires DATETIME(6) NULL,
    payload VARBINARY(256) NOT NULL DEFAULT '',
    result VARBINARY(256) NULL,
    KEY by_state (state, id)
) ENGINE = InnoDB";

/// Rows per multi-row INSERT while seeding.
const SEED_CHUNK: u32 = 1_000;

/// One client's own MariaDB connection.
pub struct Mariadb {
    conn: Conn,
}

async fn open(url: &str) -> Result<Conn, Error> {
    let opts = Opts::from_url(url).map_err(|e| Error::Setup(format!("bad MariaDB URL: {e}")))?;
    let opts = OptsBuilder::from_opts(opts).prefer_socket(false);
    let mut conn = Conn::new(opts).await?;
    // A queue worker must not take gap locks on the rows it skips: READ COMMITTED is the
    // recommended isolation for SKIP LOCKED queues (single-statement steps are unaffected).
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await?;
    Ok(conn)
}

/// Inserts rows `0..count` (or `1..=count`, per `first`) built by `row`, in multi-row INSERTs.
async fn seed(
    conn: &mut Conn,
    head: &str,
    row: &str,
    first: u32,
    count: u32,
    param: impl Fn(u32) -> Value,
) -> Result<(), Error> {
    let mut start = first;
    let end = first + count;
    while start < end {
        let stop = (start + SEED_CHUNK).min(end);
        let rows = vec![row; (stop - start) as usize].join(", ");
        let params: Vec<Value> = (start..stop).map(&param).collect();
        conn.exec_drop(format!("{head} VALUES {rows}"), Params::Positional(params))
            .await?;
        start = stop;
    }
    Ok(())
}

impl Peer for Mariadb {
    async fn prepare(url: &str, plan: &Plan) -> Result<(), Error> {
        let mut conn = open(url).await?;
        conn.query_drop("DROP TABLE IF EXISTS permits, tickets, jobs")
            .await?;
        conn.query_drop(CREATE_PERMITS).await?;
        conn.query_drop(CREATE_TICKETS).await?;
        conn.query_drop(CREATE_JOBS).await?;
        if plan.workload.uses_permits() {
            let permits = plan.workload.permits();
            seed(
                &mut conn,
                "INSERT INTO permits (id)",
                "(?)",
                0,
                permits,
                Value::from,
            )
            .await?;
        }
        if plan.workload == Workload::MixedRead {
            let row = format!("(?, '{SENDER}', '{RECIPIENT}', '{SENDER}', '', 0, NOW(6) + INTERVAL {TICKET_TTL_S} SECOND)");
            let head =
                "INSERT INTO tickets (k, sender, recipient, reply_to, payload, state, expires_at)";
            seed(&mut conn, head, &row, 0, READ_TICKETS, |n| {
                Value::from(plan.read_ticket(n))
            })
            .await?;
        }
        if plan.workload == Workload::QueueClaim {
            let tasks = plan.queue_tasks;
            seed(
                &mut conn,
                "INSERT INTO jobs (id)",
                "(?)",
                1,
                tasks,
                Value::from,
            )
            .await?;
            conn.query_drop("ANALYZE TABLE jobs").await?;
        }
        conn.disconnect().await?;
        Ok(())
    }

    async fn connect(url: &str, _plan: &Plan, _index: usize) -> Result<Self, Error> {
        Ok(Self {
            conn: open(url).await?,
        })
    }

    async fn claim(
        &mut self,
        meter: &mut Meter,
        permit: u32,
        holder: &str,
        token: i64,
    ) -> Result<Claim, Error> {
        meter
            .time(self.conn.exec_drop(CLAIM, (holder, token, permit)))
            .await?;
        if self.conn.affected_rows() == 1 {
            let fence = self.conn.last_insert_id().unwrap_or_default();
            Ok(Claim::Granted {
                fence: i64::try_from(fence).unwrap_or(i64::MAX),
            })
        } else {
            Ok(Claim::Taken)
        }
    }

    async fn release(&mut self, meter: &mut Meter, permit: u32, token: i64) -> Result<bool, Error> {
        meter
            .time(self.conn.exec_drop(RELEASE, (permit, token)))
            .await?;
        Ok(self.conn.affected_rows() == 1)
    }

    async fn offer(&mut self, meter: &mut Meter, key: &str) -> Result<Option<i64>, Error> {
        meter
            .time(self.conn.exec_drop(OFFER, (key, SENDER, RECIPIENT, SENDER)))
            .await?;
        Ok((self.conn.affected_rows() == 1).then_some(0))
    }

    async fn take(
        &mut self,
        meter: &mut Meter,
        key: &str,
        _offered: i64,
        token: i64,
    ) -> Result<Option<i64>, Error> {
        meter
            .time(self.conn.exec_drop(TAKE, (token, key, RECIPIENT)))
            .await?;
        Ok((self.conn.affected_rows() == 1).then_some(0))
    }

    async fn reply(
        &mut self,
        meter: &mut Meter,
        key: &str,
        _taken: i64,
        token: i64,
    ) -> Result<bool, Error> {
        meter
            .time(self.conn.exec_drop(REPLY, (SUMMARY, key, token)))
            .await?;
        Ok(self.conn.affected_rows() == 1)
    }

    async fn lease_next(&mut self, meter: &mut Meter, worker: &str) -> Result<Option<Job>, Error> {
        let leased = self.lease_in_transaction(meter, worker).await;
        if leased.is_err() {
            // Leave no transaction open (and no row locked) behind a failed step.
            let _ = self.conn.query_drop("ROLLBACK").await;
        }
        leased
    }

    async fn complete(
        &mut self,
        meter: &mut Meter,
        job: &Job,
        worker: &str,
    ) -> Result<bool, Error> {
        meter
            .time(self.conn.exec_drop(COMPLETE_JOB, (job.id, worker)))
            .await?;
        Ok(self.conn.affected_rows() == 1)
    }

    async fn read(&mut self, meter: &mut Meter, key: &str) -> Result<bool, Error> {
        let state: Option<i64> = meter.time(self.conn.exec_first(READ, (key,))).await?;
        Ok(state.is_some())
    }

    async fn clean_up(_url: &str, _plan: &Plan) -> Result<(), Error> {
        // The next run's `prepare` drops the tables; the server is thrown away at the end.
        Ok(())
    }
}

impl Mariadb {
    /// BEGIN; SELECT ... FOR UPDATE SKIP LOCKED; UPDATE; COMMIT — four round trips, since
    /// MariaDB has neither `UPDATE ... RETURNING` nor a subquery on the updated table.
    async fn lease_in_transaction(
        &mut self,
        meter: &mut Meter,
        worker: &str,
    ) -> Result<Option<Job>, Error> {
        meter.time(self.conn.query_drop("BEGIN")).await?;
        let next: Option<i64> = meter.time(self.conn.exec_first(NEXT_JOB, ())).await?;
        if let Some(id) = next {
            meter
                .time(self.conn.exec_drop(LEASE_JOB, (worker, id)))
                .await?;
        }
        meter.time(self.conn.query_drop("COMMIT")).await?;
        Ok(next.map(|id| Job { id, handle: 0 }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{PERMIT_TTL_S, QUEUE_LEASE_TTL_S};

    #[test]
    fn statements_spell_the_workload_ttls() {
        assert!(CLAIM.contains(&format!("INTERVAL {PERMIT_TTL_S} SECOND")));
        assert!(OFFER.contains(&format!("INTERVAL {TICKET_TTL_S} SECOND")));
        assert!(LEASE_JOB.contains(&format!("INTERVAL {QUEUE_LEASE_TTL_S} SECOND")));
    }
}
