//! `ctxbroker-bench plan` and `ctxbroker-bench tokens` run on tiny inputs
//! and print every row, with plausible figures; `plan --csv` writes every
//! run behind the table's medians.

mod support;

use support::bench;

/// The cells of the table rows (not the header or the rule) whose first
/// cell is `first`.
fn rows<'a>(out: &'a str, first: &str) -> Vec<Vec<&'a str>> {
    out.lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect::<Vec<_>>()
        })
        .filter(|cells| cells.first() == Some(&first))
        .collect()
}

fn number(cell: &str) -> f64 {
    cell.trim_end_matches('×')
        .parse()
        .unwrap_or_else(|_| panic!("{cell:?} is not a number"))
}

#[test]
fn plan_prints_a_row_per_size_with_plausible_figures() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("plan.csv");
    let out = bench(&["plan", "300,3000", "2", "--csv", csv.to_str().unwrap()]);
    let mut previous_ms: Option<f64> = None;
    for n in ["300", "3000"] {
        let r = rows(&out, n);
        assert_eq!(r.len(), 1, "one row for {n} spans:\n{out}");
        let cells = &r[0];
        assert_eq!(cells.len(), 13, "{cells:?}");
        // admit, plan, apply, verify, adopt in ms: finite, non-negative,
        // and the admission costs something.
        let ms: Vec<f64> = cells[1..6].iter().map(|c| number(c)).collect();
        assert!(ms.iter().all(|m| m.is_finite() && *m >= 0.0), "{cells:?}");
        assert!(ms[0] > 0.0, "{cells:?}");
        // Some spans were evicted into a summary, fewer than all of them.
        let evicted = number(cells[10]);
        assert!(evicted >= 1.0 && evicted < number(n), "{cells:?}");
        assert!(number(cells[11]) > 0.0, "{cells:?}");
        assert_eq!(cells[12].len(), 16, "a 64-bit digest: {cells:?}");
        match previous_ms {
            None => assert_eq!(cells[7], "-", "{cells:?}"),
            Some(_) => {
                assert!(number(cells[7]) > 0.0, "{cells:?}");
                // 3000·log2(3000) / (300·log2(300)) = 14.04
                let expected = number(cells[8]);
                assert!((expected - 14.04).abs() < 0.01, "{cells:?}");
            }
        }
        previous_ms = Some(ms[0]);
    }

    // The CSV: both runs of both sizes; the median of two is the larger,
    // which the table prints to 0.01 ms.
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("live_spans,run,admit_ms,plan_ms,apply_ms,verify_ms,adopt_ms")
    );
    let runs: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(number).collect::<Vec<_>>())
        .collect();
    assert_eq!(runs.len(), 4, "{text}");
    for (k, run) in runs.iter().enumerate() {
        assert_eq!(run.len(), 7, "{run:?}");
        assert_eq!(run[0], [300.0, 3000.0][k / 2], "{run:?}");
        assert_eq!(run[1], (k % 2) as f64, "{run:?}");
        assert!(run[2] > 0.0 && run[3] > 0.0, "{run:?}");
        assert!(
            run[2..].iter().all(|ms| ms.is_finite() && *ms >= 0.0),
            "{run:?}"
        );
    }
    for (k, n) in ["300", "3000"].into_iter().enumerate() {
        let table = number(rows(&out, n)[0][1]);
        let larger = runs[2 * k][2].max(runs[2 * k + 1][2]);
        assert!((larger - table).abs() <= 0.0051, "{n}: {larger} vs {table}");
    }
}

#[test]
fn tokens_prints_every_row_and_the_counts_agree() {
    let out = bench(&["tokens", "1", "2000", "10"]);
    let memory = out
        .lines()
        .find(|l| l.starts_with("resident memory (VmRSS) added: o200k_base"))
        .unwrap_or_else(|| panic!("no memory line: {out}"));
    assert_eq!(memory.matches(" MiB").count(), 3, "{memory}");
    for encoding in ["o200k_base", "cl100k_base"] {
        let r = rows(&out, encoding);
        // Two corpus rows, then 3 inputs × 2 sizes (1 KB is below the
        // first default size, so only the maximum is measured: 2,000).
        let corpus: Vec<_> = r.iter().filter(|c| c.len() == 8).collect();
        let adversarial: Vec<_> = r.iter().filter(|c| c.len() == 9).collect();
        assert_eq!(corpus.len(), 2, "{out}");
        assert_eq!(adversarial.len(), 3, "{out}");
        for c in &corpus {
            assert!(number(c[2]) > 10_000.0, "the corpus has tokens: {c:?}");
            assert!(number(c[4]) > 0.0 && number(c[5]) > 0.0, "{c:?}");
            assert_eq!(c[7], "yes", "{c:?}");
        }
        assert_eq!(corpus[0][2], corpus[1][2], "both count the same");
        for c in &adversarial {
            assert_eq!(number(c[2]), 2_000.0, "{c:?}");
            let tokens = number(c[3]);
            assert!((1.0..=2_000.0).contains(&tokens), "{c:?}");
            assert!(number(c[4]) > 0.0, "{c:?}");
            assert_eq!(c[8], "yes", "{c:?}");
        }
    }
}
