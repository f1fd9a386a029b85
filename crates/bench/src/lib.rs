//! `ctxbroker-bench`: ctxbroker's measurements, each compared with a
//! baseline measured in the same run (the machine is shared; only same-run
//! ratios mean much). Every subcommand of the binary is a function here,
//! so the smoke tests run the same code on small inputs.

pub mod admit;
pub mod classify;
pub mod common;
pub mod daemon;
pub mod plan;
pub mod quota;
pub mod replay;
pub mod search;
pub mod storage;
pub mod tokens;
pub mod watch;
