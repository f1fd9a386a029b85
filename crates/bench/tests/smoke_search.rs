//! `search` on small sessions: the table has a row per size, the index is
//! smaller than the text, and every anchor query finds its span (the run
//! fails otherwise).

#![allow(missing_docs)]

mod support;

#[test]
fn search_table_has_a_row_per_size() {
    let out = support::bench(&[
        "search",
        "--spans",
        "50,300",
        "--queries",
        "20",
        "--batch",
        "25",
    ]);
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| 50 |") || l.starts_with("| 300 |"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | spans | index µs | count µs | ratio | index bytes / raw | first | p50 | ...
        let index_ratio: f64 = cells[5].parse().unwrap();
        assert!(index_ratio > 0.05 && index_ratio < 0.6, "{row}");
        let p50: f64 = cells[7].parse().unwrap();
        assert!(p50 > 0.0, "{row}");
    }
}
