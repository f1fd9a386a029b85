//! A session's configuration and the budget arithmetic derived from it.

use crate::classify::{
    ClassifierTuning, MAX_PIN_PHRASE_BYTES, MAX_PIN_PHRASES, MAX_PROTECTED_FRACTION,
};
use crate::relevance::RelevanceWeights;

/// When a session compacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TriggerPolicy {
    /// At admission, whenever live + incoming would exceed the budget.
    TokenBudget,
    /// Token budget plus a staleness guard that is suspended while idle.
    Hybrid,
    /// A cadence, only for a declared workload under which it is sound.
    TimeBased,
}

/// How a session's tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenizerKind {
    /// OpenAI o200k_base.
    O200kBase,
    /// OpenAI cl100k_base.
    Cl100kBase,
    /// The caller supplies counts; broker-written text counts its bytes.
    Client,
}

/// How spans without a class are classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClassifierMode {
    /// The modal phrase rules.
    Rules,
    /// The scored standing-instruction model, with the session's tuning.
    Model,
    /// The caller classifies; an unclassified span forces approval.
    CallerOnly,
}

/// What happens when a caller-written summary misses required anchors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnchorPolicy {
    /// Refuse the commit.
    Require,
    /// Commit and count the dropped anchors in the marker.
    Warn,
}

/// Whether the broker commits compactions on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionMode {
    /// Compact at admission and commit when verification passes.
    Auto,
    /// Refuse admissions that need a compaction, with a ready plan.
    Approval,
}

/// A workload as a caller declares it, to decide whether a cadence is sound.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DeclaredWorkload {
    /// W.
    pub window_tokens: u32,
    /// α.
    pub alpha: f64,
    /// Reserved overhead.
    pub reserved_overhead_tokens: u32,
    /// The proposed cadence in milliseconds.
    pub cadence_ms: u64,
    /// The largest single span the agent may admit.
    pub max_single_injection_tokens: u32,
    /// The most tokens admitted within one interval.
    pub max_interval_accumulation_tokens: u32,
    /// Whether the agent may sit idle longer than one interval.
    pub idle_gaps: bool,
}

/// A session's effective configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionConfig {
    /// W: the model's context window in tokens.
    pub window_tokens: u32,
    /// α: the budget fraction, in (0, 1).
    pub alpha: f64,
    /// The soft watermark as a fraction of the budget, in (0, 1].
    pub soft_watermark: f64,
    /// Tokens needed outside the context; < floor(α·W).
    pub reserved_overhead_tokens: u32,
    /// Narrative below this relevance is evicted first, in [0, 1].
    pub relevance_floor: f64,
    /// When the session compacts.
    pub trigger: TriggerPolicy,
    /// For HYBRID and TIME_BASED: the staleness interval.
    pub staleness_interval_ms: u64,
    /// How tokens are counted.
    pub tokenizer: TokenizerKind,
    /// How unclassified spans are classified.
    pub classifier: ClassifierMode,
    /// The highest summary generation allowed (≥ 1).
    pub max_summary_generations: u32,
    /// What a caller summary missing anchors gets.
    pub anchor_policy: AnchorPolicy,
    /// Whether compactions need approval.
    pub mode: SessionMode,
    /// The most tokens one summary may take; 0 means the default (an
    /// eighth of the budget, at most 4096).
    pub summary_max_tokens: u32,
    /// The declared workload, required with TIME_BASED.
    pub workload: Option<DeclaredWorkload>,
    /// How relevance orders narrative for eviction.
    pub relevance: RelevanceWeights,
    /// The most tokens a summary's anchors may take; 0 means the whole
    /// summary cap. Anchors past it are dropped and counted in the marker.
    pub anchor_budget_tokens: u32,
    /// The session's adjustments to the classifier: its pin threshold and
    /// phrases of its own domain.
    pub classifier_tuning: ClassifierTuning,
    /// How the summaries the broker writes stand in the context.
    pub summary_presentation: SummaryPresentation,
    /// Under [`SummaryPresentation::User`], what a summary's text starts
    /// with; empty means [`defaults::SUMMARY_PREFIX`].
    pub summary_prefix: String,
}

/// How the summaries a compaction writes stand in the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SummaryPresentation {
    /// A system span holding the summary as written.
    #[default]
    System,
    /// A user span whose text starts with the session's summary prefix,
    /// for providers that accept system text only at the start.
    User,
}

/// Defaults for the optional fields of a configuration.
pub mod defaults {
    /// α.
    pub const ALPHA: f64 = 0.85;
    /// The soft watermark fraction of the budget.
    pub const SOFT_WATERMARK: f64 = 0.9;
    /// The relevance floor.
    pub const RELEVANCE_FLOOR: f64 = 0.05;
    /// The highest summary generation.
    pub const MAX_SUMMARY_GENERATIONS: u32 = 3;
    /// The cap on the default summary size.
    pub const SUMMARY_MAX_TOKENS_CAP: u32 = 4096;
    /// What a summary presented as a user span starts with.
    pub const SUMMARY_PREFIX: &str = "Summary of the earlier conversation:";
}

impl SessionConfig {
    /// A configuration for a window of `window_tokens` with every other
    /// field at its default.
    pub fn with_window(window_tokens: u32) -> Self {
        SessionConfig {
            window_tokens,
            alpha: defaults::ALPHA,
            soft_watermark: defaults::SOFT_WATERMARK,
            reserved_overhead_tokens: 0,
            relevance_floor: defaults::RELEVANCE_FLOOR,
            trigger: TriggerPolicy::TokenBudget,
            staleness_interval_ms: 0,
            tokenizer: TokenizerKind::O200kBase,
            classifier: ClassifierMode::Model,
            max_summary_generations: defaults::MAX_SUMMARY_GENERATIONS,
            anchor_policy: AnchorPolicy::Require,
            mode: SessionMode::Auto,
            summary_max_tokens: 0,
            workload: None,
            relevance: RelevanceWeights::default(),
            anchor_budget_tokens: 0,
            classifier_tuning: ClassifierTuning::default(),
            summary_presentation: SummaryPresentation::System,
            summary_prefix: String::new(),
        }
    }

    /// What a summary presented as a user span starts with.
    pub fn effective_summary_prefix(&self) -> &str {
        if self.summary_prefix.is_empty() {
            defaults::SUMMARY_PREFIX
        } else {
            &self.summary_prefix
        }
    }

    /// The role a summary written now takes.
    pub fn summary_role(&self) -> crate::span::Role {
        match self.summary_presentation {
            SummaryPresentation::System => crate::span::Role::System,
            SummaryPresentation::User => crate::span::Role::User,
        }
    }

    /// floor(α·W): the budget before the reserved overhead.
    pub fn alpha_window_tokens(&self) -> u32 {
        // α ∈ (0, 1) and W ≤ u32::MAX, so the product fits.
        (self.alpha * f64::from(self.window_tokens)).floor() as u32
    }

    /// The budget: floor(α·W) − reserved overhead (0 if the overhead is
    /// larger, which validation refuses).
    pub fn budget_tokens(&self) -> u32 {
        self.alpha_window_tokens()
            .saturating_sub(self.reserved_overhead_tokens)
    }

    /// The soft watermark in tokens: floor(soft_watermark · budget).
    pub fn soft_watermark_tokens(&self) -> u32 {
        (self.soft_watermark * f64::from(self.budget_tokens())).floor() as u32
    }

    /// What a background pre-compaction aims at: as far below the soft
    /// watermark as the watermark is below the budget,
    /// `2·soft_watermark_tokens − budget` (0 at most).
    ///
    /// Aiming at the watermark itself would leave the session one small
    /// turn away from crossing it again, so every later turn would be
    /// followed by a compaction and summaries would climb generations at
    /// the pace of the turns. The band below the watermark is the room the
    /// next turns use before another pre-compaction is needed.
    pub fn soft_target_tokens(&self) -> u32 {
        let soft = self.soft_watermark_tokens();
        soft.saturating_sub(self.budget_tokens().saturating_sub(soft))
    }

    /// The most tokens one summary may take.
    pub fn effective_summary_max_tokens(&self) -> u32 {
        if self.summary_max_tokens > 0 {
            self.summary_max_tokens
        } else {
            (self.budget_tokens() / 8).clamp(1, defaults::SUMMARY_MAX_TOKENS_CAP)
        }
    }

    /// The most tokens a summary's anchors may take.
    pub fn effective_anchor_budget_tokens(&self) -> u32 {
        let cap = self.effective_summary_max_tokens();
        if self.anchor_budget_tokens == 0 {
            cap
        } else {
            self.anchor_budget_tokens.min(cap)
        }
    }

    /// Checks every field; returns one violation per bad field, naming the
    /// field (as in the wire contract, under `config.`) and the limit.
    pub fn validate(&self) -> Result<(), Vec<ConfigViolation>> {
        let mut bad = Vec::new();
        let mut push = |field: &'static str, description: String| {
            bad.push(ConfigViolation { field, description })
        };
        if self.window_tokens == 0 {
            push("config.window_tokens", "must be greater than 0".into());
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            push(
                "config.alpha",
                format!("must be in the open interval (0, 1); got {}", self.alpha),
            );
        }
        if !(self.soft_watermark > 0.0 && self.soft_watermark <= 1.0) {
            push(
                "config.soft_watermark",
                format!("must be in (0, 1]; got {}", self.soft_watermark),
            );
        }
        if !(0.0..=1.0).contains(&self.relevance_floor) {
            push(
                "config.relevance_floor",
                format!("must be in [0, 1]; got {}", self.relevance_floor),
            );
        }
        if self.window_tokens > 0
            && self.alpha > 0.0
            && self.alpha < 1.0
            && self.reserved_overhead_tokens >= self.alpha_window_tokens()
        {
            push(
                "config.reserved_overhead_tokens",
                format!(
                    "must be less than floor(alpha * window_tokens) = {}; got {}",
                    self.alpha_window_tokens(),
                    self.reserved_overhead_tokens
                ),
            );
        }
        if self.max_summary_generations == 0 {
            push(
                "config.max_summary_generations",
                "must be at least 1".into(),
            );
        }
        if matches!(
            self.trigger,
            TriggerPolicy::Hybrid | TriggerPolicy::TimeBased
        ) && self.staleness_interval_ms == 0
        {
            push(
                "config.staleness_interval_ms",
                "must be greater than 0 with trigger HYBRID or TIME_BASED".into(),
            );
        }
        let w = &self.relevance;
        for (field, value) in [
            ("config.relevance.recency", w.recency),
            ("config.relevance.similarity", w.similarity),
            ("config.relevance.length", w.length),
            ("config.relevance.hint", w.hint),
        ] {
            if !(value.is_finite() && (0.0..=1.0).contains(&value)) {
                bad.push(ConfigViolation {
                    field,
                    description: format!("must be a number in [0, 1]; got {value}"),
                });
            }
        }
        if w.recency + w.similarity + w.length <= 0.0 {
            bad.push(ConfigViolation {
                field: "config.relevance",
                description: "recency, similarity and length must not all be 0".into(),
            });
        }
        if !(w.recency_half_life_turns.is_finite() && w.recency_half_life_turns > 0.0) {
            bad.push(ConfigViolation {
                field: "config.relevance.recency_half_life_turns",
                description: format!(
                    "must be a positive number; got {}",
                    w.recency_half_life_turns
                ),
            });
        }
        let tuning = &self.classifier_tuning;
        if let Some(t) = tuning.pin_threshold
            && !(t.is_finite() && t > 0.0 && t < 1.0)
        {
            bad.push(ConfigViolation {
                field: "config.classifier_tuning.pin_threshold",
                description: format!("must be in the open interval (0, 1); got {t}"),
            });
        }
        if tuning.pin_phrases.len() > MAX_PIN_PHRASES {
            bad.push(ConfigViolation {
                field: "config.classifier_tuning.pin_phrases",
                description: format!(
                    "must hold at most {MAX_PIN_PHRASES} phrases; got {}",
                    tuning.pin_phrases.len()
                ),
            });
        }
        if let Some(phrase) = tuning.pin_phrases.iter().find(|p| {
            p.trim().is_empty() || p.len() > MAX_PIN_PHRASE_BYTES || p.chars().any(char::is_control)
        }) {
            bad.push(ConfigViolation {
                field: "config.classifier_tuning.pin_phrases",
                description: format!(
                    "each phrase must be 1 to {MAX_PIN_PHRASE_BYTES} bytes of text without control characters; got {} bytes",
                    phrase.len()
                ),
            });
        }
        if let Some(f) = tuning.protected_fraction
            && !(f.is_finite() && (0.0..=MAX_PROTECTED_FRACTION).contains(&f))
        {
            bad.push(ConfigViolation {
                field: "config.classifier_tuning.protected_fraction",
                description: format!("must be in [0, {MAX_PROTECTED_FRACTION}]; got {f}"),
            });
        }
        if bad.is_empty() { Ok(()) } else { Err(bad) }
    }
}

/// One bad field of a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigViolation {
    /// The field's path in the wire contract, e.g. `config.alpha`.
    pub field: &'static str,
    /// What is wrong, with the limit.
    pub description: String,
}
