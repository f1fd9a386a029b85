//! What the commands print: plain structs serialised as JSON, or laid out
//! as tables. The JSON is this tool's own, stable shape (snake_case keys,
//! enum values without their type prefix, RFC 3339 times), not the wire's.

use std::time::{Duration, UNIX_EPOCH};

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};
use ctxbroker_proto::v1 as pb;
use serde::Serialize;

use crate::cli::Output;

/// One session, as `sessions list` and `sessions show` print it.
#[derive(Debug, Serialize)]
pub struct SessionRow {
    /// The id.
    pub session_id: String,
    /// Turns admitted.
    pub turns: u64,
    /// Compactions committed.
    pub compactions: u64,
    /// Live spans.
    pub live_spans: u32,
    /// Live tokens.
    pub live_tokens: u32,
    /// Pinned tokens.
    pub pinned_tokens: u32,
    /// The budget compaction keeps to.
    pub budget_tokens: u32,
    /// The model's window.
    pub window_tokens: u32,
    /// Evicted spans kept in the archive.
    pub archived_spans: u64,
    /// Whether a compaction waits for an operator's approval.
    pub approval_required: bool,
    /// The session's mode (automatic or approval).
    pub mode: String,
    /// Its revision.
    pub revision: u64,
    /// When it was created.
    pub created_at: Option<String>,
    /// When it last changed.
    pub updated_at: Option<String>,
}

impl SessionRow {
    /// From the wire.
    pub fn of(session: &pb::Session) -> SessionRow {
        let totals = session.totals.unwrap_or_default();
        let mode = session
            .config
            .as_ref()
            .map(|c| enum_name(c.mode().as_str_name(), "SESSION_MODE_"))
            .unwrap_or_default();
        SessionRow {
            session_id: session.session_id.clone(),
            turns: session.turns,
            compactions: session.compactions,
            live_spans: totals.live_spans,
            live_tokens: totals.live_tokens,
            pinned_tokens: totals.pinned_tokens,
            budget_tokens: totals.budget_tokens,
            window_tokens: totals.window_tokens,
            archived_spans: session.archived_spans,
            approval_required: session.approval_required,
            mode,
            revision: session.revision,
            created_at: session.created_at.map(timestamp),
            updated_at: session.updated_at.map(timestamp),
        }
    }
}

/// One live span, as `context` prints it.
#[derive(Debug, Serialize)]
pub struct SpanRow {
    /// Its id.
    pub span_id: u64,
    /// Who produced it.
    pub role: String,
    /// Its class.
    pub class: String,
    /// Who decided the class.
    pub class_source: String,
    /// Why, when the classifier decided.
    pub class_rule: String,
    /// Its tokens.
    pub tokens: u32,
    /// The turn that admitted it.
    pub turn: u64,
    /// Whether it is a pinned constraint.
    pub pinned: bool,
    /// 0 for admitted spans; a summary's generation.
    pub generation: u32,
    /// For a summary: the spans it stands for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub summarizes: Vec<u64>,
    /// Relevance to the latest turn.
    pub relevance: f64,
    /// The text.
    pub text: String,
}

impl SpanRow {
    /// From the wire.
    pub fn of(span: &pb::Span) -> SpanRow {
        let class = enum_name(span.span_class().as_str_name(), "SPAN_CLASS_");
        SpanRow {
            span_id: span.span_id,
            role: enum_name(span.role().as_str_name(), "ROLE_"),
            pinned: span.span_class() == pb::SpanClass::Constraint,
            class,
            class_source: enum_name(span.class_source().as_str_name(), "CLASS_SOURCE_"),
            class_rule: span.class_rule.clone(),
            tokens: span.tokens,
            turn: span.turn,
            generation: span.generation,
            summarizes: span.summarized_span_ids.clone(),
            relevance: span.relevance,
            text: span.text.clone(),
        }
    }
}

/// A session's live context.
#[derive(Debug, Serialize)]
pub struct ContextView {
    /// The session.
    pub session_id: String,
    /// Its revision.
    pub revision: u64,
    /// The latest turn.
    pub turn: u64,
    /// Live tokens.
    pub live_tokens: u32,
    /// The budget.
    pub budget_tokens: u32,
    /// The spans, in prompt order.
    pub spans: Vec<SpanRow>,
}

/// One compaction marker, as `markers tail` prints it.
#[derive(Debug, Serialize)]
pub struct MarkerRow {
    /// Its sequence number in the log.
    pub seq: u64,
    /// The session.
    pub session_id: String,
    /// What triggered it.
    pub trigger: String,
    /// What happened.
    pub outcome: String,
    /// Live tokens before.
    pub tokens_before: u32,
    /// Live tokens after.
    pub tokens_after: u32,
    /// The turn's tokens that caused it.
    pub incoming_tokens: u32,
    /// Spans evicted.
    pub evicted_span_ids: Vec<u64>,
    /// Constraints compressed.
    pub compressed_span_ids: Vec<u64>,
    /// The summary written, if any.
    pub summary_span_id: Option<u64>,
    /// Constraints kept of those live.
    pub pinned_retained: u32,
    /// Constraints live before.
    pub pinned_total: u32,
    /// Anchors the summary had to leave out.
    pub anchors_dropped: u32,
    /// For an aborted compaction: why, one entry per violation.
    pub violations: Vec<String>,
    /// Who acted (approvals, unpins).
    pub actor: String,
    /// Free text from the daemon.
    pub detail: String,
    /// When.
    pub at: Option<String>,
}

impl MarkerRow {
    /// From the wire.
    pub fn of(marker: &pb::CompactionMarker) -> MarkerRow {
        MarkerRow {
            seq: marker.seq,
            session_id: marker.session_id.clone(),
            trigger: enum_name(marker.trigger().as_str_name(), "COMPACTION_TRIGGER_"),
            outcome: enum_name(marker.outcome().as_str_name(), "COMPACTION_OUTCOME_"),
            tokens_before: marker.tokens_before,
            tokens_after: marker.tokens_after,
            incoming_tokens: marker.incoming_tokens,
            evicted_span_ids: marker.evicted_span_ids.clone(),
            compressed_span_ids: marker.compressed_span_ids.clone(),
            summary_span_id: marker.summary_span_id,
            pinned_retained: marker.pinned_retained,
            pinned_total: marker.pinned_total,
            anchors_dropped: marker.anchors_dropped,
            violations: marker.violations.iter().map(violation).collect(),
            actor: marker.actor.clone(),
            detail: marker.detail.clone(),
            at: marker.at.map(timestamp),
        }
    }

    /// The marker as one line of `markers tail`'s table (see
    /// [`marker_header`]).
    pub fn line(&self) -> String {
        let summary = self
            .summary_span_id
            .map_or_else(|| "-".to_owned(), |id| id.to_string());
        let mut line = marker_columns([
            &self.seq.to_string(),
            &clip(&self.session_id, 20),
            &clip(&self.trigger, 12),
            &clip(&self.outcome, 10),
            &format!("{} -> {}", self.tokens_before, self.tokens_after),
            &self.evicted_span_ids.len().to_string(),
            &summary,
            &format!("{}/{}", self.pinned_retained, self.pinned_total),
            self.at.as_deref().unwrap_or("-"),
        ]);
        if !self.actor.is_empty() {
            line.push_str(&format!("  by {}", self.actor));
        }
        for v in &self.violations {
            line.push_str(&format!("\n         ! {v}"));
        }
        line
    }
}

/// The header line of `markers tail`'s table.
pub fn marker_header() -> String {
    marker_columns([
        "SEQ", "SESSION", "TRIGGER", "OUTCOME", "TOKENS", "EVICTED", "SUMMARY", "PINNED", "AT",
    ])
}

/// One line of `markers tail`'s table, every column at its width, so the
/// lines of a followed stream line up without knowing what comes next.
fn marker_columns(c: [&str; 9]) -> String {
    format!(
        "{:>7}  {:<20}  {:<12}  {:<10}  {:<16}  {:>7}  {:>7}  {:>7}  {}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]
    )
}

/// A compaction plan, as `escalation show` prints it.
#[derive(Debug, Serialize)]
pub struct PlanView {
    /// The session.
    pub session_id: String,
    /// The plan's id, for `CommitCompaction`.
    pub plan_id: String,
    /// Live tokens now.
    pub tokens_before: u32,
    /// Live tokens after the plan.
    pub tokens_after: u32,
    /// The incoming turn's tokens planned for.
    pub incoming_tokens: u32,
    /// The target.
    pub target_tokens: u32,
    /// Spans evicted, with why.
    pub evicted: Vec<EvictedRow>,
    /// Constraints compressed.
    pub compressed_span_ids: Vec<u64>,
    /// Spans kept.
    pub kept: usize,
    /// The summary draft.
    pub summary_draft: Option<String>,
    /// Whether the verifier passed the plan.
    pub verified: bool,
    /// What it found, when it did not.
    pub violations: Vec<String>,
}

/// One evicted span in a plan.
#[derive(Debug, Serialize)]
pub struct EvictedRow {
    /// The span.
    pub span_id: u64,
    /// Its tokens.
    pub tokens: u32,
    /// Its relevance.
    pub relevance: f64,
    /// Why it goes.
    pub reason: String,
}

impl PlanView {
    /// From the wire.
    pub fn of(session: &str, response: &pb::PlanCompactionResponse) -> PlanView {
        let plan = response.plan.clone().unwrap_or_default();
        let verification = response.verification.clone().unwrap_or_default();
        PlanView {
            session_id: session.to_owned(),
            plan_id: plan.plan_id.clone(),
            tokens_before: plan.tokens_before,
            tokens_after: plan.tokens_after,
            incoming_tokens: plan.incoming_tokens,
            target_tokens: plan.target_tokens,
            evicted: plan
                .evicted
                .iter()
                .map(|e| EvictedRow {
                    span_id: e.span_id,
                    tokens: e.tokens,
                    relevance: e.relevance,
                    reason: enum_name(e.reason().as_str_name(), "EVICTION_REASON_"),
                })
                .collect(),
            compressed_span_ids: plan.compressed.iter().map(|c| c.span_id).collect(),
            kept: plan.kept_span_ids.len(),
            summary_draft: plan.summary_draft.as_ref().map(|s| s.text.clone()),
            verified: verification.passed,
            violations: verification.violations.iter().map(violation).collect(),
        }
    }

    /// As the operator reads it.
    pub fn table(&self) -> String {
        let mut out = format!(
            "session {}  plan {}\nlive tokens {} -> {} (target {}, incoming {}); {} spans kept, {} evicted, {} compressed\nverifier: {}\n",
            self.session_id,
            self.plan_id,
            self.tokens_before,
            self.tokens_after,
            self.target_tokens,
            self.incoming_tokens,
            self.kept,
            self.evicted.len(),
            self.compressed_span_ids.len(),
            if self.verified { "passed" } else { "FAILED" },
        );
        for v in &self.violations {
            out.push_str(&format!("  ! {v}\n"));
        }
        if !self.evicted.is_empty() {
            let mut table = table(&["SPAN", "TOKENS", "RELEVANCE", "REASON"]);
            for e in &self.evicted {
                table.add_row(vec![
                    e.span_id.to_string(),
                    e.tokens.to_string(),
                    format!("{:.3}", e.relevance),
                    e.reason.clone(),
                ]);
            }
            out.push_str(&format!("{table}\n"));
        }
        if let Some(summary) = &self.summary_draft {
            out.push_str(&format!(
                "summary draft:\n  {}\n",
                summary.replace('\n', "\n  ")
            ));
        }
        out
    }
}

/// The daemon, as `info` prints it.
#[derive(Debug, Serialize)]
pub struct InfoView {
    /// The address asked.
    pub addr: String,
    /// The daemon's version.
    pub version: String,
    /// The commit it was built from.
    pub git_commit: String,
    /// SHA-256 of its contract.
    pub contract_digest: String,
    /// `flush` or `relaxed`.
    pub durability: String,
    /// The tokenizers it offers.
    pub tokenizers: Vec<String>,
    /// When it started.
    pub started_at: Option<String>,
    /// The next marker's sequence number.
    pub next_marker_seq: u64,
    /// The oldest marker retained.
    pub oldest_marker_seq: u64,
}

impl InfoView {
    /// From the wire.
    pub fn of(addr: &str, info: &pb::GetServerInfoResponse) -> InfoView {
        InfoView {
            addr: addr.to_owned(),
            version: info.version.clone(),
            git_commit: info.git_commit.clone(),
            contract_digest: info.contract_digest.clone(),
            durability: info.durability.clone(),
            tokenizers: info
                .tokenizers()
                .map(|t| enum_name(t.as_str_name(), "TOKENIZER_KIND_"))
                .collect(),
            started_at: info.started_at.map(timestamp),
            next_marker_seq: info.next_marker_seq,
            oldest_marker_seq: info.oldest_marker_seq,
        }
    }
}

/// Prints `value` as JSON, or `table()` for people.
pub fn print<T: Serialize>(output: Output, value: &T, table: impl FnOnce() -> String) {
    match output {
        Output::Json => println!("{}", json(value)),
        Output::Table => println!("{}", table().trim_end()),
    }
}

/// `value` as pretty JSON. The output structs hold only strings, numbers,
/// booleans and lists, which always serialise.
pub fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// `value` as one line of JSON.
pub fn json_line<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// A table with `header`, fitted to the terminal when there is one.
pub fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.to_vec());
    table
}

/// The sessions as a table.
pub fn sessions_table(rows: &[SessionRow]) -> String {
    let mut table = table(&[
        "SESSION",
        "TURNS",
        "SPANS",
        "LIVE/BUDGET",
        "PINNED",
        "COMPACTIONS",
        "ARCHIVED",
        "MODE",
        "UPDATED",
    ]);
    for r in rows {
        table.add_row(vec![
            r.session_id.clone(),
            r.turns.to_string(),
            r.live_spans.to_string(),
            format!("{}/{}", r.live_tokens, r.budget_tokens),
            r.pinned_tokens.to_string(),
            r.compactions.to_string(),
            r.archived_spans.to_string(),
            if r.approval_required {
                format!("{} (waiting)", r.mode)
            } else {
                r.mode.clone()
            },
            r.updated_at.clone().unwrap_or_default(),
        ]);
    }
    format!("{table}\n{} session(s)", rows.len())
}

/// The context as a table; texts cut to one line unless `full`.
pub fn context_table(view: &ContextView, full: bool) -> String {
    let mut table = table(&["SPAN", "TURN", "ROLE", "CLASS", "TOKENS", "TEXT"]);
    for s in &view.spans {
        let text = if full {
            s.text.clone()
        } else {
            clip(&s.text.replace(['\n', '\r', '\t'], " "), 72)
        };
        let class = if s.generation > 0 {
            format!("{} g{}", s.class, s.generation)
        } else {
            s.class.clone()
        };
        table.add_row(vec![
            s.span_id.to_string(),
            s.turn.to_string(),
            s.role.clone(),
            class,
            s.tokens.to_string(),
            text,
        ]);
    }
    format!(
        "session {}  turn {}  revision {}  live {}/{} tokens, {} spans\n{table}",
        view.session_id,
        view.turn,
        view.revision,
        view.live_tokens,
        view.budget_tokens,
        view.spans.len()
    )
}

/// `SPAN_CLASS_CONSTRAINT` → `constraint`.
pub fn enum_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

/// A violation in one line.
fn violation(v: &pb::Violation) -> String {
    let mut out = enum_name(v.kind().as_str_name(), "VIOLATION_KIND_");
    if v.span_id != 0 {
        out.push_str(&format!(" span {}", v.span_id));
    }
    if !v.detail.is_empty() {
        out.push_str(&format!(": {}", v.detail));
    }
    if !v.missing_terms.is_empty() {
        out.push_str(&format!(" (missing {})", v.missing_terms.join(", ")));
    }
    out
}

/// A wire timestamp as RFC 3339 (UTC, seconds); a time before 1970 or
/// out of range is printed as its seconds.
pub fn timestamp(t: prost_types::Timestamp) -> String {
    match u64::try_from(t.seconds) {
        Ok(seconds) => match UNIX_EPOCH.checked_add(Duration::from_secs(seconds)) {
            Some(at) => humantime::format_rfc3339_seconds(at).to_string(),
            None => format!("{}s", t.seconds),
        },
        Err(_) => format!("{}s", t.seconds),
    }
}

/// The first `max` characters of `text`, with `…` when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}
