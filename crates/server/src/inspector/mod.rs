//! The context inspector: read-only pages that show what a session's
//! window holds, served beside `/metrics` when `inspector` is set.
//!
//! | path | page | JSON twin |
//! |---|---|---|
//! | `/inspect` | the sessions, a page at a time (`after`, `limit`) | `/inspect/api/sessions` |
//! | `/inspect/session?id=` | a session: its window bar, its live spans (`from`, `limit`), its markers newest first (`markers_before`) with a chart of live tokens over turns | `/inspect/api/session` |
//! | `/inspect/archive?id=` | its archived spans by id (`after`, `limit`), or one turn's (`turn`) | `/inspect/api/archive` |
//! | `/inspect/span?id=&span=` | one span, its text whole | `/inspect/api/span` |
//! | `/inspect/api/events?id=` | | server-sent events: the session's markers as they commit |
//! | `/inspect/login` | the token form, when the daemon has a token file | |
//!
//! The pages are plain HTML rendered here (every text escaped by the
//! template engine), with one stylesheet and one script served by the
//! daemon itself; the static views need no script. The session page's
//! script follows the live events: each new marker joins the timeline and
//! the window's numbers are read again, without a reload. An event stream
//! ends itself before the endpoint's connection deadline, and the browser
//! reconnects with the last sequence it saw (`Last-Event-ID`), so nothing
//! is missed or repeated across the reconnect.
//!
//! Callers are authenticated as gRPC callers are (see [`access`]); every
//! role may read, and a tenant's token sees its own sessions only, named
//! by their bare ids: another tenant's session is not found.

mod access;
mod live;
mod page;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use ctxbroker_store::SpanState;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::auth::Tokens;
use crate::blocking;
use crate::broker::SharedBroker;
use crate::error::ApiError;
use crate::hub::Hub;
use crate::tenant::Scope;
use crate::validate;

use access::Access;
use view::{
    ArchiveView, MarkerItem, MarkerPage, SessionItem, SessionList, SessionView, SpanItem, SpanPage,
    SpanView, TEXT_CHARS, WindowBar,
};

/// Sessions per list page: the default and the most.
const SESSIONS_PAGE: (u64, u64) = (100, 1000);
/// Live spans per session page: the default and the most.
const SPANS_PAGE: (u64, u64) = (200, 1000);
/// Markers per session page: the default and the most.
const MARKERS_PAGE: (u64, u64) = (50, 500);
/// Archived spans per page: the default and the most.
const ARCHIVE_PAGE: (u64, u64) = (100, 1000);
/// The most markers of all sessions one page walks to find a session's.
const MARKER_SCAN: usize = 100_000;

/// The inspector's routes and what they read.
#[derive(Clone)]
pub struct Inspector {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("access", &self.inner.access)
            .field("secure", &self.inner.secure)
            .field("max_live", &self.inner.max_live)
            .finish_non_exhaustive()
    }
}

struct Inner {
    broker: SharedBroker,
    hub: Hub,
    access: Access,
    /// Served over TLS: the login cookie is `Secure`.
    secure: bool,
    /// Live event streams open at once.
    live: Arc<Semaphore>,
    max_live: usize,
    shutdown: CancellationToken,
}

impl Inspector {
    /// An inspector over `broker`'s sessions and `hub`'s markers. `tokens`
    /// is the token file in force (none: every caller is an operator);
    /// `secure` says the endpoint serves TLS; at most `max_live` event
    /// streams are open at once; `shutdown` ends them.
    pub fn new(
        broker: SharedBroker,
        hub: Hub,
        tokens: Option<Arc<Tokens>>,
        secure: bool,
        max_live: usize,
        shutdown: CancellationToken,
    ) -> Inspector {
        let max_live = max_live.max(1);
        Inspector {
            inner: Arc::new(Inner {
                broker,
                hub,
                access: tokens.map_or(Access::Open, Access::Tokens),
                secure,
                live: Arc::new(Semaphore::new(max_live)),
                max_live,
                shutdown,
            }),
        }
    }

    /// The routes, under `/inspect`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/inspect", get(sessions_page))
            .route("/inspect/", get(|| async { Redirect::to("/inspect") }))
            .route("/inspect/session", get(session_page))
            .route("/inspect/archive", get(archive_page))
            .route("/inspect/span", get(span_page))
            .route("/inspect/api/sessions", get(sessions_json))
            .route("/inspect/api/session", get(session_json))
            .route("/inspect/api/archive", get(archive_json))
            .route("/inspect/api/span", get(span_json))
            .route("/inspect/api/events", get(events))
            .route(
                "/inspect/login",
                get(login_page)
                    .post(login)
                    .layer(DefaultBodyLimit::max(4 << 10)),
            )
            .route("/inspect/logout", axum::routing::post(logout))
            .route("/inspect/assets/inspector.css", get(page::stylesheet))
            .route("/inspect/assets/inspector.js", get(page::script))
            .layer(axum::middleware::map_response(page::guarded))
            .with_state(self)
    }
}

/// The query parameters any view takes; each view reads its own.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Params {
    id: Option<String>,
    after: Option<String>,
    limit: Option<String>,
    from: Option<String>,
    markers_before: Option<String>,
    turn: Option<String>,
    span: Option<String>,
    from_seq: Option<String>,
}

/// A refusal: its status and what to tell the caller.
#[derive(Debug, Clone)]
struct Problem {
    status: StatusCode,
    message: String,
}

impl Problem {
    fn bad(message: impl Into<String>) -> Problem {
        Problem {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// An error of the broker as a caller in `scope` reads it.
    fn of(err: ApiError, scope: &Scope) -> Problem {
        let status: tonic::Status = err.localized(scope).into();
        let code = match status.code() {
            tonic::Code::NotFound => StatusCode::NOT_FOUND,
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
            tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
            tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Problem {
            status: code,
            message: status.message().to_owned(),
        }
    }

    fn json(&self) -> Response {
        let body = serde_json::json!({
            "error": { "status": self.status.as_u16(), "message": self.message }
        });
        let mut response = (self.status, json_body(&body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"ctxbroker\""),
            );
        }
        response
    }
}

/// A JSON answer.
fn json_body(value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the view could not be written as JSON: {err}\n"),
        )
            .into_response(),
    }
}

/// A whole number parameter within `[1, max]`, or its default when it is
/// absent or empty.
fn number(field: &str, value: &Option<String>, default: u64, max: u64) -> Result<u64, Problem> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(default),
        Some(text) => match text.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(Problem::bad(format!(
                "`{field}` must be a whole number from 1 to {max}; got {text:?}"
            ))),
        },
    }
}

/// An optional whole number parameter (an index, a sequence, a turn).
fn position(field: &str, value: &Option<String>) -> Result<Option<u64>, Problem> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => text.parse::<u64>().map(Some).map_err(|_| {
            Problem::bad(format!(
                "`{field}` must be a whole number from 0 to {}; got {text:?}",
                u64::MAX
            ))
        }),
    }
}

impl Inspector {
    fn broker(&self) -> &SharedBroker {
        &self.inner.broker
    }

    /// The scope of the caller of a request, or why it is refused.
    fn scope(&self, headers: &HeaderMap) -> Result<Scope, Problem> {
        self.inner
            .access
            .caller(headers)
            .map(|caller| caller.scope())
            .map_err(|refused| Problem {
                status: StatusCode::UNAUTHORIZED,
                message: refused.0,
            })
    }

    /// A view read as the caller of a request with `headers` sees it.
    async fn read<'a, T, F>(
        &'a self,
        headers: &HeaderMap,
        params: &'a Params,
        view: impl FnOnce(&'a Inspector, Scope, &'a Params) -> F,
    ) -> Result<T, Problem>
    where
        F: Future<Output = Result<T, Problem>> + 'a,
    {
        let scope = self.scope(headers)?;
        view(self, scope, params).await
    }

    /// The full id of the session the `id` parameter names, checked as
    /// the gRPC API checks it for a caller in `scope`.
    fn full_id(&self, scope: &Scope, params: &Params) -> Result<String, Problem> {
        let Some(id) = params.id.as_deref().filter(|id| !id.is_empty()) else {
            return Err(Problem::bad("`id` is required: the session's id"));
        };
        self.named(scope, "id", id)
    }

    /// The full id of the session a caller in `scope` names `id` in
    /// `field`.
    fn named(&self, scope: &Scope, field: &str, id: &str) -> Result<String, Problem> {
        validate::named_session_id(scope, field, id, self.broker().limits())
            .map_err(|bad| Problem::bad(format!("`{}` {}", bad.field, bad.description)))?;
        Ok(scope.full_id(id).into_owned())
    }

    async fn sessions(&self, scope: Scope, params: &Params) -> Result<SessionList, Problem> {
        let scope = &scope;
        let limit = number("limit", &params.limit, SESSIONS_PAGE.0, SESSIONS_PAGE.1)? as usize;
        let after = match params.after.as_deref().filter(|a| !a.is_empty()) {
            Some(after) => Some(self.named(scope, "after", after).map_err(|_| {
                Problem::bad("`after` must be a session id from the previous page")
            })?),
            None => None,
        };
        let mut records = self
            .broker()
            .list_sessions(scope.prefix(), after, limit + 1)
            .await
            .map_err(|err| Problem::of(err, scope))?;
        let more = records.len() > limit;
        records.truncate(limit);
        let sessions: Vec<SessionItem> =
            records.iter().map(|r| SessionItem::of(r, scope)).collect();
        let next_after = more
            .then(|| sessions.last().map(|s| s.id.clone()))
            .flatten();
        Ok(SessionList {
            sessions,
            next_after,
        })
    }

    async fn session(&self, scope: Scope, params: &Params) -> Result<SessionView, Problem> {
        let scope = &scope;
        let full = self.full_id(scope, params)?;
        let from = position("from", &params.from)?.unwrap_or(0);
        let limit = number("limit", &params.limit, SPANS_PAGE.0, SPANS_PAGE.1)?;
        let before = position("markers_before", &params.markers_before)?;
        let store = self.broker().store().clone();
        // Read before the session: a marker committed after this point is
        // in the live events, one committed before it in the page (or in
        // both, which the script tells apart by sequence).
        let next_seq = store.marker_bounds().next;
        let (record, spans) = self
            .broker()
            .context(&full)
            .await
            .map_err(|err| Problem::of(err, scope))?;
        let window = WindowBar::of(&record, spans.iter().map(|(span, _)| span));
        let total = spans.len();
        let start = usize::try_from(from).unwrap_or(usize::MAX).min(total);
        let end = start.saturating_add(limit as usize).min(total);
        let items = spans[start..end]
            .iter()
            .map(|(span, relevance)| SpanItem::of(span, Some(*relevance), TEXT_CHARS))
            .collect();
        let markers = {
            let full = full.clone();
            blocking::read(&store, move |store| {
                store.session_markers(&full, before, MARKERS_PAGE.0 as usize, MARKER_SCAN)
            })
            .await
            .map_err(|err| Problem::of(err, scope))?
        };
        Ok(SessionView {
            session: SessionItem::of(&record, scope),
            window,
            spans: SpanPage {
                from: start,
                limit: limit as usize,
                total,
                items,
                next_from: (end < total).then_some(end),
            },
            markers: MarkerPage {
                items: markers
                    .markers
                    .iter()
                    .map(|m| MarkerItem::of(m, scope))
                    .collect(),
                before: markers.before,
            },
            next_seq,
        })
    }

    async fn archive(&self, scope: Scope, params: &Params) -> Result<ArchiveView, Problem> {
        let scope = &scope;
        let full = self.full_id(scope, params)?;
        let turn = position("turn", &params.turn)?;
        let after = position("after", &params.after)?;
        let limit = number("limit", &params.limit, ARCHIVE_PAGE.0, ARCHIVE_PAGE.1)? as usize;
        let filter = ctxbroker_core::search::SpanFilter {
            from_turn: turn,
            to_turn: turn,
            standing: Some(ctxbroker_core::search::Standing::Archived),
            ..Default::default()
        };
        let listing = {
            let full = full.clone();
            blocking::read(self.broker().store(), move |store| {
                store.list_spans(&full, &filter, after, limit)
            })
            .await
            .map_err(|err| Problem::of(err, scope))?
        };
        let items: Vec<SpanItem> = listing
            .spans
            .iter()
            .map(|stored| {
                let mut item = SpanItem::of(&stored.span, None, TEXT_CHARS);
                if let SpanState::Archived { by_seq } = stored.state {
                    item.archived_by_seq = Some(by_seq);
                }
                item
            })
            .collect();
        let next_after = listing.more.then(|| items.last().map(|s| s.id)).flatten();
        Ok(ArchiveView {
            session_id: params.id.clone().unwrap_or_default(),
            turn,
            items,
            next_after,
        })
    }

    async fn span(&self, scope: Scope, params: &Params) -> Result<SpanView, Problem> {
        let scope = &scope;
        let full = self.full_id(scope, params)?;
        let Some(span_id) = position("span", &params.span)? else {
            return Err(Problem::bad("`span` is required: the span's id"));
        };
        let stored = self
            .broker()
            .span(&full, span_id)
            .await
            .map_err(|err| Problem::of(err, scope))?;
        let mut item = SpanItem::of(&stored.span, None, usize::MAX);
        let live = match stored.state {
            SpanState::Live => true,
            SpanState::Archived { by_seq } => {
                item.archived_by_seq = Some(by_seq);
                false
            }
        };
        Ok(SpanView {
            session_id: params.id.clone().unwrap_or_default(),
            live,
            span: item,
        })
    }
}

/// A page: the view rendered, or the problem as a page, or the login form
/// for a caller who is not logged in.
fn html<T>(
    inspector: &Inspector,
    result: Result<T, Problem>,
    render: fn(&T, bool) -> maud::Markup,
) -> Response {
    let login = inspector.inner.access.required();
    match result {
        Ok(view) => render(&view, login).into_response(),
        Err(problem) if problem.status == StatusCode::UNAUTHORIZED => (
            StatusCode::UNAUTHORIZED,
            page::login(login, Some(&problem.message)),
        )
            .into_response(),
        Err(problem) => (
            problem.status,
            page::problem(problem.status, &problem.message),
        )
            .into_response(),
    }
}

/// A JSON twin: the view, or the problem, as JSON.
fn json<T: serde::Serialize>(result: Result<T, Problem>) -> Response {
    match result {
        Ok(view) => json_body(&view),
        Err(problem) => problem.json(),
    }
}

/// A view's page and its JSON twin: both read the view with `$read` as
/// the request's caller sees it; the page renders it with `$render`.
macro_rules! page_and_twin {
    ($page:ident, $twin:ident, $read:ident, $render:path) => {
        async fn $page(
            State(inspector): State<Inspector>,
            headers: HeaderMap,
            Query(params): Query<Params>,
        ) -> Response {
            let result = inspector.read(&headers, &params, Inspector::$read).await;
            html(&inspector, result, $render)
        }

        async fn $twin(
            State(inspector): State<Inspector>,
            headers: HeaderMap,
            Query(params): Query<Params>,
        ) -> Response {
            json(inspector.read(&headers, &params, Inspector::$read).await)
        }
    };
}

page_and_twin!(sessions_page, sessions_json, sessions, page::sessions);
page_and_twin!(session_page, session_json, session, page::session);
page_and_twin!(archive_page, archive_json, archive, page::archive);
page_and_twin!(span_page, span_json, span, page::span);

/// `/inspect/api/events`: the session's markers as server-sent events.
async fn events(
    State(inspector): State<Inspector>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Response {
    let scope = match inspector.scope(&headers) {
        Ok(scope) => scope,
        Err(problem) => return problem.json(),
    };
    match live::open(&inspector, scope, &headers, &params).await {
        Ok(response) => response,
        Err(problem) => problem.json(),
    }
}

/// `GET /inspect/login`.
async fn login_page(State(inspector): State<Inspector>) -> Response {
    page::login(inspector.inner.access.required(), None).into_response()
}

/// The login form's fields.
#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

/// `POST /inspect/login`: checks the token and sets it as the cookie.
async fn login(State(inspector): State<Inspector>, Form(form): Form<LoginForm>) -> Response {
    let access = &inspector.inner.access;
    let token = form.token.trim();
    let refuse = |status: StatusCode, message: &str| {
        (status, page::login(access.required(), Some(message))).into_response()
    };
    if !access.required() {
        return Redirect::to("/inspect").into_response();
    }
    if !access::cookie_safe(token) {
        let message = format!(
            "`token` must be 1 to {} visible ASCII characters without `;`, `,`, quotes or backslashes",
            access::MAX_TOKEN_BYTES
        );
        return refuse(StatusCode::BAD_REQUEST, &message);
    }
    if let Err(refused) = access.login(token) {
        return refuse(StatusCode::UNAUTHORIZED, &refused.0);
    }
    let mut response = Redirect::to("/inspect").into_response();
    if let Some(cookie) = access::set_cookie(Some(token), inspector.inner.secure) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `POST /inspect/logout`: forgets the cookie.
async fn logout(State(inspector): State<Inspector>) -> Response {
    let mut response = Redirect::to("/inspect/login").into_response();
    if let Some(cookie) = access::set_cookie(None, inspector.inner.secure) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}
