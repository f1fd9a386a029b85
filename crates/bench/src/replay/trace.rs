//! The trace: one long agent session, generated from a seed.
//!
//! A session is a system prompt, then phases of work (a user task, then
//! assistant turns and tool outputs in alternation), with constraints
//! stated by the user early and never repeated, bursts of very large tool
//! outputs, and idle gaps where the user is away. Every turn is one span.
//!
//! The user's constraints come in one of two phrasings ([`Phrasing`]):
//!
//! - **templates** (the labelled trace): six constraints, each built from
//!   a template that expresses its modality with the words the classifier
//!   rules look for, stated within the first 12–120 turns;
//! - **held-out** (the unlabelled trace): the session's share of the user
//!   constraints of the labelled data's held-out split, stated verbatim
//!   within the first quarter of the session, and its share of the
//!   split's user distractors (questions, step-local instructions,
//!   transient holds, reported speech, task requests, pasted output,
//!   acknowledgements, plain narrative) as user turns anywhere after the
//!   first one (see [`super::heldout`] for the deal).
//!
//! What the generator guarantees, so that the measurements mean what they
//! say (the tests below check each point):
//!
//! - With templates, only constraint turns express a modality: no other
//!   text contains a phrase the classifier reads as a prohibition,
//!   restriction, requirement or correction, so no other line can stand
//!   in for a constraint.
//! - With held-out phrasings, no turn but the one stating it contains a
//!   constraint's text, so no other turn can stand in for it.
//! - The only paths in tool outputs are the session's pool paths, and the
//!   only error lines are the session's pool error lines; the tracked
//!   anchors are exactly the pool entries that appear in some tool output.
//! - Every session has at least one burst episode and one idle gap,
//!   whatever its length, so that short traces still exercise both.

use std::collections::{BTreeMap, BTreeSet};

use ctxbroker_core::span::{Modality, Role};
use ctxbroker_core::tokens::TokenCounter;

use super::heldout::{HeldOutSpan, Share};
use crate::common::Rng;

/// What a turn is, for the report and the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TurnKind {
    /// The system prompt.
    System,
    /// A user constraint; the index into [`Trace::constraints`].
    Constraint(usize),
    /// A held-out user turn that binds nothing beyond the moment; the
    /// index into [`Trace::distractors`].
    Distractor(usize),
    /// A user task opening a phase.
    Task,
    /// The model's own turn.
    Assistant,
    /// An ordinary tool output (a few hundred to a few thousand tokens).
    Tool,
    /// A tool output of a burst episode (20–60% of W).
    Burst,
}

/// One turn of the trace: one span.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    /// Simulated time since the session started.
    pub(crate) at_ms: u64,
    pub(crate) role: Role,
    pub(crate) kind: TurnKind,
    pub(crate) text: String,
    /// Counted once with the real tokenizer; every policy uses this count.
    pub(crate) tokens: u32,
}

/// A constraint as the trace states it, with what measuring it needs.
#[derive(Debug, Clone)]
pub(crate) struct Constraint {
    /// The index of the turn that states it.
    pub(crate) turn: usize,
    /// What a unit of live text must have to hold it.
    pub(crate) hold: Hold,
    /// For a held-out phrasing: its id and category in the split.
    pub(crate) source: Option<Source>,
}

/// What holds a constraint in the live context.
#[derive(Debug, Clone)]
pub(crate) enum Hold {
    /// A template's constraint: a unit (a line, or a part of a line between
    /// ` | `) containing every term and expressing the modality.
    Terms {
        modality: Modality,
        terms: Vec<String>,
    },
    /// A held-out constraint: a span containing this text verbatim.
    Verbatim(String),
}

/// Where a held-out turn comes from in the split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    pub(crate) id: String,
    pub(crate) category: String,
}

impl From<&HeldOutSpan> for Source {
    fn from(span: &HeldOutSpan) -> Source {
        Source {
            id: span.id.clone(),
            category: span.category.clone(),
        }
    }
}

/// Where the user's constraints come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phrasing<'a> {
    /// Six template constraints with modal phrases; no distractors.
    Templates,
    /// The session's share of the held-out split: its constraints and its
    /// distractors, stated verbatim, each at most once.
    HeldOut(&'a Share),
}

/// One session's trace.
#[derive(Debug, Clone)]
pub(crate) struct Trace {
    pub(crate) turns: Vec<Turn>,
    pub(crate) constraints: Vec<Constraint>,
    /// The held-out distractors stated, in order (none with templates).
    pub(crate) distractors: Vec<Source>,
    /// The distinct pool paths and error lines that appear in tool
    /// outputs, sorted.
    pub(crate) anchors: Vec<String>,
    /// Burst episodes and burst outputs.
    pub(crate) burst_episodes: usize,
    pub(crate) burst_outputs: usize,
    /// Idle gaps (no turn for 15–75 minutes).
    pub(crate) idle_gaps: usize,
}

impl Trace {
    /// When the last turn arrives: the session's length.
    pub(crate) fn end_ms(&self) -> u64 {
        self.turns.last().map_or(0, |t| t.at_ms)
    }

    /// Tokens of every turn.
    pub(crate) fn tokens(&self) -> u64 {
        self.turns.iter().map(|t| u64::from(t.tokens)).sum()
    }

    /// The smallest and largest burst output, in tokens ((0, 0) when
    /// there is none).
    pub(crate) fn burst_range(&self) -> (u32, u32) {
        let sizes = self
            .turns
            .iter()
            .filter(|t| t.kind == TurnKind::Burst)
            .map(|t| t.tokens);
        let lo = sizes.clone().min().unwrap_or(0);
        (lo, sizes.max().unwrap_or(0))
    }
}

/// Constraints stated per session, with templates.
pub(crate) const CONSTRAINTS_PER_SESSION: usize = 6;
/// With held-out phrasings: constraints are stated within the first
/// `1/HELD_OUT_WINDOW` of the turns (at least the first 12), on at most a
/// third of those turns; distractors take at most a tenth of all turns.
const HELD_OUT_WINDOW: usize = 4;
const HELD_OUT_CONSTRAINT_SHARE: usize = 3;
const HELD_OUT_DISTRACTOR_SHARE: usize = 10;
/// A burst output's size as a fraction of W: 40k–120k at W = 200k.
const BURST_FRACTION: (f64, f64) = (0.2, 0.6);
/// Outputs per burst episode.
const BURST_OUTPUTS: (u64, u64) = (2, 4);
/// Seconds before a burst output (the tool's run).
const BURST_GAP_S: (u64, u64) = (5, 60);
/// Chance per ordinary turn that a burst episode starts.
const BURST_CHANCE: f64 = 1.0 / 180.0;
/// Turns per phase of work.
const PHASE_TURNS: (u64, u64) = (150, 350);
/// Chance that a phase starts after an idle gap.
const IDLE_CHANCE: f64 = 0.5;
/// An idle gap's length in seconds.
const IDLE_S: (u64, u64) = (15 * 60, 75 * 60);
/// Paths and error lines in a session's pools.
const POOL_PATHS: usize = 60;
const POOL_ERRORS: usize = 24;
/// Paths and error lines a phase works on.
const FOCUS_PATHS: usize = 7;
const FOCUS_ERRORS: usize = 3;

/// What the user says at a turn chosen before the trace is written.
#[derive(Debug, Clone, Copy)]
enum Said<'a> {
    /// A template constraint (the template's index).
    Template(usize),
    /// A held-out constraint.
    Constraint(&'a HeldOutSpan),
    /// A held-out distractor.
    Distractor(&'a HeldOutSpan),
}

/// Generates session `session` of a run seeded with `seed`: `turns` turns
/// for a window of `window` tokens (burst outputs scale with it), counted
/// with `counter`, with the user's constraints phrased as `phrasing` says.
/// A session's trace depends only on the seed, its index, `turns`,
/// `window` and the phrasing (for held-out phrasings, the session's
/// share).
///
/// With held-out phrasings, the session states the first
/// `min(share, (q − 1) / 3)` constraints of its share, where q = max(12,
/// turns / 4) (at most turns − 1), at distinct turns drawn uniformly from
/// 2..=q, in the share's order; and the first `min(share, (turns − 2) /
/// 10)` distractors of its share at distinct other turns drawn uniformly
/// from 2..turns, in order. The rest of the trace is written as with
/// templates.
pub(crate) fn generate(
    seed: u64,
    session: usize,
    turns: usize,
    window: u32,
    counter: &dyn TokenCounter,
    phrasing: Phrasing<'_>,
) -> Trace {
    let mut rng = Rng::new(seed ^ (session as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
    // Decorrelate nearby seeds.
    for _ in 0..4 {
        rng.next_u64();
    }
    let mut w = Writer::new(rng, session);
    let turns = turns.max(4);
    // No burst and no idle gap before this turn.
    let window_end = (turns / 25).clamp(12, 120).min(turns - 1);
    let said_at = match phrasing {
        Phrasing::Templates => template_turns(&mut w.rng, window_end),
        Phrasing::HeldOut(share) => held_out_turns(&mut w.rng, turns, share),
    };

    let forced_idle = turns / 2;
    let forced_burst = turns / 3;
    let mut out: Vec<Turn> = Vec::with_capacity(turns);
    let mut constraints = Vec::new();
    let mut distractors = Vec::new();
    let mut t_ms = 0u64;
    let mut next_phase = 1usize;
    let mut idle_forced = false;
    let mut burst_left = 0u64;
    let mut burst_episodes = 0usize;
    let mut burst_outputs = 0usize;
    let mut idle_gaps = 0usize;
    let mut last = TurnKind::System;
    let system = w.system_prompt();
    out.push(Turn {
        at_ms: 0,
        role: Role::System,
        kind: TurnKind::System,
        tokens: counter.count(&system),
        text: system,
    });
    for i in 1..turns {
        let said = said_at.get(&i).copied();
        // A phase (and the forced idle gap) falling on a user's turn
        // starts at the next turn.
        let force_idle = !idle_forced && i >= forced_idle;
        let (kind, gap_s) = if let Some(said) = said {
            let kind = match said {
                Said::Distractor(_) => TurnKind::Distractor(distractors.len()),
                Said::Template(_) | Said::Constraint(_) => TurnKind::Constraint(constraints.len()),
            };
            (kind, w.rng.range(5, 40))
        } else if i >= next_phase || force_idle {
            next_phase = i + w.rng.range(PHASE_TURNS.0, PHASE_TURNS.1) as usize;
            burst_left = 0;
            w.new_phase();
            if force_idle || (i > window_end && w.rng.chance(IDLE_CHANCE)) {
                idle_forced |= force_idle;
                idle_gaps += 1;
                (TurnKind::Task, w.rng.range(IDLE_S.0, IDLE_S.1))
            } else {
                (TurnKind::Task, w.rng.range(20, 180))
            }
        } else if burst_left > 0 {
            if last == TurnKind::Burst {
                (TurnKind::Assistant, w.rng.range(3, 15))
            } else {
                burst_left -= 1;
                (TurnKind::Burst, w.rng.range(BURST_GAP_S.0, BURST_GAP_S.1))
            }
        } else if i > window_end
            && last != TurnKind::Burst
            && (w.rng.chance(BURST_CHANCE) || (i >= forced_burst && burst_episodes == 0))
        {
            burst_episodes += 1;
            burst_left = w.rng.range(BURST_OUTPUTS.0, BURST_OUTPUTS.1) - 1;
            (TurnKind::Burst, w.rng.range(BURST_GAP_S.0, BURST_GAP_S.1))
        } else if last == TurnKind::Assistant {
            (TurnKind::Tool, w.rng.range(1, 20))
        } else {
            (TurnKind::Assistant, w.rng.range(2, 15))
        };
        t_ms += gap_s * 1000 + w.rng.range(0, 999);
        w.now_s = t_ms / 1000;
        let (role, text) = match (said, kind) {
            (Some(Said::Template(template)), _) => {
                let (text, modality, terms) = w.constraint(template);
                constraints.push(Constraint {
                    turn: i,
                    hold: Hold::Terms { modality, terms },
                    source: None,
                });
                (Role::User, text)
            }
            (Some(Said::Constraint(span)), _) => {
                constraints.push(Constraint {
                    turn: i,
                    hold: Hold::Verbatim(span.text.clone()),
                    source: Some(Source::from(span)),
                });
                (Role::User, span.text.clone())
            }
            (Some(Said::Distractor(span)), _) => {
                distractors.push(Source::from(span));
                (Role::User, span.text.clone())
            }
            (None, TurnKind::Task) => (Role::User, w.task()),
            (None, TurnKind::Assistant) => (Role::Assistant, w.assistant()),
            (None, TurnKind::Tool) => (Role::Tool, w.tool_output()),
            (None, TurnKind::Burst) => {
                burst_outputs += 1;
                let f = BURST_FRACTION.0 + (BURST_FRACTION.1 - BURST_FRACTION.0) * w.rng.unit();
                let target = (f64::from(window) * f) as u64;
                (Role::Tool, w.burst(target, counter))
            }
            // Only the first turn is the system prompt, and constraint and
            // distractor turns are always said.
            (None, TurnKind::System | TurnKind::Constraint(_) | TurnKind::Distractor(_)) => {
                (Role::System, w.system_prompt())
            }
        };
        last = kind;
        out.push(Turn {
            at_ms: t_ms,
            role,
            kind,
            tokens: counter.count(&text),
            text,
        });
    }
    let anchors: BTreeSet<String> = w
        .used_paths
        .iter()
        .map(|&i| w.paths[i].clone())
        .chain(w.used_errors.iter().map(|&i| w.errors[i].0.clone()))
        .collect();
    Trace {
        turns: out,
        constraints,
        distractors,
        anchors: anchors.into_iter().collect(),
        burst_episodes,
        burst_outputs,
        idle_gaps,
    }
}

/// The template constraints' turns: six distinct turns in 2..=`window_end`,
/// the k-th (in time) stating the k-th of the templates in an order drawn
/// from `rng`.
fn template_turns(rng: &mut Rng, window_end: usize) -> BTreeMap<usize, Said<'static>> {
    let mut slots: BTreeSet<usize> = BTreeSet::new();
    while slots.len() < CONSTRAINTS_PER_SESSION.min(window_end.saturating_sub(1)) {
        slots.insert(rng.range(2, window_end as u64) as usize);
    }
    let mut templates: Vec<usize> = (0..CONSTRAINT_TEMPLATES).collect();
    for i in (1..templates.len()).rev() {
        let j = rng.below(i + 1);
        templates.swap(i, j);
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(k, turn)| {
            let template = templates
                .get(k)
                .copied()
                .unwrap_or(k % CONSTRAINT_TEMPLATES);
            (turn, Said::Template(template))
        })
        .collect()
}

/// The held-out turns of a session of `turns` turns: as many of the
/// share's constraints as the first quarter has room for, then as many of
/// its distractors as a tenth of the turns, each at a distinct turn drawn
/// from `rng` (see [`generate`]).
fn held_out_turns<'a>(rng: &mut Rng, turns: usize, share: &'a Share) -> BTreeMap<usize, Said<'a>> {
    let stated_by = (turns / HELD_OUT_WINDOW).max(12).min(turns - 1);
    let n_constraints = share
        .constraints
        .len()
        .min(stated_by.saturating_sub(1) / HELD_OUT_CONSTRAINT_SHARE);
    let mut constraint_turns: BTreeSet<usize> = BTreeSet::new();
    while constraint_turns.len() < n_constraints {
        constraint_turns.insert(rng.range(2, stated_by as u64) as usize);
    }
    let n_distractors = share
        .distractors
        .len()
        .min(turns.saturating_sub(2) / HELD_OUT_DISTRACTOR_SHARE);
    let mut distractor_turns: BTreeSet<usize> = BTreeSet::new();
    while distractor_turns.len() < n_distractors {
        let turn = rng.range(2, turns as u64 - 1) as usize;
        if !constraint_turns.contains(&turn) {
            distractor_turns.insert(turn);
        }
    }
    let constraints = constraint_turns
        .into_iter()
        .zip(&share.constraints)
        .map(|(turn, span)| (turn, Said::Constraint(span)));
    let distractors = distractor_turns
        .into_iter()
        .zip(&share.distractors)
        .map(|(turn, span)| (turn, Said::Distractor(span)));
    constraints.chain(distractors).collect()
}

const DIRS: [&str; 12] = [
    "src/net",
    "src/storage",
    "src/api",
    "src/billing",
    "crates/core/src",
    "crates/server/src",
    "services/export",
    "internal/auth",
    "pkg/queue",
    "lib/report",
    "tests/integration",
    "deploy/charts",
];
const STEMS: [&str; 20] = [
    "retry",
    "backoff",
    "client",
    "handler",
    "router",
    "schema",
    "migrate",
    "session",
    "token_bucket",
    "pool",
    "codec",
    "ledger",
    "invoice",
    "worker",
    "cache",
    "limits",
    "export_job",
    "scheduler",
    "settings",
    "metrics",
];
const EXTS: [&str; 5] = ["rs", "py", "go", "ts", "yaml"];
const IDENTS: [&str; 15] = [
    "retry_budget",
    "max_delay",
    "flush_interval",
    "batch_size",
    "conn_pool",
    "export_cursor",
    "lease_ttl",
    "shard_map",
    "rate_limit",
    "idle_timeout",
    "checkpoint_id",
    "page_token",
    "backoff_cap",
    "queue_depth",
    "write_quorum",
];
const VARS: [&str; 10] = [
    "delay", "cursor", "batch", "lease", "page", "count", "limit", "budget", "shard", "offset",
];
const METHODS: [&str; 8] = [
    "len",
    "clone",
    "next_page",
    "flush",
    "get",
    "take",
    "min",
    "saturating_sub",
];
const SERVICES: [&str; 6] = [
    "export-worker",
    "billing-api",
    "auth-gateway",
    "ledger-sync",
    "report-cron",
    "queue-relay",
];
const MODULES: [&str; 8] = [
    "net", "storage", "api", "billing", "export", "auth", "queue", "report",
];
const REPOS: [&str; 4] = ["atlas", "quartz", "harbor", "meridian"];
const COMMENTS: [&str; 6] = [
    "the cursor advances once per page",
    "keep the lease alive while the batch is in flight",
    "retry with a longer delay after a timeout",
    "shards are rebalanced when the map changes",
    "the budget is refilled on every tick",
    "a zero limit turns the throttle off",
];

/// Constraint templates: (modality, text with `{}` for the term, choices
/// for the term). The term is what any form of the constraint must keep.
const CONSTRAINT_TEMPLATES: usize = 7;

fn constraint_template(i: usize) -> (Modality, &'static str, &'static [&'static str]) {
    match i {
        0 => (
            Modality::Prohibition,
            "Never write to the `{}` namespace; stage every change first.",
            &["prod", "prod-eu", "payments-live", "billing-prod"],
        ),
        1 => (
            Modality::Prohibition,
            "Do not edit the files under `{}`; they are generated by the build.",
            &["gen/proto", "api/generated", "schema/out"],
        ),
        2 => (
            Modality::Requirement,
            "Always run `{}` before every commit.",
            &[
                "make lint",
                "just check",
                "npm run verify",
                "cargo xtask ci",
            ],
        ),
        3 => (
            Modality::Restriction,
            "Use only the `{}` client for database access.",
            &["sqlx", "pgbouncer", "dbkit", "prisma"],
        ),
        4 => (
            Modality::Correction,
            "Correction: the staging database listens on port {}, not 5432.",
            &["6432", "6543", "7432", "15432"],
        ),
        5 => (
            Modality::Prohibition,
            "Don't push to the `{}` branch directly; open a pull request.",
            &["main", "release", "trunk"],
        ),
        _ => (
            Modality::Requirement,
            "You must keep the `{}` feature flag off in every environment.",
            &["bulk_export_v2", "fast_ledger", "async_invoices"],
        ),
    }
}

/// Writes the texts of one session.
struct Writer {
    rng: Rng,
    repo: &'static str,
    paths: Vec<String>,
    /// (line, index of the path it names).
    errors: Vec<(String, usize)>,
    focus_paths: Vec<usize>,
    focus_errors: Vec<usize>,
    used_paths: BTreeSet<usize>,
    used_errors: BTreeSet<usize>,
    /// Simulated seconds since the start, for log timestamps.
    now_s: u64,
}

impl Writer {
    fn new(mut rng: Rng, session: usize) -> Writer {
        let repo = REPOS[session % REPOS.len()];
        let exts: Vec<&str> = DIRS.iter().map(|_| rng.pick(&EXTS)).collect();
        let mut seen = BTreeSet::new();
        let mut paths = Vec::with_capacity(POOL_PATHS);
        while paths.len() < POOL_PATHS {
            let d = rng.below(DIRS.len());
            let stem = rng.pick(&STEMS);
            let path = format!("{}/{stem}.{}", DIRS[d], exts[d]);
            if seen.insert(path.clone()) {
                paths.push(path);
            }
        }
        let mut w = Writer {
            rng,
            repo,
            paths,
            errors: Vec::new(),
            focus_paths: Vec::new(),
            focus_errors: Vec::new(),
            used_paths: BTreeSet::new(),
            used_errors: BTreeSet::new(),
            now_s: 0,
        };
        let mut lines = BTreeSet::new();
        while w.errors.len() < POOL_ERRORS {
            let p = w.rng.below(w.paths.len());
            let line = w.error_line(p);
            if lines.insert(line.clone()) {
                w.errors.push((line, p));
            }
        }
        w.new_phase();
        w
    }

    fn error_line(&mut self, p: usize) -> String {
        let path = &self.paths[p];
        let r = &mut self.rng;
        match r.below(8) {
            0 => format!(
                "error[E0{}]: mismatched types at {path}:{}:{}",
                r.range(277, 599),
                r.range(10, 900),
                r.range(1, 80)
            ),
            1 => format!(
                "ERROR {}: upstream connect to 10.0.{}.{}:{} refused while flushing {path}",
                r.pick(&SERVICES),
                r.range(0, 9),
                r.range(2, 250),
                r.range(5000, 9999)
            ),
            2 => format!(
                "thread 'main' panicked at {path}:{}:{}: index out of bounds: the len is {} but the index is {}",
                r.range(10, 900),
                r.range(1, 80),
                r.range(1, 64),
                r.range(64, 128)
            ),
            3 => format!(
                "FAILED {path}::test_{}_{} - AssertionError: expected {}, got {}",
                r.pick(&VARS),
                r.range(1, 99),
                r.range(0, 500),
                r.range(501, 999)
            ),
            4 => format!(
                "FATAL: lease {} expired after {}s in {path}",
                r.pick(&IDENTS),
                r.range(5, 600)
            ),
            5 => format!(
                "TypeError: Cannot read properties of undefined (reading '{}') at {path}:{}",
                r.pick(&VARS),
                r.range(10, 900)
            ),
            6 => format!(
                "panic: runtime error: invalid memory address or nil pointer dereference [{path}:{}]",
                r.range(10, 900)
            ),
            _ => format!(
                "ERROR {}: checksum mismatch in segment {} written by {path}",
                r.pick(&SERVICES),
                r.range(1, 4000)
            ),
        }
    }

    /// Picks the paths and errors the next phase works on.
    fn new_phase(&mut self) {
        self.focus_paths = (0..FOCUS_PATHS)
            .map(|_| self.rng.below(self.paths.len()))
            .collect();
        self.focus_errors = (0..FOCUS_ERRORS)
            .map(|_| self.rng.below(self.errors.len()))
            .collect();
    }

    /// A focus path, for prose (not tracked).
    fn mention(&mut self) -> String {
        let i = self.focus_paths[self.rng.below(self.focus_paths.len())];
        self.paths[i].clone()
    }

    /// A focus path written into a tool output (tracked).
    fn path(&mut self) -> String {
        let i = self.focus_paths[self.rng.below(self.focus_paths.len())];
        self.used_paths.insert(i);
        self.paths[i].clone()
    }

    /// A focus error line written into a tool output (tracked, with the
    /// path it names).
    fn error(&mut self) -> String {
        let i = self.focus_errors[self.rng.below(self.focus_errors.len())];
        self.used_errors.insert(i);
        let (line, p) = &self.errors[i];
        self.used_paths.insert(*p);
        line.clone()
    }

    fn system_prompt(&mut self) -> String {
        format!(
            "You are a coding agent working in the {} repository. Tools: shell, file reads, test runs and log queries. Report what you change and why.",
            self.repo
        )
    }

    fn constraint(&mut self, template: usize) -> (String, Modality, Vec<String>) {
        let (modality, text, choices) = constraint_template(template);
        let term = self.rng.pick(choices);
        (text.replace("{}", term), modality, vec![term.to_owned()])
    }

    fn task(&mut self) -> String {
        let p = self.mention();
        let ident = self.rng.pick(&IDENTS);
        let svc = self.rng.pick(&SERVICES);
        let n = self.rng.range(3, 90);
        match self.rng.below(5) {
            0 => format!(
                "Next task: the nightly export in {p} times out after {n} minutes; find the cause and fix it."
            ),
            1 => format!("Please look into the flaky test around {ident} in {p}."),
            2 => format!(
                "The deploy of {svc} broke in staging this morning; see what changed in {p}."
            ),
            3 => format!("Can you speed up {ident}? Requests through {p} take {n}0 ms at p99."),
            _ => format!(
                "New issue from the on-call: {svc} restarts every few hours. Start with {p}."
            ),
        }
    }

    fn sentence(&mut self) -> String {
        let p = self.mention();
        let ident = self.rng.pick(&IDENTS);
        let module = self.rng.pick(&MODULES);
        let svc = self.rng.pick(&SERVICES);
        let n = self.rng.range(2, 400);
        match self.rng.below(8) {
            0 => format!("Reading {p} to see where {ident} is set."),
            1 => format!(
                "The trace points at {p}; {ident} is reset on every retry, so the loop gives up after {n} attempts."
            ),
            2 => format!("That test passes now. Next I will check {p}."),
            3 => {
                "The log shows the same symptom again, so the pool runs dry under load.".to_owned()
            }
            4 => format!("I will patch {p} so that {ident} is computed once per request."),
            5 => format!("Running the tests for {module} to check the change."),
            6 => format!("The change to {p} is in; {n} tests pass."),
            _ => format!("Looking at the last {n} lines of the {svc} logs."),
        }
    }

    fn assistant(&mut self) -> String {
        let n = self.rng.range(1, 6);
        (0..n)
            .map(|_| self.sentence())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn timestamp(&mut self) -> String {
        let s = self.now_s + self.rng.range(0, 59);
        format!(
            "2025-03-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            1 + (s / 86_400) % 28,
            (s / 3600) % 24,
            (s / 60) % 60,
            s % 60,
            self.rng.range(0, 999)
        )
    }

    fn code_line(&mut self) -> String {
        let a = self.rng.pick(&VARS);
        let b = self.rng.pick(&IDENTS);
        let m = self.rng.pick(&METHODS);
        let n = self.rng.range(1, 512);
        match self.rng.below(9) {
            0 => format!("    let {a} = {b}.{m}();"),
            1 => format!("    if {a} > {b} {{"),
            2 => format!("        {a} = {a}.saturating_add({n});"),
            3 => "    }".to_owned(),
            4 => format!("    self.{b}.insert({a}, {n});"),
            5 => format!("fn {b}_{m}(&mut self, {a}: u64) -> Result<u64, Fault> {{"),
            6 => format!("    // {}", self.rng.pick(&COMMENTS)),
            7 => format!("    Ok({a})"),
            _ => "}".to_owned(),
        }
    }

    fn log_line(&mut self) -> String {
        let ts = self.timestamp();
        let svc = self.rng.pick(&SERVICES);
        let n = self.rng.range(1, 5000);
        let ms = self.rng.range(1, 900);
        match self.rng.below(4) {
            0 => format!("{ts} INFO {svc}: processed batch of {n} records in {ms}ms"),
            1 => format!(
                "{ts} DEBUG {svc}: lease {} renewed, ttl {}s",
                self.rng.range(1000, 9999),
                self.rng.range(5, 120)
            ),
            2 => format!(
                "{ts} WARN {svc}: slow request to 10.0.{}.{} took {ms}ms",
                self.rng.range(0, 9),
                self.rng.range(2, 250)
            ),
            _ => format!("{ts} INFO {svc}: checkpoint {n} written, {ms} pending"),
        }
    }

    fn test_line(&mut self) -> String {
        let module = self.rng.pick(&MODULES);
        let var = self.rng.pick(&VARS);
        let case = self.rng.range(1, 9999);
        let outcome = if self.rng.chance(0.03) {
            "ignored"
        } else {
            "ok"
        };
        format!("test {module}::{var}::case_{case:04} ... {outcome}")
    }

    /// An ordinary tool output: a file read, a search, a test run, a build
    /// or a log query, a few hundred to a few thousand tokens.
    fn tool_output(&mut self) -> String {
        let mut lines: Vec<String> = Vec::new();
        match self.rng.below(10) {
            0..=2 => {
                let p = self.path();
                lines.push(format!("$ cat {p}"));
                for _ in 0..self.rng.range(30, 300) {
                    let line = self.code_line();
                    lines.push(line);
                }
            }
            3 | 4 => {
                let ident = self.rng.pick(&IDENTS);
                lines.push(format!("$ rg -n {ident}"));
                for _ in 0..self.rng.range(5, 60) {
                    let p = self.path();
                    let at = self.rng.range(1, 900);
                    let code = self.code_line();
                    lines.push(format!("{p}:{at}:{code}"));
                }
            }
            5 | 6 => {
                let module = self.rng.pick(&MODULES);
                lines.push(format!("$ cargo test -p {module}"));
                let n = self.rng.range(20, 200);
                for _ in 0..n {
                    let line = self.test_line();
                    lines.push(line);
                }
                for _ in 0..self.rng.range(0, 2) {
                    let e = self.error();
                    lines.push(e);
                }
                lines.push(format!(
                    "test result: {n} passed; finished in {}.{:02}s",
                    self.rng.range(0, 90),
                    self.rng.range(0, 99)
                ));
            }
            7 => {
                lines.push("$ cargo build".to_owned());
                for _ in 0..self.rng.range(5, 40) {
                    let module = self.rng.pick(&MODULES);
                    lines.push(format!(
                        "   Compiling {module}-{} v0.{}.{}",
                        self.rng.pick(&VARS),
                        self.rng.range(1, 30),
                        self.rng.range(0, 9)
                    ));
                }
                let e = self.error();
                lines.push(e);
                let p = self.path();
                lines.push(format!(
                    "  --> {p}:{}:{}",
                    self.rng.range(1, 900),
                    self.rng.range(1, 80)
                ));
            }
            _ => {
                let svc = self.rng.pick(&SERVICES);
                lines.push(format!("$ kubectl logs {svc} --tail 200"));
                for k in 0..self.rng.range(50, 250) {
                    if k % 97 == 50 {
                        let e = self.error();
                        lines.push(e);
                    } else {
                        let line = self.log_line();
                        lines.push(line);
                    }
                }
            }
        }
        lines.join("\n")
    }

    /// A burst output of about `target` tokens: a whole test suite or a
    /// long log dump, with a few error lines and paths of the phase in it.
    fn burst(&mut self, target: u64, counter: &dyn TokenCounter) -> String {
        let tests = self.rng.chance(0.5);
        let mut text = if tests {
            "$ cargo test --workspace -- --include-ignored".to_owned()
        } else {
            let svc = self.rng.pick(&SERVICES);
            format!("$ kubectl logs {svc} --since 12h")
        };
        // Lines are counted as they are written, to stop near the target;
        // the whole text is counted again by the caller.
        let mut tokens = u64::from(counter.count(&text));
        let mut k = 0u64;
        while tokens < target {
            let line = if k % 400 == 199 {
                self.error()
            } else if k % 400 == 399 {
                let p = self.path();
                format!(
                    "  --> {p}:{}:{}",
                    self.rng.range(1, 900),
                    self.rng.range(1, 80)
                )
            } else if tests {
                self.test_line()
            } else {
                self.log_line()
            };
            tokens += u64::from(counter.count(&line)) + 1;
            text.push('\n');
            text.push_str(&line);
            k += 1;
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxbroker_core::classify::{classify, modality_of};
    use ctxbroker_core::config::TokenizerKind;
    use ctxbroker_core::span::SpanClass;
    use ctxbroker_core::tokens::counter;

    fn small(seed: u64) -> Trace {
        generate(
            seed,
            0,
            400,
            200_000,
            counter(TokenizerKind::O200kBase),
            Phrasing::Templates,
        )
    }

    #[test]
    fn same_seed_same_trace_other_seed_other_trace() {
        let a = small(11);
        let b = small(11);
        let c = small(12);
        assert_eq!(a.turns.len(), 400);
        let texts = |t: &Trace| {
            t.turns
                .iter()
                .map(|x| (x.at_ms, x.text.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(texts(&a), texts(&b));
        assert_ne!(texts(&a), texts(&c));
        assert_eq!(a.anchors, b.anchors);
    }

    #[test]
    fn time_moves_forward_with_bursts_and_idle_gaps() {
        let t = small(3);
        assert!(t.turns.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
        assert!(t.burst_episodes >= 1 && t.burst_outputs >= 2);
        assert!(t.idle_gaps >= 1);
        let longest = t
            .turns
            .windows(2)
            .map(|w| w[1].at_ms - w[0].at_ms)
            .max()
            .unwrap();
        assert!(longest >= IDLE_S.0 * 1000, "{longest}");
        for turn in t.turns.iter().filter(|x| x.kind == TurnKind::Burst) {
            assert!(
                (38_000..=126_000).contains(&turn.tokens),
                "a burst of {} tokens",
                turn.tokens
            );
        }
        let ordinary = t.turns.iter().filter(|x| x.kind == TurnKind::Tool);
        assert!(ordinary.clone().count() > 50);
        assert!(ordinary.clone().all(|x| x.tokens < 8_000));
    }

    #[test]
    fn only_constraint_turns_express_a_modality() {
        for seed in [1, 2, 3] {
            let t = small(seed);
            assert_eq!(t.constraints.len(), CONSTRAINTS_PER_SESSION);
            assert!(t.distractors.is_empty());
            for (i, turn) in t.turns.iter().enumerate() {
                match turn.kind {
                    TurnKind::Constraint(k) => {
                        let c = &t.constraints[k];
                        assert_eq!(c.turn, i);
                        assert!(c.source.is_none());
                        assert_eq!(classify(turn.role, &turn.text).class, SpanClass::Constraint);
                        let Hold::Terms { modality, terms } = &c.hold else {
                            panic!("a template constraint is held by its terms: {c:?}");
                        };
                        assert!(!terms.is_empty());
                        assert!(
                            ctxbroker_core::predicate::expresses(&turn.text, *modality),
                            "{}",
                            turn.text
                        );
                    }
                    _ => {
                        assert_eq!(modality_of(&turn.text), None, "{}", turn.text);
                        assert_ne!(classify(turn.role, &turn.text).class, SpanClass::Constraint);
                    }
                }
            }
        }
    }

    #[test]
    fn error_words_appear_only_in_tracked_error_lines() {
        let t = small(5);
        assert!(t.anchors.len() > 10, "{}", t.anchors.len());
        let stems = ["error", "fail", "fatal", "panic", "traceback", "exception"];
        for turn in t.turns.iter().filter(|x| x.role == Role::Tool) {
            for line in turn.text.lines() {
                let lower = line.to_lowercase();
                if stems.iter().any(|s| lower.contains(s)) {
                    assert!(
                        t.anchors.iter().any(|a| a == line.trim()),
                        "an untracked error line: {line}"
                    );
                }
            }
        }
        // Every tracked anchor is in some tool output.
        for a in &t.anchors {
            assert!(
                t.turns
                    .iter()
                    .any(|x| x.role == Role::Tool && x.text.contains(a.as_str())),
                "{a}"
            );
        }
    }

    fn held_out(seed: u64, session: usize, turns: usize, share: &Share) -> Trace {
        generate(
            seed,
            session,
            turns,
            200_000,
            counter(TokenizerKind::O200kBase),
            Phrasing::HeldOut(share),
        )
    }

    #[test]
    fn held_out_phrasings_are_stated_verbatim_once_and_nowhere_else() {
        let deal = crate::replay::heldout::load_and_deal(1, 3).unwrap();
        let share = &deal.shares[1];
        let t = held_out(1, 1, 3_000, share);
        // The default run has room for the whole share.
        assert_eq!(t.constraints.len(), share.constraints.len());
        assert_eq!(t.distractors.len(), share.distractors.len());
        let mut stated = Vec::new();
        let mut said = Vec::new();
        for (i, turn) in t.turns.iter().enumerate() {
            match turn.kind {
                TurnKind::Constraint(k) => {
                    let c = &t.constraints[k];
                    assert_eq!(c.turn, i);
                    assert_eq!(turn.role, Role::User);
                    assert!(i <= 750, "stated at turn {i}");
                    let Hold::Verbatim(text) = &c.hold else {
                        panic!("a held-out constraint is held verbatim: {c:?}");
                    };
                    assert_eq!(text, &turn.text);
                    let source = c.source.clone().unwrap();
                    assert_eq!(share.constraints[k].id, source.id);
                    assert_eq!(share.constraints[k].text, turn.text);
                    stated.push(source.id);
                }
                TurnKind::Distractor(k) => {
                    assert_eq!(turn.role, Role::User);
                    assert_eq!(share.distractors[k].text, turn.text);
                    assert_eq!(share.distractors[k].id, t.distractors[k].id);
                    said.push(t.distractors[k].id.clone());
                }
                _ => {}
            }
        }
        let ids = |v: &[HeldOutSpan]| v.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
        assert_eq!(stated, ids(&share.constraints));
        assert_eq!(said, ids(&share.distractors));
        // No other turn holds a constraint's text.
        for c in &t.constraints {
            let Hold::Verbatim(text) = &c.hold else {
                unreachable!()
            };
            for (i, turn) in t.turns.iter().enumerate() {
                if i != c.turn {
                    assert!(
                        !turn.text.contains(text.as_str()),
                        "turn {i} holds {text:?}"
                    );
                }
            }
        }
        // The work around them is written as with templates.
        assert!(t.burst_episodes >= 1 && t.idle_gaps >= 1);
        assert!(t.anchors.len() > 10);
    }

    #[test]
    fn a_short_held_out_trace_states_a_prefix_of_its_share() {
        let deal = crate::replay::heldout::load_and_deal(4, 1).unwrap();
        let share = &deal.shares[0];
        let t = held_out(4, 0, 300, share);
        // q = 75: 24 constraints in turns 2..=75; 29 distractors.
        assert_eq!(t.constraints.len(), 24);
        assert_eq!(t.distractors.len(), 29);
        assert!(t.constraints.iter().all(|c| (2..=75).contains(&c.turn)));
        let categories = |v: Vec<&Source>| {
            v.into_iter()
                .map(|s| s.category.clone())
                .collect::<BTreeSet<_>>()
                .len()
        };
        let sources: Vec<&Source> = t
            .constraints
            .iter()
            .filter_map(|c| c.source.as_ref())
            .collect();
        assert_eq!(categories(sources), 12);
        assert_eq!(categories(t.distractors.iter().collect()), 8);
        assert!(t.idle_gaps >= 1 && t.burst_episodes >= 1);
        let again = held_out(4, 0, 300, share);
        let texts = |t: &Trace| t.turns.iter().map(|x| x.text.clone()).collect::<Vec<_>>();
        assert_eq!(texts(&t), texts(&again));
    }
}
