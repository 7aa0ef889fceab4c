//! PostgreSQL in its best form for each step: one autocommit conditional statement per step,
//! prepared once per connection, `RETURNING` instead of a second round trip, and the queue claim
//! as one statement (`UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING id`),
//! which is the same transaction as BEGIN/SELECT/UPDATE/COMMIT in one round trip.

use std::collections::HashMap;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

use crate::driver::{Claim, Job, Peer};
use crate::error::Error;
use crate::meter::Meter;
use crate::workload::{Plan, Workload, READ_TICKETS, RECIPIENT, SENDER, SUMMARY, TICKET_TTL_S};

const CLAIM: &str = "UPDATE permits SET holder = $1, token = $2, fence = fence + 1, \
     expires_at = now() + interval '30 seconds' \
     WHERE id = $3 AND (holder IS NULL OR expires_at < now()) RETURNING fence";
const RELEASE: &str =
    "UPDATE permits SET holder = NULL, token = NULL, expires_at = NULL WHERE id = $1 AND token = $2";
const OFFER: &str =
    "INSERT INTO tickets (k, sender, recipient, reply_to, payload, state, expires_at) \
     VALUES ($1, $2, $3, $4, '', 0, now() + interval '600 seconds')";
const TAKE: &str = "UPDATE tickets SET state = 1, token = $1 \
     WHERE k = $2 AND recipient = $3 AND state = 0 AND expires_at > now()";
const REPLY: &str =
    "UPDATE tickets SET state = 2, summary = $1 WHERE k = $2 AND token = $3 AND state = 1";
const READ: &str = "SELECT state FROM tickets WHERE k = $1";
const LEASE_JOB: &str = "UPDATE jobs SET state = 1, worker = $1, \
     lease_expires = now() + interval '30 seconds' \
     WHERE id = (SELECT id FROM jobs WHERE state = 0 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
     RETURNING id";
const COMPLETE_JOB: &str =
    "UPDATE jobs SET state = 2, result = 'ok' WHERE id = $1 AND state = 1 AND worker = $2";

/// The schema, dropped and created afresh for every run. `fillfactor` leaves room in each page
/// so that updates of unindexed columns stay HOT (no index write); `jobs_ready` is a partial
/// index over the queued tasks only, so the claim never walks over done ones.
const SCHEMA: &str = "
DROP TABLE IF EXISTS permits, tickets, jobs;
CREATE TABLE permits (
    id integer PRIMARY KEY,
    holder text,
    token bigint,
    fence bigint NOT NULL DEFAULT 0,
    expires_at timestamptz
) WITH (fillfactor = 50);
CREATE TABLE tickets (
    k text PRIMARY KEY,
    sender text NOT NULL,
    recipient text NOT NULL,
    reply_to text NOT NULL,
    payload bytea NOT NULL,
    state smallint NOT NULL,
    token bigint,
    expires_at timestamptz NOT NULL,
    summary text
) WITH (fillfactor = 70);
CREATE TABLE jobs (
    id bigint PRIMARY KEY,
    state smallint NOT NULL DEFAULT 0,
    worker text,
    lease_expires timestamptz,
    payload bytea NOT NULL DEFAULT '',
    result bytea
);
CREATE INDEX jobs_ready ON jobs (id) WHERE state = 0;
";

/// One client's own PostgreSQL connection, with the statements it prepared so far.
pub struct Postgres {
    client: Client,
    prepared: HashMap<&'static str, Statement>,
}

async fn open(config: &str) -> Result<Client, Error> {
    let (client, connection) = tokio_postgres::connect(config, NoTls).await?;
    tokio::spawn(async move {
        if let Err(why) = connection.await {
            eprintln!("peers-bench: postgres connection ended: {why}");
        }
    });
    Ok(client)
}

impl Postgres {
    /// The prepared form of `sql` (prepared on first use, during the warm-up).
    async fn statement(&mut self, sql: &'static str) -> Result<Statement, Error> {
        if let Some(statement) = self.prepared.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.prepared.insert(sql, statement.clone());
        Ok(statement)
    }

    /// Runs `sql` and answers how many rows it changed.
    async fn execute(
        &mut self,
        meter: &mut Meter,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        let statement = self.statement(sql).await?;
        Ok(meter.time(self.client.execute(&statement, params)).await?)
    }

    /// Runs `sql` and answers the first column of its row, if it returned one.
    async fn query_one_value<T>(
        &mut self,
        meter: &mut Meter,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<T>, Error>
    where
        T: for<'a> tokio_postgres::types::FromSql<'a>,
    {
        let statement = self.statement(sql).await?;
        let row = meter
            .time(self.client.query_opt(&statement, params))
            .await?;
        Ok(match row {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        })
    }
}

fn permit_id(permit: u32) -> i32 {
    // Permits number at most 10,000: the conversion cannot saturate in practice.
    i32::try_from(permit).unwrap_or(i32::MAX)
}

impl Peer for Postgres {
    async fn prepare(config: &str, plan: &Plan) -> Result<(), Error> {
        let client = open(config).await?;
        client.batch_execute(SCHEMA).await?;
        if plan.workload.uses_permits() {
            let count = i32::try_from(plan.workload.permits())
                .map_err(|_| Error::Setup("too many permits".into()))?;
            client
                .execute(
                    "INSERT INTO permits (id) SELECT generate_series(0, $1 - 1)",
                    &[&count],
                )
                .await?;
        }
        if plan.workload == Workload::MixedRead {
            let prefix = plan.read_ticket_prefix();
            let seed = format!(
                "INSERT INTO tickets (k, sender, recipient, reply_to, payload, state, expires_at) \
                 SELECT $1::text || n::text, '{SENDER}', '{RECIPIENT}', '{SENDER}', '', 0, \
                 now() + interval '{TICKET_TTL_S} seconds' FROM generate_series(0, $2 - 1) AS n"
            );
            let count =
                i32::try_from(READ_TICKETS).map_err(|_| Error::Setup("too many tickets".into()))?;
            client.execute(&seed, &[&prefix, &count]).await?;
        }
        if plan.workload == Workload::QueueClaim {
            let tasks = i64::from(plan.queue_tasks);
            client
                .execute(
                    "INSERT INTO jobs (id) SELECT generate_series(1, $1::bigint)",
                    &[&tasks],
                )
                .await?;
        }
        // Fresh statistics and visibility maps, so every run starts from the same shape.
        client
            .batch_execute("VACUUM ANALYZE permits, tickets, jobs")
            .await?;
        Ok(())
    }

    async fn connect(config: &str, _plan: &Plan, _index: usize) -> Result<Self, Error> {
        Ok(Self {
            client: open(config).await?,
            prepared: HashMap::new(),
        })
    }

    async fn claim(
        &mut self,
        meter: &mut Meter,
        permit: u32,
        holder: &str,
        token: i64,
    ) -> Result<Claim, Error> {
        let fence: Option<i64> = self
            .query_one_value(meter, CLAIM, &[&holder, &token, &permit_id(permit)])
            .await?;
        Ok(match fence {
            Some(fence) => Claim::Granted { fence },
            None => Claim::Taken,
        })
    }

    async fn release(&mut self, meter: &mut Meter, permit: u32, token: i64) -> Result<bool, Error> {
        let changed = self
            .execute(meter, RELEASE, &[&permit_id(permit), &token])
            .await?;
        Ok(changed == 1)
    }

    async fn offer(&mut self, meter: &mut Meter, key: &str) -> Result<Option<i64>, Error> {
        let changed = self
            .execute(meter, OFFER, &[&key, &SENDER, &RECIPIENT, &SENDER])
            .await?;
        Ok((changed == 1).then_some(0))
    }

    async fn take(
        &mut self,
        meter: &mut Meter,
        key: &str,
        _offered: i64,
        token: i64,
    ) -> Result<Option<i64>, Error> {
        let changed = self
            .execute(meter, TAKE, &[&token, &key, &RECIPIENT])
            .await?;
        Ok((changed == 1).then_some(0))
    }

    async fn reply(
        &mut self,
        meter: &mut Meter,
        key: &str,
        _taken: i64,
        token: i64,
    ) -> Result<bool, Error> {
        let changed = self
            .execute(meter, REPLY, &[&SUMMARY, &key, &token])
            .await?;
        Ok(changed == 1)
    }

    async fn lease_next(&mut self, meter: &mut Meter, worker: &str) -> Result<Option<Job>, Error> {
        let id: Option<i64> = self.query_one_value(meter, LEASE_JOB, &[&worker]).await?;
        Ok(id.map(|id| Job { id, handle: 0 }))
    }

    async fn complete(
        &mut self,
        meter: &mut Meter,
        job: &Job,
        worker: &str,
    ) -> Result<bool, Error> {
        let changed = self
            .execute(meter, COMPLETE_JOB, &[&job.id, &worker])
            .await?;
        Ok(changed == 1)
    }

    async fn read(&mut self, meter: &mut Meter, key: &str) -> Result<bool, Error> {
        let state: Option<i16> = self.query_one_value(meter, READ, &[&key]).await?;
        Ok(state.is_some())
    }

    async fn clean_up(_config: &str, _plan: &Plan) -> Result<(), Error> {
        // The next run's `prepare` drops the tables; the server is thrown away at the end.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{PERMIT_TTL_S, QUEUE_LEASE_TTL_S};

    #[test]
    fn statements_spell_the_workload_ttls() {
        assert!(CLAIM.contains(&format!("interval '{PERMIT_TTL_S} seconds'")));
        assert!(OFFER.contains(&format!("interval '{TICKET_TTL_S} seconds'")));
        assert!(LEASE_JOB.contains(&format!("interval '{QUEUE_LEASE_TTL_S} seconds'")));
    }
}
