//! `baton`: the server, the local dev cluster and the client commands in one binary.

use std::process::ExitCode;

mod cli;

/// mimalloc instead of the system allocator: a mass expiry frees and allocates millions of
/// small change records, and glibc's malloc spent most of the nodes' CPU consolidating its free
/// lists (docs/benchmarks.md, "State scale").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::from_process_args();
    let runtime = match cli::runtime::build(args.nodes_in_process()) {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("baton: cannot start the async runtime: {e}");
            return ExitCode::from(cli::exit::FAILURE);
        }
    };
    let code = runtime.block_on(cli::run(args));
    // Work still on a blocking thread (a disk sync that hangs, say) must not hold the exit:
    // a graceful stop has its bound (`shutdown::LONGEST_STOP`), and dropping the runtime would
    // wait for such work without one.
    runtime.shutdown_timeout(baton_node::shutdown::EXIT_GRACE);
    code
}
