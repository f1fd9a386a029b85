//! The work an admission does on the text of each span it admits, per
//! byte, on the turns of the admit mix: what grows with a turn's size,
//! stage by stage, in process and on one thread. Printed after the split
//! (`--split-mix-turns 0` skips it).

use std::hint::black_box;
use std::time::Instant;

use ctxbroker_core::config::TokenizerKind;
use ctxbroker_core::facts::{self, LiveFacts};
use ctxbroker_core::search::TermVector;
use ctxbroker_core::span::{Role, Span};
use ctxbroker_core::tokens::{self, TokenCounter};
use ctxbroker_proto::v1 as pb;

use super::workload::Workload;
use crate::common::Failure;

/// Passes over the turns; each stage's figure is their median.
const PASSES: usize = 5;

/// The stages, in the order [`measure`] gives them. The first four are
/// what the daemon does for each admitted span (the store makes the seed
/// and the term vector for the span's row; the session reads its facts
/// from the seed, or derives a shorter span's from its text); the fifth
/// is the reference: every span's facts derived from its text, as a
/// session without seeds does.
pub const STAGES: [&str; 5] = [
    "count (o200k_base)",
    "facts' seed (texts of 1 KiB or more)",
    "term vector",
    "facts read from the seeds",
    "facts derived from the text (reference)",
];

/// The figures of one run.
#[derive(Debug, Clone)]
pub struct PerByte {
    /// Turns read in each pass.
    pub turns: usize,
    /// Their text, bytes.
    pub bytes: usize,
    /// Each stage's median over the passes, in the order of [`STAGES`],
    /// nanoseconds per byte of all the turns' text.
    pub ns_per_byte: [f64; STAGES.len()],
}

/// The first `turns` turns of the mix's pool as admitted spans,
/// classified by the rules.
fn spans(workload: &Workload, turns: usize, counter: &dyn TokenCounter) -> Vec<Span> {
    (workload.pool.iter().take(turns).enumerate())
        .map(|(n, turn)| {
            let role = match turn.role {
                pb::Role::Tool => Role::Tool,
                pb::Role::User => Role::User,
                _ => Role::Assistant,
            };
            let id = n as u64 + 1;
            crate::plan::admitted(id, id, role, turn.text.clone(), counter)
        })
        .collect()
}

/// Times each stage over the first `turns` turns of the mix, `PASSES`
/// times.
pub fn measure(workload: &Workload, turns: usize) -> Result<PerByte, Failure> {
    let counter = tokens::counter(TokenizerKind::O200kBase);
    let spans = spans(workload, turns, counter);
    let bytes: usize = spans.iter().map(|s| s.text.len()).sum();
    if bytes == 0 {
        return Err("--split-mix-turns: the turns hold no text".into());
    }
    let mut passes: Vec<[f64; STAGES.len()]> = Vec::with_capacity(PASSES);
    for _ in 0..PASSES {
        let mut pass = [0.0; STAGES.len()];
        let mut time = |stage: usize, run: &mut dyn FnMut()| {
            let started = Instant::now();
            run();
            pass[stage] = started.elapsed().as_nanos() as f64 / bytes as f64;
        };
        time(0, &mut || {
            for span in &spans {
                black_box(counter.count(black_box(&span.text)));
            }
        });
        let mut seeds: Vec<Option<Box<[u8]>>> = Vec::new();
        time(1, &mut || {
            seeds = spans
                .iter()
                .map(|span| facts::seed(black_box(span)).map(Vec::into_boxed_slice))
                .collect();
        });
        time(2, &mut || {
            for span in &spans {
                black_box(TermVector::of(black_box(&span.text)));
            }
        });
        time(3, &mut || {
            black_box(LiveFacts::of_seeded(black_box(&spans), &seeds));
        });
        time(4, &mut || {
            black_box(LiveFacts::of(black_box(&spans)));
        });
        passes.push(pass);
    }
    let mut ns_per_byte = [0.0; STAGES.len()];
    for (stage, median) in ns_per_byte.iter_mut().enumerate() {
        let mut values: Vec<f64> = passes.iter().map(|pass| pass[stage]).collect();
        values.sort_by(f64::total_cmp);
        *median = values[values.len() / 2];
    }
    Ok(PerByte {
        turns: spans.len(),
        bytes,
        ns_per_byte,
    })
}

/// Prints the table: each stage per byte and per turn of the mix's mean
/// size, then the sum of the daemon's four.
pub fn print(figures: &PerByte) {
    let mean = figures.bytes as f64 / figures.turns.max(1) as f64;
    println!();
    println!(
        "per-span work on the admit mix's turns, in process, per byte of text: medians of {PASSES} passes over {} turns ({} bytes, {mean:.0} bytes a turn on average)",
        figures.turns, figures.bytes
    );
    println!("| stage | ns per byte | µs per turn of the mean size |\n|---|---|---|");
    for (stage, ns) in STAGES.iter().zip(figures.ns_per_byte) {
        println!("| {stage} | {ns:.2} | {:.2} |", ns * mean / 1000.0);
    }
    let admission: f64 = figures.ns_per_byte[..4].iter().sum();
    println!(
        "| an admission's four stages above | {admission:.2} | {:.2} |",
        admission * mean / 1000.0
    );
}
