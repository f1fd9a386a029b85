//! `classify`: the standing-instruction classifier against the labelled
//! spans in `crates/core/data/classify` — per category and split, recall
//! of standing instructions, false pins of the rest, precision, and the
//! time per span — and `classify train`, which fits the model on the
//! training split alone and writes the weights the core crate compiles in.
//!
//! ```text
//! ctxbroker-bench classify [--data DIR] [--repeats N]
//! ctxbroker-bench classify train [--data DIR] [--write PATH] [--check] [--cv]
//! ```
//!
//! The held-out split is read only to measure: nothing is fitted or
//! chosen on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ctxbroker_core::classify::features::ALL_FEATURES;
use ctxbroker_core::classify::model::Model;
use ctxbroker_core::classify::train::{Example, TrainOptions, out_of_fold, train};
use ctxbroker_core::classify::{ClassifierTuning, Verdict, assess};
use ctxbroker_core::span::Role;
use serde::Deserialize;

use crate::common::{Failure, flags, percentile};

/// Where the labelled spans live in a checkout.
pub fn default_data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/data/classify")
}

/// One labelled span as stored (JSON Lines).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Labelled {
    /// Unique id: `tr-…` in the training split, `ho-…` held out, `cd-…`
    /// and `ct-…` in the chat splits.
    pub id: String,
    /// What kind of span it is (`ban_noun_phrase`, `question`, …).
    pub category: String,
    /// `user`, `system`, `assistant` or `tool`.
    pub role: String,
    /// `constraint` or `narrative`.
    pub label: String,
    /// The span's text.
    pub text: String,
}

impl Labelled {
    /// The role as core knows it.
    pub fn role(&self) -> Result<Role, Failure> {
        Ok(match self.role.as_str() {
            "user" => Role::User,
            "system" => Role::System,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => return Err(format!("{}: unknown role {other:?}", self.id).into()),
        })
    }

    /// Whether it is a standing instruction.
    pub fn constraint(&self) -> Result<bool, Failure> {
        match self.label.as_str() {
            "constraint" => Ok(true),
            "narrative" => Ok(false),
            other => Err(format!("{}: unknown label {other:?}", self.id).into()),
        }
    }
}

/// Reads one split (`train` or `heldout`).
pub fn load(dir: &Path, split: &str) -> Result<Vec<Labelled>, Failure> {
    let path = dir.join(format!("{split}.jsonl"));
    let text =
        std::fs::read_to_string(&path).map_err(|err| format!("{}: {err}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let span: Labelled = serde_json::from_str(line)
            .map_err(|err| format!("{}:{}: {err}", path.display(), n + 1))?;
        span.role()?;
        span.constraint()?;
        out.push(span);
    }
    Ok(out)
}

/// The training examples of a split.
pub fn examples(spans: &[Labelled]) -> Result<Vec<Example>, Failure> {
    spans
        .iter()
        .map(|s| {
            Ok(Example {
                role: s.role()?,
                text: s.text.clone(),
                constraint: s.constraint()?,
            })
        })
        .collect()
}

/// How one group of spans fared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// Spans in the group.
    pub n: usize,
    /// Standing instructions among them.
    pub positives: usize,
    /// Pinned (verdict standing).
    pub pinned: usize,
    /// Doubtful (below the pin threshold, above the doubt threshold).
    pub doubtful: usize,
    /// Standing instructions pinned.
    pub true_pins: usize,
    /// Standing instructions pinned or doubtful.
    pub kept: usize,
}

impl Tally {
    fn add(&mut self, constraint: bool, verdict: Verdict) {
        self.n += 1;
        let pinned = verdict == Verdict::Standing;
        let doubtful = verdict == Verdict::Doubtful;
        self.pinned += usize::from(pinned);
        self.doubtful += usize::from(doubtful);
        if constraint {
            self.positives += 1;
            self.true_pins += usize::from(pinned);
            self.kept += usize::from(pinned || doubtful);
        }
    }

    /// Pinned standing instructions over all standing instructions.
    pub fn recall(&self) -> f64 {
        ratio(self.true_pins, self.positives)
    }

    /// Pinned or doubtful standing instructions over all of them.
    pub fn kept_recall(&self) -> f64 {
        ratio(self.kept, self.positives)
    }

    /// Standing instructions among the pinned.
    pub fn precision(&self) -> f64 {
        ratio(self.true_pins, self.pinned)
    }

    /// Pinned spans that are not standing instructions.
    pub fn false_pins(&self) -> usize {
        self.pinned - self.true_pins
    }

    /// Doubtful spans that are not standing instructions: kept in the
    /// tier, at the cost of its room.
    pub fn tiered_others(&self) -> usize {
        self.doubtful - (self.kept - self.true_pins)
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

/// One split's results.
#[derive(Debug, Clone, Default)]
pub struct SplitReport {
    /// Every span of the split.
    pub all: Tally,
    /// User and system spans only (the ones the model scores).
    pub scored: Tally,
    /// By category.
    pub by_category: BTreeMap<String, Tally>,
    /// The ids of standing instructions that were not pinned, with their
    /// verdict's explanation.
    pub missed: Vec<(String, String)>,
    /// The ids of other spans that were pinned, with the explanation.
    pub false_pins: Vec<(String, String)>,
}

impl SplitReport {
    /// Counts one span's verdict, and lists it when it is a miss or a
    /// false pin.
    fn record(
        &mut self,
        span: &Labelled,
        role: Role,
        constraint: bool,
        verdict: Verdict,
        why: String,
    ) {
        self.all.add(constraint, verdict);
        if matches!(role, Role::User | Role::System) {
            self.scored.add(constraint, verdict);
        }
        self.by_category
            .entry(span.category.clone())
            .or_default()
            .add(constraint, verdict);
        if constraint && verdict != Verdict::Standing {
            self.missed.push((span.id.clone(), why));
        } else if !constraint && verdict == Verdict::Standing {
            self.false_pins.push((span.id.clone(), why));
        }
    }
}

/// Who decides, in an evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decider {
    /// The built-in model.
    Model,
    /// The modal phrase rules alone, as the broker classified before the
    /// model: a user or system span is pinned when any modal phrase
    /// fires. The same-run baseline.
    ModalRules,
}

/// Classifies every span of a split.
pub fn evaluate(spans: &[Labelled], decider: Decider) -> Result<SplitReport, Failure> {
    let tuning = ClassifierTuning::default();
    let mut report = SplitReport::default();
    for span in spans {
        let role = span.role()?;
        let constraint = span.constraint()?;
        let (verdict, why) = match (role, decider) {
            (Role::User | Role::System, Decider::Model) => {
                let a = assess(role, &span.text, &tuning);
                (a.verdict, a.explanation)
            }
            (Role::User | Role::System, Decider::ModalRules) => {
                match ctxbroker_core::classify::modality_of(&span.text) {
                    Some(_) => (Verdict::Standing, "modal phrase".to_owned()),
                    None => (Verdict::Narrative, "no modal phrase".to_owned()),
                }
            }
            (Role::Tool | Role::Assistant, _) => (Verdict::Narrative, "by role".to_owned()),
        };
        report.record(span, role, constraint, verdict, why);
    }
    Ok(report)
}

/// Median microseconds per span over `repeats` passes of `texts`, and the
/// same for the spans of 20–120 words (a typical turn).
pub fn timing(spans: &[Labelled], repeats: usize) -> Result<(f64, f64), Failure> {
    let tuning = ClassifierTuning::default();
    let user: Vec<(Role, &str)> = spans
        .iter()
        .filter_map(|s| match s.role() {
            Ok(r @ (Role::User | Role::System)) => Some((r, s.text.as_str())),
            _ => None,
        })
        .collect();
    let typical: Vec<(Role, &str)> = user
        .iter()
        .copied()
        .filter(|(_, t)| (20..=120).contains(&t.split_whitespace().count()))
        .collect();
    let per_span = |set: &[(Role, &str)]| {
        let mut runs = Vec::new();
        for _ in 0..repeats.max(1) {
            let start = Instant::now();
            for (role, text) in set {
                std::hint::black_box(assess(*role, text, &tuning));
            }
            runs.push(start.elapsed().as_secs_f64() * 1e6 / set.len().max(1) as f64);
        }
        runs.sort_by(f64::total_cmp);
        percentile(&runs, 0.5)
    };
    Ok((per_span(&user), per_span(&typical)))
}

/// The flags of `classify`.
#[derive(Debug, clap::Parser)]
struct EvalFlags {
    /// The directory holding train.jsonl and heldout.jsonl.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Passes over the spans for the timing.
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// List the ids of misses and false pins of the training split and of
    /// the chat split read while developing (`chat-dev`); the held-out
    /// split's and the unread chat split's are not listed: reading them
    /// invites tuning to them.
    #[arg(long)]
    explain: bool,
}

/// The chat splits: user messages written apart from the training and
/// held-out splits' generators and from the classifier, in the phrasing
/// of chat (rules stated as facts about the team or the system, idioms,
/// hedges, conditions, rules after small talk), never fitted on. The
/// development one is read while working on the classifier; the test one
/// is not, so its figure is the estimate for phrasing nobody anticipated.
/// Each as its file's name, its row's and its modal-rules baseline row's.
pub const CHAT_SPLITS: [(&str, &str, &str); 2] = [
    ("chat-dev", "chat, dev", "chat, dev, modal rules"),
    ("chat-test", "chat, test", "chat, test, modal rules"),
];

/// The flags of `classify train`.
#[derive(Debug, clap::Parser)]
struct TrainFlags {
    /// The directory holding train.jsonl.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Write the weights as Rust to this file (the core crate's
    /// `src/classify/weights.rs`).
    #[arg(long)]
    write: Option<PathBuf>,
    /// Fail unless the trained model equals the one compiled in.
    #[arg(long)]
    check: bool,
    /// Gradient steps (default: the committed model's).
    #[arg(long)]
    steps: Option<usize>,
    /// L2 penalty (default: the committed model's).
    #[arg(long)]
    l2: Option<f64>,
    /// Step size (default: the committed model's).
    #[arg(long)]
    learning_rate: Option<f64>,
    /// Weight of a missed standing instruction against a false pin.
    #[arg(long)]
    positive_weight: Option<f64>,
    /// Also score every training span by a model fitted without its fold,
    /// at the trained thresholds, and list the misses and false pins: the
    /// training split's own estimate of the figures on unseen text.
    #[arg(long)]
    cv: bool,
}

/// `ctxbroker-bench classify …`.
pub fn classify_main(args: &[String]) -> Result<(), Failure> {
    if args.first().map(String::as_str) == Some("train") {
        let flags: TrainFlags = flags("classify train", args.get(1..).unwrap_or_default());
        let dir = flags.data.clone().unwrap_or_else(default_data_dir);
        let defaults = TrainOptions::default();
        let options = TrainOptions {
            steps: flags.steps.unwrap_or(defaults.steps),
            l2: flags.l2.unwrap_or(defaults.l2),
            learning_rate: flags.learning_rate.unwrap_or(defaults.learning_rate),
            positive_weight: flags.positive_weight.unwrap_or(defaults.positive_weight),
            ..defaults
        };
        let spans = load(&dir, "train")?;
        let model = train(&examples(&spans)?, &options);
        print!("{}", weights_source(&model));
        if let Some(path) = flags.write {
            std::fs::write(&path, weights_source(&model))?;
            eprintln!("wrote {}", path.display());
        }
        if flags.cv {
            let report = cross_validated(&spans, &model, &options)?;
            eprint!("{}", table(&[("train, out of fold", report.clone())]));
            for (id, why) in report.missed.iter().chain(&report.false_pins) {
                eprintln!("{id}  {why}");
            }
        }
        if flags.check && !same_model(&model, ctxbroker_core::classify::model::builtin()) {
            return Err("the compiled-in model differs from training on the data: run \
                        `ctxbroker-bench classify train --write crates/core/src/classify/weights.rs`"
                .into());
        }
        return Ok(());
    }
    let flags: EvalFlags = flags("classify", args);
    let dir = flags.data.unwrap_or_else(default_data_dir);
    let train = load(&dir, "train")?;
    // The held-out split is written apart from the training split and the
    // model; until it exists, only the training split is measured.
    let heldout = if dir.join("heldout.jsonl").exists() {
        Some(load(&dir, "heldout")?)
    } else {
        println!(
            "(no held-out split in {}: training split only)\n",
            dir.display()
        );
        None
    };
    let mut reports = vec![("train", evaluate(&train, Decider::Model)?)];
    let mut baseline = vec![("train, modal rules", evaluate(&train, Decider::ModalRules)?)];
    if let Some(heldout) = &heldout {
        reports.push(("held-out", evaluate(heldout, Decider::Model)?));
        baseline.push((
            "held-out, modal rules",
            evaluate(heldout, Decider::ModalRules)?,
        ));
    }
    print!("{}", table(&reports));
    let mut chat = Vec::new();
    for (split, name, rules) in CHAT_SPLITS {
        if dir.join(format!("{split}.jsonl")).exists() {
            let spans = load(&dir, split)?;
            chat.push((name, evaluate(&spans, Decider::Model)?));
            baseline.push((rules, evaluate(&spans, Decider::ModalRules)?));
        }
    }
    if !chat.is_empty() {
        println!(
            "\nThe chat splits: user messages written apart from the generators and the classifier, in chat phrasing.\n"
        );
        print!("{}", summary(&chat));
    }
    println!(
        "\nBaseline, same run: the modal phrase rules alone (the classifier before the model).\n"
    );
    print!("{}", summary(&baseline));
    let (all, typical) = timing(&train, flags.repeats)?;
    println!(
        "\ntime per user/system span: median {all:.1} µs over {} passes; typical turn (20–120 words) {typical:.1} µs",
        flags.repeats
    );
    if flags.explain {
        let dev = chat.iter().filter(|(name, _)| *name == CHAT_SPLITS[0].1);
        for (_, report) in reports.iter().take(1).chain(dev) {
            for (id, why) in &report.missed {
                println!("missed      {id}  {why}");
            }
            for (id, why) in &report.false_pins {
                println!("false pin   {id}  {why}");
            }
        }
    }
    Ok(())
}

/// The training split judged by out-of-fold scores at `model`'s
/// thresholds; the explanations are `model`'s, after the out-of-fold
/// score.
pub fn cross_validated(
    spans: &[Labelled],
    model: &Model,
    options: &TrainOptions,
) -> Result<SplitReport, Failure> {
    let scores = out_of_fold(&examples(spans)?, options);
    let mut scores = scores.into_iter();
    let mut report = SplitReport::default();
    for span in spans {
        let role = span.role()?;
        let constraint = span.constraint()?;
        let (verdict, why) = match role {
            Role::User | Role::System => {
                let score = scores.next().unwrap_or(0.0);
                let verdict = if score >= model.pin_threshold {
                    Verdict::Standing
                } else if score >= model.doubt_threshold {
                    Verdict::Doubtful
                } else {
                    Verdict::Narrative
                };
                let fitted = explain(model, &span.text, role == Role::System);
                (verdict, format!("out of fold {score:.2}; fitted {fitted}"))
            }
            Role::Tool | Role::Assistant => (Verdict::Narrative, "by role".to_owned()),
        };
        report.record(span, role, constraint, verdict, why);
    }
    Ok(report)
}

/// The score of `text` by `model` and the features that carried it, as
/// in a classification's rule.
fn explain(model: &Model, text: &str, system_role: bool) -> String {
    let scored = model.score(text, system_role);
    let mut out = format!("{:.2}:", scored.score);
    for (f, _) in &scored.raised_by {
        out.push_str(&format!(" +{}", f.name()));
    }
    for (f, _) in &scored.lowered_by {
        out.push_str(&format!(" -{}", f.name()));
    }
    out
}

/// Whether two models are the same to the precision the source keeps.
pub fn same_model(a: &Model, b: &Model) -> bool {
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * (1.0 + x.abs().max(y.abs()));
    close(a.bias, b.bias)
        && close(a.pin_threshold, b.pin_threshold)
        && close(a.doubt_threshold, b.doubt_threshold)
        && a.weights.iter().zip(&b.weights).all(|(x, y)| close(*x, *y))
}

/// The Rust source of `weights.rs` for a model.
pub fn weights_source(model: &Model) -> String {
    let mut out = String::from(
        "//! The trained model. Generated by `ctxbroker-bench classify train\n\
         //! --write crates/core/src/classify/weights.rs` from\n\
         //! `data/classify/train.jsonl`; do not edit by hand.\n\n\
         use super::model::Model;\n\n\
         /// The model trained on the training split.\n\
         pub(super) static MODEL: Model = Model {\n",
    );
    out.push_str(&format!("    bias: {:?},\n    weights: [\n", model.bias));
    for (f, w) in ALL_FEATURES.iter().zip(&model.weights) {
        out.push_str(&format!("        {w:?}, // {}\n", f.name()));
    }
    out.push_str(&format!(
        "    ],\n    pin_threshold: {:?},\n    doubt_threshold: {:?},\n}};\n",
        model.pin_threshold, model.doubt_threshold
    ));
    out
}

/// The markdown table of both splits: the summary, then by category.
pub fn table(reports: &[(&str, SplitReport)]) -> String {
    let mut out = summary(reports);
    by_category(reports, &mut out);
    out
}

/// One row per split: precision, recall, false pins.
pub fn summary(reports: &[(&str, SplitReport)]) -> String {
    let mut out = String::new();
    out.push_str("| split | user/system spans | precision | recall (pinned) | recall (pinned or doubtful) | false pins | others in the tier | all spans |\n|---|---|---|---|---|---|---|---|\n");
    for (name, r) in reports {
        out.push_str(&format!(
            "| {name} | {} ({} standing) | {:.3} | {:.3} ({}/{}) | {:.3} | {} of {} | {} | {} |\n",
            r.scored.n,
            r.scored.positives,
            r.scored.precision(),
            r.scored.recall(),
            r.scored.true_pins,
            r.scored.positives,
            r.scored.kept_recall(),
            r.scored.false_pins(),
            r.scored.n - r.scored.positives,
            r.scored.tiered_others(),
            r.all.n,
        ));
    }
    out
}

fn by_category(reports: &[(&str, SplitReport)], out: &mut String) {
    out.push_str("\n| category | train: pinned / n | held-out: pinned / n | held-out doubtful |\n|---|---|---|---|\n");
    let mut categories: Vec<&String> = reports
        .iter()
        .flat_map(|(_, r)| r.by_category.keys())
        .collect();
    categories.sort();
    categories.dedup();
    for c in categories {
        let cell = |i: usize| {
            reports
                .get(i)
                .and_then(|(_, r)| r.by_category.get(c))
                .map_or("–".to_owned(), |t| format!("{}/{}", t.pinned, t.n))
        };
        let doubtful = reports
            .get(1)
            .and_then(|(_, r)| r.by_category.get(c))
            .map_or(0, |t| t.doubtful);
        out.push_str(&format!(
            "| {c} | {} | {} | {doubtful} |\n",
            cell(0),
            cell(1)
        ));
    }
}
