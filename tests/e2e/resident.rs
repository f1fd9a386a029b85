//! The resident set through the real binary: with a session cache of one
//! byte, every idle session but the last one used leaves memory, and each
//! comes back from the store exactly as it was, compactions, pins and
//! deletes included.

use ctxbroker_proto::v1 as pb;
use pb::Role;

use crate::support::*;

fn tool_text(session: usize, turn: usize) -> String {
    format!(
        "Session {session}, step {turn}: {}",
        prose(
            (session * 100 + turn) as u64,
            &["migration", "schema", "index"],
            30
        )
    )
}

#[tokio::test]
async fn sessions_let_go_by_the_cache_come_back_exactly() {
    let mut daemon = Daemon::start_with(&["--session-cache-bytes", "1"]).await;
    let mut client = daemon.client().await;
    let ids: Vec<String> = (0..5).map(|n| format!("cache-{n}")).collect();
    for id in &ids {
        create(&mut client, id, window(600)).await;
    }
    let mut compactions = 0;
    for turn in 0..16 {
        for (n, id) in ids.iter().enumerate() {
            let mut spans = vec![span(Role::Tool, &tool_text(n, turn))];
            if turn == 2 {
                spans.push(span(
                    Role::User,
                    &format!("Never write to the `prod-{n}` namespace; stage only."),
                ));
            }
            let reply = admit(&mut client, id, spans).await.unwrap();
            compactions += usize::from(reply.compaction.is_some());
        }
    }
    assert!(
        compactions >= ids.len(),
        "every session should have compacted"
    );

    // Each session is read after four others pushed it out of memory.
    let mut before = Vec::new();
    for id in &ids {
        before.push(context(&mut client, id).await);
    }
    for _ in 0..2 {
        for (id, expected) in ids.iter().zip(&before) {
            assert_eq!(&context(&mut client, id).await, expected, "{id} reloaded");
        }
    }
    // The pinned constraint is among what came back.
    assert!(
        before[3]
            .spans
            .iter()
            .any(|s| s.text.contains("prod-3") && s.span_class == pb::SpanClass::Constraint as i32)
    );

    // A session deleted while out of memory is gone, and its id is free.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: ids[0].clone(),
        })
        .await
        .unwrap();
    let missing = client
        .get_context(pb::GetContextRequest {
            session_id: ids[0].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    create(&mut client, &ids[0], window(600)).await;
    assert!(context(&mut client, &ids[0]).await.spans.is_empty());

    // The others carry on where they stood, before and after a restart.
    for (n, id) in ids.iter().enumerate().skip(1) {
        let reply = admit(&mut client, id, vec![span(Role::Tool, &tool_text(n, 50))])
            .await
            .unwrap();
        assert_eq!(reply.turn, before[n].turn + 1, "{id}");
    }
    let mut after = Vec::new();
    for id in &ids {
        after.push(context(&mut client, id).await);
    }
    daemon.restart().await;
    let mut client = daemon.client().await;
    for (id, expected) in ids.iter().zip(&after) {
        assert_eq!(
            &context(&mut client, id).await,
            expected,
            "{id} after restart"
        );
    }
}
