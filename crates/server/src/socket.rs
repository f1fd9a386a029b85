//! The listening socket: bound by the daemon, or handed over by a parent
//! (`--listen-fd`, systemd's `LISTEN_FDS`). Both sides of the hand-over
//! live here: [`Socket::settle`] checks an inherited descriptor before
//! taking it, and [`hand_over`] is how a parent (a test, the benchmark, a
//! supervisor written in Rust) passes its listener to a child.

use std::path::{Path, PathBuf};
use std::process::Command;

use tokio::net::TcpListener;
#[cfg(unix)]
use tokio::net::UnixListener;

use crate::config::Listen;
use crate::server::ServerError;

/// The descriptor number a parent hands its listener over as, and the
/// `--listen-fd` it then names (systemd's first socket is fd 3 too).
pub const HANDED_OVER_FD: i32 = 3;

/// Where the daemon will serve, settled before the runtime starts: an
/// inherited descriptor is checked and taken over first, so nothing the
/// daemon opens later can be confused with it.
#[derive(Debug)]
pub enum Socket {
    /// A listening socket handed over by the parent (`--listen-fd`, or
    /// systemd's `LISTEN_FDS` protocol), checked and owned.
    Inherited(std::net::TcpListener),
    /// An address to bind once the runtime runs.
    Bind(std::net::SocketAddr),
    /// A Unix socket path to bind once the runtime runs.
    Unix(PathBuf),
}

/// A bound, listening socket the daemon serves gRPC on.
#[derive(Debug)]
pub enum Listener {
    /// TCP: plaintext on loopback, TLS or an opt-in elsewhere.
    Tcp(TcpListener),
    /// A Unix domain socket: plaintext, owner-only. The daemon removes
    /// the socket file when it stops.
    #[cfg(unix)]
    Unix {
        /// The listener.
        listener: UnixListener,
        /// Its path.
        path: PathBuf,
    },
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::Tcp(listener)
    }
}

impl Listener {
    /// The TCP address, for a TCP listener.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Listener::Tcp(listener) => listener.local_addr().ok(),
            #[cfg(unix)]
            Listener::Unix { .. } => None,
        }
    }

    /// The socket file, for a Unix listener.
    pub fn unix_path(&self) -> Option<&Path> {
        match self {
            Listener::Tcp(_) => None,
            #[cfg(unix)]
            Listener::Unix { path, .. } => Some(path),
        }
    }
}

impl Socket {
    /// Takes over the inherited descriptor named by `listen` (or by
    /// systemd), or notes the address to bind. A descriptor that is
    /// closed, not a socket, or not a listening TCP socket is refused with
    /// a clear error and left untouched.
    pub fn settle(listen: &Listen) -> Result<Socket, ServerError> {
        match listen {
            Listen::Fd(fd) => inherited(*fd).map(Socket::Inherited),
            Listen::Unix(path) => Ok(Socket::Unix(path.clone())),
            Listen::Addr(addr) => match systemd_fd() {
                Some(fd) => inherited(fd).map(Socket::Inherited),
                None => Ok(Socket::Bind(*addr)),
            },
        }
    }

    /// The listening socket, registered with the running runtime.
    pub async fn listen(self) -> Result<Listener, ServerError> {
        match self {
            Socket::Inherited(listener) => {
                listener
                    .set_nonblocking(true)
                    .map_err(ServerError::Listen)?;
                TcpListener::from_std(listener)
                    .map(Listener::Tcp)
                    .map_err(ServerError::Listen)
            }
            Socket::Bind(addr) => TcpListener::bind(addr)
                .await
                .map(Listener::Tcp)
                .map_err(ServerError::Listen),
            Socket::Unix(path) => bind_unix(path).await,
        }
    }
}

/// Binds a Unix socket at `path`. A socket file left by a daemon that did
/// not stop cleanly is replaced; a path where something still answers, or
/// that is not a socket, is refused and left as it is.
#[cfg(unix)]
async fn bind_unix(path: PathBuf) -> Result<Listener, ServerError> {
    use std::os::unix::fs::FileTypeExt;
    let refuse = |why: String| {
        ServerError::Listen(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("listen_unix {}: {why}", path.display()),
        ))
    };
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if tokio::net::UnixStream::connect(&path).await.is_ok() {
                return Err(refuse(
                    "another process serves on this socket; stop it or choose another path".into(),
                ));
            }
            std::fs::remove_file(&path).map_err(|err| {
                refuse(format!("a stale socket file could not be removed: {err}"))
            })?;
        }
        Ok(_) => {
            return Err(refuse(
                "exists and is not a socket; it is left as it is".into(),
            ));
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(refuse(format!("cannot be inspected: {err}"))),
    }
    // The process's umask (077, set at start) makes the socket owner-only
    // from its creation; read and write for the owner is all it needs.
    let listener = UnixListener::bind(&path).map_err(|err| refuse(err.to_string()))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|err| refuse(format!("cannot make the socket owner-only: {err}")))?;
    Ok(Listener::Unix { listener, path })
}

#[cfg(not(unix))]
async fn bind_unix(path: PathBuf) -> Result<Listener, ServerError> {
    Err(ServerError::Listen(std::io::Error::other(format!(
        "listen_unix {}: Unix sockets are only served on unix",
        path.display()
    ))))
}

/// fd 3 when systemd passed exactly one socket to this very process.
fn systemd_fd() -> Option<i32> {
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    let fds: u32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    (pid == std::process::id() && fds == 1).then_some(HANDED_OVER_FD)
}

#[cfg(unix)]
#[allow(unsafe_code)]
fn inherited(fd: i32) -> Result<std::net::TcpListener, ServerError> {
    use std::os::fd::{BorrowedFd, FromRawFd};
    let refuse = |why: String| {
        ServerError::Listen(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("fd {fd} {why}"),
        ))
    };
    if fd < 0 {
        return Err(refuse("is not a descriptor".into()));
    }
    // SAFETY: F_GETFD only reads the descriptor table; on a closed number it
    // fails with EBADF and touches nothing.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        let err = std::io::Error::last_os_error();
        return Err(refuse(format!("is not open: {err}")));
    }
    // SAFETY: the descriptor is open (checked just above) and stays open
    // while it is borrowed: nothing in this function closes it, and no
    // other thread of the process runs yet.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let socket = socket2::SockRef::from(&borrowed);
    let kind = socket
        .r#type()
        .map_err(|err| refuse(format!("is not a socket: {err}")))?;
    if kind != socket2::Type::STREAM {
        return Err(refuse("is not a stream socket".into()));
    }
    let local = socket
        .local_addr()
        .map_err(|err| refuse(format!("is not a bound socket: {err}")))?;
    let Some(addr) = local.as_socket() else {
        return Err(refuse("is not a TCP socket (not IPv4 or IPv6)".into()));
    };
    if !socket
        .is_listener()
        .map_err(|err| refuse(format!("cannot be inspected: {err}")))?
    {
        return Err(refuse(format!("is bound to {addr} but not listening")));
    }
    // SAFETY: the caller handed this descriptor to the process to own (it
    // said so with --listen-fd or LISTEN_FDS), and the checks above proved
    // it an open, listening TCP socket; from here on it is closed exactly
    // once, by the listener.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    // Not inherited by anything the daemon might start.
    let _ = socket2::SockRef::from(&listener).set_cloexec(true);
    Ok(listener)
}

#[cfg(not(unix))]
fn inherited(fd: i32) -> Result<std::net::TcpListener, ServerError> {
    Err(ServerError::Listen(std::io::Error::other(format!(
        "inheriting fd {fd} is only supported on unix"
    ))))
}

/// Makes `command` serve `listener`: the child finds it at fd
/// [`HANDED_OVER_FD`], without close-on-exec, and is told so with
/// `--listen-fd`. The parent keeps its listener, so a restarted child can
/// be handed the same socket and clients keep the address.
#[cfg(unix)]
#[allow(unsafe_code)]
pub fn hand_over(command: &mut Command, listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = listener.as_raw_fd();
    command.arg("--listen-fd").arg(HANDED_OVER_FD.to_string());
    // SAFETY: the closure runs between fork and exec and calls only fcntl
    // and dup2, which are async-signal-safe.
    unsafe {
        command.pre_exec(move || inherit_as(fd, HANDED_OVER_FD));
    }
}

/// In a child between fork and exec: makes `fd` available as `target`
/// across exec. `dup2` gives a copy without close-on-exec, but when the
/// two numbers are equal it changes nothing, so the flag is cleared by
/// hand (without this, a parent whose listener happened to be fd 3 started
/// a daemon without its socket).
#[cfg(unix)]
#[allow(unsafe_code)]
pub fn inherit_as(fd: i32, target: i32) -> std::io::Result<()> {
    // SAFETY: fcntl and dup2 on descriptors of this process.
    unsafe {
        if fd == target {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        } else if libc::dup2(fd, target) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
