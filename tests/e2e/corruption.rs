//! Damage to the data directory is detected, never served as valid: a
//! flipped bit in the middle of the engine's log, or a truncated log, used
//! to come back as an older store with the writes after the damage gone
//! and nothing said. The daemon now refuses to start on it, naming what
//! was lost and the way out.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::Role;

use crate::support::*;

/// A way to damage the bytes of the engine's log.
type Harm = dyn Fn(&mut Vec<u8>);

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Runs the daemon on `dir` and expects it to refuse to start: returns
/// what it wrote to stderr.
fn refused_on(dir: &Path) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir);
    let (status, stderr) = refused_start(
        command,
        &format!(
            "the daemon started on a damaged directory {}",
            dir.display()
        ),
    );
    assert!(!status.success(), "exit status {status:?}");
    stderr
}

#[tokio::test]
async fn a_damaged_log_is_refused_not_served_older() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "kept", window(100_000)).await;
    for n in 1..=50 {
        let text = format!(
            "acknowledged record number {n:02} of the session, with a path src/file_{n}.rs"
        );
        admit(&mut client, "kept", vec![span(Role::Tool, &text)])
            .await
            .unwrap();
    }
    assert!(daemon.terminate(Duration::from_secs(20)).success());

    let scratch = tempfile::tempdir().unwrap();
    let engine_log = |dir: &Path| dir.join("db");
    let damage: [(&str, &Harm); 2] = [
        ("a flipped bit", &|bytes: &mut Vec<u8>| {
            let at = find(bytes, b"record number 25 ").expect("the record in the log");
            bytes[at + 3] ^= 0x01;
        }),
        ("a truncated log", &|bytes: &mut Vec<u8>| {
            let at = find(bytes, b"record number 25 ").expect("the record in the log");
            bytes.truncate(at);
        }),
    ];
    for (what, harm) in damage {
        let dir = scratch.path().join(what.replace(' ', "-"));
        copy_dir(daemon.data_dir(), &dir);
        let mut bytes = std::fs::read(engine_log(&dir)).unwrap();
        harm(&mut bytes);
        std::fs::write(engine_log(&dir), bytes).unwrap();
        let stderr = refused_on(&dir);
        assert!(
            stderr.contains("lost acknowledged writes"),
            "{what}: {stderr}"
        );
        assert!(stderr.contains("commit-epoch"), "{what}: {stderr}");
    }

    // The undamaged directory serves every acknowledged record.
    daemon.restart().await;
    let mut client = daemon.client().await;
    let ctx = context(&mut client, "kept").await;
    assert_eq!(ctx.spans.len(), 50);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
