//! `--listen-fd` naming a descriptor the daemon cannot serve on: a closed
//! number, a regular file, a UDP socket, a TCP socket that is connected
//! rather than listening, a negative number. Each gets the clean error on
//! stderr and exit code 1, never an abort (the daemon used to take
//! ownership before checking, then closed a descriptor it did not own and
//! died of an I/O-safety abort).

#![allow(unsafe_code)]

use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;

use ctxbroker_server::socket::inherit_as;

use crate::support::refused_start;

/// The number the daemon is told to serve on.
const TARGET: i32 = 3;

/// Starts the daemon with `--listen-fd fd_arg`, `handed` (if any) placed at
/// fd 3 of the child, and returns its exit status and stderr.
fn start_with_fd(fd_arg: &str, handed: Option<&OwnedFd>) -> (std::process::ExitStatus, String) {
    let data = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command
        .arg(format!("--listen-fd={fd_arg}"))
        .arg("--data-dir")
        .arg(data.path().join("data"))
        .env("CTXBROKER_LOG", "warn");
    if let Some(fd) = handed {
        let raw = fd.as_raw_fd();
        // SAFETY: only fcntl/dup2 between fork and exec (async-signal-safe).
        unsafe {
            command.pre_exec(move || inherit_as(raw, TARGET));
        }
    }
    refused_start(
        command,
        &format!("the daemon served on --listen-fd {fd_arg}"),
    )
}

#[test]
fn a_descriptor_that_is_not_a_listening_socket_is_refused_cleanly() {
    let file = tempfile::tempfile().unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let connected = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let refused = "ctxbrokerd: cannot listen: fd";
    let cases: Vec<(&str, &str, Option<OwnedFd>, i32, &str)> = vec![
        ("closed", "987", None, 1, "fd 987 is not open"),
        (
            "regular file",
            "3",
            Some(file.into()),
            1,
            "fd 3 is not a socket",
        ),
        (
            "udp socket",
            "3",
            Some(udp.into()),
            1,
            "fd 3 is not a stream socket",
        ),
        (
            "connected, not listening",
            "3",
            Some(connected.into()),
            1,
            "but not listening",
        ),
        // Refused as a flag, before anything is looked at.
        ("negative", "-1", None, 2, "--listen-fd"),
    ];
    for (name, fd_arg, handed, code, expected) in &cases {
        let (status, stderr) = start_with_fd(fd_arg, handed.as_ref());
        assert_eq!(
            status.signal(),
            None,
            "{name}: the daemon died of a signal ({status}): {stderr}"
        );
        assert_eq!(status.code(), Some(*code), "{name}: {stderr}");
        assert!(
            (*code != 1 || stderr.contains(refused)) && stderr.contains(expected),
            "{name}: {expected:?} not in {stderr}"
        );
        assert!(
            !stderr.contains("fatal runtime error"),
            "{name}: aborted: {stderr}"
        );
    }
    drop(listener);
}
