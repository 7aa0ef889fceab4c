//! The one error type of the driver: which system failed, and how.

/// Why a run, or one request of it, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MariaDB answered an error or the connection broke.
    #[error("mariadb: {0}")]
    Mariadb(#[from] mysql_async::Error),
    /// PostgreSQL answered an error or the connection broke.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// etcd answered an error or the connection broke.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// The set-up could not be done as planned.
    #[error("set-up: {0}")]
    Setup(String),
}
