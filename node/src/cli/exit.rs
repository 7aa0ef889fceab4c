//! Exit codes, so scripts can tell a refusal from an outage.

use baton_rpc::error::infra;
use baton_rpc::Error;

/// Success.
pub const OK: u8 = 0;
/// `baton check` found problems, a race judgement failed, or another failure.
pub const FAILURE: u8 = 1;
/// Bad usage (clap uses it for parse errors too).
pub const USAGE: u8 = 2;
/// The store refused the command (a contract refusal or an administrative one), or an effect
/// `acquire` was answered with anything but a grant.
pub const REFUSED: u8 = 3;
/// The cluster could not be reached or gave no usable answer in time, or one this client cannot
/// read (for a write: the outcome is unknown).
pub const UNREACHABLE: u8 = 4;
/// A watch needs history no node retains any more: resync from a snapshot.
pub const COMPACTED: u8 = 5;
/// The reader of the command's output went away before it was all written (`| head`): what a
/// shell reports for a process killed by SIGPIPE (128 + 13), so `set -o pipefail` sees the same
/// as with any filter, and a verdict (exit 1 or 3) is never turned into a success.
pub const CLOSED_PIPE: u8 = 141;

/// Prints a client error the way scripts and people both read it, and returns its exit code.
pub fn report(error: &Error) -> u8 {
    match error {
        Error::Refused(refusal) => {
            eprintln!("{}: {refusal}", refusal.code());
            REFUSED
        }
        Error::Server { code, message } if not_now(code) => {
            eprintln!("{code}: {message}");
            eprintln!(
                "baton: the cluster could not serve this now (no leader, overloaded or \
                 stopping); try again"
            );
            UNREACHABLE
        }
        Error::Server { code, message } => {
            eprintln!("{code}: {message}");
            REFUSED
        }
        Error::Unavailable { .. } | Error::OutcomeUnknown(_) => {
            eprintln!("baton: {error}");
            eprintln!(
                "baton: if the command was a write, its outcome is unknown: it may have been \
                 applied; read the state before sending it again"
            );
            UNREACHABLE
        }
        Error::Config(_) => {
            eprintln!("baton: {error}");
            USAGE
        }
        // Not a clean failure: a script that reads exit 1 as "did not happen" would take a
        // take that may have won for a loss.
        Error::Protocol(_) => {
            eprintln!("baton: {error}");
            eprintln!(
                "baton: if the command was a write, it may have been applied (this client cannot \
                 read the answer): read the state before sending it again"
            );
            UNREACHABLE
        }
        Error::Compacted { .. } => {
            eprintln!("COMPACTED: {error}");
            COMPACTED
        }
    }
}

/// Whether a server's code says it could not serve the call now, not that it refused it: an
/// administrative call is not retried by the client, so these reach the command as they came (a
/// leader transfer asked of a node that just stepped down answers `NOT_LEADER`). Scripts retry on
/// exit 4; exit 3 would tell them the store said no.
fn not_now(code: &str) -> bool {
    [
        infra::NOT_LEADER,
        infra::NO_LEADER,
        infra::OVERLOADED,
        infra::SHUTTING_DOWN,
    ]
    .contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str) -> Error {
        Error::Server {
            code: code.into(),
            message: String::new(),
        }
    }

    #[test]
    fn an_answer_this_client_cannot_read_leaves_the_outcome_unknown() {
        assert_eq!(report(&Error::Protocol("unreadable".into())), UNREACHABLE);
    }

    #[test]
    fn a_node_that_cannot_serve_now_is_an_outage_not_a_refusal() {
        for code in ["NOT_LEADER", "NO_LEADER", "OVERLOADED", "SHUTTING_DOWN"] {
            assert_eq!(report(&server(code)), UNREACHABLE, "{code}");
        }
        // INTERNAL (raft stopped) and NOT_INITIALIZED may last: retrying would loop.
        for code in [
            "ALREADY_INITIALIZED",
            "MEMBERSHIP",
            "HANDOVER_FAILED",
            "INTERNAL",
            "NOT_INITIALIZED",
        ] {
            assert_eq!(report(&server(code)), REFUSED, "{code}");
        }
    }
}
