//! Telling standing instructions from narrative in spans nobody labelled.
//!
//! A span keeps the class its caller gives. For the rest, tool and
//! assistant output is narrative (it describes the world; it does not bind
//! the agent). User and system turns are classified, per session, by one
//! of two deciders:
//!
//! - **the scored model** ([`classify_with`], mode `MODEL`, the default):
//!   a small linear model over linguistic features ([`features`]), learned
//!   from the training split of the labelled spans in `data/classify`
//!   ([`train`]) and measured on their held-out split;
//! - **the modal phrase rules** ([`classify`], mode `RULES`): a constraint
//!   when a prohibition, restriction, requirement or correction phrase
//!   fires ([`modal`]).
//!
//! The model's verdict has three values. At or above the pin threshold a
//! span is a standing instruction and pinned. Between the doubt and pin
//! thresholds it is doubtful: it goes to the session's
//! standing-instructions tier ([`SpanClass::Protected`]), kept verbatim and
//! evicted only after all narrative, within a bounded share of the window
//! ([`ClassifierTuning::protected_fraction`]). Below, it is narrative. The
//! pin threshold keeps 97 % of the training split's instructions pinned
//! when each is scored by a model fitted without it; the doubt threshold
//! keeps 99.5 % pinned or doubtful, but never admits a sentence with no
//! evidence at all.
//!
//! A session's own phrases ([`ClassifierTuning`]) pin under either.
//!
//! The model: a segment (line or
//! sentence) scores high when it reads as an instruction that reaches
//! beyond the current step — a modal or a ban, an imperative with a scope,
//! a label and a format, a condition and an action, a correction that
//! holds, a habit ("whenever you change …") — and low when it reads as a
//! question, a time-limited hold, a report of someone else's words, one
//! piece of work ("fix the typo"), a statement or guesswork, or pasted
//! output (lines shaped like logs, traces or a compiler's). A span's score
//! is its best segment's, so a rule buried in a long message counts.
//!
//! Each decision is explainable: the classification's `rule` says the
//! verdict, the score and the features that carried it
//! (`standing 0.97: +noun_ban +scope -length`). It is deterministic and
//! linear in the text. Sessions can lower or raise the pin threshold and
//! add phrases of their own ([`ClassifierTuning`]).
//!
//! Transient holds ("don't change anything yet", "wait until I've looked")
//! and step-local instructions ("make sure this test passes") are not
//! pinned: the time limit, the pointer at the current step or the verb of
//! one task is part of what the model reads, and such a span stays
//! narrative (or, when in doubt, in the bounded tier), evicted like the
//! rest of the step it belongs to. Nothing pinned is ever unpinned by the
//! broker on its own, so there is no expiry to report: a hold that was
//! pinned by mistake is unpinned by the caller (Unpin), which the marker
//! records.
//!
//! Two kinds of sentence the model reads as narrative are kept in the tier
//! all the same, never pinned, and marked in the explanation: a hold
//! (`+hold`, "no deploys until the on-call is back"), which binds until it
//! is lifted, and a practice of the writer's team stated as a plain fact
//! (`+practice`, "we pin base images by digest", "in this repo we use
//! pnpm"; see [`features::Floor`]), which binds as long as the
//! work goes on and carries no modal word for the model to find.
//!
//! The modal phrase rules ([`modal`]) still name a constraint's modality
//! for its predicate and check that a compressed form keeps it.

pub mod features;
mod lexicon;
mod modal;
pub mod model;
pub mod train;
mod weights;
mod word;

pub(crate) use modal::{CodeCursor, analyse, analyse_in, code_ranges, is_word_char};
pub use modal::{modality_name, modality_of};

use std::fmt::Write as _;

use crate::span::{ClassSource, Classification, Role, SpanClass};

/// The most phrases a session may add.
pub const MAX_PIN_PHRASES: usize = 32;
/// The longest phrase a session may add, in bytes.
pub const MAX_PIN_PHRASE_BYTES: usize = 128;
/// Room for an explanation: a verdict, a score and six features' names.
const EXPLANATION_CAPACITY: usize = 128;
/// The share of the window the standing-instructions tier may take unless
/// the session says otherwise.
pub const DEFAULT_PROTECTED_FRACTION: f64 = 0.05;
/// The largest share of the window a session may give that tier.
pub const MAX_PROTECTED_FRACTION: f64 = 0.5;

/// How one session adjusts the classifier.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClassifierTuning {
    /// The score at or above which a span is pinned, in (0, 1); `None`
    /// keeps the model's own threshold.
    pub pin_threshold: Option<f64>,
    /// Phrases that mark a standing instruction in this session's domain
    /// (matched case-insensitively on whole words in user and system
    /// turns), for wordings the model does not know.
    pub pin_phrases: Vec<String>,
    /// The share of the window, in [0, 0.5], that doubtful instructions
    /// may take in the standing-instructions tier; `None` keeps
    /// [`DEFAULT_PROTECTED_FRACTION`], 0 turns the tier off (doubtful spans
    /// are then narrative).
    pub protected_fraction: Option<f64>,
}

impl ClassifierTuning {
    /// The share of the window the standing-instructions tier may take.
    pub fn effective_protected_fraction(&self) -> f64 {
        self.protected_fraction
            .unwrap_or(DEFAULT_PROTECTED_FRACTION)
    }
}

/// The verdict of the model on one user or system span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A standing instruction: pinned.
    Standing,
    /// Looks like an instruction but scored below the pin threshold.
    Doubtful,
    /// Narrative.
    Narrative,
}

impl Verdict {
    fn name(self) -> &'static str {
        match self {
            Verdict::Standing => "standing",
            Verdict::Doubtful => "doubtful",
            Verdict::Narrative => "narrative",
        }
    }
}

/// A scored decision and its explanation.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Standing, doubtful or narrative.
    pub verdict: Verdict,
    /// The model's score in [0, 1] (1 when a session phrase decided).
    pub score: f64,
    /// The deciding segment's byte range in the text.
    pub segment: Option<(usize, usize)>,
    /// The explanation, as the classification's `rule`.
    pub explanation: String,
}

/// Decides the class of a span whose caller gave none by the modal phrase
/// rules (the `RULES` classifier mode): a user or system span
/// is a constraint when a modal phrase fires ("prohibition:never");
/// tool and assistant output is narrative.
pub fn classify(role: Role, text: &str) -> Classification {
    match role {
        Role::Tool => by_rules(SpanClass::Narrative, "role:tool".to_owned()),
        Role::Assistant => by_rules(SpanClass::Narrative, "role:assistant".to_owned()),
        Role::User | Role::System => match analyse(text).primary() {
            Some(hit) => by_rules(
                SpanClass::Constraint,
                format!("{}:{}", modality_name(hit.modality), hit.rule),
            ),
            None => by_rules(SpanClass::Narrative, "default:narrative".to_owned()),
        },
    }
}

/// Decides the class of a span whose caller gave none by the scored model
/// (the `MODEL` classifier mode, the default), under a session's tuning.
pub fn classify_with(role: Role, text: &str, tuning: &ClassifierTuning) -> Classification {
    match role {
        Role::Tool | Role::Assistant => classify(role, text),
        Role::User | Role::System => classification(&assess(role, text, tuning), tuning),
    }
}

/// A constraint when one of the session's phrases occurs in `text` (on
/// whole words, ignoring case), whatever the classifier mode.
pub fn by_phrase(text: &str, tuning: &ClassifierTuning) -> Option<Classification> {
    matching_phrase(text, tuning).map(|p| by_rules(SpanClass::Constraint, format!("phrase:{p:?}")))
}

/// The first of the session's phrases that occurs in `text`.
fn matching_phrase<'t>(text: &str, tuning: &'t ClassifierTuning) -> Option<&'t String> {
    tuning.pin_phrases.iter().find(|p| contains_phrase(text, p))
}

/// Scores a user or system span under a session's tuning and explains the
/// score.
pub fn assess(role: Role, text: &str, tuning: &ClassifierTuning) -> Assessment {
    let model = model::builtin();
    let scored = model.score(text, role == Role::System);
    let phrase = matching_phrase(text, tuning);
    let pin = tuning.pin_threshold.unwrap_or(model.pin_threshold);
    let doubt = model.doubt_threshold.min(pin);
    // `kept_for`: doubtful only because of a floor. A hold binds until it
    // is lifted, and a team's practice as long as the work goes on: kept
    // in the tier, not pinned.
    let (verdict, score, kept_for) = match phrase {
        Some(_) => (Verdict::Standing, 1.0, None),
        None if scored.score >= pin => (Verdict::Standing, scored.score, None),
        None if scored.score >= doubt => (Verdict::Doubtful, scored.score, None),
        None => match scored.floor {
            Some(floor) => (Verdict::Doubtful, scored.score, Some(floor)),
            None => (Verdict::Narrative, scored.score, None),
        },
    };
    let mut explanation = String::with_capacity(EXPLANATION_CAPACITY);
    // Writing to a String cannot fail.
    let _ = write!(explanation, "{} {:.2}:", verdict.name(), score);
    if let Some(floor) = kept_for {
        explanation.push(' ');
        explanation.push_str(floor.mark());
    }
    if let Some(p) = phrase {
        let _ = write!(explanation, " +phrase:{p:?}");
    }
    for (f, _) in &scored.raised_by {
        explanation.push_str(" +");
        explanation.push_str(f.name());
    }
    for (f, _) in &scored.lowered_by {
        explanation.push_str(" -");
        explanation.push_str(f.name());
    }
    if explanation.ends_with(':') {
        // Prose with no feature at all is not the same as no prose.
        explanation.push_str(match scored.segment {
            Some(_) => " no evidence",
            None => " no prose",
        });
    }
    // It is kept with the span as its rule: no spare room.
    explanation.shrink_to_fit();
    Assessment {
        verdict,
        score,
        segment: scored.segment,
        explanation,
    }
}

/// The classification of an assessed user or system span: a doubtful one
/// goes to the standing-instructions tier unless the session turned the
/// tier off.
pub fn classification(assessment: &Assessment, tuning: &ClassifierTuning) -> Classification {
    let class = match assessment.verdict {
        Verdict::Standing => SpanClass::Constraint,
        Verdict::Doubtful if tuning.effective_protected_fraction() > 0.0 => SpanClass::Protected,
        Verdict::Doubtful | Verdict::Narrative => SpanClass::Narrative,
    };
    by_rules(class, assessment.explanation.clone())
}

/// Whether `text` contains `phrase` on whole-word boundaries, ignoring
/// case.
fn contains_phrase(text: &str, phrase: &str) -> bool {
    let phrase = phrase.trim().to_lowercase();
    if phrase.is_empty() {
        return false;
    }
    let lowered = text.to_lowercase();
    let mut from = 0;
    while let Some(found) = lowered[from..].find(&phrase) {
        let start = from + found;
        let end = start + phrase.len();
        let before = lowered[..start].chars().next_back();
        let after = lowered[end..].chars().next();
        let edge = |c: Option<char>, inner: Option<char>| {
            c.is_none_or(|c| !is_word_char(c)) || inner.is_some_and(|i| !is_word_char(i))
        };
        if edge(before, phrase.chars().next()) && edge(after, phrase.chars().next_back()) {
            return true;
        }
        from = start + lowered[start..].chars().next().map_or(1, char::len_utf8);
    }
    false
}

fn by_rules(class: SpanClass, rule: String) -> Classification {
    Classification {
        class,
        source: ClassSource::Rules,
        rule,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_and_assistant_output_is_narrative_by_role() {
        let text = "ERROR: you must never do this";
        assert_eq!(classify(Role::Tool, text).rule, "role:tool");
        assert_eq!(classify(Role::Assistant, text).rule, "role:assistant");
        assert_eq!(classify(Role::Tool, text).class, SpanClass::Narrative);
    }

    #[test]
    fn explanations_name_the_verdict_score_and_features() {
        let c = classify_with(
            Role::User,
            "Never write to the `prod` namespace; stage only.",
            &ClassifierTuning::default(),
        );
        assert_eq!(c.class, SpanClass::Constraint, "{}", c.rule);
        assert!(c.rule.starts_with("standing "), "{}", c.rule);
        assert!(c.rule.contains("+neg_modal"), "{}", c.rule);
        assert_eq!(c.source, ClassSource::Rules);
    }

    #[test]
    fn the_rules_name_the_modal_phrase() {
        let c = classify(
            Role::User,
            "Never write to the `prod` namespace; stage only.",
        );
        assert_eq!(c.class, SpanClass::Constraint);
        assert_eq!(c.rule, "prohibition:never");
        assert_eq!(
            classify(Role::User, "Refactor the parser.").rule,
            "default:narrative"
        );
        let tuning = ClassifierTuning {
            pin_threshold: None,
            pin_phrases: vec!["house rule".into()],
            protected_fraction: None,
        };
        let c = by_phrase("House rule: tickets get a PR link.", &tuning);
        assert_eq!(c.map(|c| c.rule).as_deref(), Some("phrase:\"house rule\""));
        assert_eq!(by_phrase("no rule here", &tuning), None);
    }

    #[test]
    fn session_phrases_pin_on_whole_words_only() {
        let tuning = ClassifierTuning {
            pin_threshold: None,
            pin_phrases: vec!["house rule".into()],
            protected_fraction: None,
        };
        let c = classify_with(Role::User, "House rule: tickets get a PR link.", &tuning);
        assert_eq!(c.class, SpanClass::Constraint);
        assert!(c.rule.contains("+phrase:\"house rule\""), "{}", c.rule);
        assert!(!contains_phrase(
            "the warehouse rules are odd",
            "house rule"
        ));
        assert!(contains_phrase("A HOUSE RULE.", "house rule"));
        assert!(!contains_phrase("anything", ""));
    }

    #[test]
    fn the_threshold_is_adjustable() {
        let text = "Why does the build fail?";
        let low = ClassifierTuning {
            pin_threshold: Some(0.000_001),
            pin_phrases: Vec::new(),
            protected_fraction: None,
        };
        assert_eq!(
            classify_with(Role::User, text, &low).class,
            SpanClass::Constraint
        );
        // Above the threshold nothing reaches, a clear instruction is
        // doubtful: in the standing-instructions tier, or narrative when
        // the session gives the tier no room.
        let mut high = ClassifierTuning {
            pin_threshold: Some(0.999_999),
            pin_phrases: Vec::new(),
            protected_fraction: None,
        };
        let doubted = classify_with(Role::User, "Never push to main.", &high);
        assert_eq!(doubted.class, SpanClass::Protected);
        assert!(doubted.rule.starts_with("doubtful "), "{}", doubted.rule);
        high.protected_fraction = Some(0.0);
        assert_eq!(
            classify_with(Role::User, "Never push to main.", &high).class,
            SpanClass::Narrative
        );
        // Evidence-free text is narrative, not doubtful.
        assert_eq!(
            classify_with(Role::User, "ok", &ClassifierTuning::default()).class,
            SpanClass::Narrative
        );
    }

    #[test]
    fn empty_text_is_narrative() {
        for text in ["", "   \n\t ", "```\nnever\n```"] {
            let c = classify_with(Role::User, text, &ClassifierTuning::default());
            assert_eq!(c.class, SpanClass::Narrative, "{text:?}: {}", c.rule);
            assert_eq!(classify(Role::User, text).class, SpanClass::Narrative);
        }
    }

    #[test]
    fn an_explanation_without_features_says_whether_there_was_prose() {
        let tuning = ClassifierTuning::default();
        // Prose on which no feature fires scores the model's bias alone.
        let bare = model::sigmoid(model::builtin().bias);
        for (text, said) in [
            (
                "sidebar colours look blue to me",
                format!("narrative {bare:.2}: no evidence"),
            ),
            (
                "```\nfn main() {}\n```",
                "narrative 0.00: no prose".to_owned(),
            ),
        ] {
            let a = assess(Role::User, text, &tuning);
            assert_eq!(a.explanation, said, "{text:?}");
        }
    }

    #[test]
    fn holds_practices_and_norms_are_kept_in_the_tier_and_not_pinned() {
        let tuning = ClassifierTuning::default();
        let off = ClassifierTuning {
            protected_fraction: Some(0.0),
            ..ClassifierTuning::default()
        };
        let doubt = model::builtin().doubt_threshold;
        // (text, why it is kept): each scores as narrative; a hold, a
        // practice or a norm is kept doubtful, in the tier, and narrative
        // again with the tier off. None of them: asked, reported, telling
        // what was seen, walking through code, telling what happened or
        // what goes wrong, or naming one thing rather than a kind.
        for (text, kept_for) in [
            (
                "no schema migrations until the quarter closes, finance is reconciling",
                Some("+hold"),
            ),
            (
                "the staging cluster is reserved for the load test till thursday so don't deploy there",
                Some("+hold"),
            ),
            (
                "keep the feature flag off until marketing announces it",
                Some("+hold"),
            ),
            ("should we stop deploying until the audit is over?", None),
            ("the release manager said no merges until friday", None),
            ("nothing in the queue yet", None),
            ("we bundle the frontend with esbuild", Some("+practice")),
            (
                "in the payments service we usually round amounts half-up",
                Some("+practice"),
            ),
            (
                "the team tags releases from the main branch",
                Some("+practice"),
            ),
            ("heads up, we vendor the protobuf files", Some("+practice")),
            ("here we loop over the rows and call save", None),
            ("we deploy and then the pods restart twice", None),
            ("we keep getting timeouts from the search cluster", None),
            ("we run out of disk on the runners", None),
            ("do we pin the base image?", None),
            ("we pinned the base image last week", None),
            (
                "build artifacts live in the artifacts bucket",
                Some("+norm"),
            ),
            ("api keys come from the secrets manager", Some("+norm")),
            ("vendored crates need a license file", Some("+norm")),
            (
                "schema changes get a migration and a rollback plan",
                Some("+norm"),
            ),
            (
                "invoice numbers are generated by the billing service",
                Some("+norm"),
            ),
            ("fyi pdfs go to the archive bucket", Some("+norm")),
            ("uploads get stuck at 99 percent", None),
            ("merge requests sit for hours in the queue", None),
            ("checkout pages get a 503 under load", None),
            ("invoice numbers were generated by hand", None),
            ("yeah go for it", None),
            ("the dashboards live in grafana", None),
            ("exports go to s3 and then the job deletes them", None),
        ] {
            let a = assess(Role::User, text, &tuning);
            let why = format!("{text:?}: {}", a.explanation);
            assert!(a.score < doubt, "{why}");
            let marks = a.explanation.split_whitespace().collect::<Vec<_>>();
            for mark in ["+hold", "+practice", "+norm"] {
                assert_eq!(marks.contains(&mark), kept_for == Some(mark), "{why}");
            }
            let (verdict, class) = match kept_for {
                Some(_) => (Verdict::Doubtful, SpanClass::Protected),
                None => (Verdict::Narrative, SpanClass::Narrative),
            };
            assert_eq!(a.verdict, verdict, "{why}");
            assert_eq!(classification(&a, &tuning).class, class, "{why}");
            assert_eq!(
                classification(&a, &off).class,
                SpanClass::Narrative,
                "{why}"
            );
        }
    }

    /// Assesses a user's `text` with the default tuning: pinned or not as
    /// `pinned` says, its explanation carrying each of `with` and none of
    /// `without`.
    fn expect(text: &str, pinned: bool, with: &[&str], without: &[&str]) {
        let a = assess(Role::User, text, &ClassifierTuning::default());
        let why = format!("{text:?}: {}", a.explanation);
        assert_eq!(a.verdict == Verdict::Standing, pinned, "{why}");
        let marks = a.explanation.split_whitespace().collect::<Vec<_>>();
        assert!(with.iter().all(|m| marks.contains(m)), "{why}");
        assert!(!without.iter().any(|m| marks.contains(m)), "{why}");
    }

    #[test]
    fn a_rule_with_its_source_after_it_and_a_choice_with_an_exception_are_pinned() {
        // (text, the mark that pins it): a directive, then whom it comes
        // from; a choice left, then limited.
        for (text, mark) in [
            (
                "never merge your own pull requests, the security lead told us that",
                "+justified",
            ),
            (
                "don't upgrade the ORM, the platform team asked us not to",
                "+justified",
            ),
            (
                "no secrets in environment files, our auditor insisted",
                "+justified",
            ),
            (
                "feel free to rewrite the queries, just not the stored procedures",
                "+restrict",
            ),
            (
                "tidy up whatever you like except the vendored code",
                "+restrict",
            ),
            (
                "you can change the section order, but the headings stay",
                "+restrict",
            ),
        ] {
            expect(text, true, &[mark], &["-report"]);
        }
        // Someone else's rule reported, what can be seen, and a choice
        // left with nothing taken back.
        for text in [
            "the platform team said we should never upgrade the ORM",
            "my lead mentioned no secrets in env files, not sure it's still true",
            "you can see the error in the console but not in the logs",
            "feel free to ask questions",
            "go ahead and merge it",
            "the app builds fine with node 18 but not with node 20",
        ] {
            expect(text, false, &[], &["+justified"]);
        }
    }

    #[test]
    fn should_that_expects_demands_nothing() {
        for text in [
            "that should be fine once the cache clears",
            "the next build should be quicker",
            "it should only take a second",
        ] {
            expect(text, false, &[], &["+req_modal"]);
        }
        // "Should" that demands, and an expectation beside a demand.
        for text in [
            "handlers should stay small and pure",
            "the API should reject unknown fields",
            "the build should be faster, and it must stay under ten minutes",
        ] {
            expect(text, true, &["+req_modal"], &[]);
        }
    }

    #[test]
    fn demands_and_bans_by_idiom_are_pinned() {
        // The frame tells nothing: no statement.
        expect(
            "it's important that the API stays stateless",
            true,
            &["+req_modal"],
            &["-statement"],
        );
        for text in [
            "the audit log is not to be truncated",
            "shipping without tests is a hard no",
            "a rewrite in rust is out of the question",
            "dropping support for postgres 12 is not an option",
        ] {
            expect(text, true, &["+neg_modal"], &[]);
        }
        for text in [
            "the important thing is that the API works",
            "is a rewrite out of the question?",
        ] {
            expect(text, false, &[], &[]);
        }
    }

    #[test]
    fn prohibitions_without_a_subject_in_french_and_italian_are_pinned() {
        for text in [
            "ne pousse jamais sur main",
            "n'utilise pas de variables globales",
            "non usare variabili globali",
            "gebruik nooit globale variabelen",
        ] {
            expect(text, true, &["+foreign_directive"], &[]);
        }
        // A statement opens with its subject, or "non" before a verb that
        // tells.
        for text in ["ça ne compile pas", "non compila più", "il build non parte"] {
            expect(text, false, &[], &[]);
        }
    }
}
