//! The standing-instruction model: a logistic score per segment, the
//! span's score the best of its segments, and the explanation of that
//! score (the features that carried it).
//!
//! The weights are learned offline from the labelled training split by
//! [`super::train`] and committed in `weights.rs`; a test proves that
//! training on the committed data reproduces them.

use super::features::{ALL_FEATURES, FEATURE_COUNT, Feature, Floor, Segment, segments};

/// A trained model: a bias, one weight per feature, and the two
/// thresholds chosen on held-back folds of the training data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Model {
    /// The intercept of the logistic score.
    pub bias: f64,
    /// One weight per feature, in [`ALL_FEATURES`] order.
    pub weights: [f64; FEATURE_COUNT],
    /// At or above this score a span is a standing instruction and pinned.
    pub pin_threshold: f64,
    /// At or above this score (and below the pin threshold) a span is a
    /// doubtful instruction.
    pub doubt_threshold: f64,
}

/// The model committed with the code.
pub fn builtin() -> &'static Model {
    &super::weights::MODEL
}

/// A span's score and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The probability-like score in [0, 1] of the best segment.
    pub score: f64,
    /// The best segment's byte range in the text, if there is any prose.
    pub segment: Option<(usize, usize)>,
    /// The features of the best segment that raised its score the most,
    /// with their contributions, strongest first (at most four).
    pub raised_by: Vec<(Feature, f64)>,
    /// The features of the best segment that lowered its score the most,
    /// strongest first (at most two).
    pub lowered_by: Vec<(Feature, f64)>,
    /// Why some segment is kept in the tier whatever its score, the
    /// first by precedence ([`Floor`]).
    pub floor: Option<Floor>,
}

impl Model {
    /// The logit of one segment.
    pub fn logit(&self, segment: &Segment) -> f64 {
        self.bias
            + self
                .weights
                .iter()
                .zip(segment.features.0.iter())
                .map(|(w, x)| w * x)
                .sum::<f64>()
    }

    /// Scores a user or system text.
    pub fn score(&self, text: &str, system_role: bool) -> Scored {
        let segs = segments(text, system_role);
        let best = segs.iter().map(|s| (self.logit(s), s)).fold(
            None::<(f64, &Segment)>,
            |best, (z, s)| match best {
                Some((bz, _)) if bz >= z => best,
                _ => Some((z, s)),
            },
        );
        let Some((z, seg)) = best else {
            return Scored {
                score: 0.0,
                segment: None,
                raised_by: Vec::new(),
                lowered_by: Vec::new(),
                floor: None,
            };
        };
        let floor = segs.iter().filter_map(|s| s.floor).min();
        let mut parts: Vec<(Feature, f64)> = Vec::with_capacity(FEATURE_COUNT);
        parts.extend(
            ALL_FEATURES
                .iter()
                .map(|f| (*f, self.weights[*f as usize] * seg.features.get(*f)))
                .filter(|(_, c)| *c != 0.0),
        );
        parts.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()).then(a.0.cmp(&b.0)));
        let raised_by = parts
            .iter()
            .filter(|p| p.1 > 0.0)
            .take(4)
            .copied()
            .collect();
        let lowered_by = parts
            .iter()
            .filter(|p| p.1 < 0.0)
            .take(2)
            .copied()
            .collect();
        Scored {
            score: sigmoid(z),
            segment: Some(seg.range),
            raised_by,
            lowered_by,
            floor,
        }
    }
}

/// The logistic function, stable for large magnitudes.
pub fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}
