#![doc = "ctxbroker's gRPC daemon: admission with per-session serialisation, the marker hub, configuration and an ordered shutdown."]
//!
//! This is the only crate that knows the wire contract, the policy and the
//! store at once: it validates requests, converts between wire and domain
//! types, serialises each session's requests, hands commits to the store's
//! single writer and publishes markers once they are durable.

pub mod audit;
pub mod auth;
pub mod blocking;
pub mod broker;
mod coalesce;
pub mod config;
pub mod convert;
pub mod error;
pub mod hub;
pub mod idempotency;
pub mod incoming;
pub mod inspector;
pub mod metrics;
pub mod quota;
pub mod scheduler;
pub mod search;
pub mod server;
pub mod service;
pub mod sessions;
pub mod socket;
pub mod tenant;
pub mod tls;
pub mod transfer;
pub mod validate;

pub use config::{Cli, Settings};
pub use server::{Control, ServerError, Serving, main_with_args, run, run_with};
pub use socket::{Socket, hand_over};

/// What the binary was built from, for `GetServerInfo`.
#[derive(Debug, Clone, Copy)]
pub struct BuildInfo {
    /// The package version.
    pub version: &'static str,
    /// The git commit ("unknown" outside a checkout).
    pub git_commit: &'static str,
    /// SHA-256 of the `.proto` files.
    pub contract_digest: &'static str,
}
