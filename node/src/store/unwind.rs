//! The process ends, rather than unwind, out of a panic that would leave the applied state half
//! changed.
//!
//! An apply changes the state in place under the write lock. Unwinding out of one part way
//! poisons the lock, and the readers (which take a poisoned lock as it is: a panic elsewhere
//! must not stop a node serving) would see the half-applied state labelled as applied up to the
//! entry: a snapshot build or a backup would save it, and the node would restart from it
//! diverged from its peers. Aborting keeps it off disk: the node restarts from its last
//! snapshot and log, like after a SIGKILL.

/// Aborts the process when dropped during a panic. Declare it after the lock guard it
/// protects, so that it drops first, with the lock still held.
pub(super) struct AbortOnUnwind(pub(super) &'static str);

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The panic's own message is already out (the panic hook runs before unwinding).
            eprintln!(
                "baton: panic during {}: aborting, so that no half-applied state is read or saved",
                self.0
            );
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    use super::*;

    const CHILD: &str = "BATON_UNWIND_TEST_CHILD";

    /// Runs this test again in a child process with `CHILD` set to `mode`.
    fn child(name: &str, mode: &str) -> std::process::ExitStatus {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads", "1"])
            .env(CHILD, mode)
            .output()
            .unwrap()
            .status
    }

    #[test]
    fn a_panic_under_the_guard_aborts_instead_of_unwinding() {
        const NAME: &str =
            "store::unwind::tests::a_panic_under_the_guard_aborts_instead_of_unwinding";
        match std::env::var(CHILD).as_deref() {
            Ok("guarded") => {
                let _guard = AbortOnUnwind("a test");
                panic!("inside the guard");
            }
            Ok(_) => panic!("outside the guard"),
            Err(_) => {}
        }
        assert_eq!(child(NAME, "guarded").signal(), Some(libc_sigabrt()));
        // Without the guard the same panic unwinds: the test fails, the process exits normally.
        let unguarded = child(NAME, "unguarded");
        assert_eq!(unguarded.signal(), None, "{unguarded:?}");
        assert!(!unguarded.success());
    }

    /// SIGABRT, the signal `std::process::abort` ends the process with.
    fn libc_sigabrt() -> i32 {
        nix::sys::signal::Signal::SIGABRT as i32
    }
}
