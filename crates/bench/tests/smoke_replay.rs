//! `ctxbroker-bench replay` on a tiny trace: the table has its three rows
//! with plausible values, ctxbroker's row loses nothing the policy
//! promises to keep, and a seed always gives the same table and CSV; with
//! `--unlabelled`, a fourth row measures ctxbroker on held-out phrasings
//! with the classes withheld, and the other three do not change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::path::Path;

use ctxbroker_bench::classify::{default_data_dir, load};
use ctxbroker_core::classify::{ClassifierTuning, classify_with};
use ctxbroker_core::span::{Role, SpanClass};
use support::bench;

const TURNS: u64 = 300;
const WINDOW: u64 = 200_000;

/// Runs the replay of one session of `TURNS` turns, with `extra` flags;
/// returns the table.
fn replay_with(seed: u64, csv: &Path, extra: &[&str]) -> String {
    let seed = seed.to_string();
    let turns = TURNS.to_string();
    let window = WINDOW.to_string();
    let mut args = vec![
        "replay",
        "--seed",
        &seed,
        "--sessions",
        "1",
        "--turns",
        &turns,
        "--window",
        &window,
        "--csv",
        csv.to_str().expect("the temporary path is UTF-8"),
    ];
    args.extend_from_slice(extra);
    bench(&args)
}

/// Runs the replay of one session of `TURNS` turns; returns the table.
fn replay(seed: u64, csv: &Path) -> String {
    replay_with(seed, csv, &[])
}

/// One row of the table.
#[derive(Debug)]
struct Row {
    label: String,
    turns_lost: u64,
    turns: u64,
    compactions: u64,
    idle: u64,
    generation: u64,
    anchors_lost: u64,
    anchors: u64,
    constraints_lost: u64,
    constraints: u64,
    /// (kept, stated), or `None` for "—".
    recall: Option<(u64, u64)>,
    /// (pinned, offered), or `None` for "—".
    false_pins: Option<(u64, u64)>,
    peak: u64,
    window: u64,
}

fn number(text: &str) -> u64 {
    text.trim()
        .replace(',', "")
        .parse()
        .unwrap_or_else(|err| panic!("{text:?} is not a number: {err}"))
}

/// "a / b" as (a, b).
fn ratio(cell: &str) -> (u64, u64) {
    let (a, b) = cell
        .split_once(" / ")
        .unwrap_or_else(|| panic!("{cell:?} is not `a / b`"));
    (number(a), number(b))
}

/// "a / b" as Some((a, b)), "—" as None.
fn ratio_or_dash(cell: &str) -> Option<(u64, u64)> {
    (cell.trim() != "—").then(|| ratio(cell))
}

/// The header the rows are parsed against.
const HEADER: &str = "| policy | turns lost to overflow | compactions | compactions while idle | max summary generation | anchors lost | constraints lost | constraint recall | false pins | live-token peak vs W |";

fn rows(table: &str) -> Vec<Row> {
    table
        .lines()
        .filter(|l| l.starts_with("| ("))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 10, "{line}");
            let (turns_lost, turns) = ratio(cells[1]);
            let (anchors_lost, anchors) = ratio(cells[5]);
            let (constraints_lost, constraints) = ratio(cells[6]);
            let peak_cell = cells[9].split(" (").next().unwrap_or("");
            let (peak, window) = ratio(peak_cell);
            Row {
                label: cells[0].trim().to_owned(),
                turns_lost,
                turns,
                compactions: number(cells[2]),
                idle: number(cells[3]),
                generation: number(cells[4]),
                anchors_lost,
                anchors,
                constraints_lost,
                constraints,
                recall: ratio_or_dash(cells[7]),
                false_pins: ratio_or_dash(cells[8]),
                peak,
                window,
            }
        })
        .collect()
}

#[test]
fn replay_table_and_series() {
    let dir = tempfile::tempdir().unwrap();
    let first_csv = dir.path().join("first.csv");
    let table = replay(1, &first_csv);
    assert!(table.contains(HEADER), "{table}");
    let rows = rows(&table);
    assert_eq!(rows.len(), 3, "{table}");
    for (row, prefix) in rows.iter().zip(["(a)", "(b)", "(c)"]) {
        assert!(row.label.starts_with(prefix), "{row:?}");
        assert_eq!(row.turns, TURNS, "{row:?}");
        assert_eq!(row.window, WINDOW, "{row:?}");
        assert!(row.peak > 0 && row.peak <= row.window, "{row:?}");
        assert!(row.compactions > 0, "{row:?}");
        assert!(row.idle <= row.compactions, "{row:?}");
        assert_eq!(row.constraints, 6, "{row:?}");
        assert!(
            row.anchors > 0 && row.anchors_lost <= row.anchors,
            "{row:?}"
        );
    }
    let (cadence, relevance, broker) = (&rows[0], &rows[1], &rows[2]);

    // The baselines classify nothing; the caller classifies (c)'s turns,
    // so it keeps every constraint, and the trace has no distractors.
    for row in [cadence, relevance] {
        assert_eq!((row.recall, row.false_pins), (None, None), "{row:?}");
    }
    assert_eq!(broker.recall, Some((6, 6)), "{table}");
    assert_eq!(broker.false_pins, None, "{table}");

    // ctxbroker: nothing lost, never compacts while idle, constraints
    // kept, summaries within the generation cap, live within the budget.
    assert_eq!(broker.turns_lost, 0, "{table}");
    assert_eq!(broker.idle, 0, "{table}");
    assert_eq!(broker.constraints_lost, 0, "{table}");
    assert!(broker.generation <= 3, "{table}");
    assert!(broker.peak <= WINDOW * 85 / 100, "{table}");

    // The baselines show what the measurements can see: the trace has an
    // idle gap of 15 minutes or more, so the cadence summarises while
    // idle, climbing a generation per tick; both lose constraints.
    assert!(cadence.idle >= 5, "{table}");
    assert!(cadence.generation > 3, "{table}");
    assert!(cadence.constraints_lost > 0, "{table}");
    assert!(relevance.constraints_lost > 0, "{table}");
    assert_eq!(relevance.idle, 0, "{table}");

    // The series: every policy present, ctxbroker's without a lost turn
    // or an idle compaction, no live total above W.
    let csv = std::fs::read_to_string(&first_csv).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("policy,session,t_s,live_tokens,demand_tokens,window_tokens,event,summary_generation")
    );
    let mut seen = [0usize; 3];
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 8, "{line}");
        let policy = ["cadence", "relevance", "ctxbroker"]
            .iter()
            .position(|p| *p == f[0])
            .unwrap_or_else(|| panic!("unknown policy in {line}"));
        seen[policy] += 1;
        assert!(number(f[3]) <= WINDOW, "{line}");
        assert!(
            ["admit", "lost", "compact", "compact_idle"].contains(&f[6]),
            "{line}"
        );
        if policy == 2 {
            assert!(f[6] == "admit" || f[6] == "compact", "{line}");
        }
    }
    assert!(seen.iter().all(|&n| n as u64 >= TURNS - 1), "{seen:?}");

    // Deterministic: the same seed gives the same table and series; another
    // seed another trace.
    let again_csv = dir.path().join("again.csv");
    assert_eq!(replay(1, &again_csv), table);
    assert_eq!(std::fs::read_to_string(&again_csv).unwrap(), csv);
    let other_csv = dir.path().join("other.csv");
    replay(2, &other_csv);
    assert_ne!(std::fs::read_to_string(&other_csv).unwrap(), csv);
}

#[test]
fn unlabelled_replay_adds_a_row_and_changes_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let plain_csv = dir.path().join("plain.csv");
    let plain = replay(3, &plain_csv);
    let first_csv = dir.path().join("unlabelled.csv");
    let table = replay_with(3, &first_csv, &["--unlabelled"]);
    assert!(table.contains(HEADER), "{table}");
    assert!(table.contains("Unlabelled trace (row (d))"), "{table}");
    let all = rows(&table);
    assert_eq!(all.len(), 4, "{table}");
    for (row, prefix) in all.iter().zip(["(a)", "(b)", "(c)", "(d)"]) {
        assert!(row.label.starts_with(prefix), "{row:?}");
    }

    // The caller-classified rows are the plain run's, line for line, and
    // ctxbroker's still loses nothing and never compacts while idle.
    let labelled = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("| (a)") || l.starts_with("| (b)") || l.starts_with("| (c)"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(labelled(&table), labelled(&plain));
    let broker = &all[2];
    assert_eq!(
        (broker.turns_lost, broker.constraints_lost, broker.idle),
        (0, 0, 0),
        "{table}"
    );
    assert_eq!(broker.recall, Some((6, 6)), "{table}");

    // (d): 300 turns state the first 24 constraints of the session's share
    // (the first quarter, a third of its turns) and 29 distractors (a
    // tenth of the turns); recall and false pins are measured, not given.
    let d = &all[3];
    assert_eq!(d.turns, TURNS, "{d:?}");
    assert_eq!(d.constraints, 24, "{table}");
    let (kept, stated) = d.recall.expect("(d) measures recall");
    assert_eq!(stated, 24, "{table}");
    assert!(kept <= stated, "{table}");
    let (pinned, offered) = d.false_pins.expect("(d) measures false pins");
    assert_eq!(offered, 29, "{table}");
    assert!(pinned <= offered, "{table}");
    assert_eq!(d.constraints_lost, 0, "{table}");
    assert_eq!(kept, stated, "{table}");
    assert_eq!(d.idle, 0, "{table}");
    assert!(d.compactions > 0 && d.peak <= WINDOW * 85 / 100, "{table}");
    assert!(table.contains("| constraint category | stated | kept by the classifier | lost |"));
    assert!(table.contains("| distractor category | offered | pinned or in the tier |"));
    // Every one of the twelve constraint categories and eight distractor
    // categories is in the trace.
    let section = |start: &str| -> usize {
        table
            .split(start)
            .nth(1)
            .unwrap_or("")
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with("| "))
            .count()
    };
    assert_eq!(section("| constraint category |"), 12, "{table}");
    assert_eq!(section("| distractor category |"), 8, "{table}");

    // The ids it lists are the classifier's decisions on the held-out
    // texts: those not kept are narrative to it, those pinned wrongly are
    // kept, and the counts agree with the table.
    let heldout = load(&default_data_dir(), "heldout").unwrap();
    let text: HashMap<&str, &str> = heldout
        .iter()
        .map(|s| (s.id.as_str(), s.text.as_str()))
        .collect();
    let keeps = |id: &str| {
        let text = text
            .get(id)
            .unwrap_or_else(|| panic!("{id} is not held out"));
        matches!(
            classify_with(Role::User, text, &ClassifierTuning::default()).class,
            SpanClass::Constraint | SpanClass::Protected
        )
    };
    let listed = |prefix: &str| -> Vec<String> {
        let line = table
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in {table}"));
        let line = line.trim_end_matches('.');
        if line == "none" {
            return Vec::new();
        }
        line.split(", ")
            .map(|item| item.split(" (").next().unwrap_or("").to_owned())
            .collect()
    };
    let not_kept = listed("Row (d): constraints not kept at admission: ");
    assert_eq!(not_kept.len() as u64, stated - kept, "{table}");
    assert!(not_kept.iter().all(|id| !keeps(id)), "{not_kept:?}");
    let false_pinned = listed("Row (d): distractors pinned or in the tier: ");
    assert_eq!(false_pinned.len() as u64, pinned, "{table}");
    assert!(false_pinned.iter().all(|id| keeps(id)), "{false_pinned:?}");
    assert_eq!(
        listed("Row (d): constraints lost: ").len() as u64,
        d.constraints_lost,
        "{table}"
    );

    // The series has (d)'s rows, without a lost turn or an idle
    // compaction.
    let csv = std::fs::read_to_string(&first_csv).unwrap();
    let unlabelled: Vec<&str> = csv
        .lines()
        .filter(|l| l.starts_with("ctxbroker_unlabelled,"))
        .collect();
    assert!(unlabelled.len() as u64 >= TURNS, "{}", unlabelled.len());
    for line in &unlabelled {
        let event = line.split(',').nth(6).unwrap_or("");
        assert!(event == "admit" || event == "compact", "{line}");
    }

    // Deterministic for a seed.
    let again_csv = dir.path().join("again.csv");
    assert_eq!(replay_with(3, &again_csv, &["--unlabelled"]), table);
    assert_eq!(std::fs::read_to_string(&again_csv).unwrap(), csv);
}
