//! Trigger soundness: when a compaction cadence can be trusted.
//!
//! A clock does not know how much was admitted between two ticks. A cadence
//! protects the window only when nothing that can arrive within one interval
//! — the accumulation, and the largest single injection — overflows the
//! headroom the budget leaves, `floor((1 − α)·W) − overhead`; and it only
//! stays harmless when the agent is never idle for a whole interval
//! (otherwise the timer keeps summarising summaries). Anything else gets
//! the token-budget trigger.

use crate::config::{ConfigViolation, DeclaredWorkload, SessionConfig, SessionMode, TriggerPolicy};
use crate::session::SessionRecord;

/// The verdict on a declared workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerAssessment {
    /// `TimeBased` when the cadence is sound, otherwise `TokenBudget`.
    pub recommended: TriggerPolicy,
    /// Whether every condition for a cadence holds.
    pub time_based_sound: bool,
    /// `floor((1 − α)·W) − overhead`, saturating at 0.
    pub headroom_tokens: u32,
    /// One line per condition, with the numbers, saying whether it holds.
    pub reasons: Vec<String>,
}

/// The headroom of a workload: `floor((1 − α)·W) − overhead`, saturating.
///
/// A tiny tolerance absorbs binary rounding of α (so that α = 0.85 and
/// W = 200,000 give exactly 30,000, not 29,999); an α outside (0, 1) leaves
/// no headroom to rely on.
pub fn headroom_tokens(workload: &DeclaredWorkload) -> u32 {
    let alpha = workload.alpha;
    if !(alpha > 0.0 && alpha < 1.0) {
        return 0;
    }
    let w = f64::from(workload.window_tokens);
    let free = ((1.0 - alpha) * w + 1e-6).floor().clamp(0.0, w);
    // free ≤ W ≤ u32::MAX, so the conversion is exact.
    (free as u32).saturating_sub(workload.reserved_overhead_tokens)
}

/// Decides whether a compaction cadence is sound for `workload`.
pub fn assess(workload: &DeclaredWorkload) -> TriggerAssessment {
    let headroom = headroom_tokens(workload);
    let mut reasons = Vec::with_capacity(5);
    let alpha_ok = workload.alpha > 0.0 && workload.alpha < 1.0;
    reasons.push(format!(
        "headroom = floor((1 - alpha {}) * window {}) - overhead {} = {headroom} tokens{}",
        workload.alpha,
        workload.window_tokens,
        workload.reserved_overhead_tokens,
        if alpha_ok {
            ""
        } else {
            " (alpha must be in (0, 1))"
        }
    ));
    let cadence_ok = workload.cadence_ms > 0;
    reasons.push(if cadence_ok {
        format!("ok: cadence {} ms > 0", workload.cadence_ms)
    } else {
        "unsound: cadence 0 ms; a cadence must be positive".to_string()
    });
    let accumulation = workload.max_interval_accumulation_tokens;
    let accumulation_ok = accumulation <= headroom;
    reasons.push(if accumulation_ok {
        format!("ok: at most {accumulation} tokens per interval <= headroom {headroom}")
    } else {
        format!(
            "unsound: up to {accumulation} tokens per interval > headroom {headroom}; the window overflows between two ticks"
        )
    });
    let single = workload.max_single_injection_tokens;
    let single_ok = single <= headroom;
    reasons.push(if single_ok {
        format!("ok: largest single injection {single} tokens <= headroom {headroom}")
    } else {
        format!(
            "unsound: a single injection of up to {single} tokens > headroom {headroom}; one span overflows the window before the next tick"
        )
    });
    let idle_ok = !workload.idle_gaps;
    reasons.push(if idle_ok {
        "ok: no idle gaps longer than one interval".to_string()
    } else {
        "unsound: idle gaps; a timer would keep summarising summaries while nothing is admitted"
            .to_string()
    });
    let sound = alpha_ok && cadence_ok && accumulation_ok && single_ok && idle_ok;
    TriggerAssessment {
        recommended: if sound {
            TriggerPolicy::TimeBased
        } else {
            TriggerPolicy::TokenBudget
        },
        time_based_sound: sound,
        headroom_tokens: headroom,
        reasons,
    }
}

/// A cadence is accepted only for a declared workload under which it is
/// sound. The workload's window, alpha and overhead are the session's own:
/// given as 0 they are filled in, given otherwise they must match.
pub fn time_based(c: &mut SessionConfig) -> Result<(), ConfigViolation> {
    let bad = |field, description: String| Err(ConfigViolation { field, description });
    let Some(workload) = c.workload.as_mut() else {
        return bad(
            "config.workload",
            "is required with trigger TIME_BASED: declare the workload so its cadence can be checked".into(),
        );
    };
    if workload.window_tokens == 0 {
        workload.window_tokens = c.window_tokens;
    }
    if workload.alpha == 0.0 {
        workload.alpha = c.alpha;
    }
    if workload.reserved_overhead_tokens == 0 {
        workload.reserved_overhead_tokens = c.reserved_overhead_tokens;
    }
    let mismatch = workload.window_tokens != c.window_tokens
        || workload.alpha != c.alpha
        || workload.reserved_overhead_tokens != c.reserved_overhead_tokens;
    if mismatch {
        return bad(
            "config.workload",
            "window_tokens, alpha and reserved_overhead_tokens must be 0 or equal to the session's"
                .into(),
        );
    }
    let assessment = assess(workload);
    if !assessment.time_based_sound {
        return bad(
            "config.trigger",
            format!(
                "TIME_BASED is unsound for the declared workload (use TOKEN_BUDGET or HYBRID): {}",
                assessment.reasons.join("; ")
            ),
        );
    }
    Ok(())
}

/// Whether a configuration has a staleness guard: HYBRID or TIME_BASED
/// with a positive interval.
pub fn has_staleness_guard(config: &SessionConfig) -> bool {
    matches!(
        config.trigger,
        TriggerPolicy::Hybrid | TriggerPolicy::TimeBased
    ) && config.staleness_interval_ms > 0
}

/// Whether automatic compaction may run now: the session is in AUTO mode,
/// no unclassified span has suspended it, and it admitted something since
/// its last compaction (an idle session is never compacted).
pub fn compacts_on_its_own(record: &SessionRecord) -> bool {
    record.config.mode == SessionMode::Auto
        && !record.approval_required
        && record.turns > record.last_compaction_turn
}

/// Whether the staleness guard is due: the configuration has one, the
/// session compacts on its own, and one staleness interval has passed
/// since its last compaction (or its creation). Read from the record
/// alone, so a session need not be loaded to know.
pub fn staleness_due(record: &SessionRecord, now_ms: u64) -> bool {
    has_staleness_guard(&record.config)
        && compacts_on_its_own(record)
        && now_ms.saturating_sub(record.last_compaction_ms.max(record.created_at_ms))
            >= record.config.staleness_interval_ms
}

/// Whether the background pre-compaction has work: the session compacts
/// on its own and stands above its soft watermark.
pub fn soft_due(record: &SessionRecord) -> bool {
    compacts_on_its_own(record)
        && record.live_tokens > u64::from(record.config.soft_watermark_tokens())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> DeclaredWorkload {
        DeclaredWorkload {
            window_tokens: 200_000,
            alpha: 0.85,
            reserved_overhead_tokens: 0,
            cadence_ms: 90_000,
            max_single_injection_tokens: 120_000,
            max_interval_accumulation_tokens: 120_000,
            idle_gaps: true,
        }
    }

    #[test]
    fn the_seed_workload_needs_the_token_budget() {
        let a = assess(&seed());
        assert_eq!(a.recommended, TriggerPolicy::TokenBudget);
        assert!(!a.time_based_sound);
        assert_eq!(a.headroom_tokens, 30_000);
        let text = a.reasons.join("\n");
        assert!(text.contains("120000 tokens > headroom 30000"), "{text}");
        assert!(text.contains("idle gaps"), "{text}");
    }

    #[test]
    fn homogeneous_small_turns_may_use_a_cadence() {
        let w = DeclaredWorkload {
            max_single_injection_tokens: 1_000,
            max_interval_accumulation_tokens: 2_000,
            idle_gaps: false,
            ..seed()
        };
        let a = assess(&w);
        assert_eq!(a.recommended, TriggerPolicy::TimeBased);
        assert!(a.time_based_sound);
        assert_eq!(a.headroom_tokens, 30_000);
        assert!(
            a.reasons.iter().skip(1).all(|r| r.starts_with("ok: ")),
            "{:?}",
            a.reasons
        );
    }

    #[test]
    fn each_condition_alone_makes_it_unsound() {
        let good = DeclaredWorkload {
            max_single_injection_tokens: 1_000,
            max_interval_accumulation_tokens: 2_000,
            idle_gaps: false,
            ..seed()
        };
        let cases = [
            DeclaredWorkload {
                cadence_ms: 0,
                ..good
            },
            DeclaredWorkload {
                max_interval_accumulation_tokens: 30_001,
                ..good
            },
            DeclaredWorkload {
                max_single_injection_tokens: 30_001,
                ..good
            },
            DeclaredWorkload {
                idle_gaps: true,
                ..good
            },
            DeclaredWorkload {
                reserved_overhead_tokens: 29_000,
                ..good
            },
            DeclaredWorkload { alpha: 1.0, ..good },
            DeclaredWorkload {
                alpha: f64::NAN,
                ..good
            },
        ];
        for w in cases {
            let a = assess(&w);
            assert!(!a.time_based_sound, "{w:?}");
            assert_eq!(a.recommended, TriggerPolicy::TokenBudget);
            assert_eq!(a.reasons.len(), 5);
        }
        // At the limit it still holds.
        let edge = DeclaredWorkload {
            max_interval_accumulation_tokens: 30_000,
            max_single_injection_tokens: 30_000,
            ..good
        };
        assert!(assess(&edge).time_based_sound);
    }

    #[test]
    fn headroom_arithmetic() {
        let cases = [
            (200_000, 0.85, 0, 30_000),
            (200_000, 0.85, 1_000, 29_000),
            (200_000, 0.85, 40_000, 0),
            (128_000, 0.9, 0, 12_800),
            (1, 0.5, 0, 0),
            (u32::MAX, 0.5, 0, u32::MAX / 2),
            (0, 0.85, 0, 0),
        ];
        for (w, alpha, overhead, want) in cases {
            let wl = DeclaredWorkload {
                window_tokens: w,
                alpha,
                reserved_overhead_tokens: overhead,
                ..DeclaredWorkload::default()
            };
            assert_eq!(headroom_tokens(&wl), want, "{w} {alpha} {overhead}");
        }
    }

    #[test]
    fn background_work_is_due_only_for_a_session_that_compacts_on_its_own() {
        let mut config = SessionConfig::with_window(1000);
        config.trigger = TriggerPolicy::Hybrid;
        config.staleness_interval_ms = 100;
        let mut record = SessionRecord::new("s", config, 1_000);
        record.live_tokens = u64::from(record.config.soft_watermark_tokens()) + 1;
        // Idle since creation: nothing is due, however long it sits.
        assert!(has_staleness_guard(&record.config));
        assert!(!staleness_due(&record, 10_000) && !soft_due(&record));
        record.turns = 1;
        assert!(staleness_due(&record, 1_100) && soft_due(&record));
        assert!(!staleness_due(&record, 1_099));
        record.approval_required = true;
        assert!(!staleness_due(&record, 10_000) && !soft_due(&record));
        record.approval_required = false;
        record.config.trigger = TriggerPolicy::TokenBudget;
        assert!(!has_staleness_guard(&record.config) && !staleness_due(&record, 10_000));
    }
}
