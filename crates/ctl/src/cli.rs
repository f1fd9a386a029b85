//! The command line: every command, option and default.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Drives a ctxbroker daemon: sessions, contexts, compaction markers,
/// pins, escalations, exports and imports.
#[derive(Debug, Parser)]
#[command(name = "ctxbrokerctl", version, about, propagate_version = true)]
pub struct Cli {
    /// Where to connect and how.
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// `table` for people, `json` for programs (one JSON document; a
    /// followed marker stream is one JSON object per line).
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How to reach the daemon.
#[derive(Debug, Args)]
pub struct ConnectionArgs {
    /// The daemon: `HOST:PORT`, `http://HOST:PORT`, `https://HOST:PORT`
    /// or `unix:/path/to/socket`.
    #[arg(
        long,
        env = "CTXBROKER_ADDR",
        default_value = "127.0.0.1:50051",
        global = true
    )]
    pub addr: String,
    /// A bearer token (the daemon's `--auth-tokens-file`); prefer the
    /// environment variable, which `ps` does not show.
    #[arg(long, env = "CTXBROKER_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Connect over TLS, trusting this CA certificate (PEM).
    #[arg(long, global = true)]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM), for a daemon that asks for one.
    #[arg(long, requires = "tls_key", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, requires = "tls_cert", global = true)]
    pub tls_key: Option<PathBuf>,
    /// The name the daemon's certificate must carry, when it is not the
    /// address's host.
    #[arg(long, global = true)]
    pub tls_domain: Option<String>,
    /// Deadline of each call (not of a followed stream), e.g. `10s`,
    /// `500ms`.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s", global = true)]
    pub timeout: Duration,
}

/// The output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned tables and short lines.
    Table,
    /// JSON.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sessions: list, show, delete.
    #[command(subcommand)]
    Sessions(SessionsCommand),
    /// A session's live context, in prompt order.
    Context(ContextArgs),
    /// Compaction markers: the durable log, and the live stream.
    #[command(subcommand)]
    Markers(MarkersCommand),
    /// Pins a span as a constraint.
    Pin(PinArgs),
    /// Releases a pinned constraint, saying who and why (recorded in an
    /// UNPIN marker).
    Unpin(UnpinArgs),
    /// Escalations: review a session's compaction and approve it.
    #[command(subcommand)]
    Escalation(EscalationCommand),
    /// Writes sessions' snapshots to files.
    Export(ExportArgs),
    /// Restores sessions from snapshot files.
    Import(ImportArgs),
    /// The daemon's version, contract, limits and marker log.
    Info,
    /// The daemon's gRPC health.
    Health,
}

/// `sessions ...`
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// Every session (all pages).
    List,
    /// One session: configuration and totals.
    Show {
        /// The session.
        session: String,
    },
    /// Deletes a session and everything it holds.
    Delete {
        /// The session.
        session: String,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

/// `context SESSION`
#[derive(Debug, Args)]
pub struct ContextArgs {
    /// The session.
    pub session: String,
    /// Whole texts instead of a one-line preview.
    #[arg(long)]
    pub full: bool,
}

/// `markers ...`
#[derive(Debug, Subcommand)]
pub enum MarkersCommand {
    /// Prints markers from the log; with `--follow`, then every new one,
    /// resuming after a lost connection or a daemon restart.
    Tail(TailArgs),
}

/// `markers tail`
#[derive(Debug, Args)]
pub struct TailArgs {
    /// The first sequence number to print; by default the oldest
    /// retained marker.
    #[arg(long)]
    pub from_seq: Option<u64>,
    /// Only these sessions' markers (repeat the flag for several).
    #[arg(long = "session")]
    pub sessions: Vec<String>,
    /// Keep printing new markers until interrupted.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Stop after the marker with this sequence number.
    #[arg(long)]
    pub until_seq: Option<u64>,
}

/// `pin SESSION SPAN`
#[derive(Debug, Args)]
pub struct PinArgs {
    /// The session.
    pub session: String,
    /// The span to pin.
    pub span: u64,
}

/// `unpin SESSION SPAN --actor WHO --reason WHY`
#[derive(Debug, Args)]
pub struct UnpinArgs {
    /// The session.
    pub session: String,
    /// The pinned span.
    pub span: u64,
    /// Who releases it.
    #[arg(long)]
    pub actor: String,
    /// Why.
    #[arg(long)]
    pub reason: String,
}

/// `escalation ...`
#[derive(Debug, Subcommand)]
pub enum EscalationCommand {
    /// Plans the compaction a session is waiting for and shows it: what
    /// goes, what stays, the summary draft, the verifier's verdict.
    /// Nothing changes.
    Show(PlanArgs),
    /// Plans, shows, and on confirmation commits the compaction in the
    /// name of `--actor` (recorded in its marker).
    Approve(ApproveArgs),
}

/// What to plan for.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The session.
    pub session: String,
    /// Tokens of the turn waiting to be admitted (the escalation's
    /// `incoming_tokens`).
    #[arg(long, default_value_t = 0)]
    pub incoming: u32,
    /// Plan down to this many live tokens instead of the session's target.
    #[arg(long)]
    pub target: Option<u32>,
}

/// `escalation approve`
#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// The plan to make.
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Who approves.
    #[arg(long)]
    pub actor: String,
    /// Commit without asking.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// `export`
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The sessions to export.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub sessions: Vec<String>,
    /// Every session.
    #[arg(long)]
    pub all: bool,
    /// The directory the snapshots go to, one `SESSION.snapshot` file each
    /// (created if missing; an existing file is not overwritten).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
}

/// `import`
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Snapshot files written by `export`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}
