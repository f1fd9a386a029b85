//! What the smoke tests share: running the built bench binary.

// Not `#[test]` code: `allow-expect-in-tests` does not reach it.
#![allow(clippy::expect_used)]

use std::process::Command;

/// Runs `ctxbroker-bench ARGS` and returns its standard output; fails the
/// test on a non-zero exit, with both outputs.
pub(crate) fn bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxbroker-bench"))
        .args(args)
        .output()
        .expect("the bench binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ctxbroker-bench {args:?} failed: {}\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
