//! `ctxbroker-bench replay` on a tiny trace: the table has its three rows
//! with plausible values, ctxbroker's row loses nothing the policy
//! promises to keep, and a seed always gives the same table and CSV.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;

use support::bench;

const TURNS: u64 = 300;
const WINDOW: u64 = 200_000;

/// Runs the replay of one session of `TURNS` turns; returns the table.
fn replay(seed: u64, csv: &Path) -> String {
    bench(&[
        "replay",
        "--seed",
        &seed.to_string(),
        "--sessions",
        "1",
        "--turns",
        &TURNS.to_string(),
        "--window",
        &WINDOW.to_string(),
        "--csv",
        csv.to_str().expect("the temporary path is UTF-8"),
    ])
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

fn rows(table: &str) -> Vec<Row> {
    table
        .lines()
        .filter(|l| l.starts_with("| ("))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            assert_eq!(cells.len(), 8, "{line}");
            let (turns_lost, turns) = ratio(cells[1]);
            let (anchors_lost, anchors) = ratio(cells[5]);
            let (constraints_lost, constraints) = ratio(cells[6]);
            let peak_cell = cells[7].split(" (").next().unwrap_or("");
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
