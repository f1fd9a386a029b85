//! Idempotent retries: a turn re-sent with the same idempotency keys after
//! a lost reply returns the original spans and admits nothing twice — also
//! across a `kill -9`, and after the spans were evicted; keys reused for
//! other content, or a turn that mixes old and new keys, are refused by
//! field.

use ctxbroker_proto::v1 as pb;
use pb::Role;
use prost::Message;
use tonic::Code;
use tonic_types::StatusExt;

use crate::support::*;

/// The field a refusal names, and its description.
fn violation(status: &tonic::Status) -> (String, String) {
    let details = status.get_error_details();
    let bad = details.bad_request().expect("BadRequest details");
    let v = &bad.field_violations[0];
    (v.field.clone(), v.description.clone())
}

fn turn(n: u64) -> Vec<pb::SpanInput> {
    vec![
        keyed(
            Role::User,
            &format!("Step {n}: check the rollout."),
            &format!("t{n}/0"),
        ),
        keyed(
            Role::Tool,
            &format!("Step {n}: {}", prose(n, &["rollout"], 30)),
            &format!("t{n}/1"),
        ),
    ]
}

#[tokio::test]
async fn a_retried_turn_is_admitted_once() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "retry", window(1200)).await;

    let first = admit(&mut client, "retry", turn(1)).await.unwrap();
    assert!(!first.replayed);
    let ids: Vec<u64> = first.spans.iter().map(|s| s.span_id).collect();
    let before = context(&mut client, "retry").await.encode_to_vec();

    // The reply was lost; the agent sends the same turn again.
    let again = admit(&mut client, "retry", turn(1)).await.unwrap();
    assert!(again.replayed);
    assert_eq!(
        again.spans.iter().map(|s| s.span_id).collect::<Vec<_>>(),
        ids
    );
    assert_eq!(again.turn, first.turn);
    assert_eq!(again.revision, first.revision, "nothing was written");
    assert!(again.compaction.is_none());
    assert_eq!(context(&mut client, "retry").await.encode_to_vec(), before);
    assert_eq!(session(&mut client, "retry").await.turns, 1);

    // Keys outlive the process.
    daemon.restart().await;
    let mut client = daemon.client().await;
    let after_crash = admit(&mut client, "retry", turn(1)).await.unwrap();
    assert!(after_crash.replayed);
    assert_eq!(
        after_crash
            .spans
            .iter()
            .map(|s| s.span_id)
            .collect::<Vec<_>>(),
        ids
    );
    assert_eq!(context(&mut client, "retry").await.encode_to_vec(), before);

    // A key reused for other content, a turn mixing old and new keys, and
    // a turn keyed only in part are refused by field; nothing changes.
    let mut other = turn(1);
    other[1].text = "Something else entirely.".into();
    let refusals = [
        (
            other,
            "spans[1].idempotency_key",
            "was used in this session",
        ),
        (
            vec![turn(1)[0].clone(), turn(2)[1].clone()],
            "spans[1].idempotency_key",
            "is new",
        ),
        (
            vec![turn(3)[0].clone(), span(Role::Tool, "unkeyed")],
            "spans[1].idempotency_key",
            "must be set",
        ),
        (
            vec![
                keyed(Role::User, "a", "same"),
                keyed(Role::User, "b", "same"),
            ],
            "spans[1].idempotency_key",
            "repeats",
        ),
        (
            vec![keyed(Role::User, "a", "has space")],
            "spans[0].idempotency_key",
            "printable ASCII",
        ),
        (
            vec![keyed(Role::User, "a", &"k".repeat(129))],
            "spans[0].idempotency_key",
            "at most 128 bytes",
        ),
    ];
    for (spans, field, says) in refusals {
        let status = admit(&mut client, "retry", spans).await.expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let (named, description) = violation(&status);
        assert_eq!(named, field, "{status:?}");
        assert!(description.contains(says), "{description}");
        assert!(status.message().contains(field), "{}", status.message());
    }
    assert_eq!(context(&mut client, "retry").await.encode_to_vec(), before);

    // Once evicted by later compactions, a retry still finds the turn, in
    // the archive, and admits nothing.
    let mut gone = std::collections::HashSet::new();
    for n in 10..80 {
        let reply = admit(&mut client, "retry", turn(n)).await.unwrap();
        if let Some(m) = reply.compaction {
            gone.extend(m.evicted_span_ids);
        }
        if ids.iter().all(|id| gone.contains(id)) {
            break;
        }
    }
    let evicted = ids.iter().all(|id| gone.contains(id));
    assert!(evicted, "the first turn was evicted");
    let turns = session(&mut client, "retry").await.turns;
    let late = admit(&mut client, "retry", turn(1)).await.unwrap();
    assert!(late.replayed);
    assert!(
        late.spans
            .iter()
            .all(|s| s.state() == pb::SpanState::Archived && s.archived_by_seq > 0),
        "{:?}",
        late.spans
    );
    assert_eq!(session(&mut client, "retry").await.turns, turns);
}
