//! Histories made by hand, for the checkers' tests (the unit tests beside the rules and
//! `tests/t71_robustness_checkers.rs`): times are given in milliseconds for readability and
//! recorded in microseconds.

use super::check::Violation;
use super::history::{Input, Op, Outcome, Output};

/// A history under construction.
#[derive(Default)]
pub struct H {
    /// The operations so far, in the order they were added (each one's index its place).
    pub ops: Vec<Op>,
}

impl H {
    /// Appends an operation of `client` sent at `call` ms that ended at `ret` ms (if it did).
    pub fn op(
        &mut self,
        client: &str,
        input: Input,
        call: u64,
        ret: Option<u64>,
        outcome: Outcome,
    ) {
        let index = self.ops.len();
        self.ops.push(Op {
            index,
            client: client.into(),
            input,
            call: call * 1000,
            ret: ret.map(|ret| ret * 1000),
            outcome,
        });
    }

    /// An answered operation.
    pub fn ok(&mut self, client: &str, input: Input, call: u64, ret: u64, output: Output) {
        self.op(client, input, call, Some(ret), Outcome::Ok(output));
    }

    /// An operation refused with `code`.
    pub fn refused(&mut self, client: &str, input: Input, call: u64, ret: u64, code: &str) {
        self.op(
            client,
            input,
            call,
            Some(ret),
            Outcome::Refused(code.into()),
        );
    }

    /// An operation that got no answer.
    pub fn ambiguous(&mut self, client: &str, input: Input, call: u64) {
        self.op(
            client,
            input,
            call,
            None,
            Outcome::Ambiguous("timed out".into()),
        );
    }

    /// `watch` delivered the change `kind` of `key` at `fence` (naming `holder`) at `at` ms, at
    /// position `revision`.0.
    pub fn delivered(
        &mut self,
        watch: &str,
        (kind, key, holder, fence): (&str, &str, &str, u64),
        at: u64,
        revision: u64,
    ) {
        let input = Input::WatchLease {
            kind: kind.into(),
            key: key.into(),
            holder: holder.into(),
            fence,
        };
        self.ok(watch, input, at, at, position(revision));
    }

    /// `watch` met a `COMPACTED` at `at` ms and went on from revision `oldest`.
    pub fn compacted(&mut self, watch: &str, at: u64, oldest: u64) {
        let input = Input::WatchCompacted {
            requested: oldest - 1,
        };
        self.ok(watch, input, at, at, position(oldest));
    }
}

/// A watch position at `revision`, first change.
pub fn position(revision: u64) -> Output {
    Output::Position { revision, index: 0 }
}

/// The rules `violations` break, sorted, each once.
pub fn rules(violations: &[Violation]) -> Vec<&str> {
    let mut rules: Vec<&str> = violations.iter().map(|v| v.rule.as_str()).collect();
    rules.sort_unstable();
    rules.dedup();
    rules
}
