//! The test process's own listener is fd 3, the very number the daemon is
//! told to serve on. `dup2(3, 3)` changes nothing, so handing it over used
//! to leave close-on-exec set: the daemon started without its socket and
//! then aborted. This runs without the test harness so that nothing opens
//! a descriptor before the listener takes fd 3.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub,
    unsafe_code
)]

#[path = "e2e/support.rs"]
mod support;

use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd};

use ctxbroker_proto::v1 as pb;
use support::{Daemon, admit, context, create, span, window};

/// A listener at exactly fd 3, whatever the process had open before.
fn listener_at_fd3() -> TcpListener {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let fd = listener.as_raw_fd();
    if fd == 3 {
        return listener;
    }
    // fd 3 is taken by something inherited: keep that open under another
    // number, then put the listener at 3.
    // SAFETY: plain descriptor calls on this process's own descriptors,
    // before any other thread exists.
    unsafe {
        if libc::fcntl(3, libc::F_GETFD) >= 0 {
            assert!(libc::fcntl(3, libc::F_DUPFD_CLOEXEC, 10) >= 0);
        }
        assert_eq!(libc::dup2(fd, 3), 3);
        drop(listener);
        let moved = TcpListener::from_raw_fd(3);
        libc::fcntl(3, libc::F_SETFD, libc::FD_CLOEXEC);
        moved
    }
}

fn main() {
    let listener = listener_at_fd3();
    assert_eq!(listener.as_raw_fd(), 3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let temp = tempfile::tempdir().unwrap();
        let mut daemon = Daemon::start_on(
            listener,
            temp.path().join("data"),
            temp.path().join("ctxbrokerd.log"),
            None,
            &[],
        )
        .await;
        let mut client = daemon.client().await;
        create(&mut client, "fd3", window(4_000)).await;
        admit(
            &mut client,
            "fd3",
            vec![span(pb::Role::User, "Never write to the prod namespace.")],
        )
        .await
        .unwrap();
        // The same socket, at fd 3 again, survives a restart.
        daemon.restart().await;
        let mut client = daemon.client().await;
        let live = context(&mut client, "fd3").await;
        assert_eq!(live.spans.len(), 1, "{live:?}");
        drop(daemon);
        drop(temp);
    });
    println!("fd3: 1 passed, 0 failed");
}
