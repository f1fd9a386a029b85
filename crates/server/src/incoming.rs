//! The gRPC connections, from `accept` to the hand-over to tonic: a cap on
//! how many are open ([`Gate`]), a deadline by which each must have
//! finished its TLS handshake (when TLS is on) and sent the HTTP/2
//! preface, and TLS itself with the certificate in force at that moment.
//!
//! Only connections that spoke in time reach tonic; the others are closed
//! when their deadline passes, or sooner when the cap is reached and a new
//! connection takes the place of the oldest of them.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::{debug, warn};

use crate::coalesce::Stash;
use crate::socket::Listener;
use crate::tls::Tls;

/// What every HTTP/2 connection starts with (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Pause after an accept error other than a failed connection (out of
/// descriptors, say), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// The most often a warning about refused connections is logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A cap on open connections. A connection holds a [`Slot`] from accept
/// to close; until it [`spoke`](Slot::spoke) (finished its handshake, or
/// sent its request) it may be displaced: when every slot is taken, a new
/// connection takes the slot of the oldest one that has not spoken yet,
/// which is closed. When every open connection has spoken, the new one is
/// refused. Silent clients therefore cannot keep working ones out.
#[derive(Debug, Clone)]
pub struct Gate {
    state: Arc<Mutex<GateState>>,
}

#[derive(Debug)]
struct GateState {
    cap: usize,
    open: usize,
    /// Slots not yet spoken, oldest first.
    waiting: VecDeque<Arc<Entry>>,
}

#[derive(Debug, Default)]
struct Entry {
    displaced: CancellationToken,
    /// The slot's place in `open` was given back (closed) or handed to a
    /// newer connection (displaced).
    released: AtomicBool,
}

/// One connection's place under a [`Gate`].
#[derive(Debug)]
pub struct Slot {
    gate: Gate,
    entry: Arc<Entry>,
}

impl Gate {
    /// A gate letting at most `cap` connections be open (at least one).
    pub fn new(cap: usize) -> Gate {
        Gate {
            state: Arc::new(Mutex::new(GateState {
                cap: cap.max(1),
                open: 0,
                waiting: VecDeque::new(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection: a free one, or the one of the oldest
    /// connection that has not spoken (which is told to close); `None`
    /// when every open connection has spoken.
    pub fn admit(&self) -> Option<Slot> {
        let entry = Arc::new(Entry::default());
        let mut state = self.lock();
        if state.open < state.cap {
            state.open += 1;
        } else {
            let oldest = loop {
                let oldest = state.waiting.pop_front()?;
                if !oldest.released.swap(true, Ordering::AcqRel) {
                    break oldest;
                }
            };
            oldest.displaced.cancel();
        }
        state.waiting.push_back(entry.clone());
        drop(state);
        Some(Slot {
            gate: self.clone(),
            entry,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().open
    }
}

impl Slot {
    /// The connection has spoken: it can no longer be displaced.
    pub fn spoke(&self) {
        let mut state = self.gate.lock();
        state
            .waiting
            .retain(|entry| !Arc::ptr_eq(entry, &self.entry));
    }

    /// Resolves when a newer connection took this slot.
    pub async fn displaced(&self) {
        self.entry.displaced.cancelled().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state
            .waiting
            .retain(|entry| !Arc::ptr_eq(entry, &self.entry));
        if !self.entry.released.swap(true, Ordering::AcqRel) {
            state.open = state.open.saturating_sub(1);
        }
    }
}

/// Logs refusals at most every [`WARN_EVERY`], with how many there were.
#[derive(Debug)]
pub struct Throttled {
    what: &'static str,
    last: Option<Instant>,
    since: u64,
}

impl Throttled {
    /// A throttle for warnings about `what`.
    pub fn new(what: &'static str) -> Throttled {
        Throttled {
            what,
            last: None,
            since: 0,
        }
    }

    /// Counts one refusal and warns when the last warning is old enough.
    pub fn refused(&mut self, cap: usize) {
        self.since += 1;
        if self.last.is_none_or(|last| last.elapsed() >= WARN_EVERY) {
            warn!(
                refused = self.since,
                cap, "{}: connection cap reached; refusing new connections", self.what
            );
            self.last = Some(Instant::now());
            self.since = 0;
        }
    }
}

/// How the gRPC connections are held to account.
#[derive(Debug, Clone)]
pub struct Hardening {
    /// The time a connection has to finish its TLS handshake and send the
    /// HTTP/2 preface.
    pub handshake_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

/// A transport: TCP or a Unix socket, plain or with TLS over it.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

type Transport = Box<dyn Io>;

/// A connection handed to tonic: its preface already read (and replayed
/// first), its slot held until it is dropped.
pub struct Conn {
    transport: Transport,
    /// The preface, replayed before anything else is read.
    replay: &'static [u8],
    /// Small writes held back for the next large one (see `coalesce`).
    stash: Stash,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    _slot: Slot,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.replay.is_empty() {
            let n = this.replay.len().min(buf.remaining());
            let (now, later) = this.replay.split_at(n);
            buf.put_slice(now);
            this.replay = later;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.transport).poll_read(cx, buf)
    }
}

/// Writes pass through a [`Stash`], and the connection takes no vectored
/// writes, so that h2 keeps a reply of a few hundred bytes in one write
/// with its trailers (see `coalesce`).
impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.stash.poll_write(&mut this.transport, cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.stash.poll_drain(&mut this.transport, cx))?;
        Pin::new(&mut this.transport).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.stash.poll_drain(&mut this.transport, cx))?;
        Pin::new(&mut this.transport).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// The connections of `listener` that spoke in time, for tonic's
/// `serve_with_incoming`. Accepting stops, and the listener is closed,
/// when `stop` fires.
pub fn incoming(
    listener: Listener,
    tls: Option<Arc<Tls>>,
    hardening: Hardening,
    gate: Gate,
    stop: CancellationToken,
) -> ReceiverStream<io::Result<Conn>> {
    let (ready, stream) = mpsc::channel(256);
    tokio::spawn(accept_loop(listener, tls, hardening, gate, stop, ready));
    ReceiverStream::new(stream)
}

/// The next connection of `listener`, with the peer's address for TCP.
async fn accept(listener: &Listener) -> io::Result<(Transport, Option<SocketAddr>)> {
    match listener {
        Listener::Tcp(tcp) => {
            let (stream, remote) = tcp.accept().await?;
            let _ = stream.set_nodelay(true);
            Ok((Box::new(stream), Some(remote)))
        }
        #[cfg(unix)]
        Listener::Unix { listener, .. } => {
            let (stream, _) = listener.accept().await?;
            Ok((Box::new(stream), None))
        }
    }
}

async fn accept_loop(
    listener: Listener,
    tls: Option<Arc<Tls>>,
    hardening: Hardening,
    gate: Gate,
    stop: CancellationToken,
    ready: mpsc::Sender<io::Result<Conn>>,
) {
    let local = listener.local_addr();
    let mut refusals = Throttled::new("gRPC");
    loop {
        let accepted = tokio::select! {
            accepted = accept(&listener) => accepted,
            () = stop.cancelled() => break,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                warn!(%err, "gRPC: accept failed; pausing before the next accept");
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    () = stop.cancelled() => break,
                }
            }
        };
        let Some(slot) = gate.admit() else {
            refusals.refused(hardening.max_connections);
            drop(stream);
            continue;
        };
        let peer = Peer(remote);
        let tls = tls.clone();
        let ready = ready.clone();
        let stop = stop.clone();
        let timeout = hardening.handshake_timeout;
        tokio::spawn(async move {
            let opened = tokio::select! {
                opened = tokio::time::timeout(timeout, open(stream, tls.as_deref())) => opened,
                () = slot.displaced() => {
                    debug!(%peer, "closed a connection still in its handshake: the connection cap was reached");
                    return;
                }
                () = stop.cancelled() => return,
            };
            let transport = match opened {
                Ok(Ok(transport)) => transport,
                Ok(Err(err)) => {
                    debug!(%peer, %err, "closed a connection that failed its handshake");
                    return;
                }
                Err(_) => {
                    debug!(
                        %peer,
                        timeout_ms = timeout.as_millis() as u64,
                        "closed a connection that did not finish its handshake in time"
                    );
                    return;
                }
            };
            slot.spoke();
            let conn = Conn {
                transport,
                replay: PREFACE,
                stash: Stash::default(),
                local,
                remote,
                _slot: slot,
            };
            let _ = ready.send(Ok(conn)).await;
        });
    }
}

/// A peer as the log names it: its address, or the Unix socket.
struct Peer(Option<SocketAddr>);

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(addr) => addr.fmt(f),
            None => f.write_str("unix socket peer"),
        }
    }
}

/// TLS when on, then the HTTP/2 preface, read whole.
async fn open(stream: Transport, tls: Option<&Tls>) -> io::Result<Transport> {
    let mut transport: Transport = match tls {
        Some(tls) => Box::new(tls.grpc_acceptor().accept(stream).await?),
        None => stream,
    };
    let mut preface = [0u8; PREFACE.len()];
    transport.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not HTTP/2: gRPC is served over HTTP/2 only",
        ));
    }
    Ok(transport)
}

/// Errors about one connection, not the listener: accept the next.
pub fn is_connection_error(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_gate_displaces_the_oldest_silent_slot_and_refuses_when_all_spoke() {
        let gate = Gate::new(2);
        let first = gate.admit().unwrap();
        let second = gate.admit().unwrap();
        assert_eq!(gate.open(), 2);
        second.spoke();
        // Full: the third takes the first's slot.
        let third = gate.admit().unwrap();
        assert!(first.entry.displaced.is_cancelled());
        assert!(!second.entry.displaced.is_cancelled());
        assert_eq!(gate.open(), 2);
        drop(first);
        assert_eq!(gate.open(), 2, "a displaced slot was already handed on");
        third.spoke();
        assert!(gate.admit().is_none(), "every open connection spoke");
        drop(second);
        assert_eq!(gate.open(), 1);
        let fourth = gate.admit().unwrap();
        assert_eq!(gate.open(), 2);
        drop(third);
        drop(fourth);
        assert_eq!(gate.open(), 0);
        assert!(gate.lock().waiting.is_empty());
    }
}
