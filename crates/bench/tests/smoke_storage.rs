//! `storage` on a tiny workload: it populates a daemon in a child process
//! (this package's own binary, serving through `storage serve`, since cargo
//! builds `ctxbrokerd` only for the root package's tests), restarts it,
//! reads everything back, and reports every figure.
#![allow(missing_docs)]

use std::path::PathBuf;

use ctxbroker_bench::storage::{DaemonProgram, StorageOptions, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_reports_every_figure_on_a_tiny_workload() {
    let program = DaemonProgram::Bench(PathBuf::from(env!("CARGO_BIN_EXE_ctxbroker-bench")));
    let options = StorageOptions {
        sessions: 20,
        spans: 50,
        turn_spans: 16,
        clients: 2,
        restarts: 2,
        sample: 5,
        ..StorageOptions::new(program)
    };
    let report = run(&options).await.unwrap();

    assert_eq!(report.spans_admitted, 1_000);
    assert_eq!(report.markers, 0, "nothing compacts in this workload");
    // Every span came back, byte for byte, after the restarts.
    assert_eq!(report.sessions_verified, 20);
    assert_eq!(report.spans_read_back, 1_000);
    assert_eq!(report.text_bytes_read_back, report.raw_text_bytes);
    // Plausible texts: 80 to 2,000 bytes each.
    assert!((80_000..2_000_000).contains(&report.raw_text_bytes));

    assert!(report.populate > std::time::Duration::ZERO);
    assert!(report.memory_populated.rss > 0);
    assert!(report.memory_populated.hwm >= report.memory_populated.rss);
    assert!(report.memory_sample.rss > 0 && report.memory_verified.rss > 0);
    assert!(report.disk_populated.file_bytes > report.raw_text_bytes);
    assert!(report.disk_populated.allocated_bytes > 0 && report.disk_populated.files > 0);
    assert!(report.disk_final.file_bytes > 0);
    assert_eq!(report.restarts.len(), 2);
    for restart in &report.restarts {
        assert!(restart.serving > std::time::Duration::ZERO);
        assert!(restart.first_context >= restart.serving);
        assert!(restart.memory_serving.rss > 0);
    }

    let rendered = report.render();
    for figure in [
        "daemon RSS, end of populate",
        "daemon RSS after restart, serving",
        "daemon RSS after reading 5 sessions",
        "daemon RSS after reading 20 sessions",
        "data dir, sum of file sizes",
        "data dir, allocated (du)",
        "restart to serving (GetServerInfo), median of 2",
        "restart to first GetContext, median of 2",
        "20 sessions, 1000 spans",
    ] {
        assert!(
            rendered.contains(figure),
            "{figure} missing from:\n{rendered}"
        );
    }
}
