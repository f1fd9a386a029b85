//! `ctxbrokerctl`: the operator's command line for a ctxbroker daemon.
//!
//! Every command is one or a few calls of the `ctxbroker.v1` contract, as
//! any client would make them (with the bearer token and, for a call about
//! one session, the `x-ctxbroker-session` routing header); nothing here
//! reaches around the daemon. Output is a table for people or JSON for
//! programs, in this tool's own stable shape ([`render`]); failures print
//! the gRPC status with its details and exit with a code per kind
//! ([`error::Exit`]). docs/operators.md, "Operator CLI", is the manual.

pub mod cli;
pub mod commands;
pub mod connect;
pub mod error;
pub mod render;

use std::process::ExitCode;

use clap::Parser;

use crate::error::{CtlError, Exit, Report};

/// Parses the process's arguments, runs the command, and returns the exit
/// code.
pub fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ctxbrokerctl: cannot start: {e}");
            return Exit::Failed.code();
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => Exit::Ok.code(),
        Err(error) => {
            eprintln!("{}", Report(&error));
            error.exit().code()
        }
    }
}

/// Runs a parsed command line.
pub async fn run(cli: cli::Cli) -> Result<(), CtlError> {
    let connection = connect::Connection::open(&cli.connection).await?;
    commands::run(&connection, cli.output, cli.command).await
}
