//! Moving a session between two replicas with ExportSession and
//! ImportSession: the moved session reads the same on both (record, live
//! context, every span by id, archived ones too), survives a `kill -9` of
//! its new home, answers keyed retries from the original admissions, and
//! then behaves the same under the same turns (same ids, tokens, markers
//! apart from their global seqs and clocks). Damaged, altered or
//! misdirected snapshots are refused by field, a taken id is refused, and
//! neither refusal changes anything.

use ctxbroker_proto::v1 as pb;
use pb::Role;
use pb::context_broker_client::ContextBrokerClient;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use crate::support::*;

type Client = ContextBrokerClient<Channel>;

const ID: &str = "agent-7:moved";

fn turn(n: u64) -> Vec<pb::SpanInput> {
    vec![
        keyed(
            Role::User,
            &format!("Step {n}: check the rollout of overlay-{n}."),
            &format!("t{n}/u"),
        ),
        keyed(
            Role::Tool,
            &format!("Step {n} output: {}", prose(n, &["rollout", "overlay"], 60)),
            &format!("t{n}/t"),
        ),
    ]
}

/// The checksum as the contract defines it, computed here independently:
/// CRC-32 (IEEE) over format_version (LE u32), the id's length (LE u64),
/// the id and the body.
fn checksum(format_version: u32, session_id: &str, body: &[u8]) -> u32 {
    let mut crc = !0u32;
    let len = (session_id.len() as u64).to_le_bytes();
    let version = format_version.to_le_bytes();
    for part in [&version[..], &len[..], session_id.as_bytes(), body] {
        for &byte in part {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
    }
    !crc
}

async fn export(client: &mut Client, id: &str) -> Result<pb::ExportSessionResponse, tonic::Status> {
    client
        .export_session(pb::ExportSessionRequest {
            session_id: id.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn import(
    client: &mut Client,
    snapshot: Option<pb::SessionSnapshot>,
) -> Result<pb::ImportSessionResponse, tonic::Status> {
    client
        .import_session(pb::ImportSessionRequest { snapshot })
        .await
        .map(|r| r.into_inner())
}

/// Everything a client can read of one session: GetSession, GetContext,
/// and GetSpan of every id up to `max_id` (an error is kept as its code).
#[derive(Debug, PartialEq)]
struct Seen {
    session: pb::Session,
    context: pb::GetContextResponse,
    spans: Vec<Result<pb::Span, Code>>,
}

async fn seen(client: &mut Client, max_id: u64) -> Seen {
    let mut spans = Vec::new();
    for span_id in 1..=max_id {
        let got = client
            .get_span(pb::GetSpanRequest {
                session_id: ID.into(),
                span_id,
            })
            .await;
        spans.push(
            got.map(|r| r.into_inner().span.unwrap())
                .map_err(|s| s.code()),
        );
    }
    Seen {
        session: session(client, ID).await,
        context: context(client, ID).await,
        spans,
    }
}

/// What depends on the replica's clock or its marker log, cleared so that
/// two replicas' answers to the same turn can be compared whole.
fn without_clocks(mut reply: pb::AdmitResponse) -> pb::AdmitResponse {
    for span in &mut reply.spans {
        span.admitted_at = None;
    }
    if let Some(marker) = &mut reply.compaction {
        marker.seq = 0;
        marker.at = None;
    }
    reply
}

fn seen_without_clocks(mut seen: Seen) -> Seen {
    seen.session.updated_at = None;
    for span in seen
        .context
        .spans
        .iter_mut()
        .chain(seen.spans.iter_mut().flatten())
    {
        span.admitted_at = None;
        span.archived_by_seq = 0;
    }
    seen
}

/// The field a refusal names, with its description.
fn named_field(status: &tonic::Status) -> (String, String) {
    let details = status.get_error_details();
    let bad = details.bad_request().expect("BadRequest details");
    let v = &bad.field_violations[0];
    (v.field.clone(), v.description.clone())
}

/// The highest span id a reply tells of.
fn highest(reply: &pb::AdmitResponse) -> u64 {
    let admitted = reply.spans.iter().map(|s| s.span_id).max().unwrap_or(0);
    let summary = reply
        .compaction
        .as_ref()
        .and_then(|m| m.summary_span_id)
        .unwrap_or(0);
    admitted.max(summary)
}

#[tokio::test]
async fn a_session_moved_between_replicas_is_the_same_session() {
    let a = Daemon::start().await;
    let mut b = Daemon::start().await;
    let mut on_a = a.client().await;
    let mut on_b = b.client().await;

    // On A: a constraint, keyed turns, compactions (summaries, archived
    // spans, summaries of summaries), a caller's pin, an unpin and a
    // manual compaction.
    create(&mut on_a, ID, window(1600)).await;
    let rule = admit(
        &mut on_a,
        ID,
        vec![keyed(
            Role::User,
            "Never write to the `prod` namespace; stage only.",
            "rule",
        )],
    )
    .await
    .unwrap();
    assert_eq!(rule.spans[0].span_class(), pb::SpanClass::Constraint);
    let mut max_id = highest(&rule);
    let mut compactions = 0;
    for n in 1..=30 {
        let reply = admit(&mut on_a, ID, turn(n)).await.unwrap();
        max_id = max_id.max(highest(&reply));
        compactions += usize::from(reply.compaction.is_some());
        if n == 26 || n == 27 {
            // Pin the tool output of turns 26 and 27 with a caller's predicate.
            on_a.pin(pb::PinRequest {
                session_id: ID.into(),
                span_id: reply.spans[1].span_id,
                predicate: Some(pb::Predicate {
                    modality: pb::Modality::Requirement as i32,
                    required_terms: vec![format!("Step {n}")],
                    source: 0,
                }),
            })
            .await
            .unwrap();
        }
    }
    assert!(compactions >= 2, "compactions ran: {compactions}");
    let pinned = context(&mut on_a, ID).await;
    let caller_pins: Vec<u64> = pinned
        .spans
        .iter()
        .filter(|s| {
            s.span_class() == pb::SpanClass::Constraint
                && s.predicate.as_ref().map(|p| p.source()) == Some(pb::PredicateSource::Caller)
        })
        .map(|s| s.span_id)
        .collect();
    assert_eq!(caller_pins.len(), 2, "{:?}", pinned.spans);
    on_a.unpin(pb::UnpinRequest {
        session_id: ID.into(),
        span_id: caller_pins[0],
        actor: "oncall".into(),
        reason: "the step is done".into(),
    })
    .await
    .unwrap();
    let live = context(&mut on_a, ID).await.totals.unwrap().live_tokens;
    let plan = on_a
        .plan_compaction(pb::PlanCompactionRequest {
            session_id: ID.into(),
            incoming_tokens: 0,
            target_tokens: Some(live / 2),
        })
        .await
        .unwrap()
        .into_inner()
        .plan
        .unwrap();
    let manual = on_a
        .commit_compaction(pb::CommitCompactionRequest {
            session_id: ID.into(),
            plan_id: plan.plan_id,
            actor: "oncall".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .marker
        .unwrap();
    max_id = max_id.max(manual.summary_span_id.unwrap_or(0));
    let probe = max_id + 2;
    let on_a_before = seen(&mut on_a, probe).await;
    let archived = on_a_before
        .spans
        .iter()
        .flatten()
        .filter(|s| s.state() == pb::SpanState::Archived)
        .count();
    assert!(archived >= 10, "spans were archived: {archived}");
    assert!(
        on_a_before.context.spans.iter().any(|s| s.generation >= 1),
        "a summary is live"
    );

    let exported = export(&mut on_a, ID).await.unwrap();
    assert_eq!(exported.session.as_ref(), Some(&on_a_before.session));
    assert_eq!(exported.archived_spans, archived as u64);
    assert_eq!(exported.idempotency_keys, 61);
    let snapshot = exported.snapshot.clone().unwrap();
    assert_eq!(snapshot.format_version, 1);
    assert_eq!(snapshot.session_id, ID);
    assert_eq!(
        snapshot.checksum,
        checksum(1, ID, &snapshot.body),
        "the checksum is the one the contract defines"
    );
    assert_eq!(
        exported.snapshot_bytes,
        prost::Message::encoded_len(&snapshot) as u64
    );
    // Exporting changes nothing.
    assert_eq!(seen(&mut on_a, probe).await, on_a_before);

    // Refusals first: each names its field, and B stays empty.
    let info = |c: &mut Client| {
        let mut c = c.clone();
        async move {
            c.get_server_info(pb::GetServerInfoRequest {})
                .await
                .unwrap()
                .into_inner()
        }
    };
    let b_info = info(&mut on_b).await;
    let mut flipped = snapshot.clone();
    let at = flipped.body.len() / 3;
    flipped.body[at] ^= 0x08;
    let mut truncated = snapshot.clone();
    truncated.body.truncate(truncated.body.len() - 5);
    truncated.checksum = checksum(1, ID, &truncated.body);
    let refusals: Vec<(&str, Option<pb::SessionSnapshot>, &str, &str)> = vec![
        ("no snapshot", None, "snapshot", "is required"),
        (
            "one flipped bit",
            Some(flipped),
            "snapshot.checksum",
            "damaged or altered",
        ),
        (
            "a format from the future",
            Some(pb::SessionSnapshot {
                format_version: 7,
                ..snapshot.clone()
            }),
            "snapshot.format_version",
            "reads version 1",
        ),
        (
            "another session's id",
            Some(pb::SessionSnapshot {
                session_id: "agent-8".into(),
                ..snapshot.clone()
            }),
            "snapshot.checksum",
            "damaged or altered",
        ),
        (
            "an id no session may have",
            Some(pb::SessionSnapshot {
                session_id: "agent 7".into(),
                ..snapshot.clone()
            }),
            "snapshot.session_id",
            "may only contain",
        ),
        (
            "a truncated body with a matching checksum",
            Some(truncated),
            "snapshot.body",
            "does not decode",
        ),
    ];
    for (what, snapshot, field, says) in refusals {
        let status = import(&mut on_b, snapshot).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        let (named, description) = named_field(&status);
        assert_eq!(named, field, "{what}: {status:?}");
        assert!(description.contains(says), "{what}: {description}");
    }
    let listed = on_b
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.sessions.is_empty(),
        "nothing was written: {listed:?}"
    );
    let status = on_b
        .get_session(pb::GetSessionRequest {
            session_id: ID.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(
        info(&mut on_b).await.next_marker_seq,
        b_info.next_marker_seq
    );

    // The move.
    let imported = import(&mut on_b, Some(snapshot.clone())).await.unwrap();
    assert_eq!(imported.session.as_ref(), Some(&on_a_before.session));
    assert_eq!(imported.archived_spans, archived as u64);
    assert_eq!(imported.idempotency_keys, 61);
    assert_eq!(seen(&mut on_b, probe).await, on_a_before);
    assert_eq!(
        info(&mut on_b).await.next_marker_seq,
        b_info.next_marker_seq,
        "an import writes no marker"
    );

    // A taken id is refused, on either replica, and changes nothing.
    for client in [&mut on_a, &mut on_b] {
        let status = import(client, Some(snapshot.clone())).await.unwrap_err();
        assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
        assert_eq!(error_info(&status).0, "SESSION_EXISTS");
        assert_eq!(seen(client, probe).await, on_a_before);
    }

    // Acknowledged means durable on the new replica too.
    b.restart().await;
    let mut on_b = b.client().await;
    assert_eq!(seen(&mut on_b, probe).await, on_a_before);

    // Keyed retries replay the original admissions on both: an archived
    // turn and a live one.
    for n in [2, 30] {
        let on_a_replay = admit(&mut on_a, ID, turn(n)).await.unwrap();
        let on_b_replay = admit(&mut on_b, ID, turn(n)).await.unwrap();
        assert!(on_b_replay.replayed, "turn {n}");
        assert_eq!(on_b_replay, on_a_replay, "turn {n}");
    }
    let states: Vec<pb::SpanState> = admit(&mut on_b, ID, turn(2))
        .await
        .unwrap()
        .spans
        .iter()
        .map(|s| s.state())
        .collect();
    assert_eq!(states, [pb::SpanState::Archived, pb::SpanState::Archived]);
    assert_eq!(seen(&mut on_b, probe).await, on_a_before);

    // The same turns from here on: the same ids, tokens, classes,
    // compactions and markers on both, apart from clocks and global seqs.
    let a_next = info(&mut on_a).await.next_marker_seq;
    let mut moved_markers = Vec::new();
    for n in 31..=50 {
        let on_a_reply = admit(&mut on_a, ID, turn(n)).await.unwrap();
        let on_b_reply = admit(&mut on_b, ID, turn(n)).await.unwrap();
        max_id = max_id.max(highest(&on_a_reply));
        if let (Some(ma), Some(mb)) = (&on_a_reply.compaction, &on_b_reply.compaction) {
            assert!(ma.seq >= a_next, "A's marker is new in A's log");
            moved_markers.push((ma.session_seq, mb.seq));
        }
        assert_eq!(
            without_clocks(on_b_reply),
            without_clocks(on_a_reply),
            "turn {n}"
        );
    }
    assert!(!moved_markers.is_empty(), "the later turns compacted");
    // B's log holds only the session's markers made on B, numbered from
    // B's own start, carrying the session's numbering on from A's.
    let (_, b_log) = watch_replay(&mut on_b, 0).await;
    assert_eq!(
        b_log
            .iter()
            .map(|m| (m.session_seq, m.seq))
            .collect::<Vec<_>>(),
        moved_markers
    );
    assert_eq!(b_log[0].seq, 1);
    let (_, a_log) = watch_replay(&mut on_a, 0).await;
    let before_move = a_log.iter().filter(|m| m.seq < a_next).count() as u64;
    assert!(
        before_move >= 3,
        "A wrote the session's markers: {before_move}"
    );
    assert_eq!(
        b_log[0].session_seq,
        before_move + 1,
        "the session's markers go on from its count on A"
    );
    let probe = max_id + 2;
    assert_eq!(
        seen_without_clocks(seen(&mut on_b, probe).await),
        seen_without_clocks(seen(&mut on_a, probe).await)
    );
}

#[tokio::test]
async fn a_snapshot_too_large_to_import_is_refused_at_export() {
    let daemon =
        Daemon::start_with(&["--max-request-bytes", "4096", "--max-span-bytes", "1024"]).await;
    let mut client = daemon.client().await;
    create(&mut client, "big", window(100_000)).await;
    for n in 0..8 {
        admit(
            &mut client,
            "big",
            vec![span(Role::Tool, &prose(n, &["overlay"], 120))],
        )
        .await
        .unwrap();
    }
    let before = context(&mut client, "big").await;
    let status = export(&mut client, "big").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let (reason, metadata) = error_info(&status);
    assert_eq!(reason, "SNAPSHOT_TOO_LARGE");
    assert_eq!(metadata["max_request_bytes"], "4096");
    let bytes: u64 = metadata["request_bytes"].parse().unwrap();
    assert!(bytes > 4096, "{metadata:?}");
    assert!(status.message().contains("max_request_bytes"), "{status:?}");
    assert_eq!(context(&mut client, "big").await, before);

    // A small session still moves out of the same server.
    create(&mut client, "small", window(1000)).await;
    admit(
        &mut client,
        "small",
        vec![span(Role::User, "Deploy to staging.")],
    )
    .await
    .unwrap();
    let small = export(&mut client, "small").await.unwrap();
    assert!(small.snapshot_bytes < 4096, "{}", small.snapshot_bytes);
    let status = export(&mut client, "nobody").await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}
