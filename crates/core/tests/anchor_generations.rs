//! Invariant 8 over a long session: anchors survive generations of
//! summaries, and when some must be dropped the markers say exactly how
//! many.
//!
//! Fifty tool results, each naming its own file path and its own error
//! line, are admitted to one session, which compacts (at admission, in the
//! background above the soft watermark, and on the caller's request) until
//! summaries of summaries reach the session's last generation and are
//! merged there. With a generous anchor budget every anchor is still in
//! the live context at the end; with a tight one some are gone, and the
//! committed markers' `anchors_dropped` add up to exactly the number of
//! anchors missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashSet;

use ctxbroker_core::config::SessionConfig;
use ctxbroker_core::marker::{CompactionTrigger, Outcome};
use ctxbroker_core::predicate::derive;
use ctxbroker_core::session::{CallerEdits, Change, Incoming, Rejection, Session};
use ctxbroker_core::span::{ClassSource, Classification, Role, Span, SpanClass};
use ctxbroker_core::summary::{extract_anchors, summarize_bounded};
use support::tokens;

/// Distinct tool results.
const TOOL_RESULTS: usize = 50;
/// The session's last summary generation.
const MAX_GENERATIONS: u32 = 5;

fn path(i: usize) -> String {
    format!("src/mod_{i:02}/handler_{i:02}.rs")
}

fn error_line(i: usize) -> String {
    format!(
        "error[E04{i:02}]: unresolved name `frob_{i:02}` in {}",
        path(i)
    )
}

/// A tool result whose anchors are its own: a path and an error line
/// (with the identifier inside it), among prose that has none.
fn tool_result(i: usize) -> String {
    let mut text = format!(
        "$ cargo build\n   Compiling handler number {i}\n{}\n",
        error_line(i)
    );
    for _ in 0..3 {
        text.push_str(
            "The build stopped before linking. The worker queue was drained and the cache was \
             cleared before the next attempt. Nothing else in the workspace changed during \
             this run.\n",
        );
    }
    text.push_str(&format!("The failing module is {}.", path(i)));
    text
}

/// The model's turn before a build: prose without anchors.
fn plan_note(i: usize) -> String {
    let mut text = format!("Building handler number {i} now.");
    for _ in 0..3 {
        text.push_str(
            " I read the whole log before deciding what to change, and the change stays small \
             so that the next build tells us something new about the failure.",
        );
    }
    text
}

fn narrative(role: Role, text: String) -> Incoming {
    Incoming {
        role,
        tokens: tokens().count(&text),
        text,
        classification: Classification {
            class: SpanClass::Narrative,
            source: ClassSource::Caller,
            rule: String::new(),
        },
        predicate: None,
        relevance_hint: None,
        unclassified: false,
        attributes: None,
    }
}

fn constraint(text: &str) -> Incoming {
    Incoming {
        role: Role::User,
        tokens: tokens().count(text),
        text: text.to_string(),
        classification: Classification {
            class: SpanClass::Constraint,
            source: ClassSource::Caller,
            rule: String::new(),
        },
        predicate: Some(derive(text, None)),
        relevance_hint: None,
        unclassified: false,
        attributes: None,
    }
}

/// The anchors line of a summary (without its `anchors: ` label).
fn anchors_line(summary: &str) -> &str {
    summary
        .lines()
        .find_map(|l| l.strip_prefix("anchors: "))
        .unwrap_or("")
}

/// What a long session did.
#[derive(Debug, Default)]
struct Account {
    /// Every distinct anchor of every admitted span.
    admitted: Vec<String>,
    /// The live context at the end, joined.
    live_text: String,
    /// The sum of the committed markers' `anchors_dropped`.
    dropped: u64,
    /// Committed compactions.
    compactions: u32,
    /// The highest generation any summary reached.
    highest: u32,
    /// Compactions that summarised a summary already at the last
    /// generation.
    merged_at_last: u32,
    /// The triggers of the committed compactions.
    triggers: HashSet<CompactionTrigger>,
}

struct Driver {
    s: Session,
    now: u64,
    anchor_budget: u32,
    out: Account,
}

impl Driver {
    fn commit(&mut self, change: Change) {
        if let Some(marker) = &change.marker {
            assert_eq!(marker.outcome, Outcome::Committed, "{marker:?}");
            if marker.trigger != CompactionTrigger::Unpin {
                self.compaction(&change);
            }
        }
        self.s.apply(&change);
        self.check_live();
    }

    /// Checks one committed compaction's summary and records its account.
    fn compaction(&mut self, change: &Change) {
        let marker = change.marker.as_ref().unwrap();
        let max = self.s.record.config.max_summary_generations;
        self.out.compactions += 1;
        self.out.triggers.insert(marker.trigger);
        self.out.dropped += u64::from(marker.anchors_dropped);
        let evicted: Vec<&Span> = change
            .evict
            .iter()
            .map(|id| self.s.spans.iter().find(|s| s.id == *id).unwrap())
            .collect();
        let highest_evicted = evicted.iter().map(|s| s.generation).max().unwrap_or(0);
        // The history of the session, shown when a test fails.
        eprintln!(
            "{:?}: evicted {} (generations {:?}), summary generation {}, anchors carried {} dropped {}",
            marker.trigger,
            evicted.len(),
            evicted
                .iter()
                .map(|s| s.generation)
                .filter(|&g| g > 0)
                .collect::<Vec<_>>(),
            marker.summary_generation,
            marker.anchors_carried,
            marker.anchors_dropped
        );
        if let Some(summary) = &change.summary {
            assert_eq!(marker.summary_generation, summary.generation);
            assert!(
                summary.generation <= max,
                "a summary of generation {} beyond the last {max}",
                summary.generation
            );
            assert_eq!(
                summary.generation,
                (highest_evicted + 1).min(max),
                "generation is 1 + the highest summarised, capped"
            );
            if highest_evicted == max {
                self.out.merged_at_last += 1;
            }
            self.out.highest = self.out.highest.max(summary.generation);
            // The anchors fit the session's anchor budget.
            if self.anchor_budget > 0 {
                let line = anchors_line(&summary.text);
                let n = tokens().count(line);
                assert!(
                    n <= self.anchor_budget,
                    "the anchors of summary {} take {n} tokens, over the anchor budget {}: {line}",
                    summary.id,
                    self.anchor_budget
                );
            }
            // What the summary claims to carry, it carries.
            let info = summary.summary.as_ref().unwrap();
            for a in &info.anchors {
                assert!(
                    summary.text.contains(a.as_str()),
                    "{a} claimed, not carried"
                );
            }
            assert_eq!(marker.anchors_carried as usize, info.anchors.len());
        }
    }

    fn check_live(&self) {
        let max = self.s.record.config.max_summary_generations;
        for s in &self.s.spans {
            assert!(s.generation <= max);
        }
        let live: u64 = self.s.spans.iter().map(|s| u64::from(s.tokens)).sum();
        assert!(live <= u64::from(self.s.record.config.budget_tokens()));
    }

    fn admit(&mut self, turn: Vec<Incoming>) {
        for i in &turn {
            for a in extract_anchors(&i.text) {
                if !self.out.admitted.contains(&a) {
                    self.out.admitted.push(a);
                }
            }
        }
        self.now += 1_000;
        match self.s.admit(turn, self.now, tokens()) {
            Ok(change) => self.commit(change),
            Err(e) => panic!("turn {} refused: {e:?}", self.s.record.turns + 1),
        }
    }

    /// The server's background pre-compaction above the soft watermark
    /// (which the next admission sometimes overtakes).
    fn background(&mut self) {
        if let Some(change) = self.s.soft_compaction(self.now, tokens()) {
            self.commit(change);
        }
    }

    /// A caller's compaction down to a quarter of the budget.
    fn manual(&mut self) {
        let target = u64::from(self.s.record.config.budget_tokens()) / 4;
        let out = self.s.plan(0, Some(target), self.now, tokens());
        assert!(out.verdict.passed(), "{:?}", out.verdict);
        let edits = CallerEdits {
            actor: "operator".into(),
            ..CallerEdits::default()
        };
        match self.s.commit(out.plan_id, &edits, self.now, tokens()) {
            Ok(change) => self.commit(change),
            Err(Rejection::NothingToCommit) => {}
            Err(e) => panic!("manual compaction refused: {e:?}"),
        }
    }
}

fn long_session(anchor_budget: u32) -> Account {
    let mut config = SessionConfig::with_window(3_000);
    config.max_summary_generations = MAX_GENERATIONS;
    config.summary_max_tokens = 3_000;
    config.anchor_budget_tokens = anchor_budget;
    config.validate().unwrap();
    let now = 1_700_000_000_000;
    let mut d = Driver {
        s: Session::create("anchors", config, now),
        now,
        anchor_budget,
        out: Account::default(),
    };
    d.admit(vec![constraint(
        "Never write to the `prod` namespace; stage only.",
    )]);
    for i in 0..TOOL_RESULTS {
        d.admit(vec![
            narrative(Role::Assistant, plan_note(i)),
            narrative(Role::Tool, tool_result(i)),
        ]);
        if i % 3 != 1 {
            d.background();
        }
        if i % 10 == 9 {
            d.manual();
        }
    }
    d.out.live_text =
        d.s.spans
            .iter()
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join("\n");
    d.out
}

/// The admitted anchors missing from the live context.
fn missing(out: &Account) -> Vec<&String> {
    out.admitted
        .iter()
        .filter(|a| !out.live_text.contains(a.as_str()))
        .collect()
}

/// The test's own precondition: every tool result brings anchors of its
/// own, and none of them is inside another result's, so that "missing"
/// is well defined.
fn distinct_anchors() {
    let per_result: Vec<Vec<String>> = (0..TOOL_RESULTS)
        .map(|i| extract_anchors(&tool_result(i)))
        .collect();
    for (i, anchors) in per_result.iter().enumerate() {
        assert!(anchors.contains(&path(i)), "{anchors:?}");
        assert!(anchors.contains(&error_line(i)), "{anchors:?}");
        for (j, others) in per_result.iter().enumerate().filter(|&(j, _)| j != i) {
            for a in anchors {
                for b in others {
                    assert!(
                        !b.contains(a.as_str()),
                        "{a} (of {i}) is inside {b} (of {j})"
                    );
                }
            }
        }
    }
    let all: HashSet<&String> = per_result.iter().flatten().collect();
    assert!(all.len() >= 2 * TOOL_RESULTS);
}

/// What both sessions must go through: at least four generations, a
/// summary at the last one summarised again, and compactions at
/// admission, in the background and on request.
fn reached_every_path(out: &Account) {
    assert!(
        out.highest >= 4,
        "only {} generations: {out:?}",
        out.highest
    );
    assert!(
        out.merged_at_last >= 1,
        "never summarised at the last generation"
    );
    for t in [
        CompactionTrigger::HardBudget,
        CompactionTrigger::SoftWatermark,
        CompactionTrigger::Manual,
    ] {
        assert!(out.triggers.contains(&t), "no {t:?} compaction: {out:?}");
    }
}

#[test]
fn generous_anchor_budget_carries_every_anchor_across_generations() {
    distinct_anchors();
    let out = long_session(0);
    reached_every_path(&out);
    assert!(out.admitted.len() >= 2 * TOOL_RESULTS);
    let gone = missing(&out);
    assert!(gone.is_empty(), "{} anchors lost: {gone:?}", gone.len());
    assert_eq!(out.dropped, 0);
}

#[test]
fn tight_anchor_budget_drops_anchors_and_markers_count_them() {
    distinct_anchors();
    let budget = 120;
    let out = long_session(budget);
    reached_every_path(&out);
    let gone = missing(&out);
    assert!(!gone.is_empty(), "a tight anchor budget dropped nothing");
    assert_eq!(
        out.dropped,
        gone.len() as u64,
        "the markers count {} anchors dropped, {} are missing",
        out.dropped,
        gone.len()
    );
}

/// A summary is a function of what it summarises: re-deriving a plan to
/// commit it, or after a restart, must write the very same summary. Here
/// many sentences are equally salient (the same words in another order)
/// and only some fit, so the choice rests on how ties are broken.
#[test]
fn equally_salient_sentences_are_chosen_the_same_way_every_time() {
    const WORDS: [&str; 6] = ["drained", "worker", "queue", "retried", "build", "cache"];
    let mut spans = Vec::new();
    for i in 0..24u64 {
        let mut words = WORDS;
        words.rotate_left((i % 6) as usize);
        if i % 2 == 1 {
            words.reverse();
        }
        // Other sentences give the words different weights.
        let weights = WORDS[..=(i % 6) as usize].join(" then ");
        let text = format!("{}. Later {weights} again.", words.join(" "));
        let span = Span {
            id: i + 1,
            position: i + 1,
            role: Role::Tool,
            classification: Classification {
                class: SpanClass::Narrative,
                source: ClassSource::Caller,
                rule: String::new(),
            },
            tokens: tokens().count(&text),
            text,
            generation: 0,
            turn: i + 1,
            predicate: None,
            summary: None,
            relevance_hint: None,
            admitted_at_ms: 0,
            original: None,
            attributes: None,
        };
        spans.push(span);
    }
    let refs: Vec<&Span> = spans.iter().collect();
    let first = summarize_bounded(&refs, 400, 120, MAX_GENERATIONS, tokens());
    assert!(first.text.lines().count() > 2, "{}", first.text);
    for _ in 0..30 {
        let again = summarize_bounded(&refs, 400, 120, MAX_GENERATIONS, tokens());
        assert_eq!(again, first);
    }
}
