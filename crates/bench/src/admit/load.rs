//! The load driver: concurrent closed-loop clients, each waiting for its
//! reply before sending the next request, with a warm-up that is not
//! recorded and a measured window of fixed length.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::common::Failure;

/// What one request did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome {
    /// The reply carried a compaction marker.
    pub compacted: bool,
}

/// One client's request, sent again and again.
pub trait Op: Send + 'static {
    /// Sends one request and waits for its reply.
    fn call(&mut self) -> impl Future<Output = Result<Outcome, Failure>> + Send;
}

/// What a run of clients recorded.
#[derive(Debug, Default)]
pub struct Samples {
    /// Latencies of replies without a compaction, sorted.
    pub plain: Vec<Duration>,
    /// Latencies of replies with one, sorted.
    pub compacted: Vec<Duration>,
    /// Failed requests in the window.
    pub errors: u64,
    /// The first failure, for the report.
    pub first_error: Option<String>,
    /// The measured window.
    pub window: Duration,
}

impl Samples {
    /// Every latency, sorted.
    pub fn all(&self) -> Vec<Duration> {
        let mut all = Vec::with_capacity(self.plain.len() + self.compacted.len());
        all.extend_from_slice(&self.plain);
        all.extend_from_slice(&self.compacted);
        all.sort_unstable();
        all
    }

    /// Successful requests in the window.
    pub fn count(&self) -> usize {
        self.plain.len() + self.compacted.len()
    }

    /// Successful requests per second.
    pub fn rate(&self) -> f64 {
        per_second(self.count() as f64, self.window)
    }

    /// Sorts the latencies after merging.
    pub fn sort(&mut self) {
        self.plain.sort_unstable();
        self.compacted.sort_unstable();
    }

    /// Adds another run's samples (another client, or another round of
    /// the same row): latencies, counts and windows add up.
    pub fn merge(&mut self, other: Samples) {
        self.plain.extend(other.plain);
        self.compacted.extend(other.compacted);
        self.errors += other.errors;
        self.window += other.window;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// `n` per `window`, per second.
pub fn per_second(n: f64, window: Duration) -> f64 {
    if window.is_zero() {
        0.0
    } else {
        n / window.as_secs_f64()
    }
}

/// Runs every op as its own closed-loop client: `warmup` unrecorded, then
/// `window` recorded. A request counts in the window when it both starts
/// and ends within it.
pub async fn closed_loop<O: Op>(ops: Vec<O>, warmup: Duration, window: Duration) -> Samples {
    let begin = Instant::now() + warmup;
    let end = begin + window;
    let mut tasks = Vec::with_capacity(ops.len());
    for mut op in ops {
        tasks.push(tokio::spawn(async move {
            let mut mine = Samples::default();
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let result = op.call().await;
                let done = Instant::now();
                if sent < begin || done > end {
                    continue;
                }
                match result {
                    Ok(outcome) => {
                        if outcome.compacted {
                            mine.compacted.push(done - sent);
                        } else {
                            mine.plain.push(done - sent);
                        }
                    }
                    Err(err) => {
                        mine.errors += 1;
                        if mine.first_error.is_none() {
                            mine.first_error = Some(err.to_string());
                        }
                    }
                }
            }
            mine
        }));
    }
    let mut all = Samples::default();
    for task in tasks {
        match task.await {
            Ok(samples) => all.merge(samples),
            Err(err) => {
                all.errors += 1;
                all.first_error.get_or_insert_with(|| err.to_string());
            }
        }
    }
    all.window = window;
    all.sort();
    all
}
