//! `ctxbrokerctl`: the operator's command line (the `ctxbroker-ctl` crate).

fn main() -> std::process::ExitCode {
    ctxbroker_ctl::main()
}
