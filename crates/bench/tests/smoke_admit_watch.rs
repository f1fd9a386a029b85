//! Smoke tests of `ctxbroker-bench admit` (its split too) and
//! `ctxbroker-bench watch`: the built binary on tiny sizes, checking that
//! every row is printed with plausible figures, and that `--csv` writes
//! the samples behind them. They measure nothing; they fail when the
//! harness rots.

mod support;

use std::collections::HashMap;

use support::bench;

/// The cells of the table row whose first cell is `name` (and, when
/// given, whose second is `server`).
/// The cells of a markdown table's line.
fn table_cells(line: &str) -> Vec<&str> {
    line.trim_matches('|').split('|').map(str::trim).collect()
}

fn row<'a>(output: &'a str, name: &str, server: Option<&str>) -> Vec<&'a str> {
    output
        .lines()
        .filter(|line| line.starts_with('|'))
        .map(table_cells)
        .find(|cells| cells[0] == name && server.is_none_or(|s| cells.get(1) == Some(&s)))
        .unwrap_or_else(|| panic!("no row {name:?} {server:?} in:\n{output}"))
}

fn number(cell: &str) -> f64 {
    cell.parse()
        .unwrap_or_else(|_| panic!("{cell:?} is not a number"))
}

/// The lines of a CSV file after its header, which must be `header`.
fn csv_lines(path: &std::path::Path, header: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("--csv {} was not written: {err}", path.display()));
    let mut lines = text.lines().map(str::to_owned);
    assert_eq!(lines.next().as_deref(), Some(header), "{text:.300}");
    lines.collect()
}

fn redis_installed() -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("redis-server").is_file())
    })
}

#[test]
fn admit_prints_every_row_with_plausible_figures() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("admit.csv");
    let out = bench(&[
        "admit",
        "--duration",
        "1",
        "--rounds",
        "1",
        "--warmup",
        "0.2",
        "--clients",
        "4",
        "--sessions",
        "6",
        "--connections",
        "2",
        "--window",
        "20000",
        "--max-tool-tokens",
        "4000",
        "--probe",
        "40",
        "--flat-sizes",
        "100,600",
        "--flat-requests",
        "30",
        "--flat-clients",
        "3",
        "--no-split",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    // Columns: row, server, clients, requests, req/s, p50, p90, p99, max,
    // p50 without compaction, compactions/s, CPU cores, CPU µs/req, peak
    // RSS, load generator CPU µs/req, errors.
    for (server, admit) in [
        ("ctxbroker, durable", "Admit, durable"),
        ("ctxbroker, relaxed", "Admit, relaxed"),
    ] {
        for name in ["no-op GetServerInfo", admit] {
            let cells = row(&out, name, Some(server));
            assert_eq!(cells[2], "4", "{cells:?}");
            assert!(number(cells[3]) > 0.0, "no requests: {cells:?}");
            assert!(number(cells[4]) > 0.0, "no rate: {cells:?}");
            let (p50, p99, max) = (number(cells[5]), number(cells[7]), number(cells[8]));
            assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{cells:?}");
            assert!(number(cells[11]) > 0.0, "no daemon CPU: {cells:?}");
            assert!(number(cells[13]) > 1.0, "no daemon memory: {cells:?}");
            assert_eq!(cells[15], "0", "errors: {cells:?}");
            // The same row's CPU by thread group: five parts (each
            // thread's time counted in whole ticks, so over a short row
            // they need not add up to the whole).
            let threads: Vec<f64> = out
                .lines()
                .map(table_cells)
                .find(|c| c.len() == 7 && c[0] == name && c[1] == server)
                .unwrap_or_else(|| panic!("no thread split for {name} {server}: {out}"))[2..]
                .iter()
                .map(|c| number(c))
                .collect();
            assert_eq!(threads.len(), 5, "{threads:?}");
            assert!(threads.iter().all(|t| *t >= 0.0), "{threads:?}");
        }
        assert!(number(row(&out, admit, Some(server))[10]) >= 0.0);
        for name in [
            "probe: no-op GetServerInfo",
            "probe: Admit, short user message",
        ] {
            let cells = row(&out, name, Some(server));
            assert_eq!(cells[3], "40", "{cells:?}");
            assert!(number(cells[5]) > 0.0, "{cells:?}");
        }
    }
    let redis = row(&out, "Redis RPUSH, appendfsync always", None);
    if redis_installed() {
        assert_eq!(redis[1], "redis-server", "{redis:?}");
        assert!(number(redis[4]) > 0.0, "{redis:?}");
        assert_eq!(redis[15], "0", "{redis:?}");
        assert!(
            out.contains("durable admits/s ÷ Redis RPUSH/s at 4 clients"),
            "{out}"
        );
        // Judged against the target and, beside it, the aim beyond it.
        assert!(out.contains("(target ≥ 0.5: "), "{out}");
        assert!(out.contains("; aim ≥ 1.0: "), "{out}");
    } else {
        assert_eq!(redis[1], "skipped", "{redis:?}");
        assert!(
            out.contains("Redis row skipped: redis-server is not on PATH"),
            "{out}"
        );
    }
    assert!(
        out.contains("relaxed Admit p50 (no compaction) ÷ no-op p50, one client"),
        "{out}"
    );
    assert!(out.contains("(target ≤ 1.5: "), "{out}");
    assert!(out.contains("; aim ≤ 1.3: "), "{out}");
    assert!(!out.contains("errors:"), "{out}");
    assert!(!out.contains("admission split"), "--no-split: {out}");
    // The rows of CPU per request that fits, against the session's size:
    // each daemon, each size, a no-op row and admission rows without and
    // with an idempotency key, from one client; then, at the first size,
    // a no-op row and an admission row from three clients at once.
    let one = ["100", "600"]
        .into_iter()
        .flat_map(|size| ["no-op", "admit", "admit+key"].map(|request| (size, request, "1")));
    let loaded = [("100", "no-op", "3"), ("100", "admit", "3")];
    for daemon in ["durable", "relaxed"] {
        for (size, request, clients) in one.clone().chain(loaded) {
            let cells = out
                .lines()
                .map(table_cells)
                .find(|c| {
                    c.len() == 14
                        && c[0] == daemon
                        && c[1] == size
                        && c[2] == request
                        && c[3] == clients
                })
                .unwrap_or_else(|| panic!("no {daemon} {size} {request} {clients} row: {out}"));
            // Three clients send 30 requests in all, ten each. The clients'
            // column read, the rest is read as before.
            let cells: Vec<&str> = cells
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != 3)
                .map(|(_, c)| *c)
                .collect();
            assert_eq!(cells[3], "30", "{cells:?}");
            assert!(number(cells[4]) > 0.0, "{cells:?}");
            assert!(number(cells[5]) >= 0.0, "{cells:?}");
            // The CPU by thread group: five parts. (Over 30 requests
            // they need not add up to the whole: the kernel counts
            // each thread's time in whole ticks, of 333 µs a request
            // here; the tests of the bench's `daemon` module check
            // the sum.)
            let parts: Vec<f64> = cells[6].split(" / ").map(number).collect();
            assert_eq!(parts.len(), 5, "{cells:?}");
            assert!(parts.iter().all(|p| *p >= 0.0), "{cells:?}");
            // The engine's writes per request: none for a no-op; for
            // an admission of one span the span (its term vector
            // inside) and the session's record, which carries the
            // batch's commit epoch (a pin row more for a message that
            // reads as a rule); a key row more with a key; and every
            // 16 appends a block packed, its rows removed for its run.
            let (keys, bytes) = cells[9]
                .split_once(" / ")
                .unwrap_or_else(|| panic!("{cells:?}"));
            let (keys, bytes) = (number(keys), number(bytes));
            // The keys the writer read: the session's record, and the
            // key's look-up with a key (an appended span's position is
            // not looked up); and once a session's block is due for
            // packing, its rows, so each appended span is read once
            // more, a block later.
            let reads = number(cells[10]);
            // The engine's blob files synced per request.
            let blob_syncs = number(cells[11]);
            assert!(blob_syncs >= 0.0, "{cells:?}");
            // Writes the request applied itself: none with durable
            // writes, nearly every admission of one client with
            // relaxed ones (the writer is idle; one every half second
            // goes to it to sync the blob files).
            let by_caller = number(cells[12]);
            match (daemon, request, clients) {
                ("durable", _, _) | (_, "no-op", _) => {
                    assert_eq!(by_caller, 0.0, "{cells:?}")
                }
                // Three clients find the writer busy some of the time.
                (_, _, "3") => assert!(by_caller >= 0.0, "{cells:?}"),
                _ => assert!(by_caller >= 0.5, "{cells:?}"),
            }
            // The loaded rows' sessions were grown a moment before, by
            // turns of many spans: their blocks fall due for packing
            // within the ten admissions each session makes, so each
            // admission reads up to a block's rows more.
            match request {
                "no-op" => assert!(keys == 0.0 && bytes == 0.0 && reads == 0.0, "{cells:?}"),
                "admit" if clients != "1" => assert!(
                    (2.0..=3.5).contains(&keys) && bytes > 0.0 && (1.5..4.0).contains(&reads),
                    "{cells:?}"
                ),
                "admit" => assert!(
                    (2.0..=3.5).contains(&keys) && bytes > 0.0 && (1.5..2.5).contains(&reads),
                    "{cells:?}"
                ),
                _ => assert!(
                    (3.0..=4.5).contains(&keys) && bytes > 0.0 && (2.5..3.5).contains(&reads),
                    "{cells:?}"
                ),
            }
        }
    }

    // The CSV: one line per request of every row printed, each row's count
    // the table's.
    let mut per_row: HashMap<(String, String), usize> = HashMap::new();
    for line in csv_lines(&csv, "row,server,compacted,latency_us") {
        let (name, rest) = line
            .strip_prefix('"')
            .and_then(|l| l.split_once("\",\""))
            .unwrap_or_else(|| panic!("{line:?}"));
        let (server, rest) = rest.split_once("\",").unwrap_or_else(|| panic!("{line:?}"));
        let (compacted, latency) = rest.split_once(',').unwrap_or_else(|| panic!("{line:?}"));
        assert!(compacted == "0" || compacted == "1", "{line:?}");
        let us = number(latency);
        assert!(us > 0.0 && us < 60e6, "{line:?}");
        *per_row
            .entry((name.to_owned(), server.to_owned()))
            .or_default() += 1;
    }
    let mut printed = 0;
    for ((name, server), n) in &per_row {
        let cells = row(&out, name, Some(server));
        assert_eq!(cells[3], n.to_string(), "{name}, {server}: {cells:?}");
        printed += 1;
    }
    let expected = if redis_installed() { 9 } else { 8 };
    assert_eq!(printed, expected, "rows in the CSV: {per_row:?}");
}

#[test]
fn admit_split_prints_every_stage_for_every_size() {
    let out = bench(&[
        "admit",
        "--split-only",
        "--split-sizes",
        "200,2000",
        "--split-admissions",
        "50",
        "--split-warmup",
        "5",
        "--split-mix-turns",
        "40",
    ]);
    let header = out
        .lines()
        .find(|line| line.starts_with("| live spans |"))
        .unwrap_or_else(|| panic!("no header in:\n{out}"));
    let columns: Vec<&str> = header.trim_matches('|').split('|').map(str::trim).collect();
    assert_eq!(
        columns,
        [
            "live spans",
            "live spans at the end",
            "parse µs",
            "count µs",
            "classify µs",
            "plan µs",
            "write µs",
            "apply µs",
            "encode µs",
            "total µs",
            "total p99 µs",
        ]
    );
    for (size, after) in [("200", "255"), ("2000", "2055")] {
        let cells = row(&out, size, None);
        assert_eq!(cells.len(), columns.len(), "{cells:?}");
        assert_eq!(cells[1], after, "one span per admission: {cells:?}");
        let stages: Vec<f64> = cells[2..9].iter().map(|c| number(c)).collect();
        assert!(stages.iter().all(|us| *us > 0.0), "{cells:?}");
        // Medians of the stages need not add up to the median of their
        // sums exactly; 5 % and the rounding of eight cells.
        let (total, p99) = (number(cells[9]), number(cells[10]));
        let sum: f64 = stages.iter().sum();
        assert!(
            total >= 0.95 * sum - 0.04,
            "total {total} < stages {sum}: {cells:?}"
        );
        assert!(total <= p99, "{cells:?}");
    }
    assert!(
        out.contains("flat: total p50 at 2000 live spans ÷ at 200"),
        "{out}"
    );
    assert!(out.contains("wall-clock time only"), "{out}");
    // The per-byte table: every stage, then the sum of the daemon's four.
    assert!(out.contains("passes over 40 turns"), "{out}");
    let stages = [
        "count (o200k_base)",
        "facts' seed (texts of 1 KiB or more)",
        "term vector",
        "facts read from the seeds",
        "facts derived from the text (reference)",
    ];
    let mut per_byte = Vec::new();
    for stage in stages {
        let cells = row(&out, stage, None);
        assert_eq!(cells.len(), 3, "{cells:?}");
        let (ns, us) = (number(cells[1]), number(cells[2]));
        assert!(ns > 0.0 && us > 0.0, "{cells:?}");
        per_byte.push(ns);
    }
    let cells = row(&out, "an admission's four stages above", None);
    let sum: f64 = per_byte[..4].iter().sum();
    assert!(
        (number(cells[1]) - sum).abs() <= 0.03,
        "{cells:?} against {per_byte:?}"
    );
    // Only the split: no daemon row.
    assert!(!out.contains("no-op GetServerInfo"), "{out}");
}

#[test]
fn watch_delivers_every_marker_and_compares_a_stalled_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("watch.csv");
    let out = bench(&[
        "watch",
        "--watchers",
        "20",
        "--connections",
        "2",
        "--admitters",
        "2",
        "--rate",
        "40",
        "--duration",
        "1",
        "--stalled-turns",
        "30",
        "--stalled-rounds",
        "1",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    for phase in ["no watchers", "20 watchers"] {
        let cells = row(&out, phase, None);
        assert!(number(cells[1]) > 5.0, "too few admissions: {cells:?}");
        assert!(number(cells[2]) > 0.0, "no markers: {cells:?}");
        assert!(number(cells[3]) > 0.0, "{cells:?}");
        assert_eq!(cells[7], "0", "errors: {cells:?}");
    }
    let delivery = row(&out, "from the admitting client's send", None);
    let (got, expected) = delivery[1].split_once(" of ").unwrap();
    assert_eq!(got, expected, "lost deliveries: {delivery:?}");
    assert!(number(got) >= 20.0, "{delivery:?}");
    assert!(number(delivery[2]) > 0.0, "{delivery:?}");
    assert!(
        out.contains("every marker reached every watcher: yes"),
        "{out}"
    );
    for name in ["no watcher", "one stalled watcher"] {
        let cells = row(&out, name, None);
        assert_eq!(cells[1], "30", "{cells:?}");
        assert!(number(cells[2]) > 0.0, "{cells:?}");
    }
    assert!(out.contains("stalled ÷ none: p50"), "{out}");

    // The CSV: one line per delivery counted in the table; from the send
    // is never less than from the reply, which came after the send.
    let lines = csv_lines(&csv, "watcher,seq,from_send_us,from_reply_us");
    assert_eq!(lines.len().to_string(), got, "{delivery:?}");
    for line in &lines {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), 4, "{line:?}");
        assert!(number(cells[0]) < 20.0, "{line:?}");
        assert!(number(cells[1]) >= 1.0, "{line:?}");
        let (send, reply) = (number(cells[2]), number(cells[3]));
        assert!(send > 0.0 && send < 60e6, "{line:?}");
        assert!(send >= reply, "{line:?}");
    }
}

#[test]
fn stalled_watcher_still_runs_on_its_own() {
    let out = bench(&["stalled-watcher", "30", "1"]);
    let cells = row(&out, "one stalled watcher", None);
    assert_eq!(cells[1], "30", "{cells:?}");
}
