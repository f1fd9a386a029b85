//! The HTTP endpoint: axum over HTTP/1.1, one request per connection.
//!
//! | request | answer |
//! |---|---|
//! | `GET`/`HEAD /metrics` (any query) | 200, the exposition as `text/plain; version=0.0.4; charset=utf-8`; 500 if the scrape failed |
//! | `GET`/`HEAD /` | 200, a pointer to `/metrics` |
//! | another method on those paths | 405, `Allow: GET, HEAD` |
//! | another path | 404 |
//! | a request head over 8 KiB | 431 |
//! | not HTTP | 400 (from hyper) |
//!
//! At most [`MAX_CONNECTIONS`] connections are served at once (more wait
//! to be accepted), and each one is cut [`CONNECTION_DEADLINE`] after it
//! was accepted, so slow or silent clients cannot hold the endpoint.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::Listener;
use ctxbroker_store::Store;
use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Metrics;

/// The longest request head (request line and headers) answered.
const MAX_REQUEST_HEAD: usize = 8 << 10;
/// Connections served at once.
const MAX_CONNECTIONS: usize = 16;
/// How long a connection may stay open, request and answer included.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(30);
/// How long connections still open at shutdown may take to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What the handlers share.
#[derive(Clone)]
struct Endpoint {
    metrics: Arc<Metrics>,
    store: Store,
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    store: Store,
    shutdown: CancellationToken,
) {
    let router = Router::new()
        .route("/metrics", get(exposition))
        .route(
            "/",
            get(|| async { "ctxbrokerd: metrics are at /metrics\n" }),
        )
        .method_not_allowed_fallback(|| async {
            (
                StatusCode::METHOD_NOT_ALLOWED,
                [(header::ALLOW, "GET, HEAD")],
                "only GET and HEAD\n",
            )
        })
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found; metrics are at /metrics\n",
            )
        })
        .layer(middleware::from_fn(one_request))
        .with_state(Endpoint { metrics, store });
    let listener = Bounded {
        listener,
        slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
    };
    let served =
        axum::serve(listener, router).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    tokio::select! {
        result = served => {
            if let Err(err) = result {
                warn!(%err, "metrics endpoint failed");
            }
        }
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {}
    }
}

/// `/metrics`: the exposition, rendered on the blocking pool, one scrape
/// at a time.
async fn exposition(State(endpoint): State<Endpoint>) -> Response {
    let Endpoint { metrics, store } = endpoint;
    let _turn = metrics.scrape.lock().await;
    let rendered = {
        let metrics = metrics.clone();
        tokio::task::spawn_blocking(move || Store::off_workers(|| metrics.render(&store))).await
    };
    let failed = match rendered {
        Ok(Ok(text)) => {
            return ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response();
        }
        Ok(Err(err)) => err.to_string(),
        Err(err) => format!("the scrape task failed: {err}"),
    };
    warn!(err = %failed, "metrics endpoint: scrape failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("scrape failed: {failed}\n"),
    )
        .into_response()
}

/// Refuses an oversized request head, and closes every connection after
/// its answer.
async fn one_request(request: Request, next: Next) -> Response {
    let head = request.uri().to_string().len()
        + request
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    let mut response = if head > MAX_REQUEST_HEAD {
        (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request head too large\n",
        )
            .into_response()
    } else {
        next.run(request).await
    };
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A listener with a bounded number of open connections, each with a
/// deadline.
struct Bounded {
    listener: TcpListener,
    slots: Arc<Semaphore>,
}

impl Listener for Bounded {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        // The semaphore is never closed, so this waits for a free slot.
        let slot = self.slots.clone().acquire_owned().await.ok();
        let (stream, addr) = Listener::accept(&mut self.listener).await;
        let connection = Connection {
            stream,
            deadline: Box::pin(tokio::time::sleep(CONNECTION_DEADLINE)),
            _slot: slot,
        };
        (connection, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An accepted connection: its reads and writes fail once its deadline
/// passed, and it frees its slot when closed.
struct Connection {
    stream: TcpStream,
    deadline: Pin<Box<Sleep>>,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Connection {
    /// `polled`, or a time-out if it waits past the deadline.
    fn in_time<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_pending() && self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        polled
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.in_time(cx, polled)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.in_time(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.in_time(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
