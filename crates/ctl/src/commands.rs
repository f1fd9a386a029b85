//! Each command: the calls it makes and what it prints.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use indicatif::{ProgressBar, ProgressStyle};
use prost::Message;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::cli::{
    ApproveArgs, Command, ContextArgs, EscalationCommand, ExportArgs, ImportArgs, MarkersCommand,
    Output, PinArgs, PlanArgs, SessionsCommand, TailArgs, UnpinArgs,
};
use crate::connect::Connection;
use crate::error::{CtlError, file_error};
use crate::render::{self, ContextView, InfoView, MarkerRow, PlanView, SessionRow, SpanRow};

/// Runs `command` on `connection`.
pub async fn run(
    connection: &Connection,
    output: Output,
    command: Command,
) -> Result<(), CtlError> {
    match command {
        Command::Sessions(SessionsCommand::List) => list_sessions(connection, output).await,
        Command::Sessions(SessionsCommand::Show { session }) => {
            show_session(connection, output, &session).await
        }
        Command::Sessions(SessionsCommand::Delete { session, yes }) => {
            delete_session(connection, output, &session, yes).await
        }
        Command::Context(args) => context(connection, output, args).await,
        Command::Markers(MarkersCommand::Tail(args)) => tail(connection, output, args).await,
        Command::Pin(args) => pin(connection, output, args).await,
        Command::Unpin(args) => unpin(connection, output, args).await,
        Command::Escalation(EscalationCommand::Show(args)) => {
            let view = plan(connection, &args).await?;
            render::print(output, &view, || view.table());
            Ok(())
        }
        Command::Escalation(EscalationCommand::Approve(args)) => {
            approve(connection, output, args).await
        }
        Command::Export(args) => export(connection, output, args).await,
        Command::Import(args) => import(connection, output, args).await,
        Command::Info => info(connection, output).await,
        Command::Health => health(connection, output).await,
    }
}

async fn list_sessions(connection: &Connection, output: Output) -> Result<(), CtlError> {
    let rows: Vec<SessionRow> = all_sessions(connection)
        .await?
        .iter()
        .map(SessionRow::of)
        .collect();
    render::print(output, &rows, || render::sessions_table(&rows));
    Ok(())
}

/// Every session, page by page.
async fn all_sessions(connection: &Connection) -> Result<Vec<pb::Session>, CtlError> {
    let mut client = connection.broker();
    let mut sessions = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_sessions(connection.request(
                pb::ListSessionsRequest {
                    page_size: 0,
                    page_token: page_token.clone(),
                },
                None,
            ))
            .await?
            .into_inner();
        sessions.extend(page.sessions);
        if page.next_page_token.is_empty() || page.next_page_token == page_token {
            return Ok(sessions);
        }
        page_token = page.next_page_token;
    }
}

async fn show_session(connection: &Connection, output: Output, id: &str) -> Result<(), CtlError> {
    let session = connection
        .broker()
        .get_session(connection.request(
            pb::GetSessionRequest {
                session_id: id.to_owned(),
            },
            Some(id),
        ))
        .await?
        .into_inner()
        .session
        .unwrap_or_default();
    let row = SessionRow::of(&session);
    render::print(output, &row, || {
        let mut text = render::sessions_table(std::slice::from_ref(&row));
        if let Some(config) = &session.config {
            text.push_str(&format!("\nconfiguration: {config:?}"));
        }
        text
    });
    Ok(())
}

async fn delete_session(
    connection: &Connection,
    output: Output,
    id: &str,
    yes: bool,
) -> Result<(), CtlError> {
    if !yes {
        confirm(&format!(
            "Delete session {id} and everything it holds (spans, archive, keys)?"
        ))?;
    }
    let deleted = connection
        .broker()
        .delete_session(connection.request(
            pb::DeleteSessionRequest {
                session_id: id.to_owned(),
            },
            Some(id),
        ))
        .await?
        .into_inner();
    #[derive(serde::Serialize)]
    struct Deleted<'a> {
        session_id: &'a str,
        spans_deleted: u64,
    }
    let view = Deleted {
        session_id: id,
        spans_deleted: deleted.spans_deleted,
    };
    render::print(output, &view, || {
        format!("deleted session {id} ({} spans)", deleted.spans_deleted)
    });
    Ok(())
}

async fn context(
    connection: &Connection,
    output: Output,
    args: ContextArgs,
) -> Result<(), CtlError> {
    let id = args.session;
    let context = connection
        .broker()
        .get_context(connection.request(
            pb::GetContextRequest {
                session_id: id.clone(),
            },
            Some(&id),
        ))
        .await?
        .into_inner();
    let totals = context.totals.unwrap_or_default();
    let view = ContextView {
        session_id: id,
        revision: context.revision,
        turn: context.turn,
        live_tokens: totals.live_tokens,
        budget_tokens: totals.budget_tokens,
        spans: context.spans.iter().map(SpanRow::of).collect(),
    };
    render::print(output, &view, || render::context_table(&view, args.full));
    Ok(())
}

/// How long a followed tail waits before reconnecting, at most.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

async fn tail(connection: &Connection, output: Output, args: TailArgs) -> Result<(), CtlError> {
    let mut next = args.from_seq;
    let mut backoff = Duration::from_millis(100);
    let mut printed_header = false;
    let mut stdout = std::io::stdout();
    loop {
        let request = pb::WatchCompactionsRequest {
            from_seq: next.unwrap_or(0),
            session_ids: args.sessions.clone(),
            start: if next.is_some() {
                pb::WatchStart::FromSeq as i32
            } else {
                pb::WatchStart::Oldest as i32
            },
        };
        let session = match args.sessions.as_slice() {
            [one] => Some(one.as_str()),
            _ => None,
        };
        let stream = connection
            .broker()
            .watch_compactions(connection.streaming_request(request, session))
            .await;
        let mut stream = match stream {
            Ok(response) => response.into_inner(),
            Err(status) if args.follow && retryable(&status) => {
                eprintln!("ctxbrokerctl: {}; reconnecting", status.message());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
            Err(status) => return Err(status.into()),
        };
        if output == Output::Table && !printed_header {
            println!("{}", render::marker_header());
            printed_header = true;
        }
        loop {
            match stream.message().await {
                Ok(Some(event)) => match event.event {
                    Some(pb::watch_compactions_response::Event::Marker(marker)) => {
                        backoff = Duration::from_millis(100);
                        if let Some(expected) = next
                            && args.sessions.is_empty()
                            && marker.seq != expected
                        {
                            return Err(CtlError::Stream(format!(
                                "expected marker {expected}, got {}",
                                marker.seq
                            )));
                        }
                        next = Some(marker.seq.saturating_add(1));
                        let row = MarkerRow::of(&marker);
                        let line = match output {
                            Output::Json => render::json_line(&row),
                            Output::Table => row.line(),
                        };
                        // A closed pipe (`| head`) ends the tail quietly.
                        if writeln!(stdout, "{line}")
                            .and_then(|()| stdout.flush())
                            .is_err()
                        {
                            return Ok(());
                        }
                        if args.until_seq.is_some_and(|until| marker.seq >= until) {
                            return Ok(());
                        }
                    }
                    Some(pb::watch_compactions_response::Event::CaughtUp(caught_up)) => {
                        if next.is_none() || args.sessions.is_empty() {
                            next = Some(caught_up.next_seq.max(next.unwrap_or(0)));
                        }
                        if !args.follow && args.until_seq.is_none() {
                            return Ok(());
                        }
                    }
                    None => {}
                },
                Ok(None) if !args.follow => return Ok(()),
                Ok(None) => break,
                Err(status) if args.follow && retryable(&status) => {
                    if let Some(resume) = resume_from(&status) {
                        next = Some(resume.max(next.unwrap_or(0)));
                    }
                    eprintln!(
                        "ctxbrokerctl: stream ended ({}); resuming from {}",
                        status.message(),
                        next.map_or_else(|| "the oldest".to_owned(), |n| n.to_string())
                    );
                    break;
                }
                Err(status) => return Err(status.into()),
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A watch error worth reconnecting after: the daemon went away or is
/// restarting.
fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
    )
}

/// The `resume-from-seq` trailer of a daemon shutting down.
fn resume_from(status: &tonic::Status) -> Option<u64> {
    status
        .metadata()
        .get("resume-from-seq")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

async fn pin(connection: &Connection, output: Output, args: PinArgs) -> Result<(), CtlError> {
    let span = connection
        .broker()
        .pin(connection.request(
            pb::PinRequest {
                session_id: args.session.clone(),
                span_id: args.span,
                predicate: None,
            },
            Some(&args.session),
        ))
        .await?
        .into_inner()
        .span
        .unwrap_or_default();
    let row = SpanRow::of(&span);
    render::print(output, &row, || {
        format!(
            "pinned span {} of {} ({})",
            row.span_id, args.session, row.class
        )
    });
    Ok(())
}

async fn unpin(connection: &Connection, output: Output, args: UnpinArgs) -> Result<(), CtlError> {
    let response = connection
        .broker()
        .unpin(connection.request(
            pb::UnpinRequest {
                session_id: args.session.clone(),
                span_id: args.span,
                actor: args.actor.clone(),
                reason: args.reason.clone(),
            },
            Some(&args.session),
        ))
        .await?
        .into_inner();
    #[derive(serde::Serialize)]
    struct Unpinned {
        span: SpanRow,
        marker: Option<MarkerRow>,
    }
    let view = Unpinned {
        span: SpanRow::of(&response.span.unwrap_or_default()),
        marker: response.marker.as_ref().map(MarkerRow::of),
    };
    render::print(output, &view, || {
        format!(
            "unpinned span {} of {} (now {}); marker {}",
            view.span.span_id,
            args.session,
            view.span.class,
            view.marker.as_ref().map_or(0, |m| m.seq)
        )
    });
    Ok(())
}

async fn plan(connection: &Connection, args: &PlanArgs) -> Result<PlanView, CtlError> {
    let response = connection
        .broker()
        .plan_compaction(connection.request(
            pb::PlanCompactionRequest {
                session_id: args.session.clone(),
                incoming_tokens: args.incoming,
                target_tokens: args.target,
            },
            Some(&args.session),
        ))
        .await?
        .into_inner();
    Ok(PlanView::of(&args.session, &response))
}

async fn approve(
    connection: &Connection,
    output: Output,
    args: ApproveArgs,
) -> Result<(), CtlError> {
    let view = plan(connection, &args.plan).await?;
    if output == Output::Table || !args.yes {
        eprintln!("{}", view.table().trim_end());
    }
    if !view.verified {
        return Err(CtlError::Unverified);
    }
    if !args.yes {
        confirm(&format!(
            "Commit this compaction of {} as {}?",
            args.plan.session, args.actor
        ))?;
    }
    let committed = connection
        .broker()
        .commit_compaction(connection.request(
            pb::CommitCompactionRequest {
                session_id: args.plan.session.clone(),
                plan_id: view.plan_id.clone(),
                summary_text: None,
                compressed_forms: Vec::new(),
                actor: args.actor.clone(),
            },
            Some(&args.plan.session),
        ))
        .await?
        .into_inner();
    let marker = MarkerRow::of(&committed.marker.unwrap_or_default());
    render::print(output, &marker, || {
        format!(
            "committed: marker {} ({} -> {} tokens); the session admits again",
            marker.seq, marker.tokens_before, marker.tokens_after
        )
    });
    Ok(())
}

/// The suffix of a snapshot file.
const SNAPSHOT_SUFFIX: &str = ".snapshot";

async fn export(connection: &Connection, output: Output, args: ExportArgs) -> Result<(), CtlError> {
    let ids: Vec<String> = if args.all {
        all_sessions(connection)
            .await?
            .into_iter()
            .map(|s| s.session_id)
            .collect()
    } else {
        args.sessions
    };
    std::fs::create_dir_all(&args.dir).map_err(|e| file_error(&args.dir, e))?;
    let bar = progress(output, ids.len() as u64, "exported");
    #[derive(serde::Serialize)]
    struct Exported {
        session_id: String,
        file: PathBuf,
        bytes: u64,
        archived_spans: u64,
        idempotency_keys: u64,
    }
    let mut done = Vec::with_capacity(ids.len());
    for id in &ids {
        bar.set_message(id.clone());
        let file = args.dir.join(format!("{id}{SNAPSHOT_SUFFIX}"));
        if file.exists() {
            bar.abandon();
            return Err(CtlError::Usage(format!(
                "{}: already exists; nothing was overwritten",
                file.display()
            )));
        }
        let response = connection
            .broker()
            .export_session(connection.request(
                pb::ExportSessionRequest {
                    session_id: id.clone(),
                },
                Some(id),
            ))
            .await
            .inspect_err(|_| bar.abandon())?
            .into_inner();
        let snapshot = response.snapshot.unwrap_or_default();
        let bytes = snapshot.encode_to_vec();
        write_new(&file, &bytes).inspect_err(|_| bar.abandon())?;
        bar.inc(1);
        done.push(Exported {
            session_id: id.clone(),
            file,
            bytes: bytes.len() as u64,
            archived_spans: response.archived_spans,
            idempotency_keys: response.idempotency_keys,
        });
    }
    bar.finish_and_clear();
    render::print(output, &done, || {
        let mut table = render::table(&["SESSION", "FILE", "BYTES", "ARCHIVED", "KEYS"]);
        for e in &done {
            table.add_row(vec![
                e.session_id.clone(),
                e.file.display().to_string(),
                e.bytes.to_string(),
                e.archived_spans.to_string(),
                e.idempotency_keys.to_string(),
            ]);
        }
        format!("{table}\n{} session(s) exported", done.len())
    });
    Ok(())
}

async fn import(connection: &Connection, output: Output, args: ImportArgs) -> Result<(), CtlError> {
    let bar = progress(output, args.files.len() as u64, "imported");
    let mut done = Vec::with_capacity(args.files.len());
    for file in &args.files {
        bar.set_message(file.display().to_string());
        let bytes = std::fs::read(file)
            .map_err(|e| file_error(file, e))
            .inspect_err(|_| bar.abandon())?;
        let snapshot = pb::SessionSnapshot::decode(bytes.as_slice()).map_err(|e| {
            bar.abandon();
            file_error(
                file,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("not a session snapshot written by `ctxbrokerctl export`: {e}"),
                ),
            )
        })?;
        let id = snapshot.session_id.clone();
        let response = connection
            .broker()
            .import_session(connection.request(
                pb::ImportSessionRequest {
                    snapshot: Some(snapshot),
                },
                Some(&id),
            ))
            .await
            .inspect_err(|_| bar.abandon())?
            .into_inner();
        bar.inc(1);
        done.push(SessionRow::of(&response.session.unwrap_or_default()));
    }
    bar.finish_and_clear();
    render::print(output, &done, || {
        format!("{}\nimported", render::sessions_table(&done))
    });
    Ok(())
}

async fn info(connection: &Connection, output: Output) -> Result<(), CtlError> {
    let info = connection
        .broker()
        .get_server_info(connection.request(pb::GetServerInfoRequest {}, None))
        .await?
        .into_inner();
    let view = InfoView::of(connection.addr(), &info);
    render::print(output, &view, || {
        format!(
            "address          {}\nversion          {} ({})\ncontract         {}\ndurability       {}\ntokenizers       {}\nstarted          {}\nmarkers          {}",
            view.addr,
            view.version,
            view.git_commit,
            view.contract_digest,
            view.durability,
            view.tokenizers.join(", "),
            view.started_at.as_deref().unwrap_or("-"),
            if view.next_marker_seq > view.oldest_marker_seq {
                format!("{} to {}", view.oldest_marker_seq, view.next_marker_seq - 1)
            } else {
                format!("none yet (the next is {})", view.next_marker_seq)
            },
        )
    });
    Ok(())
}

async fn health(connection: &Connection, output: Output) -> Result<(), CtlError> {
    let mut client = HealthClient::new(connection.channel());
    let response = client
        .check(connection.request(
            HealthCheckRequest {
                service: String::new(),
            },
            None,
        ))
        .await?
        .into_inner();
    let status = ServingStatus::try_from(response.status).unwrap_or(ServingStatus::Unknown);
    let name = render::enum_name(status.as_str_name(), "");
    #[derive(serde::Serialize)]
    struct Health<'a> {
        addr: &'a str,
        status: &'a str,
    }
    render::print(
        output,
        &Health {
            addr: connection.addr(),
            status: &name,
        },
        || format!("{}: {name}", connection.addr()),
    );
    if status == ServingStatus::Serving {
        Ok(())
    } else {
        Err(tonic::Status::unavailable(format!("the daemon reports {name}")).into())
    }
}

/// A progress bar on stderr for people at a terminal; hidden otherwise.
fn progress(output: Output, len: u64, done: &str) -> ProgressBar {
    if output == Output::Json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let template = format!("{{bar:30}} {{pos}}/{{len}} {done} {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Asks on the terminal; anything but `y` or `yes` declines. Without a
/// terminal there is nobody to ask: `--yes` is needed.
fn confirm(question: &str) -> Result<(), CtlError> {
    if !std::io::stdin().is_terminal() {
        return Err(CtlError::Usage(format!(
            "{question} Not asked: stdin is not a terminal; pass --yes"
        )));
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| file_error(Path::new("stdin"), e))?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(CtlError::Declined),
    }
}

/// Writes `bytes` to `path`, which must not exist yet.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), CtlError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| file_error(path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| file_error(path, e))
}
