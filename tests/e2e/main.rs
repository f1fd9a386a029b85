//! End-to-end tests: each starts the real `ctxbrokerd` binary on a socket
//! it bound itself, with a temporary data directory, and talks gRPC to it.

// The helpers the tests share are not `#[test]` functions, which is all
// `allow-unwrap-in-tests` covers in an integration test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub
)]

mod served;
mod support;

#[cfg(unix)]
mod agents;
mod auth;
mod bad_input;
mod burst;
mod classify;
mod cliff;
mod config;
mod corruption;
mod crash;
mod ctl;
mod durable;
#[cfg(feature = "failpoints")]
mod faults;
mod hardening;
mod inproc;
mod inspector;
#[cfg(unix)]
mod listen;
mod metrics;
mod ops;
mod policy;
#[cfg(unix)]
mod private;
mod quota;
mod resident;
mod retry;
mod search;
mod tenants;
mod tls;
mod transfer;
mod unix;
mod watch;
