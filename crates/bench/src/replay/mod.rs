//! `replay`: one long-horizon trace replayed through three compaction
//! policies, and what each one loses; with `--unlabelled`, a second trace
//! whose constraints are phrased as users phrase them, replayed through
//! ctxbroker with the classes withheld.
//!
//! ```text
//! ctxbroker-bench replay [--seed N] [--sessions N] [--turns N] [--window W]
//!                        [--csv PATH] [--per-session] [--unlabelled]
//! ```
//!
//! Everything runs in this process on core's pure policy, with simulated
//! time (the core reads no clock), so a run is deterministic: the same
//! flags give the same table and the same CSV.
//!
//! # The trace
//!
//! Each session (default 3 sessions of 3,000 turns, W = 200,000) is
//! generated from the seed and its index alone:
//!
//! - a system prompt, then six user constraints stated within the first
//!   12–120 turns and never repeated: prohibitions (a namespace, generated
//!   files, a branch), requirements (run a command before committing,
//!   keep a feature flag off), a restriction (one database client) and a
//!   correction (a port);
//! - phases of 150–350 turns, each opened by a user task, then assistant
//!   turns (2–15 s after the previous turn) and ordinary tool outputs
//!   (file reads, searches, test runs, builds and log queries of a few
//!   hundred to a few thousand tokens, 1–20 s) in alternation;
//! - burst episodes, starting with probability 1/180 per turn: 2–4 tool
//!   outputs of 20–60% of W each (40k–120k tokens at the default W), each
//!   5–60 s after the previous turn, an assistant turn between two;
//! - idle gaps of 15–75 minutes before half the phases.
//!
//! Every session has at least one burst episode and one idle gap. Tool
//! outputs name the session's files (a pool of 60 paths) and error lines
//! (a pool of 24), each phase working on 7 paths and 3 errors; no other
//! paths or error lines occur, and no text but the constraints expresses a
//! modality. Every turn is one span, counted once with the real
//! `o200k_base` tokenizer; all policies see the same counts.
//!
//! # The unlabelled trace (`--unlabelled`)
//!
//! The six constraints above use the words the classifier rules look for
//! ("never", "do not", "always", "use only", "correction:"). The
//! unlabelled trace takes its user phrasings from the labelled data's
//! held-out split instead (`crates/core/data/classify/heldout.jsonl`,
//! read at run time): its user-role `constraint` spans (bans as noun
//! phrases, format rules, conditional rules, scoped preferences, rules
//! buried in a long message, other languages, …) are the session's
//! constraints, and its user-role narrative spans of the categories
//! question, step_local, transient_hold, reported_speech, task_request,
//! user_pasted_output, acknowledgement and plain_narrative are distractor
//! user turns. Both are dealt to the run's sessions by the seed, one
//! category at a time in turn, the `j`-th span to session `j mod
//! sessions`, so every span goes to exactly one session. A session states
//! its constraints verbatim at distinct turns within its first q =
//! max(12, turns/4) turns (on at most a third of them), and its
//! distractors at distinct other turns anywhere after the first (at most
//! a tenth of all turns); the rest of the trace is written as above, by
//! the same generator from the same seed (the user turns displace work
//! turns, so its tool outputs, bursts and idle gaps are other draws of the
//! same distributions). Over the default run every held-out user
//! constraint (182, twelve categories) is stated exactly once and every
//! distractor (144, eight categories) occurs exactly once; a shorter run
//! states a prefix of each session's share, which together hold every
//! category as soon as the run states twelve constraints and eight
//! distractors. No turn but the one stating it contains a constraint's
//! text. A session's unlabelled trace depends on the seed, its index, the
//! number of sessions, `turns` and W.
//!
//! # The policies
//!
//! - **(a) 90 s cadence, oldest 60%** (the seed's baseline): every 90 s
//!   of simulated time from the session's start, whether or not anything
//!   was admitted since, the shortest prefix of the live context (in
//!   prompt order) holding at least 60% of live tokens is replaced by one
//!   summary. Nothing is pinned. A turn arriving when live + turn > W is
//!   lost: it overflowed the window between two ticks.
//! - **(b) relevance-only eviction**: at admission, when live + turn would
//!   exceed the budget α·W, core's planner evicts the least relevant spans
//!   (core's relevance scoring against the incoming turn: recency,
//!   similarity, length) down to the soft watermark, as ctxbroker's
//!   admission plans — but every span is narrative, so constraints are
//!   evicted like anything else; no verifier, no generation cap, no
//!   background pre-compaction. A turn that still does not fit in W is
//!   lost.
//! - **(c) ctxbroker**: core's `Session` with the daemon's defaults
//!   (`SessionConfig::with_window(W)`: α = 0.85, soft watermark 0.9,
//!   relevance floor 0.05, trigger TOKEN_BUDGET, classifier MODEL, at
//!   most 3 summary generations, anchor policy REQUIRE, mode AUTO),
//!   driven as the daemon drives it for a caller that labels its turns:
//!   every turn is classified by the rules and the class is given as the
//!   caller's (SPAN_CLASS_CONSTRAINT with a derived predicate, or
//!   SPAN_CLASS_NARRATIVE), so the session keeps it and its classifier
//!   decides nothing; `Session::admit` compacts at admission by the token
//!   budget with verification, and the soft-watermark pre-compaction the
//!   daemon queues after an admission runs right after it (same simulated
//!   time). Every 90 s the session is also offered its background work
//!   (pre-compaction and staleness guard), which it must decline while
//!   idle. A refused turn is lost.
//! - **(d) ctxbroker, unlabelled** (`--unlabelled`): the same session,
//!   configuration and driver on the unlabelled trace, every turn sent
//!   with SPAN_CLASS_UNSPECIFIED: as the daemon does for such a span, a
//!   user or system turn is handed to the session as unclassified
//!   narrative and a tool or assistant turn as narrative by role, and the
//!   session settles the class at admission under its classifier mode
//!   (MODEL): pinned, in the standing-instructions tier (Protected), or
//!   narrative.
//!
//! All of them summarise with core's summariser (an anchors block, then
//! the most salient sentences; a summary's sentences are not summarised
//! again, its anchors are carried), within the session's summary cap
//! (budget/8, at most 4,096 tokens); the baselines have no generation
//! cap. Policy (a) gives prose up to a quarter of what it replaces (the
//! rule of core's staleness compaction); (b), (c) and (d) use the
//! planner's rule.
//!
//! # The columns
//!
//! - **turns lost to overflow**: turns that never entered the live
//!   context; (a) and (b): live + turn > W; (c) and (d): refused by the
//!   session.
//! - **compactions** and **compactions while idle**: committed
//!   compactions; one is idle when no turn arrived since the previous
//!   compaction of the session (or since its start).
//! - **max summary generation**: the highest generation of any summary
//!   written.
//! - **anchors lost**: of the distinct pool paths and error lines that
//!   appear in tool outputs, those that appear verbatim in no live span
//!   (originals and summaries) at the end of the session.
//! - **constraints lost**: constraints that, at some check after they were
//!   stated, nothing in the live context held. On the labelled trace, a
//!   unit of live text holds a constraint when it contains each of the
//!   constraint's terms (core's whole-word match) and expresses its
//!   modality (core's classifier rules); a unit is a line, or a part of a
//!   line between ` | `. On the unlabelled trace, where most phrasings
//!   have no modal phrase, a live span holds a constraint when its text
//!   contains the constraint's text exactly as stated (byte for byte).
//!   The span that stated it holds it while it is live: pinned (unless
//!   compressed to make room, which changes its text, so the constraint
//!   counts as lost), protected (until the tier evicts it) or narrative
//!   (until it is evicted); a summary holds it when it quotes the whole
//!   text. Checks run after every compaction and at the end:
//!   only a compaction removes text, and no other turn of the trace
//!   expresses a template constraint or contains a held-out one, so a
//!   constraint missing once stays missing — from then on the agent works
//!   without it.
//! - **constraint recall**: for (c) and (d), the constraints the session
//!   admitted pinned or in the standing-instructions tier (the class it
//!   gave the turn at admission; a refused turn is not kept), over the
//!   constraints stated. For (c) it is every constraint by construction.
//!   (a) and (b) classify nothing: "—".
//! - **false pins**: for (d), the held-out distractor turns the session
//!   admitted pinned or in the tier, over the distractors offered; "—"
//!   where the trace has none or the policy classifies nothing. Below the
//!   table, the trace's own task turns (user turns that open a phase,
//!   narrative by construction) pinned or in the tier are counted the same
//!   way for (c) and (d).
//! - **live-token peak vs W**: the most live tokens at any moment.
//!
//! Counts are summed over sessions; the generation and the peak are
//! maxima. With `--unlabelled`, the table is followed by row (d) by
//! held-out category (constraints stated, kept, lost; distractors offered
//! and pinned) and the ids of the constraints it lost or did not keep and
//! of the distractors it pinned. The CSV has one row per admission, lost
//! turn and compaction:
//! `policy,session,t_s,live_tokens,demand_tokens,window_tokens,event,summary_generation`
//! with `policy` one of `cadence`, `relevance`, `ctxbroker`,
//! `ctxbroker_unlabelled`, `event` one of `admit`, `lost`, `compact`,
//! `compact_idle`; `demand_tokens` is live + the turn when it arrived.
//! The script `crates/bench/plot_replay.py` draws the first three.

mod heldout;
mod policy;
mod trace;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use ctxbroker_core::config::{SessionConfig, TokenizerKind};
use ctxbroker_core::tokens;

use crate::common::Failure;
use trace::Phrasing;

/// The run's parameters: `replay`'s flags.
#[derive(Debug, Clone, PartialEq, clap::Parser)]
#[command(
    about = "`ctxbroker-bench replay`: one generated trace replayed under each compaction policy: turns lost, idle compactions, constraints lost",
    long_about = None
)]
pub struct Options {
    /// Seeds the trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Sessions replayed (1 to 1,000).
    #[arg(long, default_value_t = 3)]
    pub sessions: usize,
    /// Turns per session (20 to 1,000,000).
    #[arg(long, default_value_t = 3_000)]
    pub turns: usize,
    /// W, the window, in tokens.
    #[arg(long, default_value_t = 200_000)]
    pub window: u32,
    /// Where the CSV of live tokens over time goes, if anywhere.
    #[arg(long, value_name = "PATH")]
    pub csv: Option<PathBuf>,
    /// Also print one row per policy and session.
    #[arg(long)]
    pub per_session: bool,
    /// Also replay the unlabelled trace through ctxbroker, classes
    /// withheld.
    #[arg(long)]
    pub unlabelled: bool,
}

impl Default for Options {
    /// The flags' defaults.
    fn default() -> Self {
        <Options as clap::Parser>::parse_from(["ctxbroker-bench replay"])
    }
}

impl Options {
    /// Parses the flags after `replay`.
    pub fn parse(args: &[String]) -> Result<Options, Failure> {
        let argv = std::iter::once("ctxbroker-bench replay".to_owned()).chain(args.iter().cloned());
        let options = <Options as clap::Parser>::try_parse_from(argv)?;
        options.check()?;
        Ok(options)
    }

    /// Refuses sizes outside what the replay supports.
    fn check(&self) -> Result<(), Failure> {
        if self.sessions == 0 || self.sessions > 1_000 {
            return Err(format!("--sessions must be in 1..=1000; got {}", self.sessions).into());
        }
        if self.turns < 20 || self.turns > 1_000_000 {
            return Err(format!("--turns must be in 20..=1000000; got {}", self.turns).into());
        }
        Ok(())
    }
}

/// A compaction policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// (a) Every 90 s, summarise the oldest 60%.
    Cadence,
    /// (b) At admission, evict by relevance alone.
    Relevance,
    /// (c) ctxbroker's session, every turn's class given by the caller.
    Broker,
    /// (d) ctxbroker's session on the unlabelled trace, no class given.
    Unlabelled,
}

impl PolicyKind {
    /// The three replayed on the labelled trace, in table order.
    pub const ALL: [PolicyKind; 3] = [
        PolicyKind::Cadence,
        PolicyKind::Relevance,
        PolicyKind::Broker,
    ];

    /// The row label.
    pub fn label(self) -> &'static str {
        match self {
            PolicyKind::Cadence => "(a) 90 s cadence, oldest 60%",
            PolicyKind::Relevance => "(b) relevance-only eviction",
            PolicyKind::Broker => "(c) ctxbroker",
            PolicyKind::Unlabelled => "(d) ctxbroker, unlabelled",
        }
    }

    /// The CSV key.
    pub fn key(self) -> &'static str {
        match self {
            PolicyKind::Cadence => "cadence",
            PolicyKind::Relevance => "relevance",
            PolicyKind::Broker => "ctxbroker",
            PolicyKind::Unlabelled => "ctxbroker_unlabelled",
        }
    }
}

/// One replay's measurements (or their sum over sessions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Turns offered.
    pub turns: u64,
    /// Turns that never entered the live context.
    pub turns_lost: u64,
    /// Committed compactions.
    pub compactions: u64,
    /// Compactions with no turn since the previous one.
    pub idle_compactions: u64,
    /// The highest summary generation written.
    pub max_generation: u32,
    /// The most live tokens at any moment.
    pub peak_live: u64,
    /// W.
    pub window: u64,
    /// Constraints stated.
    pub constraints: u64,
    /// Constraints missing at some check after being stated.
    pub constraints_lost: u64,
    /// Tracked anchors (distinct paths and error lines of tool outputs).
    pub anchors: u64,
    /// Tracked anchors in no live span at the end.
    pub anchors_lost: u64,
    /// Whether the policy classifies what it admits (only then are the
    /// classes below measured).
    pub classifies: bool,
    /// Constraints admitted pinned or in the standing-instructions tier.
    pub constraints_kept: u64,
    /// Held-out distractors offered.
    pub distractors: u64,
    /// Held-out distractors admitted pinned or in the tier.
    pub false_pins: u64,
    /// The trace's own task turns offered.
    pub tasks: u64,
    /// Task turns admitted pinned or in the tier.
    pub task_pins: u64,
    /// (category, id) of the held-out constraints lost.
    pub lost: Vec<(String, String)>,
    /// (category, id) of the held-out constraints admitted as narrative
    /// (or refused).
    pub not_kept: Vec<(String, String)>,
    /// (category, id) of the held-out distractors pinned or in the tier.
    pub false_pinned: Vec<(String, String)>,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.turns += o.turns;
        self.turns_lost += o.turns_lost;
        self.compactions += o.compactions;
        self.idle_compactions += o.idle_compactions;
        self.max_generation = self.max_generation.max(o.max_generation);
        self.peak_live = self.peak_live.max(o.peak_live);
        self.window = self.window.max(o.window);
        self.constraints += o.constraints;
        self.constraints_lost += o.constraints_lost;
        self.anchors += o.anchors;
        self.anchors_lost += o.anchors_lost;
        self.classifies |= o.classifies;
        self.constraints_kept += o.constraints_kept;
        self.distractors += o.distractors;
        self.false_pins += o.false_pins;
        self.tasks += o.tasks;
        self.task_pins += o.task_pins;
        self.lost.extend(o.lost.iter().cloned());
        self.not_kept.extend(o.not_kept.iter().cloned());
        self.false_pinned.extend(o.false_pinned.iter().cloned());
    }
}

/// What a CSV row records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A turn entered the live context.
    Admit,
    /// A turn was lost.
    Lost,
    /// A compaction with a turn since the previous one.
    Compact,
    /// A compaction with no turn since the previous one.
    CompactIdle,
}

impl Event {
    fn key(self) -> &'static str {
        match self {
            Event::Admit => "admit",
            Event::Lost => "lost",
            Event::Compact => "compact",
            Event::CompactIdle => "compact_idle",
        }
    }
}

/// One moment of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// Simulated ms since the session started.
    pub t_ms: u64,
    /// Live tokens after the event.
    pub live: u64,
    /// Live + the arriving turn (for a compaction: live after it).
    pub demand: u64,
    /// What happened.
    pub event: Event,
    /// The summary's generation, for a compaction.
    pub generation: u32,
}

/// One session: its trace's shape and each policy's replay.
#[derive(Debug, Clone)]
pub struct SessionReport {
    /// The session's index.
    pub session: usize,
    /// Tokens of all its turns.
    pub tokens: u64,
    /// Its simulated length.
    pub end_ms: u64,
    /// Burst episodes and burst outputs.
    pub burst_episodes: usize,
    /// Burst outputs.
    pub burst_outputs: usize,
    /// The smallest and largest burst output, in tokens.
    pub burst_range: (u32, u32),
    /// Idle gaps.
    pub idle_gaps: usize,
    /// The unlabelled trace's shape, when it was replayed.
    pub unlabelled: Option<UnlabelledShape>,
    /// Per policy, in [`PolicyKind::ALL`] order, then
    /// [`PolicyKind::Unlabelled`] when it was replayed: measurements and
    /// series.
    pub results: Vec<(PolicyKind, Stats, Vec<Point>)>,
}

/// What one session's unlabelled trace held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnlabelledShape {
    /// Tokens of all its turns.
    pub tokens: u64,
    /// Burst outputs.
    pub burst_outputs: usize,
    /// Idle gaps.
    pub idle_gaps: usize,
    /// Held-out constraints stated, by category.
    pub constraints: BTreeMap<String, u64>,
    /// Held-out distractors offered, by category.
    pub distractors: BTreeMap<String, u64>,
}

impl UnlabelledShape {
    fn add(&mut self, o: &UnlabelledShape) {
        self.tokens += o.tokens;
        self.burst_outputs += o.burst_outputs;
        self.idle_gaps += o.idle_gaps;
        for (c, n) in &o.constraints {
            *self.constraints.entry(c.clone()).or_default() += n;
        }
        for (c, n) in &o.distractors {
            *self.distractors.entry(c.clone()).or_default() += n;
        }
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Report {
    /// What was run.
    pub options: Options,
    /// Per session.
    pub sessions: Vec<SessionReport>,
    /// With the unlabelled trace: the held-out split's user constraints
    /// and distractors.
    pub held_out: Option<(usize, usize)>,
}

impl Report {
    /// A policy's measurements summed over sessions (maxima for the
    /// generation and the peak).
    pub fn totals(&self, kind: PolicyKind) -> Stats {
        let mut sum = Stats::default();
        for s in &self.sessions {
            for (k, stats, _) in &s.results {
                if *k == kind {
                    sum.add(stats);
                }
            }
        }
        sum
    }

    /// The unlabelled traces' shape summed over sessions, when replayed.
    pub fn unlabelled_shape(&self) -> Option<UnlabelledShape> {
        let mut sum: Option<UnlabelledShape> = None;
        for shape in self.sessions.iter().filter_map(|s| s.unlabelled.as_ref()) {
            sum.get_or_insert_with(UnlabelledShape::default).add(shape);
        }
        sum
    }
}

/// Generates the trace and replays it through the three policies; with
/// `unlabelled`, also generates the unlabelled trace and replays it
/// through ctxbroker with no class given.
pub fn run(options: &Options) -> Result<Report, Failure> {
    let config = SessionConfig::with_window(options.window);
    if let Err(bad) = config.validate() {
        let text: Vec<String> = bad
            .iter()
            .map(|v| format!("{}: {}", v.field, v.description))
            .collect();
        return Err(format!("--window {}: {}", options.window, text.join("; ")).into());
    }
    let deal = if options.unlabelled {
        Some(heldout::load_and_deal(options.seed, options.sessions)?)
    } else {
        None
    };
    let counter = tokens::counter(TokenizerKind::O200kBase);
    tokens::warm_up(TokenizerKind::O200kBase);
    let mut sessions = Vec::with_capacity(options.sessions);
    for session in 0..options.sessions {
        let generate = |phrasing| {
            trace::generate(
                options.seed,
                session,
                options.turns,
                options.window,
                counter,
                phrasing,
            )
        };
        let replay = |kind: PolicyKind, trace: &trace::Trace| {
            let what = format!("{} replayed", kind.key());
            let (stats, points) = timed(session, &what, || {
                policy::replay(kind, trace, &config, counter, session)
            });
            (kind, stats, points)
        };
        let trace = timed(session, "trace generated and counted", || {
            generate(Phrasing::Templates)
        });
        let mut results: Vec<_> = PolicyKind::ALL
            .into_iter()
            .map(|kind| replay(kind, &trace))
            .collect();
        let mut unlabelled = None;
        if let Some(deal) = &deal {
            let share = deal
                .shares
                .get(session)
                .ok_or_else(|| format!("no held-out share for session {session}"))?;
            let trace = timed(session, "unlabelled trace generated and counted", || {
                generate(Phrasing::HeldOut(share))
            });
            results.push(replay(PolicyKind::Unlabelled, &trace));
            let mut shape = UnlabelledShape {
                tokens: trace.tokens(),
                burst_outputs: trace.burst_outputs,
                idle_gaps: trace.idle_gaps,
                ..UnlabelledShape::default()
            };
            for source in trace.constraints.iter().filter_map(|c| c.source.as_ref()) {
                *shape
                    .constraints
                    .entry(source.category.clone())
                    .or_default() += 1;
            }
            for source in &trace.distractors {
                *shape
                    .distractors
                    .entry(source.category.clone())
                    .or_default() += 1;
            }
            unlabelled = Some(shape);
        }
        sessions.push(SessionReport {
            session,
            tokens: trace.tokens(),
            end_ms: trace.end_ms(),
            burst_episodes: trace.burst_episodes,
            burst_outputs: trace.burst_outputs,
            burst_range: trace.burst_range(),
            idle_gaps: trace.idle_gaps,
            unlabelled,
            results,
        });
    }
    Ok(Report {
        options: options.clone(),
        sessions,
        held_out: deal.map(|d| (d.constraints, d.distractors)),
    })
}

/// `n` with thousands separators.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn row(label: &str, s: &Stats) -> String {
    let share = if s.window == 0 {
        0.0
    } else {
        100.0 * s.peak_live as f64 / s.window as f64
    };
    let recall = if s.classifies {
        format!(
            "{} / {}",
            grouped(s.constraints_kept),
            grouped(s.constraints)
        )
    } else {
        "—".to_owned()
    };
    let false_pins = if s.classifies && s.distractors > 0 {
        format!("{} / {}", grouped(s.false_pins), grouped(s.distractors))
    } else {
        "—".to_owned()
    };
    format!(
        "| {label} | {} / {} | {} | {} | {} | {} / {} | {} / {} | {recall} | {false_pins} | {} / {} ({share:.1}%) |",
        grouped(s.turns_lost),
        grouped(s.turns),
        grouped(s.compactions),
        grouped(s.idle_compactions),
        s.max_generation,
        grouped(s.anchors_lost),
        grouped(s.anchors),
        grouped(s.constraints_lost),
        grouped(s.constraints),
        grouped(s.peak_live),
        grouped(s.window),
    )
}

const HEADER: &str = "| policy | turns lost to overflow | compactions | compactions while idle | max summary generation | anchors lost | constraints lost | constraint recall | false pins | live-token peak vs W |\n|---|---|---|---|---|---|---|---|---|---|";

/// The kinds replayed in a run, in table order.
fn kinds(report: &Report) -> Vec<PolicyKind> {
    let mut kinds = PolicyKind::ALL.to_vec();
    if report.held_out.is_some() {
        kinds.push(PolicyKind::Unlabelled);
    }
    kinds
}

/// The report as markdown: what the trace held, then the table.
pub fn render(report: &Report) -> String {
    let o = &report.options;
    let n = report.sessions.len().max(1) as f64;
    let tokens: u64 = report.sessions.iter().map(|s| s.tokens).sum();
    let hours: f64 = report
        .sessions
        .iter()
        .map(|s| s.end_ms as f64 / 3_600_000.0)
        .sum::<f64>()
        / n;
    let episodes: usize = report.sessions.iter().map(|s| s.burst_episodes).sum();
    let bursts: usize = report.sessions.iter().map(|s| s.burst_outputs).sum();
    let idle: usize = report.sessions.iter().map(|s| s.idle_gaps).sum();
    let smallest = report
        .sessions
        .iter()
        .map(|s| s.burst_range.0)
        .filter(|&n| n > 0)
        .min()
        .unwrap_or(0);
    let largest = report
        .sessions
        .iter()
        .map(|s| s.burst_range.1)
        .max()
        .unwrap_or(0);
    let mut out = format!(
        "Trace: seed {}, {} session(s) x {} turns, W = {}; {} tokens offered; {hours:.1} h of simulated time per session on average; {bursts} burst outputs of {}–{} tokens in {episodes} episodes; {idle} idle gaps.\n",
        o.seed,
        o.sessions,
        grouped(o.turns as u64),
        grouped(u64::from(o.window)),
        grouped(tokens),
        grouped(u64::from(smallest)),
        grouped(u64::from(largest)),
    );
    let shape = report.unlabelled_shape();
    if let (Some(shape), Some((constraints, distractors))) = (&shape, report.held_out) {
        let stated: u64 = shape.constraints.values().sum();
        let offered: u64 = shape.distractors.values().sum();
        out.push_str(&format!(
            "Unlabelled trace (row (d)): the same generator, seed and sizes, with the user's constraints and distractor turns taken verbatim from the held-out split: {stated} of its {constraints} user constraints stated ({} categories), {offered} of its {distractors} distractors offered ({} categories); {} tokens offered; {} burst outputs; {} idle gaps.\n",
            shape.constraints.len(),
            shape.distractors.len(),
            grouped(shape.tokens),
            shape.burst_outputs,
            shape.idle_gaps,
        ));
    }
    out.push_str(&format!("\n{HEADER}\n"));
    for kind in kinds(report) {
        out.push_str(&row(kind.label(), &report.totals(kind)));
        out.push('\n');
    }
    if let Some(shape) = &shape {
        unlabelled_details(report, shape, &mut out);
    }
    if o.per_session {
        out.push_str(&format!(
            "\nPer session:\n\n{}\n",
            HEADER.replacen("| policy |", "| policy, session |", 1)
        ));
        for s in &report.sessions {
            for (kind, stats, _) in &s.results {
                out.push_str(&row(&format!("{}, {}", kind.label(), s.session), stats));
                out.push('\n');
            }
        }
    }
    out
}

/// Row (d) by held-out category, the ids it lost and pinned wrongly, and
/// the trace's own task turns pinned under each classifying row.
fn unlabelled_details(report: &Report, shape: &UnlabelledShape, out: &mut String) {
    let d = report.totals(PolicyKind::Unlabelled);
    let count = |list: &[(String, String)], category: &str| {
        list.iter().filter(|(c, _)| c == category).count()
    };
    out.push_str("\nRow (d) by held-out category:\n\n| constraint category | stated | kept by the classifier | lost |\n|---|---|---|---|\n");
    for (category, stated) in &shape.constraints {
        let missed = count(&d.not_kept, category) as u64;
        out.push_str(&format!(
            "| {category} | {stated} | {} | {} |\n",
            stated.saturating_sub(missed),
            count(&d.lost, category)
        ));
    }
    out.push_str("\n| distractor category | offered | pinned or in the tier |\n|---|---|---|\n");
    for (category, offered) in &shape.distractors {
        out.push_str(&format!(
            "| {category} | {offered} | {} |\n",
            count(&d.false_pinned, category)
        ));
    }
    let ids = |list: &[(String, String)]| {
        if list.is_empty() {
            "none".to_owned()
        } else {
            let mut ids: Vec<String> = list.iter().map(|(c, id)| format!("{id} ({c})")).collect();
            ids.sort();
            ids.join(", ")
        }
    };
    out.push_str(&format!(
        "\nRow (d): constraints lost: {}.\nRow (d): constraints not kept at admission: {}.\nRow (d): distractors pinned or in the tier: {}.\n",
        ids(&d.lost),
        ids(&d.not_kept),
        ids(&d.false_pinned),
    ));
    let c = report.totals(PolicyKind::Broker);
    out.push_str(&format!(
        "Task turns of the trace (user, narrative by construction) pinned or in the tier: (c) {} / {}, (d) {} / {}.\n",
        c.task_pins, c.tasks, d.task_pins, d.tasks
    ));
}

/// Writes the series of every policy and session as CSV.
pub fn write_csv(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "policy,session,t_s,live_tokens,demand_tokens,window_tokens,event,summary_generation"
    )?;
    for s in &report.sessions {
        for (kind, stats, points) in &s.results {
            for p in points {
                writeln!(
                    out,
                    "{},{},{}.{:03},{},{},{},{},{}",
                    kind.key(),
                    s.session,
                    p.t_ms / 1000,
                    p.t_ms % 1000,
                    p.live,
                    p.demand,
                    stats.window,
                    p.event.key(),
                    p.generation
                )?;
            }
        }
    }
    Ok(())
}

/// Runs `work` for a session's trace, telling how long it took.
fn timed<T>(session: usize, what: &str, work: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let done = work();
    eprintln!(
        "session {session}: {what} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    done
}

/// `replay [flags]`: prints the table; writes the CSV when asked.
pub fn replay_main(args: &[String]) -> Result<(), Failure> {
    let options: Options = crate::common::flags("replay", args);
    options.check()?;
    let started = Instant::now();
    let report = run(&options)?;
    print!("{}", render(&report));
    if let Some(path) = &options.csv {
        let file = std::fs::File::create(path)
            .map_err(|err| format!("--csv {}: {err}", path.display()))?;
        let mut w = std::io::BufWriter::new(file);
        write_csv(&report, &mut w)?;
        w.flush()?;
        eprintln!("series written to {}", path.display());
    }
    eprintln!("replay took {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_digits() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(200_000), "200,000");
        assert_eq!(grouped(12_345_678), "12,345,678");
    }

    #[test]
    fn parses_flags_and_refuses_bad_ones() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = Options::parse(&args("--seed 9 --turns 50 --per-session")).unwrap();
        assert_eq!(
            (o.seed, o.turns, o.sessions, o.per_session, o.unlabelled),
            (9, 50, 3, true, false)
        );
        assert!(Options::parse(&args("--unlabelled")).unwrap().unlabelled);
        assert!(Options::parse(&args("--turns")).is_err());
        assert!(Options::parse(&args("--turns x")).is_err());
        assert!(Options::parse(&args("--turns 3")).is_err());
        assert!(Options::parse(&args("--bogus 1")).is_err());
        assert!(Options::parse(&args("--sessions 0")).is_err());
        assert_eq!(Options::parse(&[]).unwrap(), Options::default());
    }

    #[test]
    fn a_bad_window_is_refused_by_name() {
        let o = Options {
            window: 0,
            turns: 20,
            sessions: 1,
            ..Options::default()
        };
        let err = run(&o).unwrap_err().to_string();
        assert!(err.contains("config.window_tokens"), "{err}");
    }
}
