//! The session page's live events: its markers as they commit, as
//! server-sent events read from the same hub as the gRPC watch.
//!
//! | event | id | data |
//! |---|---|---|
//! | `marker` | its seq | the marker, as the session view's JSON has it |
//! | `caught-up` | the seq below the next | the next seq: every marker before it was sent |
//! | `gap` | | `{"next":…, "oldest":…}`: retention removed markers the stream had not sent; reload the page |
//! | `end` | | why the stream cannot go on |
//!
//! A stream starts after the id of `Last-Event-ID` (a reconnecting
//! browser's), else at `from_seq`, else at the next marker. It ends
//! itself after [`LIVE_FOR`], inside the endpoint's connection deadline;
//! the browser reconnects after the `retry` the stream sent and resumes
//! from the last id it received.

use std::collections::HashSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::view::MarkerItem;
use super::{Inspector, Params, Problem, position};
use crate::error::ApiError;
use crate::hub::{FeedEnd, FeedEvent, FeedStart, MarkerFeed};
use crate::tenant::Scope;

/// How long one event stream lasts: less than the endpoint's connection
/// deadline (30 s), so that it ends cleanly and the browser resumes.
pub(crate) const LIVE_FOR: Duration = Duration::from_secs(25);
/// How long a browser waits before it reconnects.
const RETRY: Duration = Duration::from_millis(500);
/// How often an idle stream sends a comment, so that proxies keep it.
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// Events buffered per stream before the stream's task waits.
const BUFFER: usize = 16;

/// Opens a session's event stream for a caller in `scope`.
pub(super) async fn open(
    inspector: &Inspector,
    scope: Scope,
    headers: &HeaderMap,
    params: &Params,
) -> Result<Response, Problem> {
    let full = inspector.full_id(&scope, params)?;
    let resume = match headers.get("last-event-id") {
        Some(value) => {
            let text = value.to_str().unwrap_or("");
            let seen = text.trim().parse::<u64>().map_err(|_| {
                Problem::bad(format!(
                    "`Last-Event-ID` must be a marker sequence; got {text:?}"
                ))
            })?;
            Some(seen.saturating_add(1))
        }
        None => position("from_seq", &params.from_seq)?,
    };
    let start = resume.map_or(FeedStart::Now, FeedStart::Seq);
    // The session must exist (and be the caller's): a stream of a session
    // that is not there would wait forever.
    inspector
        .broker()
        .session(&full)
        .await
        .map_err(|err| Problem::of(err, &scope))?;
    let inner = &inspector.inner;
    let Ok(permit) = inner.live.clone().try_acquire_owned() else {
        let mut response = Problem {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!(
                "{} live pages are open, the most the daemon serves at once; try again shortly",
                inner.max_live
            ),
        }
        .json();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return Ok(response);
    };
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(BUFFER);
    let first = Event::default()
        .retry(RETRY)
        .comment("ctxbroker live events");
    let store = inspector.broker().store().clone();
    match MarkerFeed::open(&inner.hub, store, start, Some(HashSet::from([full]))) {
        Ok(feed) => {
            let feed = feed.within(scope.prefix());
            let shutdown = inner.shutdown.clone();
            // The send of the first event cannot fail: the channel is new.
            let _ = tx.try_send(Ok(first));
            tokio::spawn(async move {
                let _permit = permit;
                follow(feed, scope, tx, shutdown).await;
            });
        }
        Err(ApiError::MarkerOutOfRange { requested, oldest }) => {
            let _ = tx.try_send(Ok(first));
            let _ = tx.try_send(Ok(gap(requested, oldest)));
        }
        Err(err) => return Err(Problem::of(err, &scope)),
    }
    let stream =
        Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE));
    let mut response = stream.into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// Sends the feed's events until the stream's time is up, the browser
/// goes, the daemon stops or the feed ends.
async fn follow(
    mut feed: MarkerFeed,
    scope: Scope,
    tx: mpsc::Sender<Result<Event, Infallible>>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let deadline = tokio::time::sleep(LIVE_FOR);
    tokio::pin!(deadline);
    loop {
        let next = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            () = &mut deadline => return,
            () = tx.closed() => return,
            next = feed.next_event() => next,
        };
        let (event, last) = match next {
            Ok(FeedEvent::Marker(marker)) => {
                let item = MarkerItem::of(&marker, &scope);
                let data = serde_json::to_string(&item).unwrap_or_else(|_| "{}".to_owned());
                let event = Event::default()
                    .id(marker.seq.to_string())
                    .event("marker")
                    .data(data);
                (event, false)
            }
            Ok(FeedEvent::CaughtUp(next)) => {
                let event = Event::default()
                    .id(next.saturating_sub(1).to_string())
                    .event("caught-up")
                    .data(next.to_string());
                (event, false)
            }
            Err(FeedEnd::OutOfRange { next, oldest }) => (gap(next, oldest), true),
            Err(FeedEnd::Closed { .. }) => return,
            Err(FeedEnd::Store(err)) => {
                let message = tonic::Status::from(err.localized(&scope))
                    .message()
                    .to_owned();
                (Event::default().event("end").data(message), true)
            }
        };
        if tx.send(Ok(event)).await.is_err() || last {
            return;
        }
    }
}

/// The event that says markers were trimmed before they were sent.
fn gap(next: u64, oldest: u64) -> Event {
    Event::default()
        .event("gap")
        .data(format!("{{\"next\":{next},\"oldest\":{oldest}}}"))
}
