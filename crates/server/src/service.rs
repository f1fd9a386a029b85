//! The `ctxbroker.v1.ContextBroker` service: validates requests, converts
//! between wire and domain, and runs the streams.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use ctxbroker_core::session::PlanId;
use ctxbroker_core::trigger;
use ctxbroker_proto::encoded::Encoded;
use ctxbroker_proto::v1 as pb;
use ctxbroker_proto::v1::context_broker_server::ContextBroker;
use ctxbroker_store::SpanState;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, ReusableBoxFuture};
use tonic::{Request, Response, Status, Streaming};
use tracing::field::Empty;
use tracing::{Instrument, Span, debug, instrument};

use crate::BuildInfo;
use crate::audit::{Action, AuditLog, Entry};
use crate::broker::{Admitted, SharedBroker, now_ms};
use crate::config::Durability;
use crate::convert::{self, marker_to_pb, session_to_pb, span_to_pb, totals_to_pb};
use crate::error::{ApiError, BadField};
use crate::hub::{FeedEnd, FeedEvent, FeedStart, Hub, MarkerFeed};
use crate::metrics::Metrics;
use crate::quota::StreamPermit;
use crate::search;
use crate::tenant::{Caller, Role, Scope};
use crate::validate;

/// What an open stream holds until it ends.
#[derive(Debug)]
struct StreamPermits {
    _server: OwnedSemaphorePermit,
    _tenant: StreamPermit,
}

/// Replies buffered per stream before the stream's task waits for the
/// client to read.
const STREAM_BUFFER: usize = 64;
/// Own markers remembered per admit stream, to keep them out of the inline
/// feed (they are already in the replies).
const OWN_MARKERS: usize = 1024;
/// The default and largest ListSessions page.
const PAGE: (usize, usize) = (100, 1000);

/// The service, cheap to clone.
#[derive(Debug, Clone)]
pub struct BrokerService {
    broker: SharedBroker,
    hub: Hub,
    streams: Arc<Semaphore>,
    shutdown: CancellationToken,
    build: BuildInfo,
    started_at_ms: u64,
    durability: Durability,
    /// Where admissions and watches are counted; nowhere until
    /// [`BrokerService::with_metrics`].
    metrics: Option<Arc<Metrics>>,
    /// Whether a request must carry a [`Caller`] (put there by the
    /// authentication layer); without one it is refused. When false, a
    /// request without one is served as [`Caller::open`].
    caller_required: bool,
    /// Where pins, unpins, approvals, deletions, exports and imports are
    /// recorded; nowhere until [`BrokerService::with_audit`].
    audit: Option<Arc<AuditLog>>,
}

impl BrokerService {
    /// A service over a broker. `shutdown` ends every stream it serves.
    pub fn new(
        broker: SharedBroker,
        hub: Hub,
        shutdown: CancellationToken,
        build: BuildInfo,
        durability: Durability,
    ) -> Self {
        let streams = Arc::new(Semaphore::new(broker.limits().max_concurrent_streams));
        BrokerService {
            broker,
            hub,
            streams,
            shutdown,
            build,
            started_at_ms: now_ms(),
            durability,
            metrics: None,
            caller_required: false,
            audit: None,
        }
    }

    /// Records the audited actions in `log`.
    pub fn with_audit(mut self, log: Arc<AuditLog>) -> Self {
        self.audit = Some(log);
        self
    }

    /// Records an audited action and how it ended; not a request refused
    /// as malformed (it named nothing the log could hold).
    async fn audit<T, E: Refusal>(
        &self,
        caller: &Caller,
        action: Action,
        session_id: &str,
        result: &Result<T, E>,
        detail: impl FnOnce(&T) -> String,
    ) {
        let Some(log) = &self.audit else {
            return;
        };
        let (refused, detail) = match result {
            Ok(reply) => (None, detail(reply)),
            Err(err) if err.code() == tonic::Code::InvalidArgument => return,
            Err(err) => (Some(err.code()), String::new()),
        };
        log.record(Entry::new(caller, action, session_id, refused, detail))
            .await;
    }

    /// Refuses every request that does not carry a [`Caller`]: set when
    /// authentication is on, so that a request that did not pass through
    /// the authentication layer is never served as an operator.
    pub fn require_caller(mut self) -> Self {
        self.caller_required = true;
        self
    }

    /// The caller of a request, as the authentication layer found it.
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Caller, ApiError> {
        match request.extensions().get::<Caller>() {
            Some(caller) => Ok(caller.clone()),
            None if !self.caller_required => Ok(Caller::open()),
            None => Err(ApiError::Unauthenticated(
                "no credentials: send `authorization: Bearer <token>`".to_owned(),
            )),
        }
    }

    /// Records admissions and watches in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The permits a stream holds for its life: one of the server's
    /// `max_concurrent_streams`, and one of its tenant's `max_streams`.
    fn stream_permit(&self, scope: &Scope) -> Result<StreamPermits, ApiError> {
        if self.shutdown.is_cancelled() {
            return Err(ApiError::ShuttingDown {
                resume_from_seq: None,
            });
        }
        let server =
            self.streams
                .clone()
                .try_acquire_owned()
                .map_err(|_| ApiError::StreamLimit {
                    max: self.broker.limits().max_concurrent_streams,
                })?;
        let tenant = self.broker.quotas().open_stream(scope.tenant_name())?;
        Ok(StreamPermits {
            _server: server,
            _tenant: tenant,
        })
    }

    /// Refuses a caller that is not an operator (the authentication layer
    /// already does; this keeps the service safe without it).
    fn operator_only<T>(&self, request: &Request<T>, rpc: &str) -> Result<(), ApiError> {
        let caller = self.caller(request)?;
        if caller.role == Role::Operator {
            Ok(())
        } else {
            Err(ApiError::PermissionDenied {
                role: caller.role.name(),
                rpc: rpc.to_owned(),
                detail: format!("{rpc} needs the operator role"),
            })
        }
    }

    /// Checks a session id as a caller in `scope` names it: a bare id for
    /// a tenant, a bare or full id for an operator.
    fn check_named(&self, scope: &Scope, field: &str, id: &str) -> Result<(), BadField> {
        validate::named_session_id(scope, field, id, self.broker.limits())
    }

    /// The full id of the session a caller in `scope` names `id`.
    fn full_id<'a>(
        &self,
        scope: &Scope,
        field: &str,
        id: &'a str,
    ) -> Result<std::borrow::Cow<'a, str>, ApiError> {
        self.check_named(scope, field, id)
            .map_err(validate::single)?;
        Ok(scope.full_id(id))
    }

    #[instrument(name = "admit", skip_all, fields(session_id = %req.session_id, turn = Empty))]
    async fn admit_one(
        &self,
        scope: &Scope,
        req: pb::AdmitRequest,
    ) -> Result<pb::AdmitResponse, ApiError> {
        let result = self.admit_checked(scope, req).await;
        if let Some(metrics) = &self.metrics {
            metrics.admission(&result);
        }
        result.map_err(|err| err.localized(scope))
    }

    async fn admit_checked(
        &self,
        scope: &Scope,
        req: pb::AdmitRequest,
    ) -> Result<pb::AdmitResponse, ApiError> {
        let mut bad = Vec::new();
        if let Err(b) = self.check_named(scope, "session_id", &req.session_id) {
            bad.push(b);
        }
        validate::turn_shape(&req.spans, self.broker.limits(), &mut bad);
        validate::finish(bad)?;
        let turn = convert::turn_from_pb(req.spans);
        let full = scope.full_id(&req.session_id);
        let admitted = self.broker.admit(&full, turn).await?;
        Span::current().record("turn", admitted.turn);
        Ok(admit_response(admitted, scope))
    }
}

/// Records the turn a session stands at on the handler's span.
fn record_turn(turn: u64) {
    Span::current().record("turn", turn);
}

fn admit_response(admitted: Admitted, scope: &Scope) -> pb::AdmitResponse {
    pb::AdmitResponse {
        spans: admitted
            .spans
            .iter()
            .map(|(s, state)| span_to_pb(s, *state, 0.0))
            .collect(),
        compaction: admitted.marker.as_ref().map(|m| marker_in(m, scope)),
        totals: Some(totals_to_pb(&admitted.record)),
        revision: admitted.record.revision,
        turn: admitted.turn,
        replayed: admitted.replayed,
    }
}

/// A marker as a caller in `scope` reads it: its session named by the id
/// the caller knows.
fn marker_in(marker: &ctxbroker_core::Marker, scope: &Scope) -> pb::CompactionMarker {
    let mut wire = marker_to_pb(marker);
    if let Some(local) = scope.local_id(&marker.session_id) {
        wire.session_id = local.to_owned();
    }
    wire
}

/// A session as a caller in `scope` reads it.
fn session_in(record: &ctxbroker_store::SessionRecord, scope: &Scope) -> pb::Session {
    let mut wire = session_to_pb(record);
    if let Some(local) = scope.local_id(&record.id) {
        wire.session_id = local.to_owned();
    }
    wire
}

/// Sends on a stream's channel unless shutdown comes first. False when the
/// stream should end.
async fn send<T>(
    out: &mpsc::Sender<Result<T, Status>>,
    item: Result<T, Status>,
    shutdown: &CancellationToken,
) -> bool {
    tokio::select! {
        biased;
        sent = out.send(item) => sent.is_ok(),
        () = shutdown.cancelled() => false,
    }
}

fn feed_end_status(end: FeedEnd) -> Status {
    match end {
        FeedEnd::OutOfRange { next, oldest } => ApiError::MarkerOutOfRange {
            requested: next,
            oldest,
        }
        .into(),
        FeedEnd::Closed { next } => ApiError::ShuttingDown {
            resume_from_seq: Some(next),
        }
        .into(),
        FeedEnd::Store(err) => err.into(),
    }
}

/// What a watch's next step found.
enum WatchStep {
    /// The feed's next event, or why it ended.
    Event(Result<FeedEvent, FeedEnd>),
    /// The daemon is shutting down.
    Shutdown,
}

/// Waits for the feed's next event unless shutdown comes first, and hands
/// the feed back with it.
async fn watch_step(mut feed: MarkerFeed, shutdown: CancellationToken) -> (MarkerFeed, WatchStep) {
    let step = tokio::select! {
        biased;
        () = shutdown.cancelled() => WatchStep::Shutdown,
        event = feed.next_event() => WatchStep::Event(event),
    };
    (feed, step)
}

/// A watch's response stream: the marker feed itself, read only when the
/// transport asks for the next message, that is when the client can take
/// it. No task and no buffer stand between the hub and the connection, so
/// a delivery costs one wake-up, and a client that stops reading stops
/// its feed, which then falls back to the log (never a lost marker).
///
/// It yields its events encoded: a marker's bytes are made by the first
/// watch that delivers it and shared by every other
/// ([`convert::watch_marker`]), so a marker costs one encoding however
/// many watchers receive it.
pub struct WatchStream {
    next: ReusableBoxFuture<'static, (MarkerFeed, WatchStep)>,
    shutdown: CancellationToken,
    /// Ended: after the shutdown status or the feed's end.
    ended: bool,
    /// Whose view the markers are encoded for.
    scope: Scope,
    /// Held for the stream's life: counts against `max_concurrent_streams`
    /// and the tenant's `max_streams`.
    _permit: StreamPermits,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl WatchStream {
    fn new(
        feed: MarkerFeed,
        scope: Scope,
        shutdown: CancellationToken,
        permit: StreamPermits,
    ) -> Self {
        WatchStream {
            next: ReusableBoxFuture::new(watch_step(feed, shutdown.clone())),
            shutdown,
            ended: false,
            scope,
            _permit: permit,
        }
    }
}

impl tokio_stream::Stream for WatchStream {
    type Item = Result<Encoded<pb::WatchCompactionsResponse>, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(None);
        }
        let Poll::Ready((feed, step)) = self.next.poll(cx) else {
            return Poll::Pending;
        };
        let event = match step {
            WatchStep::Shutdown => {
                self.ended = true;
                let status: Status = ApiError::ShuttingDown {
                    resume_from_seq: Some(feed.next_seq()),
                }
                .into();
                return Poll::Ready(Some(Err(status)));
            }
            WatchStep::Event(Ok(FeedEvent::Marker(marker))) => {
                convert::watch_marker_in(&marker, &self.scope)
            }
            WatchStep::Event(Ok(FeedEvent::CaughtUp(next_seq))) => {
                convert::watch_caught_up(next_seq)
            }
            WatchStep::Event(Err(end)) => {
                self.ended = true;
                return Poll::Ready(Some(Err(feed_end_status(end))));
            }
        };
        // The next step is set up now but runs only when polled: a client
        // that does not read leaves the feed untouched.
        let shutdown = self.shutdown.clone();
        self.next.set(watch_step(feed, shutdown));
        Poll::Ready(Some(Ok(event)))
    }
}

/// An error's gRPC code, whichever form the handler has it in.
trait Refusal {
    fn code(&self) -> tonic::Code;
}

impl Refusal for ApiError {
    fn code(&self) -> tonic::Code {
        self.parts().code
    }
}

impl Refusal for Status {
    fn code(&self) -> tonic::Code {
        Status::code(self)
    }
}

/// Runs a handler's body as a caller in `scope`: any error names sessions
/// by the ids the caller knows them by.
async fn in_scope<T>(
    scope: &Scope,
    body: impl Future<Output = Result<T, ApiError>>,
) -> Result<Response<T>, Status> {
    respond(scope, body.await)
}

/// A handler's result as a caller in `scope` receives it.
fn respond<T>(scope: &Scope, result: Result<T, ApiError>) -> Result<Response<T>, Status> {
    match result {
        Ok(reply) => Ok(Response::new(reply)),
        Err(err) => Err(err.localized(scope).into()),
    }
}

#[tonic::async_trait]
impl ContextBroker for BrokerService {
    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, turn = Empty))]
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let mut bad = Vec::new();
            if let Err(b) = self.check_named(&scope, "session_id", &req.session_id) {
                bad.push(b);
            }
            let config = validate::create_config(req.config.as_ref(), self.broker.limits());
            if let Err(ApiError::InvalidArgument(more)) = &config {
                bad.extend(more.iter().cloned());
            }
            validate::finish(bad)?;
            let full = scope.full_id(&req.session_id);
            let record = self.broker.create_session(&full, config?).await?;
            record_turn(record.turns);
            Ok(pb::CreateSessionResponse {
                session: Some(session_in(&record, &scope)),
            })
        })
        .await
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, turn = Empty))]
    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::GetSessionResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let full = self.full_id(&scope, "session_id", &req.session_id)?;
            let record = self.broker.session(&full).await?;
            record_turn(record.turns);
            Ok(pb::GetSessionResponse {
                session: Some(session_in(&record, &scope)),
            })
        })
        .await
    }

    #[instrument(skip_all)]
    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let mut bad = Vec::new();
            let page = validate::bounded("page_size", req.page_size, PAGE, &mut bad);
            validate::finish(bad)?;
            let after = if req.page_token.is_empty() {
                None
            } else {
                self.check_named(&scope, "page_token", &req.page_token)
                    .map_err(|_| {
                        validate::single(BadField::new(
                            "page_token",
                            "is not a token returned by ListSessions",
                        ))
                    })?;
                Some(scope.full_id(&req.page_token).into_owned())
            };
            let mut records = self
                .broker
                .list_sessions(scope.prefix(), after, page + 1)
                .await?;
            let next_page_token = if records.len() > page {
                records.truncate(page);
                records
                    .last()
                    .and_then(|r| scope.local_id(&r.id))
                    .unwrap_or_default()
                    .to_owned()
            } else {
                String::new()
            };
            Ok(pb::ListSessionsResponse {
                sessions: records.iter().map(|r| session_in(r, &scope)).collect(),
                next_page_token,
            })
        })
        .await
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, turn = Empty))]
    async fn update_session(
        &self,
        request: Request<pb::UpdateSessionRequest>,
    ) -> Result<Response<pb::UpdateSessionResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let full = self.full_id(&scope, "session_id", &req.session_id)?;
            let Some(patch) = req.config else {
                return Err(validate::single(BadField::new(
                    "config",
                    "is required: the fields to change",
                )));
            };
            let limits = self.broker.limits();
            let record = self
                .broker
                .update_session(&full, |current| {
                    validate::update_config(current, &patch, limits)
                })
                .await?;
            record_turn(record.turns);
            Ok(pb::UpdateSessionResponse {
                session: Some(session_in(&record, &scope)),
            })
        })
        .await
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id))]
    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        let caller = self.caller(&request)?;
        let scope = caller.scope();
        let req = request.into_inner();
        let full = scope.full_id(&req.session_id);
        let result = async {
            self.check_named(&scope, "session_id", &req.session_id)
                .map_err(validate::single)?;
            let spans_deleted = self.broker.delete_session(&full).await?;
            Ok(pb::DeleteSessionResponse { spans_deleted })
        }
        .await;
        self.audit(&caller, Action::DeleteSession, &full, &result, |r| {
            format!("{} spans deleted", r.spans_deleted)
        })
        .await;
        respond(&scope, result)
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id))]
    async fn retract_last_turn(
        &self,
        request: Request<pb::RetractLastTurnRequest>,
    ) -> Result<Response<pb::RetractLastTurnResponse>, Status> {
        let caller = self.caller(&request)?;
        let scope = caller.scope();
        let req = request.into_inner();
        let full = scope.full_id(&req.session_id);
        let result = async {
            let mut bad = Vec::new();
            if let Err(b) = self.check_named(&scope, "session_id", &req.session_id) {
                bad.push(b);
            }
            let max = self.broker.limits().max_spans_per_turn;
            let count = req.spans as usize;
            if count > max {
                bad.push(BadField::new(
                    "spans",
                    format!("must be at most max_spans_per_turn = {max}; got {count}"),
                ));
            }
            validate::finish(bad)?;
            let (spans, record) = self
                .broker
                .retract(&full, count, req.expected_revision)
                .await?;
            record_turn(record.turns);
            Ok(pb::RetractLastTurnResponse {
                spans: spans
                    .iter()
                    .map(|s| span_to_pb(s, SpanState::Live, 0.0))
                    .collect(),
                session: Some(session_in(&record, &scope)),
            })
        }
        .await;
        self.audit(&caller, Action::RetractLastTurn, &full, &result, |r| {
            let ids: Vec<String> = r.spans.iter().map(|s| s.span_id.to_string()).collect();
            format!("spans {} taken back", ids.join(","))
        })
        .await;
        respond(&scope, result)
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id))]
    async fn reset_session(
        &self,
        request: Request<pb::ResetSessionRequest>,
    ) -> Result<Response<pb::ResetSessionResponse>, Status> {
        let caller = self.caller(&request)?;
        let scope = caller.scope();
        let req = request.into_inner();
        let full = scope.full_id(&req.session_id);
        let result = async {
            self.check_named(&scope, "session_id", &req.session_id)
                .map_err(validate::single)?;
            let (record, spans_removed) = self
                .broker
                .reset_session(&full, req.expected_revision)
                .await?;
            Ok(pb::ResetSessionResponse {
                session: Some(session_in(&record, &scope)),
                spans_removed,
            })
        }
        .await;
        self.audit(&caller, Action::ResetSession, &full, &result, |r| {
            format!("{} spans removed", r.spans_removed)
        })
        .await;
        respond(&scope, result)
    }

    async fn admit(
        &self,
        request: Request<pb::AdmitRequest>,
    ) -> Result<Response<pb::AdmitResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let reply = self.admit_one(&scope, request.into_inner()).await?;
        Ok(Response::new(reply))
    }

    type AdmitStreamStream = ReceiverStream<Result<pb::AdmitStreamResponse, Status>>;

    #[instrument(skip_all)]
    async fn admit_stream(
        &self,
        request: Request<Streaming<pb::AdmitStreamRequest>>,
    ) -> Result<Response<Self::AdmitStreamStream>, Status> {
        let scope = self.caller(&request)?.scope();
        let permit = self.stream_permit(&scope)?;
        let mut inbound = request.into_inner();
        let (out, rx) = mpsc::channel(STREAM_BUFFER);
        let service = self.clone();
        let task = async move {
            let _permit = permit;
            let shutdown = service.shutdown.clone();
            let mut bound: Option<String> = None;
            let mut feed: Option<MarkerFeed> = None;
            let mut own: VecDeque<u64> = VecDeque::new();
            loop {
                let inline = async {
                    match feed.as_mut() {
                        Some(feed) => feed.next_event().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => {
                        let status: Status = ApiError::ShuttingDown { resume_from_seq: None }.into();
                        let _ = out.try_send(Err(status));
                        break;
                    }
                    message = inbound.message() => {
                        let req = match message {
                            Ok(Some(req)) => req,
                            Ok(None) => break,
                            Err(status) => {
                                debug!(%status, "admit stream ended by the client");
                                break;
                            }
                        };
                        let request_id = req.request_id;
                        let mut admit = req.admit.unwrap_or_default();
                        let event = match &bound {
                            Some(id) if !admit.session_id.is_empty() && &admit.session_id != id => {
                                Err(validate::single(BadField::new(
                                    "admit.session_id",
                                    format!("this stream is bound to session {id:?}"),
                                )))
                            }
                            _ => {
                                if let Some(id) = &bound {
                                    admit.session_id.clone_from(id);
                                }
                                service.admit_one(&scope, admit.clone()).await
                            }
                        };
                        let event = match event {
                            Ok(reply) => {
                                if bound.is_none() {
                                    bound = Some(admit.session_id.clone());
                                    let filter = HashSet::from([scope.full_id(&admit.session_id).into_owned()]);
                                    // Markers from here on; this turn's own is in the reply.
                                    feed = MarkerFeed::open(
                                        &service.hub,
                                        service.broker.store().clone(),
                                        FeedStart::Now,
                                        Some(filter),
                                    )
                                    .ok();
                                }
                                if let Some(marker) = &reply.compaction {
                                    own.push_back(marker.seq);
                                }
                                pb::admit_stream_response::Event::Admitted(reply)
                            }
                            Err(err) => {
                                if let ApiError::Escalation(esc) = &err {
                                    own.push_back(esc.marker_seq);
                                }
                                pb::admit_stream_response::Event::Error(err.to_turn_error())
                            }
                        };
                        while own.len() > OWN_MARKERS {
                            own.pop_front();
                        }
                        let reply = pb::AdmitStreamResponse { request_id, event: Some(event) };
                        if !send(&out, Ok(reply), &shutdown).await {
                            break;
                        }
                    }
                    event = inline => {
                        match event {
                            Ok(FeedEvent::Marker(marker)) => {
                                if let Some(at) = own.iter().position(|&seq| seq == marker.seq) {
                                    own.remove(at);
                                    continue;
                                }
                                let reply = pb::AdmitStreamResponse {
                                    request_id: 0,
                                    event: Some(pb::admit_stream_response::Event::Marker(marker_in(&marker, &scope))),
                                };
                                if !send(&out, Ok(reply), &shutdown).await {
                                    break;
                                }
                            }
                            Ok(FeedEvent::CaughtUp(_)) => {}
                            Err(end) => {
                                let _ = out.try_send(Err(feed_end_status(end)));
                                break;
                            }
                        }
                    }
                }
            }
        };
        tokio::spawn(task.in_current_span());
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, turn = Empty))]
    async fn get_context(
        &self,
        request: Request<pb::GetContextRequest>,
    ) -> Result<Response<pb::GetContextResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let full = self.full_id(&scope, "session_id", &req.session_id)?;
            let (record, spans) = self.broker.context(&full).await?;
            record_turn(record.turns);
            Ok(pb::GetContextResponse {
                spans: spans
                    .iter()
                    .map(|(span, relevance)| span_to_pb(span, SpanState::Live, *relevance))
                    .collect(),
                totals: Some(totals_to_pb(&record)),
                revision: record.revision,
                turn: record.turns,
            })
        })
        .await
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, span_id = request.get_ref().span_id))]
    async fn get_span(
        &self,
        request: Request<pb::GetSpanRequest>,
    ) -> Result<Response<pb::GetSpanResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let full = self.full_id(&scope, "session_id", &req.session_id)?;
            let stored = self.broker.span(&full, req.span_id).await?;
            Ok(pb::GetSpanResponse {
                span: Some(span_to_pb(&stored.span, stored.state, 0.0)),
            })
        })
        .await
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id))]
    async fn search_spans(
        &self,
        request: Request<pb::SearchSpansRequest>,
    ) -> Result<Response<pb::SearchSpansResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let full = self.full_id(&scope, "session_id", &req.session_id)?;
            let checked = search::check_search(&req)?;
            search::run_search(self.broker.store(), &full, checked).await
        })
        .await
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id))]
    async fn list_spans(
        &self,
        request: Request<pb::ListSpansRequest>,
    ) -> Result<Response<pb::ListSpansResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let full = self.full_id(&scope, "session_id", &req.session_id)?;
            let checked = search::check_listing(&req)?;
            search::run_listing(self.broker.store(), &full, checked).await
        })
        .await
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, turn = Empty))]
    async fn plan_compaction(
        &self,
        request: Request<pb::PlanCompactionRequest>,
    ) -> Result<Response<pb::PlanCompactionResponse>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        in_scope(&scope, async {
            let full = self.full_id(&scope, "session_id", &req.session_id)?;
            let (record, outcome) = self
                .broker
                .plan(
                    &full,
                    u64::from(req.incoming_tokens),
                    req.target_tokens.map(u64::from),
                )
                .await?;
            record_turn(record.turns);
            Ok(pb::PlanCompactionResponse {
                plan: Some(convert::plan_to_pb(&outcome, record.revision)),
                verification: Some(convert::verdict_to_pb(&outcome.verdict)),
            })
        })
        .await
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, turn = Empty))]
    async fn commit_compaction(
        &self,
        request: Request<pb::CommitCompactionRequest>,
    ) -> Result<Response<pb::CommitCompactionResponse>, Status> {
        let caller = self.caller(&request)?;
        let scope = caller.scope();
        let req = request.into_inner();
        let full = scope.full_id(&req.session_id);
        let planned = req.plan_id.clone();
        let result = async {
            let limits = self.broker.limits();
            let mut bad = Vec::new();
            if let Err(b) = self.check_named(&scope, "session_id", &req.session_id) {
                bad.push(b);
            }
            let plan_id = PlanId::parse(&req.plan_id);
            if plan_id.is_none() {
                bad.push(BadField::new(
                    "plan_id",
                    "is not a plan id returned by PlanCompaction",
                ));
            }
            if let Some(text) = &req.summary_text {
                validate::text("summary_text", text, limits.max_span_bytes, &mut bad);
            }
            if req.compressed_forms.len() > limits.max_spans_per_turn {
                bad.push(BadField::new(
                    "compressed_forms",
                    format!(
                        "must hold at most max_spans_per_turn = {} forms; got {}",
                        limits.max_spans_per_turn,
                        req.compressed_forms.len()
                    ),
                ));
            }
            let mut seen = HashSet::new();
            for (i, form) in req.compressed_forms.iter().enumerate() {
                validate::text(
                    &format!("compressed_forms[{i}].text"),
                    &form.text,
                    limits.max_span_bytes,
                    &mut bad,
                );
                if !seen.insert(form.span_id) {
                    bad.push(BadField::new(
                        format!("compressed_forms[{i}].span_id"),
                        format!("span {} has more than one form", form.span_id),
                    ));
                }
            }
            validate::label("actor", &req.actor, false, &mut bad);
            validate::finish(bad)?;
            let Some(plan_id) = plan_id else {
                return Err(validate::single(BadField::new("plan_id", "is malformed")));
            };
            let actor = attested_actor(&caller, &req.actor);
            let edits = convert::edits_from_pb(req.summary_text, req.compressed_forms, actor);
            let committed = self.broker.commit(&full, plan_id, edits).await?;
            record_turn(committed.record.turns);
            Ok(pb::CommitCompactionResponse {
                marker: committed.marker.as_ref().map(|m| marker_in(m, &scope)),
                totals: Some(totals_to_pb(&committed.record)),
                revision: committed.record.revision,
            })
        }
        .await;
        self.audit(&caller, Action::CommitCompaction, &full, &result, |r| {
            let seq = r.marker.as_ref().map_or(0, |m| m.seq);
            format!("plan {planned}, marker {seq}")
        })
        .await;
        respond(&scope, result)
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, turn = Empty))]
    async fn pin(
        &self,
        request: Request<pb::PinRequest>,
    ) -> Result<Response<pb::PinResponse>, Status> {
        let caller = self.caller(&request)?;
        let scope = caller.scope();
        let req = request.into_inner();
        let full = scope.full_id(&req.session_id);
        let span_id = req.span_id;
        let result = async {
            self.check_named(&scope, "session_id", &req.session_id)
                .map_err(validate::single)?;
            let predicate = req.predicate.unwrap_or_default();
            let mut bad = Vec::new();
            validate::modality("predicate", &predicate, &mut bad);
            validate::finish(bad)?;
            let predicate = convert::predicate_from_pb(predicate);
            let committed = self.broker.pin(&full, req.span_id, predicate).await?;
            record_turn(committed.record.turns);
            Ok(pb::PinResponse {
                span: committed
                    .replaced
                    .first()
                    .map(|s| span_to_pb(s, SpanState::Live, 0.0)),
            })
        }
        .await;
        self.audit(&caller, Action::Pin, &full, &result, |_| {
            format!("span {span_id}")
        })
        .await;
        respond(&scope, result)
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id, turn = Empty))]
    async fn unpin(
        &self,
        request: Request<pb::UnpinRequest>,
    ) -> Result<Response<pb::UnpinResponse>, Status> {
        let caller = self.caller(&request)?;
        let scope = caller.scope();
        let req = request.into_inner();
        let full = scope.full_id(&req.session_id);
        let (span_id, reason) = (req.span_id, req.reason.clone());
        let result = async {
            let mut bad = Vec::new();
            if let Err(b) = self.check_named(&scope, "session_id", &req.session_id) {
                bad.push(b);
            }
            // With a token, the token says who asked; without one, the
            // caller must.
            validate::label("actor", &req.actor, caller.token_id.is_none(), &mut bad);
            validate::label("reason", &req.reason, true, &mut bad);
            validate::finish(bad)?;
            let actor = attested_actor(&caller, &req.actor);
            let committed = self
                .broker
                .unpin(&full, req.span_id, &actor, &req.reason)
                .await?;
            record_turn(committed.record.turns);
            Ok(pb::UnpinResponse {
                span: committed
                    .replaced
                    .first()
                    .map(|s| span_to_pb(s, SpanState::Live, 0.0)),
                marker: committed.marker.as_ref().map(|m| marker_in(m, &scope)),
            })
        }
        .await;
        self.audit(&caller, Action::Unpin, &full, &result, |r| {
            let seq = r.marker.as_ref().map_or(0, |m| m.seq);
            format!("span {span_id}, marker {seq}, reason {reason:?}")
        })
        .await;
        respond(&scope, result)
    }

    type WatchCompactionsStream = WatchStream;

    #[instrument(skip_all)]
    async fn watch_compactions(
        &self,
        request: Request<pb::WatchCompactionsRequest>,
    ) -> Result<Response<Self::WatchCompactionsStream>, Status> {
        let scope = self.caller(&request)?.scope();
        let req = request.into_inner();
        let limits = self.broker.limits();
        let mut bad = Vec::new();
        if req.session_ids.len() > limits.max_watch_sessions {
            bad.push(BadField::new(
                "session_ids",
                format!(
                    "must hold at most {} ids; got {}",
                    limits.max_watch_sessions,
                    req.session_ids.len()
                ),
            ));
        } else {
            for (i, id) in req.session_ids.iter().enumerate() {
                if let Err(b) = self.check_named(&scope, &format!("session_ids[{i}]"), id) {
                    bad.push(b);
                }
            }
        }
        let start = match pb::WatchStart::try_from(req.start) {
            Ok(start) => convert::feed_start_from_pb(start, req.from_seq),
            Err(_) => {
                bad.push(BadField::new(
                    "start",
                    format!("unknown enum value {}", req.start),
                ));
                FeedStart::Now
            }
        };
        validate::finish(bad)?;
        let permit = self.stream_permit(&scope)?;
        let filter = (!req.session_ids.is_empty()).then(|| {
            req.session_ids
                .iter()
                .map(|id| scope.full_id(id).into_owned())
                .collect::<HashSet<_>>()
        });
        let mut feed = MarkerFeed::open(&self.hub, self.broker.store().clone(), start, filter)?
            .within(scope.prefix());
        if let Some(metrics) = &self.metrics {
            feed.track(metrics.watcher(feed.next_seq()));
        }
        Ok(Response::new(WatchStream::new(
            feed,
            scope,
            self.shutdown.clone(),
            permit,
        )))
    }

    #[instrument(skip_all)]
    async fn select_trigger(
        &self,
        request: Request<pb::SelectTriggerRequest>,
    ) -> Result<Response<pb::SelectTriggerResponse>, Status> {
        self.caller(&request)?;
        let req = request.into_inner();
        let Some(w) = req.workload else {
            return Err(validate::single(BadField::new("workload", "is required")).into());
        };
        let mut bad = Vec::new();
        if w.window_tokens == 0 {
            bad.push(BadField::new(
                "workload.window_tokens",
                "must be greater than 0",
            ));
        }
        if !(w.alpha > 0.0 && w.alpha < 1.0) {
            bad.push(BadField::new(
                "workload.alpha",
                format!("must be in the open interval (0, 1); got {}", w.alpha),
            ));
        }
        validate::finish(bad)?;
        let assessment = trigger::assess(&convert::workload_from_pb(&w));
        Ok(Response::new(pb::SelectTriggerResponse {
            recommended: convert::trigger_to_pb(assessment.recommended) as i32,
            time_based_sound: assessment.time_based_sound,
            headroom_tokens: assessment.headroom_tokens,
            reasons: assessment.reasons,
        }))
    }

    #[instrument(skip_all)]
    async fn get_server_info(
        &self,
        request: Request<pb::GetServerInfoRequest>,
    ) -> Result<Response<pb::GetServerInfoResponse>, Status> {
        self.caller(&request)?;
        let bounds = self.broker.store().marker_bounds();
        Ok(Response::new(pb::GetServerInfoResponse {
            version: self.build.version.to_owned(),
            git_commit: self.build.git_commit.to_owned(),
            contract_digest: self.build.contract_digest.to_owned(),
            limits: Some(convert::limits_to_pb(self.broker.limits())),
            tokenizers: vec![
                pb::TokenizerKind::O200kBase as i32,
                pb::TokenizerKind::Cl100kBase as i32,
                pb::TokenizerKind::Client as i32,
            ],
            started_at: Some(convert::timestamp(self.started_at_ms)),
            durability: match self.durability {
                Durability::Flush => "flush",
                Durability::Relaxed => "relaxed",
            }
            .to_owned(),
            next_marker_seq: bounds.next,
            oldest_marker_seq: bounds.oldest,
        }))
    }

    #[instrument(skip_all, fields(session_id = %request.get_ref().session_id))]
    async fn export_session(
        &self,
        request: Request<pb::ExportSessionRequest>,
    ) -> Result<Response<pb::ExportSessionResponse>, Status> {
        self.operator_only(&request, "ExportSession")?;
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        let id = req.session_id.clone();
        let result = crate::transfer::export_session(&self.broker, req).await;
        self.audit(&caller, Action::ExportSession, &id, &result, |r| {
            format!("{} bytes", r.snapshot_bytes)
        })
        .await;
        result.map(Response::new)
    }

    #[instrument(skip_all)]
    async fn import_session(
        &self,
        request: Request<pb::ImportSessionRequest>,
    ) -> Result<Response<pb::ImportSessionResponse>, Status> {
        self.operator_only(&request, "ImportSession")?;
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        let id = req
            .snapshot
            .as_ref()
            .map(|s| s.session_id.clone())
            .unwrap_or_default();
        let result = crate::transfer::import_session(&self.broker, req).await;
        self.audit(&caller, Action::ImportSession, &id, &result, |r| {
            let spans = r
                .session
                .as_ref()
                .map_or(0, |s| s.totals.as_ref().map_or(0, |t| t.live_spans));
            format!("{spans} live spans")
        })
        .await;
        result.map(Response::new)
    }
}

/// The actor a marker records: the authenticated token, and what the
/// caller said of itself when it said something. With auth off, only the
/// caller's word.
fn attested_actor(caller: &Caller, declared: &str) -> String {
    let token = caller.actor();
    match (token.is_empty(), declared.is_empty()) {
        (true, _) => declared.to_owned(),
        (false, true) => token,
        (false, false) => format!("{token} (as {declared})"),
    }
}
