//! What the measurements share: an in-process daemon on a loopback port,
//! clients, argument parsing and percentiles.

use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use ctxbroker_server::{BuildInfo, Settings};
use pb::context_broker_client::ContextBrokerClient;
use tonic::transport::{Channel, Endpoint};

/// A generated client on one channel.
pub type Client = ContextBrokerClient<Channel>;
/// Any failure of a measurement run.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The positional argument at `index`, parsed, or `default` when absent.
pub fn parse(args: &[String], index: usize, default: usize) -> Result<usize, Failure> {
    Ok(match args.get(index) {
        Some(text) => text.parse()?,
        None => default,
    })
}

/// The flags of subcommand `name`, parsed; on `--help` or an error, clap's
/// message is printed and the process exits (0 for help, 2 for an error).
pub fn flags<T: clap::Parser>(name: &str, args: &[String]) -> T {
    let argv = std::iter::once(format!("ctxbroker-bench {name}")).chain(args.iter().cloned());
    match T::try_parse_from(argv) {
        Ok(flags) => flags,
        Err(err) => {
            let _ = err.print();
            std::process::exit(if err.use_stderr() { 2 } else { 0 });
        }
    }
}

/// A daemon served in this process on a loopback port, with its data in
/// a temporary directory that goes with it.
#[derive(Debug)]
pub struct Daemon {
    /// Where it serves.
    pub addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

/// Starts a daemon with default settings in this process.
pub async fn daemon() -> Result<Daemon, Failure> {
    let dir = tempfile::tempdir()?;
    let settings = Settings {
        data_dir: dir.path().join("data"),
        ..Settings::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let build = BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        git_commit: "bench",
        contract_digest: "bench",
    };
    tokio::spawn(async move {
        let never = std::future::pending::<()>();
        if let Err(err) = ctxbroker_server::run(settings, listener, build, never).await {
            eprintln!("the daemon stopped: {err}");
        }
    });
    Ok(Daemon { addr, _dir: dir })
}

/// A client on its own connection to `addr`.
pub async fn client(addr: std::net::SocketAddr) -> Result<Client, Failure> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(ContextBrokerClient::new(channel))
}

/// The `p` quantile (0..=1) of sorted durations; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// A small deterministic generator (SplitMix64): the same seed gives the
/// same workload, corpus or trace on every platform and build.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in [0, n); 0 (drawing nothing) when n is 0.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in [lo, hi]; `lo` (drawing nothing) when `hi <= lo`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// One of `items`; "" when there is none.
    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items.get(self.below(items.len())).copied().unwrap_or("")
    }
}
