//! What the measurements share: clients, argument parsing, percentiles
//! and a deterministic generator.

use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::context_broker_client::ContextBrokerClient;
use tonic::transport::{Channel, Endpoint};

/// A generated client on one channel.
pub type Client = ContextBrokerClient<Channel>;
/// Any failure of a measurement run.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

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

/// A client on its own connection to `addr`, with no limit on the size of
/// a message either way.
pub async fn client(addr: std::net::SocketAddr) -> Result<Client, Failure> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(ContextBrokerClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX))
}

/// The daemon's next marker sequence.
pub async fn next_marker(client: &mut Client) -> Result<u64, Failure> {
    Ok(client
        .get_server_info(pb::GetServerInfoRequest {})
        .await?
        .into_inner()
        .next_marker_seq)
}

/// The `p` quantile (0..=1) of sorted values: the one at round((n-1)·p);
/// the default (zero) when empty.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// The median of `values` (the upper one of an even count); zero when
/// empty.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// Latency quantiles, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Quantiles {
    /// Of sorted latencies.
    pub fn of(sorted: &[Duration]) -> Quantiles {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        Quantiles {
            p50: us(percentile(sorted, 0.5)),
            p90: us(percentile(sorted, 0.9)),
            p99: us(percentile(sorted, 0.99)),
            max: us(sorted.last().copied().unwrap_or_default()),
        }
    }
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

/// Tool output of about 120 tokens, different for every `n`.
pub fn tool_output(n: usize) -> String {
    const WORDS: [&str; 12] = [
        "rollout", "staging", "probe", "replica", "timeout", "cache", "queue", "handler", "deploy",
        "latency", "retry", "worker",
    ];
    let mut out = format!("step {n} in src/mod_{n}.rs:");
    for k in 0..90 {
        out.push(' ');
        out.push_str(WORDS[(n * 7 + k * 5) % WORDS.len()]);
    }
    out
}

/// A turn of one tool output ([`tool_output`]) for `session`.
pub fn tool_turn(session: &str, n: usize) -> pb::AdmitRequest {
    pb::AdmitRequest {
        session_id: session.to_owned(),
        spans: vec![pb::SpanInput {
            role: pb::Role::Tool as i32,
            text: tool_output(n),
            ..Default::default()
        }],
    }
}

/// Creates a session of `window` tokens that compacts only when full (a
/// soft watermark of 1): with a small window, nearly every turn compacts.
pub async fn create_small(client: &mut Client, session: &str, window: u32) -> Result<(), Failure> {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: session.to_owned(),
            config: Some(pb::SessionConfig {
                window_tokens: Some(window),
                soft_watermark: Some(1.0),
                ..Default::default()
            }),
        })
        .await?;
    Ok(())
}
