//! A daemon that binds its gRPC and HTTP addresses itself (port 0) and
//! says in its log which ports it got, and a bare HTTP/1.1 exchange: what
//! the metrics and inspector tests share.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ctxbroker_proto::v1 as pb;
use pb::context_broker_client::ContextBrokerClient;
use tonic::transport::{Channel, Endpoint};

/// A daemon that bound both of its addresses itself, read from its log.
pub struct Served {
    child: Child,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Served {
    pub fn start(extra: &[&str]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ctxbrokerd"));
        for (key, _) in std::env::vars() {
            if key.starts_with("CTXBROKER_") {
                command.env_remove(key);
            }
        }
        command
            .args(["--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--log", "info", "--log-format", "text"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("ctxbrokerd starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        // Reads the log to its end, so the daemon never blocks on a full
        // pipe; the two addresses go back to the test.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                for (field, what) in [("local=", "grpc"), ("metrics_addr=", "metrics")] {
                    if (what == "grpc" && !line.contains(" serving ")) || !line.contains(field) {
                        continue;
                    }
                    let value = line.split(field).nth(1).unwrap_or_default();
                    let addr = value.split_whitespace().next().unwrap_or_default();
                    if let Ok(addr) = addr.trim_matches('"').parse::<SocketAddr>()
                        && addr.port() != 0
                    {
                        let _ = tx.send((what, addr));
                    }
                }
            }
        });
        let mut grpc = None;
        let mut metrics = None;
        while grpc.is_none() || metrics.is_none() {
            let (what, addr) = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("the daemon logs both addresses within 60 s");
            match what {
                "grpc" => grpc = Some(addr),
                _ => metrics = Some(addr),
            }
        }
        Served {
            child,
            grpc: grpc.unwrap(),
            metrics: metrics.unwrap(),
            _dir: dir,
        }
    }

    pub async fn client(&self) -> ContextBrokerClient<Channel> {
        let channel = Endpoint::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        ContextBrokerClient::new(channel)
    }

    #[allow(unsafe_code)]
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange over a plain TCP connection: status, headers
/// (lower-case names) and body.
pub fn http(addr: SocketAddr, request: &str) -> (u16, HashMap<String, String>, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete response");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect::<HashMap<_, _>>();
    if let Some(length) = headers.get("content-length")
        && !request.starts_with("HEAD ")
    {
        assert_eq!(length.parse::<usize>().unwrap(), body.len());
    }
    (status, headers, body.to_owned())
}
