//! `baton`: the server, the local dev cluster and the client commands in one binary.

use std::process::ExitCode;

use clap::Parser;

mod cli;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("baton: cannot start the async runtime: {e}");
            return ExitCode::from(cli::exit::FAILURE);
        }
    };
    runtime.block_on(cli::run(args))
}
