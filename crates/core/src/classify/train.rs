//! Training the standing-instruction model from labelled spans: pure and
//! deterministic, so the committed weights can be reproduced anywhere.
//!
//! The label belongs to a span, the features to its segments: a long
//! message with one rule buried in it is a standing instruction because of
//! one sentence. Training is therefore multiple-instance logistic
//! regression: a span's logit is its best segment's, and each step's
//! gradient flows through that segment. Full-batch gradient descent with
//! L2 regularisation, a fixed number of steps, examples in file order;
//! the intercept is a fixed prior, not learned (see
//! [`TrainOptions::prior_logit`]).
//!
//! The thresholds come from out-of-fold scores (five folds, by position),
//! so they are set by how the model scores spans it was not fitted on:
//! the pin threshold is the highest that keeps out-of-fold recall at its
//! target (a missed instruction is the costly error; a false pin costs a
//! short span's tokens), the doubt threshold the highest that keeps the
//! recall of pinned and doubtful spans together at a higher target, but
//! never at or below the score of a sentence with no evidence at all (the
//! doubtful ones are kept in the standing-instructions tier, which must
//! not fill with every acknowledgement).

use super::features::{FEATURE_COUNT, Segment, segments};
use super::model::{Model, sigmoid};
use crate::span::Role;

/// One labelled span.
#[derive(Debug, Clone)]
pub struct Example {
    /// Who wrote it.
    pub role: Role,
    /// The text.
    pub text: String,
    /// Whether it is a standing instruction.
    pub constraint: bool,
}

/// Training parameters.
#[derive(Debug, Clone, Copy)]
pub struct TrainOptions {
    /// Gradient steps.
    pub steps: usize,
    /// Step size.
    pub learning_rate: f64,
    /// L2 penalty on the weights (not the bias).
    pub l2: f64,
    /// Weight of a positive example's loss relative to a negative's. Even
    /// by default: the pin threshold, set on out-of-fold scores, is what
    /// keeps missed constraints rare; weighing positives more (or a
    /// heavier L2 penalty) lifted the tasks, holds and reports that look
    /// like instructions along with them, in the training split's
    /// out-of-fold figures (`ctxbroker-bench classify train --cv`).
    pub positive_weight: f64,
    /// Out-of-fold recall the pin threshold must keep.
    pub pin_recall: f64,
    /// Out-of-fold recall the doubt threshold must keep.
    pub doubt_recall: f64,
    /// Folds for the out-of-fold scores.
    pub folds: usize,
    /// The logit of a segment in which no feature fires: fixed, not
    /// learned. A sentence with no sign of an instruction is narrative;
    /// every bit of a standing instruction's score must come from
    /// evidence. (Learned, the intercept drifts up with the share of
    /// instructions in the data, and every featureless sentence of every
    /// message then scores as a doubtful instruction.)
    pub prior_logit: f64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            steps: 1500,
            learning_rate: 0.5,
            l2: 0.0005,
            positive_weight: 1.0,
            pin_recall: 0.97,
            doubt_recall: 0.995,
            folds: 5,
            prior_logit: -2.5,
        }
    }
}

/// A span ready for training: its segments' features.
struct Prepared {
    segments: Vec<Segment>,
    constraint: bool,
}

/// Only user and system spans are scored by the model; the rest are
/// narrative by role.
fn prepare(examples: &[Example]) -> Vec<Prepared> {
    examples
        .iter()
        .filter(|e| matches!(e.role, Role::User | Role::System))
        .map(|e| Prepared {
            segments: segments(&e.text, e.role == Role::System),
            constraint: e.constraint,
        })
        .collect()
}

/// Trains a model on `examples` and sets its thresholds from out-of-fold
/// scores.
pub fn train(examples: &[Example], options: &TrainOptions) -> Model {
    let prepared = prepare(examples);
    let (bias, weights) = fit(&prepared, options, |_| true);
    // (score, is a standing instruction) of every span, each scored by a
    // model fitted without its fold.
    let mut out_of_fold: Vec<(f64, bool)> = scores_out_of_fold(&prepared, options)
        .into_iter()
        .zip(prepared.iter().map(|p| p.constraint))
        .collect();
    let (pin_threshold, doubt_threshold) = thresholds(&mut out_of_fold, options);
    Model {
        bias,
        weights,
        pin_threshold,
        doubt_threshold,
    }
}

/// The score of every user and system example (in order; tool and
/// assistant examples are skipped), each by a model fitted without its
/// fold: how the model scores spans it was not fitted on, the training
/// split's own estimate of the figures on unseen text.
pub fn out_of_fold(examples: &[Example], options: &TrainOptions) -> Vec<f64> {
    scores_out_of_fold(&prepare(examples), options)
}

/// Out-of-fold scores of prepared spans, in their order (folds by
/// position).
fn scores_out_of_fold(prepared: &[Prepared], options: &TrainOptions) -> Vec<f64> {
    let mut scores = vec![0.0; prepared.len()];
    let folds = options.folds.max(2);
    for fold in 0..folds {
        let (b, w) = fit(prepared, options, |i| i % folds != fold);
        let model = Model {
            bias: b,
            weights: w,
            pin_threshold: 0.5,
            doubt_threshold: 0.5,
        };
        for (i, p) in prepared.iter().enumerate() {
            if i % folds == fold {
                scores[i] = span_score(&model, &p.segments);
            }
        }
    }
    scores
}

/// The pin and doubt thresholds (the highest keeping each recall target)
/// on out-of-fold scores, each rounded down to 1/1000; the doubt
/// threshold stays above the score of a sentence with no evidence.
fn thresholds(scores: &mut [(f64, bool)], options: &TrainOptions) -> (f64, f64) {
    let positives = scores.iter().filter(|s| s.1).count();
    if positives == 0 {
        return (0.5, 0.5);
    }
    scores.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (mut pin, mut doubt) = (None, None);
    let mut true_pins = 0usize;
    for (k, (score, positive)) in scores.iter().enumerate() {
        true_pins += usize::from(*positive);
        // Only where the next score differs: ties stand together.
        if scores.get(k + 1).is_some_and(|next| next.0 == *score) {
            continue;
        }
        let recall = true_pins as f64 / positives as f64;
        if pin.is_none() && recall >= options.pin_recall {
            pin = Some(*score);
        }
        if doubt.is_none() && recall >= options.doubt_recall {
            doubt = Some(*score);
        }
    }
    let round = |t: f64| ((t * 1000.0).floor() / 1000.0).clamp(0.001, 0.999);
    let lowest = scores.last().map_or(0.5, |s| s.0);
    let pin = round(pin.unwrap_or(lowest));
    // One thousandth above the evidence-free score, rounded up.
    let no_evidence = (sigmoid(options.prior_logit) * 1000.0).floor() / 1000.0 + 0.001;
    let doubt = round(doubt.unwrap_or(pin)).max(no_evidence).min(pin);
    (pin, doubt)
}

fn span_score(model: &Model, segments: &[Segment]) -> f64 {
    segments
        .iter()
        .map(|s| sigmoid(model.logit(s)))
        .fold(0.0, f64::max)
}

/// Multiple-instance logistic regression on the examples `include` keeps.
fn fit(
    prepared: &[Prepared],
    options: &TrainOptions,
    include: impl Fn(usize) -> bool,
) -> (f64, [f64; FEATURE_COUNT]) {
    let bias = options.prior_logit;
    let mut weights = [0.0; FEATURE_COUNT];
    let chosen: Vec<&Prepared> = prepared
        .iter()
        .enumerate()
        .filter(|(i, p)| include(*i) && !p.segments.is_empty())
        .map(|(_, p)| p)
        .collect();
    let total: f64 = chosen
        .iter()
        .map(|p| {
            if p.constraint {
                options.positive_weight
            } else {
                1.0
            }
        })
        .sum();
    if total == 0.0 {
        return (bias, weights);
    }
    for _ in 0..options.steps {
        let model = Model {
            bias,
            weights,
            pin_threshold: 0.5,
            doubt_threshold: 0.5,
        };
        let mut grad = [0.0; FEATURE_COUNT];
        for p in &chosen {
            let (z, best) = p
                .segments
                .iter()
                .map(|s| (model.logit(s), s))
                .fold(None::<(f64, &Segment)>, |acc, (z, s)| match acc {
                    Some((az, _)) if az >= z => acc,
                    _ => Some((z, s)),
                })
                .unwrap_or((0.0, &p.segments[0]));
            let (target, weight) = if p.constraint {
                (1.0, options.positive_weight)
            } else {
                (0.0, 1.0)
            };
            let error = weight * (sigmoid(z) - target);
            for (g, x) in grad.iter_mut().zip(best.features.0.iter()) {
                *g += error * x;
            }
        }
        for (w, g) in weights.iter_mut().zip(grad.iter()) {
            *w -= options.learning_rate * (g / total + options.l2 * *w);
        }
    }
    (bias, weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(text: &str, constraint: bool) -> Example {
        Example {
            role: Role::User,
            text: text.into(),
            constraint,
        }
    }

    #[test]
    fn training_is_deterministic_and_separates_a_toy_set() {
        let data = vec![
            ex("Never push to main.", true),
            ex("No tabs anywhere.", true),
            ex("Always run the linter before committing.", true),
            ex("From now on, use pnpm.", true),
            ex("Why does the build fail?", false),
            ex("It never finishes on my laptop.", false),
            ex("ok thanks", false),
            ex("Wait, don't change anything yet.", false),
        ];
        let options = TrainOptions {
            steps: 400,
            ..TrainOptions::default()
        };
        let a = train(&data, &options);
        let b = train(&data, &options);
        assert_eq!(a, b);
        let pos = span_score(&a, &segments("Never push to main.", false));
        let neg = span_score(&a, &segments("Why does the build fail?", false));
        assert!(pos > neg, "{pos} vs {neg}");
        assert!(a.doubt_threshold <= a.pin_threshold);
    }

    #[test]
    fn no_examples_give_a_neutral_model() {
        let m = train(&[], &TrainOptions::default());
        assert_eq!(m.bias, TrainOptions::default().prior_logit);
        assert!(m.weights.iter().all(|w| *w == 0.0));
    }
}
