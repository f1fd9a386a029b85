//! The pages, written with maud: every text from a session is escaped by
//! the template engine, so a span that holds markup shows as text. The
//! pages load one stylesheet and one script, both served from here; no
//! inline script or style runs (the `Content-Security-Policy` of every
//! answer forbids it), and every view reads without the script.

use std::time::{Duration, UNIX_EPOCH};

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::view::{
    ArchiveView, MarkerItem, SessionItem, SessionList, SessionView, SpanItem, SpanView, WindowBar,
    class_label,
};

const STYLESHEET: &str = include_str!("assets/inspector.css");
const SCRIPT: &str = include_str!("assets/inspector.js");

/// What every answer of the inspector carries: nothing but its own files
/// may run or load, it may not be framed, and nothing is cached.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                      connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Adds the inspector's headers to an answer.
pub(super) async fn guarded(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// `/inspect/assets/inspector.css`.
pub(super) async fn stylesheet(_request: Request) -> Response {
    asset("text/css; charset=utf-8", STYLESHEET)
}

/// `/inspect/assets/inspector.js`.
pub(super) async fn script(_request: Request) -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// A value for a query string: every byte but the unreserved ones
/// percent-encoded.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A link to an inspector path with these parameters.
fn link(path: &str, params: &[(&str, String)]) -> String {
    let query: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// A time in ms since the Unix epoch, as UTC; "never" for 0.
fn when(ms: u64) -> String {
    if ms == 0 {
        return "never".to_owned();
    }
    let at = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(at)
        .to_string()
        .replace('T', " ")
        .replace('Z', " UTC")
}

/// A share of W as a percentage.
fn share(tokens: u64, window: u32) -> String {
    if window == 0 {
        return "–".to_owned();
    }
    format!("{:.1} %", tokens as f64 * 100.0 / f64::from(window))
}

/// The frame every page shares.
fn frame(title: &str, logout: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · ctxbroker inspector" }
                link rel="stylesheet" href="/inspect/assets/inspector.css";
                script src="/inspect/assets/inspector.js" defer {}
            }
            body {
                a .skip href="#main" { "Skip to the content" }
                header .top {
                    nav aria-label="Inspector" {
                        a href="/inspect" { "ctxbroker inspector" }
                        " · "
                        a href="/inspect" { "Sessions" }
                    }
                    @if logout {
                        form .logout method="post" action="/inspect/logout" {
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main #main { (body) }
            }
        }
    }
}

/// The sessions list.
pub(super) fn sessions(view: &SessionList, logout: bool) -> Markup {
    let body = html! {
        h1 { "Sessions" }
        @if view.sessions.is_empty() {
            p #no-sessions { "No sessions yet." }
        } @else {
            table #sessions {
                caption { "Sessions in id order, with their live tokens against their budgets" }
                thead {
                    tr {
                        th scope="col" { "Session" }
                        th scope="col" { "Tenant" }
                        th scope="col" { "Live / budget tokens" }
                        th scope="col" { "Pinned" }
                        th scope="col" { "Turns" }
                        th scope="col" { "Compactions" }
                        th scope="col" { "Last marker" }
                        th scope="col" { "Last activity" }
                    }
                }
                tbody {
                    @for s in &view.sessions {
                        (session_row(s))
                    }
                }
            }
        }
        @if let Some(after) = &view.next_after {
            p .pages {
                a #next-page href=(link("/inspect", &[("after", after.clone())])) { "Next page →" }
            }
        }
        p .twin { a href=(link("/inspect/api/sessions", &[])) { "This list as JSON" } }
    };
    frame("Sessions", logout, body)
}

fn session_row(s: &SessionItem) -> Markup {
    html! {
        tr {
            th scope="row" {
                a href=(link("/inspect/session", &[("id", s.id.clone())])) { (s.id) }
            }
            td { (s.tenant.as_deref().unwrap_or("—")) }
            td .num {
                meter min="0" max=(s.budget_tokens) value=(s.live_tokens)
                    aria-label=(format!("{} of {} tokens", s.live_tokens, s.budget_tokens)) {}
                " " (s.live_tokens) " / " (s.budget_tokens)
            }
            td .num { (s.pinned_spans) " (" (s.pinned_tokens) " tokens)" }
            td .num { (s.turns) }
            td .num { (s.compactions) }
            td .num { @if s.last_marker == 0 { "none" } @else { "#" (s.last_marker) } }
            td { (when(s.last_activity_ms)) }
        }
    }
}

/// A session's page.
pub(super) fn session(view: &SessionView, logout: bool) -> Markup {
    let s = &view.session;
    let id = s.id.clone();
    let events = link(
        "/inspect/api/events",
        &[("id", id.clone()), ("from_seq", view.next_seq.to_string())],
    );
    let twin = link("/inspect/api/session", &[("id", id.clone())]);
    let body = html! {
        div #session data-session-id=(id) data-events-url=(events) data-json-url=(twin)
            data-next-seq=(view.next_seq) {
            h1 { "Session " code { (id) } }
            dl .facts {
                dt { "Tenant" } dd { (s.tenant.as_deref().unwrap_or("—")) }
                dt { "Turns" } dd #turns { (s.turns) }
                dt { "Revision" } dd #revision { (s.revision) }
                dt { "Compactions" } dd #compactions { (s.compactions) }
                dt { "Archived spans" } dd {
                    a href=(link("/inspect/archive", &[("id", id.clone())])) { (s.archived_spans) }
                }
                dt { "Last activity" } dd { (when(s.last_activity_ms)) }
                @if s.approval_required {
                    dt { "Compaction" } dd .warn { "waits for a caller's approval" }
                }
            }
            p #live-status role="status" aria-live="polite" {
                "New markers appear here live with JavaScript on; without it, reload the page."
            }
            (window_section(&view.window))
            (markers_section(view))
            (spans_section(view))
            p .twin { a href=(twin) { "This page as JSON" } }
        }
    };
    frame(&format!("Session {}", s.id), logout, body)
}

fn window_section(w: &WindowBar) -> Markup {
    let width = 1000.0;
    let scale = |tokens: u64| {
        if w.window_tokens == 0 {
            0.0
        } else {
            (tokens as f64 / f64::from(w.window_tokens) * width).min(width)
        }
    };
    let mut x = 0.0;
    let bars: Vec<(String, f64, f64, u64)> = w
        .classes
        .iter()
        .map(|c| {
            let start = x;
            let len = scale(c.tokens);
            x += len;
            (c.class.to_owned(), start, len, c.tokens)
        })
        .collect();
    let summary = format!(
        "{} of {} tokens live ({}); budget {}, soft watermark {}",
        w.live_tokens,
        w.window_tokens,
        share(w.live_tokens, w.window_tokens),
        w.budget_tokens,
        w.soft_watermark_tokens
    );
    html! {
        section #window aria-labelledby="window-title" {
            h2 #window-title { "The window" }
            svg #window-bar .bar viewBox="0 0 1000 48" preserveAspectRatio="none"
                role="img" aria-label=(summary) {
                rect .bar-window x="0" y="8" width="1000" height="32" {}
                @for (class, start, len, tokens) in &bars {
                    rect id=(format!("bar-{class}")) class=(format!("c-{class}"))
                        x=(format!("{start:.2}")) y="8" width=(format!("{len:.2}")) height="32" {
                        title { (class_label(class)) ": " (tokens) " tokens" }
                    }
                }
                line #bar-soft .soft x1=(format!("{:.2}", scale(u64::from(w.soft_watermark_tokens))))
                    x2=(format!("{:.2}", scale(u64::from(w.soft_watermark_tokens)))) y1="2" y2="46" {}
                line #bar-budget .budget x1=(format!("{:.2}", scale(u64::from(w.budget_tokens))))
                    x2=(format!("{:.2}", scale(u64::from(w.budget_tokens)))) y1="0" y2="48" {}
            }
            p .legend {
                @for c in &w.classes {
                    span .key { span class=(format!("swatch c-{}", c.class)) aria-hidden="true" {} (class_label(c.class)) }
                }
                span .key { span .swatch.soft-key aria-hidden="true" {} "Soft watermark" }
                span .key { span .swatch.budget-key aria-hidden="true" {} "Budget" }
            }
            dl #window-totals .totals {
                dt { "Live tokens" } dd #live-tokens { (w.live_tokens) }
                dt { "Budget" } dd #budget-tokens { (w.budget_tokens) }
                dt { "Soft watermark" } dd #soft-watermark-tokens { (w.soft_watermark_tokens) }
                dt { "Window (W)" } dd #window-tokens { (w.window_tokens) }
            }
            table #window-numbers {
                caption { "Live tokens by class" }
                thead {
                    tr {
                        th scope="col" { "Class" }
                        th scope="col" { "Tokens" }
                        th scope="col" { "Spans" }
                        th scope="col" { "Share of W" }
                    }
                }
                tbody {
                    @for c in &w.classes {
                        tr data-class=(c.class) {
                            th scope="row" { (class_label(c.class)) }
                            td .num data-field="tokens" { (c.tokens) }
                            td .num data-field="spans" { (c.spans) }
                            td .num data-field="share" { (share(c.tokens, w.window_tokens)) }
                        }
                    }
                }
            }
        }
    }
}

fn markers_section(view: &SessionView) -> Markup {
    let id = view.session.id.clone();
    html! {
        section #timeline aria-labelledby="timeline-title" {
            h2 #timeline-title { "Compaction markers" }
            (chart(view))
            table #markers {
                caption { "Markers, newest first; aborted ones are marked" }
                thead {
                    tr {
                        th scope="col" { "Seq" }
                        th scope="col" { "Turn" }
                        th scope="col" { "When" }
                        th scope="col" { "Trigger" }
                        th scope="col" { "Outcome" }
                        th scope="col" { "Tokens before → after" }
                        th scope="col" { "Evicted" }
                        th scope="col" { "Anchors carried / dropped" }
                        th scope="col" { "Detail" }
                    }
                }
                tbody {
                    @if view.markers.items.is_empty() {
                        tr #no-markers {
                            td colspan="9" {
                                @if view.markers.before.is_some() {
                                    "None among the newest markers of the log read for this page; "
                                    "the older ones are behind the link below."
                                } @else if view.session.last_marker == 0 {
                                    "No markers yet."
                                } @else {
                                    "No markers of this session are retained."
                                }
                            }
                        }
                    }
                    @for m in &view.markers.items {
                        (marker_row(m))
                    }
                }
            }
            @if let Some(before) = view.markers.before {
                p .pages {
                    a #older-markers href=(link("/inspect/session", &[("id", id.clone()), ("markers_before", before.to_string())])) {
                        "Older markers →"
                    }
                }
            }
        }
    }
}

/// One marker's row; the script builds the same for live ones.
fn marker_row(m: &MarkerItem) -> Markup {
    let outcome_class = if m.aborted() {
        "marker aborted"
    } else {
        "marker committed"
    };
    html! {
        tr id=(format!("marker-{}", m.seq)) class=(outcome_class) data-seq=(m.seq) {
            td .num { (m.seq) " " span .sub { "(#" (m.session_seq) ")" } }
            td .num { (m.turn) }
            td { (when(m.at_ms)) }
            td { (m.trigger) }
            td .outcome { @if m.aborted() { "⚠ aborted" } @else { "committed" } }
            td .num { (m.tokens_before) " → " (m.tokens_after) }
            td .num {
                (m.evicted.len())
                @if !m.tier_evicted.is_empty() { " (" (m.tier_evicted.len()) " standing)" }
            }
            td .num { (m.anchors_carried) " / " (m.anchors_dropped) }
            td {
                (m.detail)
                @if !m.violations.is_empty() {
                    ul .violations {
                        @for v in &m.violations {
                            li { strong { (v.kind) } ": " (v.detail) }
                        }
                    }
                }
            }
        }
    }
}

/// Live tokens over turns: each marker's before and after at its turn,
/// and now; the budget and the soft watermark as lines.
fn chart(view: &SessionView) -> Markup {
    let w = &view.window;
    let mut markers: Vec<&MarkerItem> = view.markers.items.iter().filter(|m| m.turn > 0).collect();
    markers.sort_by_key(|m| (m.turn, m.seq));
    let last_turn = view.session.turns.max(1);
    let first_turn = markers.first().map_or(0, |m| m.turn.saturating_sub(1));
    let (width, height, pad) = (720.0, 200.0, 28.0);
    let top = f64::from(w.window_tokens.max(1));
    let x = |turn: u64| {
        let span = (last_turn.saturating_sub(first_turn)).max(1) as f64;
        pad + (turn.saturating_sub(first_turn)) as f64 / span * (width - 2.0 * pad)
    };
    let y = |tokens: u64| height - pad - (tokens as f64 / top).min(1.0) * (height - 2.0 * pad);
    let mut points = Vec::new();
    for m in &markers {
        points.push(format!(
            "{:.1},{:.1}",
            x(m.turn),
            y(u64::from(m.tokens_before))
        ));
        points.push(format!(
            "{:.1},{:.1}",
            x(m.turn),
            y(u64::from(m.tokens_after))
        ));
    }
    points.push(format!("{:.1},{:.1}", x(last_turn), y(w.live_tokens)));
    let label = format!(
        "Live tokens over turns {first_turn} to {last_turn}: {} markers shown, {} tokens now",
        markers.len(),
        w.live_tokens
    );
    html! {
        figure .chart {
            svg #chart viewBox=(format!("0 0 {width} {height}")) role="img" aria-label=(label) {
                line .axis x1=(pad) y1=(height - pad) x2=(width - pad) y2=(height - pad) {}
                line .axis x1=(pad) y1=(pad) x2=(pad) y2=(height - pad) {}
                line .budget x1=(pad) x2=(width - pad)
                    y1=(format!("{:.1}", y(u64::from(w.budget_tokens))))
                    y2=(format!("{:.1}", y(u64::from(w.budget_tokens)))) {}
                line .soft x1=(pad) x2=(width - pad)
                    y1=(format!("{:.1}", y(u64::from(w.soft_watermark_tokens))))
                    y2=(format!("{:.1}", y(u64::from(w.soft_watermark_tokens)))) {}
                polyline .tokens points=(points.join(" ")) {}
                @for m in &markers {
                    circle class=(if m.aborted() { "dot aborted" } else { "dot" })
                        cx=(format!("{:.1}", x(m.turn))) cy=(format!("{:.1}", y(u64::from(m.tokens_after))))
                        r="4" {
                        title { "marker " (m.seq) " at turn " (m.turn) ": " (m.trigger) ", " (m.outcome) ", "
                            (m.tokens_before) " → " (m.tokens_after) " tokens" }
                    }
                }
                text .tick x=(pad) y=(height - 8.0) { "turn " (first_turn) }
                text .tick x=(width - pad) y=(height - 8.0) text-anchor="end" { "turn " (last_turn) }
                text .tick x=(pad + 4.0) y=(pad - 8.0) { (w.window_tokens) " tokens (W)" }
            }
            figcaption {
                "Live tokens over turns: each marker drops the line from its before to its after; "
                "dashed, the budget (dark) and the soft watermark (light). Shows the markers of this page."
            }
        }
    }
}

fn spans_section(view: &SessionView) -> Markup {
    let id = view.session.id.clone();
    let page = &view.spans;
    html! {
        section #live-spans aria-labelledby="spans-title" {
            h2 #spans-title { "Live spans in prompt order" }
            p #spans-stale .notice hidden { "The live context changed since this page was read: reload to see it." }
            p {
                "Spans " (page.from + usize::from(!page.items.is_empty())) "–" (page.from + page.items.len())
                " of " (page.total) ". "
                a href=(link("/inspect/archive", &[("id", id.clone())])) { "Archived spans" }
            }
            form .inline method="get" action="/inspect/archive" {
                input type="hidden" name="id" value=(id);
                label for="turn" { "Archived spans of turn " }
                input #turn type="number" name="turn" min="0" required;
                " "
                button type="submit" { "Show" }
            }
            @if !page.items.is_empty() {
                (span_table("spans", "The live spans of this page", &page.items, &id, true))
            }
            p .pages {
                @if page.from > 0 {
                    a href=(spans_link(&id, page.from.saturating_sub(page.limit), page.limit)) { "← Earlier spans" }
                    " "
                }
                @if let Some(next) = page.next_from {
                    a #next-spans href=(spans_link(&id, next, page.limit)) { "Later spans →" }
                }
            }
        }
    }
}

/// The session page that shows `limit` live spans from `from`.
fn spans_link(id: &str, from: usize, limit: usize) -> String {
    link(
        "/inspect/session",
        &[
            ("id", id.to_owned()),
            ("from", from.to_string()),
            ("limit", limit.to_string()),
        ],
    )
}

fn span_table(table_id: &str, caption: &str, items: &[SpanItem], id: &str, live: bool) -> Markup {
    html! {
        table id=(table_id) .spans {
            caption { (caption) }
            thead {
                tr {
                    th scope="col" { "Span" }
                    th scope="col" { "Turn" }
                    th scope="col" { "Role" }
                    th scope="col" { "Class (rule)" }
                    th scope="col" { "Tokens" }
                    @if live { th scope="col" { "Relevance" } } @else { th scope="col" { "Evicted by" } }
                    th scope="col" { "Gen." }
                    th scope="col" { "Text" }
                }
            }
            tbody {
                @for s in items {
                    tr id=(format!("span-{}", s.id)) class=(format!("span c-row-{}", s.class)) {
                        th scope="row" .num {
                            a href=(link("/inspect/span", &[("id", id.to_owned()), ("span", s.id.to_string())])) { (s.id) }
                        }
                        td .num { (s.turn) }
                        td { (s.role) }
                        td {
                            (s.class)
                            @if !s.rule.is_empty() { " " span .sub { "(" (s.source) ": " (s.rule) ")" } }
                            @else { " " span .sub { "(" (s.source) ")" } }
                        }
                        td .num { (s.tokens) }
                        @if live {
                            td .num { @if let Some(r) = s.relevance { (format!("{r:.3}")) } @else { "—" } }
                        } @else {
                            td .num { @if let Some(seq) = s.archived_by_seq { "marker " (seq) } @else { "—" } }
                        }
                        td .num { (s.generation) }
                        td .text {
                            pre { (s.text) }
                            @if s.truncated {
                                a href=(link("/inspect/span", &[("id", id.to_owned()), ("span", s.id.to_string())])) {
                                    "… the whole span (" (s.text_chars) " characters)"
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A page of archived spans.
pub(super) fn archive(view: &ArchiveView, logout: bool) -> Markup {
    let id = view.session_id.clone();
    let mut next = vec![("id", id.clone())];
    if let Some(turn) = view.turn {
        next.push(("turn", turn.to_string()));
    }
    let title = match view.turn {
        Some(turn) => format!("Archived spans of turn {turn}"),
        None => "Archived spans".to_owned(),
    };
    let body = html! {
        h1 { (title) " · " a href=(link("/inspect/session", &[("id", id.clone())])) { code { (id) } } }
        @if view.items.is_empty() {
            p #no-spans { "No archived spans here." }
        } @else {
            (span_table("archived", "Archived spans by id", &view.items, &id, false))
        }
        @if let Some(after) = view.next_after {
            p .pages {
                a #next-page href=(link("/inspect/archive", &[next.clone(), vec![("after", after.to_string())]].concat())) { "Next page →" }
            }
        }
        p .twin { a href=(link("/inspect/api/archive", &next)) { "This page as JSON" } }
    };
    frame(&title, logout, body)
}

/// One span, whole.
pub(super) fn span(view: &SpanView, logout: bool) -> Markup {
    let s = &view.span;
    let id = view.session_id.clone();
    let title = format!("Span {} of {}", s.id, id);
    let body = html! {
        h1 { "Span " (s.id) " · " a href=(link("/inspect/session", &[("id", id.clone())])) { code { (id) } } }
        dl .facts {
            dt { "Standing" } dd { @if view.live { "live" } @else { "archived" } }
            @if let Some(seq) = s.archived_by_seq { dt { "Evicted by" } dd { "marker " (seq) } }
            dt { "Turn" } dd { (s.turn) }
            dt { "Role" } dd { (s.role) }
            dt { "Class" } dd { (s.class) " (" (s.source) @if !s.rule.is_empty() { ": " (s.rule) } ")" }
            dt { "Tokens" } dd { (s.tokens) }
            dt { "Generation" } dd { (s.generation) }
            @if let Some(call) = &s.tool_call_id { dt { "Tool call" } dd { code { (call) } } }
        }
        h2 { "Text" }
        pre #span-text .whole { (s.text) }
        @if let Some(original) = &s.original {
            h2 { "As admitted, before it was compressed" }
            pre .whole { (original) }
        }
        p .twin { a href=(link("/inspect/api/span", &[("id", id.clone()), ("span", s.id.to_string())])) { "This span as JSON" } }
    };
    frame(&title, logout, body)
}

/// The login form; with `required` false, says there is nothing to log
/// in to.
pub(super) fn login(required: bool, message: Option<&str>) -> Markup {
    let body = html! {
        h1 { "Log in" }
        @if let Some(message) = message {
            p #problem .problem role="alert" { (message) }
        }
        @if required {
            form method="post" action="/inspect/login" {
                label for="token" { "Bearer token" }
                input #token type="password" name="token" autocomplete="current-password" required;
                button type="submit" { "Log in" }
            }
            p .hint { "Any token of the daemon's token file works; a tenant's token shows its tenant's sessions." }
        } @else {
            p { "The daemon has no token file: the inspector is open. " a href="/inspect" { "See the sessions." } }
        }
    };
    frame("Log in", false, body)
}

/// A refusal as a page.
pub(super) fn problem(status: StatusCode, message: &str) -> Markup {
    let title = status.canonical_reason().unwrap_or("Error");
    let body = html! {
        h1 { (status.as_u16()) " · " (title) }
        p #problem .problem role="alert" { (message) }
        p { a href="/inspect" { "Back to the sessions" } }
    };
    frame(title, false, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_encode_what_a_query_cannot_hold() {
        assert_eq!(
            link("/inspect/session", &[("id", "acme/s 1&x=<y>".to_owned())]),
            "/inspect/session?id=acme%2Fs%201%26x%3D%3Cy%3E"
        );
        assert_eq!(link("/inspect", &[]), "/inspect");
    }

    #[test]
    fn times_read_as_utc() {
        assert_eq!(when(0), "never");
        assert_eq!(when(1_700_000_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn markup_in_text_is_escaped() {
        let page = problem(StatusCode::NOT_FOUND, "<script>alert(1)</script>").into_string();
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
    }
}
