//! `ctxbrokerd`: the ctxbroker daemon. Parses its flags and hands over to
//! `ctxbroker-server`, which tests drive the same way.

use std::process::ExitCode;

use ctxbroker_server::BuildInfo;

fn main() -> ExitCode {
    let build = BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        git_commit: env!("CTXBROKER_GIT_COMMIT"),
        contract_digest: env!("CTXBROKER_CONTRACT_DIGEST"),
    };
    ctxbroker_server::main_with_args(std::env::args_os(), build)
}
