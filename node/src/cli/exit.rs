//! Exit codes, so scripts can tell a refusal from an outage.

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
/// The cluster could not be reached or gave no usable answer in time (for a write: the outcome is
/// unknown).
pub const UNREACHABLE: u8 = 4;
/// A watch needs history no node retains any more: resync from a snapshot.
pub const COMPACTED: u8 = 5;

/// Prints a client error the way scripts and people both read it, and returns its exit code.
pub fn report(error: &Error) -> u8 {
    match error {
        Error::Refused(refusal) => {
            eprintln!("{}: {refusal}", refusal.code());
            REFUSED
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
        Error::Protocol(_) => {
            eprintln!("baton: {error}");
            FAILURE
        }
        Error::Compacted { .. } => {
            eprintln!("COMPACTED: {error}");
            COMPACTED
        }
    }
}
