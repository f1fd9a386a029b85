//! Smoke test of `ctxbroker-bench quota`: the built binary on tiny sizes,
//! checking that both rows are printed and that the flood was refused
//! while admitting about its quota. It measures nothing; it fails when
//! the harness rots.

mod support;

use support::bench;

fn cells<'a>(output: &'a str, name: &str) -> Vec<&'a str> {
    output
        .lines()
        .filter(|line| line.starts_with('|'))
        .map(|line| {
            line.trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect::<Vec<_>>()
        })
        .find(|cells| cells[0] == name)
        .unwrap_or_else(|| panic!("no row {name:?} in:\n{output}"))
}

#[test]
fn quota_prints_both_rows_and_the_flood_is_refused() {
    let out = bench(&[
        "quota",
        "--turns",
        "30",
        "--rounds",
        "2",
        "--flooders",
        "2",
        "--flood-rate",
        "200",
        "--flood-quota",
        "5",
    ]);
    for name in ["alone", "while flood floods"] {
        let row = cells(&out, name);
        assert_eq!(row[1], "60", "{out}");
        let p99: f64 = row[4].parse().unwrap();
        assert!(p99 > 0.0, "{out}");
    }
    assert!(out.contains("flooded ÷ alone: p50 "), "{out}");
    let flood = out
        .lines()
        .find(|l| l.starts_with("flood: "))
        .unwrap_or_else(|| panic!("no flood line in:\n{out}"));
    assert!(flood.contains(" 0 other errors"), "{flood}");
    let refused: f64 = flood
        .split(", ")
        .find(|p| p.ends_with("refused/s with QUOTA_EXCEEDED"))
        .and_then(|p| p.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no refusals in {flood}"));
    assert!(refused > 0.0, "{flood}");
}
