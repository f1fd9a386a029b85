//! The Redis baseline: `redis-server` from the system's packages in a child
//! process on a free loopback port, with a temporary directory and
//! `appendonly yes`, `appendfsync always` (a reply only after its write is
//! fsynced; Redis fsyncs once per event-loop pass, so concurrent clients
//! share fsyncs, as the daemon's share flushes), no snapshots. Spoken to in
//! RESP over plain TCP.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::common::Failure;
use crate::daemon::wait_for_exit;

/// How long redis-server may take to answer PING.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// A redis-server child process. Dropping it kills it and removes its data.
#[derive(Debug)]
pub struct RedisProcess {
    /// Where it serves.
    pub addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

/// Why there is no Redis row.
#[derive(Debug)]
pub enum Unavailable {
    /// `redis-server` is not on PATH.
    NotInstalled,
    /// It is, but it did not start.
    Failed(String),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::NotInstalled => write!(
                f,
                "redis-server is not on PATH (Debian: apt-get install -y redis-server)"
            ),
            Unavailable::Failed(why) => write!(f, "redis-server did not start: {why}"),
        }
    }
}

impl RedisProcess {
    /// Starts redis-server and waits until it answers PING.
    pub async fn start() -> Result<RedisProcess, Unavailable> {
        let found = std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| dir.join("redis-server").is_file())
        });
        if !found {
            return Err(Unavailable::NotInstalled);
        }
        let fail =
            |what: &str, err: &dyn std::fmt::Display| Unavailable::Failed(format!("{what}: {err}"));
        let dir = tempfile::tempdir().map_err(|e| fail("temporary directory", &e))?;
        // A port the kernel just gave out and took back: free unless
        // something else grabs it in between, which a retry covers.
        let mut last = String::new();
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| fail("picking a port", &e))?
                .port();
            let mut child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .arg("--dir")
                .arg(dir.path())
                .args([
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--save",
                    "",
                    "--daemonize",
                    "no",
                    "--protected-mode",
                    "no",
                ])
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| fail("spawning redis-server", &e))?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let started = Instant::now();
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    let log =
                        std::fs::read_to_string(dir.path().join("redis.log")).unwrap_or_default();
                    last = format!("exited with {status}: {}", log.lines().last().unwrap_or(""));
                    break;
                }
                if let Ok(mut conn) = RespConn::connect(addr).await
                    && conn.ping().await.is_ok()
                {
                    return Ok(RedisProcess {
                        addr,
                        child,
                        _dir: dir,
                    });
                }
                if started.elapsed() > START_DEADLINE {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = format!("no answer to PING within {START_DEADLINE:?}");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Err(Unavailable::Failed(last))
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis-server --version`'s first line.
    pub fn version() -> String {
        Command::new("redis-server")
            .arg("--version")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|text| text.trim().to_owned())
            .unwrap_or_default()
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        if !wait_for_exit(&mut self.child, Duration::from_secs(10)) {
            eprintln!("redis-server (pid {}) did not exit", self.child.id());
        }
    }
}

/// One RESP connection.
#[derive(Debug)]
pub struct RespConn {
    stream: BufReader<TcpStream>,
    out: Vec<u8>,
    line: String,
}

impl RespConn {
    /// Connects, with Nagle off as the daemon's connections have it.
    pub async fn connect(addr: SocketAddr) -> Result<RespConn, Failure> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RespConn {
            stream: BufReader::new(stream),
            out: Vec::new(),
            line: String::new(),
        })
    }

    /// PING; Ok on PONG.
    pub async fn ping(&mut self) -> Result<(), Failure> {
        self.stream
            .get_mut()
            .write_all(b"*1\r\n$4\r\nPING\r\n")
            .await?;
        let reply = self.reply().await?;
        if reply == "+PONG" {
            Ok(())
        } else {
            Err(format!("PING answered {reply:?}").into())
        }
    }

    /// `RPUSH key value`; the list's new length.
    pub async fn rpush(&mut self, key: &str, value: &[u8]) -> Result<u64, Failure> {
        self.out.clear();
        self.out.extend_from_slice(b"*3\r\n$5\r\nRPUSH\r\n");
        bulk(&mut self.out, key.as_bytes());
        bulk(&mut self.out, value);
        self.stream.get_mut().write_all(&self.out).await?;
        let reply = self.reply().await?;
        match reply.strip_prefix(':') {
            Some(n) => Ok(n.parse()?),
            None => Err(format!("RPUSH answered {reply:?}").into()),
        }
    }

    /// One reply line, without its CRLF. Errors (`-ERR ...`) are failures.
    async fn reply(&mut self) -> Result<String, Failure> {
        self.line.clear();
        let n = self.stream.read_line(&mut self.line).await?;
        if n == 0 {
            return Err("redis closed the connection".into());
        }
        let reply = self.line.trim_end_matches(['\r', '\n']);
        if let Some(err) = reply.strip_prefix('-') {
            return Err(format!("redis: {err}").into());
        }
        Ok(reply.to_owned())
    }
}

/// Appends a RESP bulk string.
fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(bytes.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}
