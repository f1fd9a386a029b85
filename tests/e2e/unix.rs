//! Serving on a Unix domain socket (`--listen-unix`, docs/security.md):
//! plaintext to the socket's owner only, the file removed at a clean stop,
//! a stale file replaced, a live one or a file that is not a socket left
//! alone and the start refused.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;
use hyper_util::rt::TokioIo;
use pb::context_broker_client::ContextBrokerClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::support::{refused_start, span, window};

/// A channel over the Unix socket at `path`.
async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

fn daemon(socket: &Path, data: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
    command
        .arg("--listen-unix")
        .arg(socket)
        .arg("--data-dir")
        .arg(data)
        .env("CTXBROKER_LOG", "warn");
    command
}

/// A daemon killed if the test ends without stopping it.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a daemon on `socket` and waits until it answers there.
async fn start(socket: &Path, data: &Path) -> (Running, ContextBrokerClient<Channel>) {
    let mut running = Running(
        daemon(socket, data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ctxbrokerd starts"),
    );
    let began = Instant::now();
    loop {
        if let Ok(channel) = unix_channel(socket).await {
            let mut client = ContextBrokerClient::new(channel);
            if client
                .get_server_info(pb::GetServerInfoRequest {})
                .await
                .is_ok()
            {
                return (running, client);
            }
        }
        assert!(running.0.try_wait().unwrap().is_none(), "the daemon exited");
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "not serving within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn terminate(running: &mut Running) {
    let child = &mut running.0;
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: a signal to the child this test started.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, libc::SIGTERM)
    };
    let status = child.wait().unwrap();
    assert!(status.success(), "a clean stop: {status:?}");
}

fn paths() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ctxbroker.sock");
    let data = dir.path().join("data");
    (dir, socket, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_serves_plaintext_to_its_owner_and_goes_at_a_clean_stop() {
    let (_dir, socket, data) = paths();
    let (mut child, mut client) = start(&socket, &data).await;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "owner-only: {mode:o}");

    client
        .create_session(pb::CreateSessionRequest {
            session_id: "over-uds".into(),
            config: Some(window(4_000)),
        })
        .await
        .unwrap();
    let admitted = client
        .admit(pb::AdmitRequest {
            session_id: "over-uds".into(),
            spans: vec![span(pb::Role::User, "Keep every answer under ten lines.")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admitted.turn, 1);

    terminate(&mut child);
    assert!(
        !socket.exists(),
        "the socket file is removed at a clean stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_is_replaced_and_a_live_one_or_a_file_is_refused() {
    let (dir, socket, data) = paths();
    // A socket file nobody serves: what a killed daemon leaves.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let (mut child, _client) = start(&socket, &data).await;

    // A second daemon on the same socket path (another data directory).
    let (status, stderr) = refused_start(
        daemon(&socket, &dir.path().join("other")),
        "a second daemon served on a live socket",
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("another process serves on this socket"),
        "{stderr}"
    );
    assert!(socket.exists(), "the live socket is left alone");
    terminate(&mut child);

    // A regular file at the path.
    std::fs::write(&socket, "not a socket").unwrap();
    let (status, stderr) = refused_start(daemon(&socket, &data), "served over a regular file");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "not a socket");
}

#[test]
fn tls_on_a_unix_socket_is_refused_by_name() {
    let (dir, socket, data) = paths();
    let mut command = daemon(&socket, &data);
    let cert = dir.path().join("cert.pem");
    command
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&cert);
    let (status, stderr) = refused_start(command, "served TLS on a Unix socket");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("listen_unix"), "{stderr}");
    assert!(stderr.contains("TCP listeners"), "{stderr}");
}
