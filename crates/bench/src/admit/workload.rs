//! The admitted turns: a realistic agent mix, generated deterministically
//! up front so the load generator spends nothing on it, and shared by the
//! daemon rows and the Redis row byte for byte.
//!
//! Turns of a session, in order: every `constraint_every`-th turn is a user
//! constraint ("Never write to the `prod-17` namespace; stage only.",
//! classified by the daemon's rules); the others are drawn from a pool in
//! which 45 % are assistant turns of 20–200 tokens, 13 % user messages of
//! 8–60 tokens and 42 % tool outputs whose size is Pareto-distributed
//! (150 tokens and up, shape 1.16, capped at `max_tool_tokens`): the median
//! tool output is about 290 tokens, one in a hundred is over 7,000, and
//! the pool's largest is raised to the cap (120,000 by default) so that
//! every run admits it.

use ctxbroker_core::config::TokenizerKind;
use ctxbroker_core::tokens::{self, TokenCounter};
use ctxbroker_proto::v1 as pb;

use crate::common::{Rng, percentile};

/// Turns in the pool the clients draw from.
const POOL_TURNS: usize = 4096;
/// Distinct constraint texts.
const CONSTRAINTS: usize = 97;
/// The smallest tool output and the tail's shape.
const TOOL_MIN_TOKENS: f64 = 150.0;
const TOOL_SHAPE: f64 = 1.16;

/// One pre-generated turn.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Who speaks.
    pub role: pb::Role,
    /// The text, as sent.
    pub text: String,
    /// Its o200k_base token count.
    pub tokens: u32,
}

/// How the pool is made.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// The largest tool output, in tokens.
    pub max_tool_tokens: u32,
    /// Every this many turns of a session, one is a constraint.
    pub constraint_every: u64,
    /// The pool's seed.
    pub seed: u64,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            max_tool_tokens: 120_000,
            constraint_every: 25,
            seed: 0x5eed_c7b0,
        }
    }
}

/// The pre-generated turns.
#[derive(Debug)]
pub struct Workload {
    /// Narrative turns (assistant, user, tool).
    pub pool: Vec<Turn>,
    /// Constraint turns.
    pub constraints: Vec<Turn>,
    /// Large tool outputs used to fill sessions before measuring.
    pub prefill: Vec<Turn>,
    /// Every this many turns of a session, one is a constraint.
    pub constraint_every: u64,
}

impl Workload {
    /// Generates the pool (deterministic for a given mix).
    pub fn generate(mix: Mix) -> Workload {
        let counter = tokens::counter(TokenizerKind::O200kBase);
        let mut rng = Rng::new(mix.seed);
        let mut pool = Vec::with_capacity(POOL_TURNS);
        for n in 0..POOL_TURNS {
            let pick = rng.unit();
            let (role, target) = if pick < 0.45 {
                (pb::Role::Assistant, rng.range(20, 200) as u32)
            } else if pick < 0.58 {
                (pb::Role::User, rng.range(8, 60) as u32)
            } else {
                let u = rng.unit().max(f64::MIN_POSITIVE);
                let size = TOOL_MIN_TOKENS / u.powf(1.0 / TOOL_SHAPE);
                (
                    pb::Role::Tool,
                    size.min(f64::from(mix.max_tool_tokens)) as u32,
                )
            };
            pool.push(turn(role, target, n, &mut rng, counter));
        }
        // The tail's far end is rare: make sure the pool reaches it, by
        // raising its largest tool output to the cap.
        if let Some(largest) = (0..pool.len())
            .filter(|&i| pool[i].role == pb::Role::Tool)
            .max_by_key(|&i| pool[i].tokens)
            && pool[largest].tokens < mix.max_tool_tokens
        {
            pool[largest] = turn(
                pb::Role::Tool,
                mix.max_tool_tokens,
                largest,
                &mut rng,
                counter,
            );
        }
        let constraints = (0..CONSTRAINTS)
            .map(|n| {
                let text = constraint_text(n, &mut rng);
                Turn {
                    role: pb::Role::User,
                    tokens: counter.count(&text),
                    text,
                }
            })
            .collect();
        let prefill = (0..16)
            .map(|n| turn(pb::Role::Tool, 8_000, 100_000 + n, &mut rng, counter))
            .collect();
        Workload {
            pool,
            constraints,
            prefill,
            constraint_every: mix.constraint_every.max(1),
        }
    }

    /// The turn a session admits as its `turn`-th (from 0), for a client
    /// whose draws from the pool are numbered by `draw`.
    pub fn next(&self, turn: u64, draw: u64) -> &Turn {
        if turn % self.constraint_every == self.constraint_every - 1 {
            &self.constraints[(draw as usize) % self.constraints.len()]
        } else {
            &self.pool[(draw as usize) % self.pool.len()]
        }
    }

    /// Tool outputs in the pool: count, median, 99th percentile and largest,
    /// in tokens.
    pub fn tool_sizes(&self) -> (usize, u32, u32, u32) {
        let mut sizes: Vec<u32> = self
            .pool
            .iter()
            .filter(|t| t.role == pb::Role::Tool)
            .map(|t| t.tokens)
            .collect();
        sizes.sort_unstable();
        (
            sizes.len(),
            percentile(&sizes, 0.5),
            percentile(&sizes, 0.99),
            sizes.last().copied().unwrap_or(0),
        )
    }

    /// The mean tokens of a turn, constraints included at their rate.
    pub fn mean_turn_tokens(&self) -> f64 {
        let mean = |turns: &[Turn]| {
            turns.iter().map(|t| f64::from(t.tokens)).sum::<f64>() / turns.len().max(1) as f64
        };
        let every = self.constraint_every as f64;
        (mean(&self.pool) * (every - 1.0) + mean(&self.constraints)) / every
    }

    /// The mean UTF-8 bytes of a turn, constraints included at their rate.
    pub fn mean_turn_bytes(&self) -> f64 {
        let mean = |turns: &[Turn]| {
            turns.iter().map(|t| t.text.len() as f64).sum::<f64>() / turns.len().max(1) as f64
        };
        let every = self.constraint_every as f64;
        (mean(&self.pool) * (every - 1.0) + mean(&self.constraints)) / every
    }
}

/// A turn of about `target` tokens.
fn turn(role: pb::Role, target: u32, n: usize, rng: &mut Rng, counter: &dyn TokenCounter) -> Turn {
    let mut text = String::new();
    let mut tokens = 0u32;
    let mut line = 0usize;
    while tokens < target {
        let next = match role {
            pb::Role::Tool => tool_line(n, line, rng),
            _ => sentence(rng),
        };
        line += 1;
        tokens += counter.count(&next);
        text.push_str(&next);
    }
    let tokens = counter.count(&text);
    Turn { role, text, tokens }
}

const WORDS: [&str; 48] = [
    "the",
    "request",
    "handler",
    "returns",
    "cache",
    "entry",
    "before",
    "after",
    "retry",
    "timeout",
    "deploy",
    "staging",
    "rollout",
    "replica",
    "worker",
    "queue",
    "latency",
    "config",
    "should",
    "because",
    "error",
    "value",
    "index",
    "schema",
    "migration",
    "table",
    "column",
    "service",
    "client",
    "server",
    "token",
    "window",
    "budget",
    "summary",
    "branch",
    "commit",
    "build",
    "test",
    "failed",
    "passed",
    "module",
    "function",
    "option",
    "default",
    "update",
    "check",
    "state",
    "result",
];
const MODULES: [&str; 8] = [
    "broker", "store", "writer", "planner", "hub", "config", "session", "tokens",
];
const SERVICES: [&str; 6] = ["api", "billing", "search", "auth", "ingest", "scheduler"];

fn word(rng: &mut Rng) -> &'static str {
    rng.pick(&WORDS)
}

fn sentence(rng: &mut Rng) -> String {
    let words = rng.range(6, 18) as usize;
    let mut out = String::new();
    for i in 0..words {
        if i > 0 {
            out.push(' ');
        }
        match rng.below(12) {
            0 => out.push_str(&format!(
                "`{}::{}_{}`",
                rng.pick(&MODULES),
                word(rng),
                rng.below(100)
            )),
            1 => out.push_str(&format!("{}", rng.below(10_000))),
            _ => out.push_str(word(rng)),
        }
    }
    out.push_str(". ");
    out
}

/// One line of tool output `n`: a compiler warning, a log line, a test
/// result, a stack frame or a sentence.
pub(crate) fn tool_line(n: usize, line: usize, rng: &mut Rng) -> String {
    let module = rng.pick(&MODULES);
    match rng.below(5) {
        0 => format!(
            "src/{module}/{}_{n}.rs:{}:{}: warning: unused variable: `{}_{}`\n",
            word(rng),
            rng.below(900) + 1,
            rng.below(80) + 1,
            word(rng),
            rng.below(50)
        ),
        1 => format!(
            "2025-06-{:02}T{:02}:{:02}:{:02}Z INFO {}: request {:08x} {} in {}ms status={}\n",
            rng.below(28) + 1,
            rng.below(24),
            rng.below(60),
            rng.below(60),
            rng.pick(&SERVICES),
            rng.next_u64() as u32,
            word(rng),
            rng.below(900),
            [200, 200, 200, 404, 500][rng.below(5)]
        ),
        2 => format!(
            "test {module}::tests::{}_{}_{line} ... {}\n",
            word(rng),
            word(rng),
            if rng.below(20) == 0 { "FAILED" } else { "ok" }
        ),
        3 => format!(
            "    at {}.{}.{}({}.java:{})\n",
            rng.pick(&SERVICES),
            word(rng),
            word(rng),
            module,
            rng.below(2_000)
        ),
        _ => {
            let mut s = sentence(rng);
            s.push('\n');
            s
        }
    }
}

fn constraint_text(n: usize, rng: &mut Rng) -> String {
    match n % 4 {
        0 => format!("Never write to the `prod-{n}` namespace; stage only."),
        1 => format!(
            "Do not delete anything under /var/lib/{}-{n}/data.",
            rng.pick(&SERVICES)
        ),
        2 => format!(
            "Always run `cargo test -p {}_{n}` before you commit.",
            rng.pick(&MODULES)
        ),
        _ => format!(
            "Actually, use port {} instead of 8080 for the {} service.",
            9000 + n,
            rng.pick(&SERVICES)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_has_a_heavy_tail_and_periodic_constraints() {
        let workload = Workload::generate(Mix {
            max_tool_tokens: 20_000,
            ..Mix::default()
        });
        let (tools, median, _, largest) = workload.tool_sizes();
        assert!(tools > POOL_TURNS / 3, "{tools} tool outputs");
        assert!((150..1_000).contains(&median), "median {median}");
        assert!(largest >= 15_000, "largest {largest}");
        assert!(largest <= 21_000, "largest {largest}");
        let every = workload.constraint_every;
        let constraint = workload.next(every - 1, 3);
        assert!(
            workload
                .constraints
                .iter()
                .any(|c| c.text == constraint.text)
        );
        assert!(workload.pool.iter().all(|t| t.text != constraint.text));
        let again = Workload::generate(Mix {
            max_tool_tokens: 20_000,
            ..Mix::default()
        });
        assert_eq!(workload.pool[17].text, again.pool[17].text);
    }
}
