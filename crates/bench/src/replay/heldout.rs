//! The unlabelled trace's user phrasings: the user spans of the labelled
//! data's held-out split (`crates/core/data/classify/heldout.jsonl`, read
//! with [`crate::classify::load`]), dealt to the run's sessions.
//!
//! The deal is a pure function of the split, the seed and the number of
//! sessions:
//!
//! 1. The user-role `constraint` spans are grouped by category; each group
//!    is shuffled by the seed, and so is the order of the categories.
//! 2. The groups are interleaved: the first span of every category (in
//!    that order), then the second of every category that has one, and so
//!    on. Any prefix of twelve or more spans of this order therefore holds
//!    every category (the held-out split has twelve user constraint
//!    categories of at least ten spans each).
//! 3. The `j`-th span of the order goes to session `j mod sessions`, which
//!    states its spans in order of `j`.
//!
//! The user-role `narrative` spans of [`DISTRACTOR_CATEGORIES`] are dealt
//! the same way (with their own shuffles) as the session's distractors.
//! Every span of either kind thus goes to exactly one session, and a
//! session whose trace has room for all of its share states every one of
//! them once: over a default run (3 sessions of 3,000 turns) every
//! held-out user constraint is stated exactly once, and every distractor
//! occurs exactly once. A shorter trace states a prefix of its share (see
//! the trace generator); as every session of a run has the same number of
//! turns, the spans stated over the run are then a prefix of the order,
//! and they hold every category as soon as the run states twelve
//! constraints and eight distractors.

use std::collections::BTreeMap;

use ctxbroker_core::span::Role;

use crate::classify::{Labelled, default_data_dir, load};
use crate::common::{Failure, Rng};

/// The categories of user narrative spans mixed into the trace as
/// distractors: turns a user writes that bind nothing beyond the moment.
pub(crate) const DISTRACTOR_CATEGORIES: [&str; 8] = [
    "question",
    "step_local",
    "transient_hold",
    "reported_speech",
    "task_request",
    "user_pasted_output",
    "acknowledgement",
    "plain_narrative",
];

/// One held-out span as the trace uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldOutSpan {
    /// Its id in the split (`ho-…`).
    pub(crate) id: String,
    /// Its category in the split.
    pub(crate) category: String,
    /// Its text, stated verbatim.
    pub(crate) text: String,
}

/// What one session states: its constraints and its distractors, each in
/// the order the trace states them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Share {
    pub(crate) constraints: Vec<HeldOutSpan>,
    pub(crate) distractors: Vec<HeldOutSpan>,
}

/// The held-out split's user spans, dealt to `sessions` sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deal {
    /// Per session, by index.
    pub(crate) shares: Vec<Share>,
    /// User constraints in the split.
    pub(crate) constraints: usize,
    /// Distractors in the split (user narrative of the listed categories).
    pub(crate) distractors: usize,
}

/// Reads the held-out split from the checkout and deals it.
pub(crate) fn load_and_deal(seed: u64, sessions: usize) -> Result<Deal, Failure> {
    let spans = load(&default_data_dir(), "heldout")?;
    deal(&spans, seed, sessions)
}

/// Deals `spans` (a split, as [`load`] returns it) to `sessions` sessions.
pub(crate) fn deal(spans: &[Labelled], seed: u64, sessions: usize) -> Result<Deal, Failure> {
    let mut constraints: BTreeMap<String, Vec<HeldOutSpan>> = BTreeMap::new();
    let mut distractors: BTreeMap<String, Vec<HeldOutSpan>> = BTreeMap::new();
    for span in spans {
        if span.role()? != Role::User {
            continue;
        }
        let group = if span.constraint()? {
            &mut constraints
        } else if DISTRACTOR_CATEGORIES.contains(&span.category.as_str()) {
            &mut distractors
        } else {
            continue;
        };
        group
            .entry(span.category.clone())
            .or_default()
            .push(HeldOutSpan {
                id: span.id.clone(),
                category: span.category.clone(),
                text: span.text.clone(),
            });
    }
    if constraints.is_empty() || distractors.is_empty() {
        return Err(format!(
            "the held-out split has {} user constraint and {} distractor categories; the unlabelled replay needs both",
            constraints.len(),
            distractors.len()
        )
        .into());
    }
    let sessions = sessions.max(1);
    let mut rng = Rng::new(seed ^ 0x6a09_e667_f3bc_c908);
    for _ in 0..4 {
        rng.next_u64();
    }
    let constraint_order = interleave(constraints, &mut rng);
    let distractor_order = interleave(distractors, &mut rng);
    let mut shares = vec![Share::default(); sessions];
    let (n_constraints, n_distractors) = (constraint_order.len(), distractor_order.len());
    for (j, span) in constraint_order.into_iter().enumerate() {
        shares[j % sessions].constraints.push(span);
    }
    for (j, span) in distractor_order.into_iter().enumerate() {
        shares[j % sessions].distractors.push(span);
    }
    Ok(Deal {
        shares,
        constraints: n_constraints,
        distractors: n_distractors,
    })
}

/// Shuffles each category's spans and the order of the categories, then
/// takes one span of every category per round.
fn interleave(groups: BTreeMap<String, Vec<HeldOutSpan>>, rng: &mut Rng) -> Vec<HeldOutSpan> {
    let mut groups: Vec<Vec<HeldOutSpan>> = groups.into_values().collect();
    for group in &mut groups {
        shuffle(group, rng);
    }
    shuffle(&mut groups, rng);
    let longest = groups.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::with_capacity(groups.iter().map(Vec::len).sum());
    for round in 0..longest {
        for group in &groups {
            if let Some(span) = group.get(round) {
                out.push(span.clone());
            }
        }
    }
    out
}

/// Fisher–Yates with the bench's generator.
fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i + 1);
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn split() -> Vec<Labelled> {
        load(&default_data_dir(), "heldout").unwrap()
    }

    #[test]
    fn every_user_constraint_and_distractor_goes_to_exactly_one_session() {
        let spans = split();
        let deal = deal(&spans, 1, 3).unwrap();
        let user = |constraint: bool| -> BTreeSet<String> {
            spans
                .iter()
                .filter(|s| s.role().unwrap() == Role::User)
                .filter(|s| s.constraint().unwrap() == constraint)
                .filter(|s| constraint || DISTRACTOR_CATEGORIES.contains(&s.category.as_str()))
                .map(|s| s.id.clone())
                .collect()
        };
        let dealt = |f: fn(&Share) -> &Vec<HeldOutSpan>| -> Vec<String> {
            deal.shares
                .iter()
                .flat_map(|s| f(s).iter().map(|x| x.id.clone()))
                .collect()
        };
        let constraints = dealt(|s| &s.constraints);
        let distractors = dealt(|s| &s.distractors);
        assert_eq!(constraints.len(), deal.constraints);
        assert_eq!(distractors.len(), deal.distractors);
        assert_eq!(
            constraints.iter().cloned().collect::<BTreeSet<_>>(),
            user(true)
        );
        assert_eq!(
            distractors.iter().cloned().collect::<BTreeSet<_>>(),
            user(false)
        );
        assert_eq!(deal.constraints, user(true).len());
        // Shares differ in size by one at most.
        let sizes: Vec<usize> = deal.shares.iter().map(|s| s.constraints.len()).collect();
        assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
    }

    #[test]
    fn a_prefix_of_twelve_holds_every_category_and_the_deal_follows_the_seed() {
        let spans = split();
        let one = deal(&spans, 1, 1).unwrap();
        let categories = |v: &[HeldOutSpan]| -> BTreeSet<String> {
            v.iter().map(|s| s.category.clone()).collect()
        };
        let all = categories(&one.shares[0].constraints);
        assert_eq!(all.len(), 12, "{all:?}");
        assert_eq!(categories(&one.shares[0].constraints[..12]), all);
        let distractors = categories(&one.shares[0].distractors[..8]);
        assert_eq!(distractors.len(), DISTRACTOR_CATEGORIES.len());
        assert_eq!(deal(&spans, 1, 1).unwrap(), one);
        assert_ne!(deal(&spans, 2, 1).unwrap(), one);
    }
}
