//! A crash loop under load: several sessions admit turns, bursts,
//! constraints, pins and unpins concurrently while watchers follow the
//! marker log; the daemon is killed with `kill -9` at a random moment of
//! each cycle and restarted on the same data directory. Afterwards every
//! acknowledged operation is checked against the restarted daemon: spans
//! live or archived by a committed marker, constraints still pinned, the
//! marker log contiguous and exactly what the watchers received, and no
//! session half-compacted.
//!
//! The run is driven by a seeded xorshift generator; set
//! `CTXBROKER_CRASH_SEED` to replay another schedule. The seed is printed
//! with the summary line.
//!
//! - [`harness`]: the daemon's kill loop, the request wrapper that sorts
//!   outcomes, the readers the checks share;
//! - [`load`]: the admitters and the watchers;
//! - [`ledger`]: what they recorded as acknowledged;
//! - [`checks`]: one file per check, named after what it proves, all run
//!   over the same loop's records.

// Messages are built with `..Default::default()` even where every field is
// given today, so that fields the contract gains keep this compiling.
#![allow(clippy::needless_update)]

mod checks;
mod harness;
mod ledger;
mod load;

use ctxbroker_proto::v1 as pb;

use harness::CYCLES;

/// One crash loop, then every check of [`checks`] over its records and
/// the restarted daemon. The loop is run once and shared: each check
/// reports its own failures, by name, and the summary line counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_work_survives_a_crash_loop_under_load() {
    let mut run = harness::run(harness::seed()).await;
    let check = checks::run_all(&mut run).await;

    let checks::Checker {
        markers,
        mut violations,
        failed,
        landed,
        ..
    } = check;
    let tally = run.tally;
    let seed = run.seed;
    let acked_spans: usize = run.logs.values().map(|l| l.spans.len()).sum();
    let resumes: usize = run
        .watchers
        .iter()
        .map(|w| w.log.segments.len().saturating_sub(1))
        .sum();
    let breaks: Vec<&String> = run.watchers.iter().flat_map(|w| &w.log.breaks).collect();
    violations.extend(
        tally
            .violations
            .iter()
            .map(|what| format!("under load: {what}")),
    );
    let committed = markers
        .iter()
        .filter(|m| m.outcome() == pb::CompactionOutcome::Committed)
        .count();
    let soft = markers
        .iter()
        .filter(|m| m.trigger() == pb::CompactionTrigger::SoftWatermark)
        .count();
    let unpins = markers
        .iter()
        .filter(|m| m.trigger() == pb::CompactionTrigger::Unpin)
        .count();
    let refused: u64 = tally.refused.values().sum();
    println!(
        "crash loop: seed {seed}; operations acknowledged {} (refused {refused}), unacknowledged {} ({} failed with the daemon up; {landed} spans of unanswered turns landed), spans acknowledged {acked_spans}; kills {CYCLES}; markers {} ({committed} committed, {} aborted, {soft} soft-watermark, {unpins} unpin, {} compressing); watcher resumes {resumes}; violations = {}; load {:.1} s, total {:.1} s",
        tally.acked,
        tally.unacked,
        tally.unacked_while_up,
        markers.len(),
        markers.len() - committed,
        tally.compressions,
        violations.len(),
        run.load_done.as_secs_f64(),
        run.started.elapsed().as_secs_f64(),
    );
    println!("crash loop: failures by check {failed:?}");
    println!("crash loop: refusals {:?}", tally.refused);
    println!("crash loop: watcher stream ends {breaks:?}");
    assert!(
        violations.is_empty(),
        "{} violations:\n{}",
        violations.len(),
        violations.join("\n")
    );
    assert!(
        committed > 0 && resumes > 0,
        "the run should compact and resume watchers"
    );
}
