//! Watching markers: replay from the durable log then live delivery, in
//! order, contiguous, resumable without gap or duplicate, each event the
//! very bytes its generated message encodes to.

use std::time::Duration;

use ctxbroker_proto::v1 as pb;
use pb::Role;
use prost::Message;
use prost::bytes::Buf;
use tonic::Code;

use crate::support::*;

/// Admits until the session has compacted `n` more times.
async fn compact_times(
    client: &mut pb::context_broker_client::ContextBrokerClient<tonic::transport::Channel>,
    id: &str,
    n: usize,
    seed: &mut u64,
) -> Vec<pb::CompactionMarker> {
    let mut got = Vec::new();
    while got.len() < n {
        *seed += 1;
        let text = prose(*seed, &["watch", id], 50);
        let reply = admit(client, id, vec![span(Role::Tool, &text)])
            .await
            .unwrap();
        got.extend(reply.compaction);
    }
    got
}

#[tokio::test]
async fn a_watcher_sees_every_marker_in_order_and_resumes_exactly() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "w-a", window(600)).await;
    create(&mut client, "w-b", window(600)).await;

    // A watcher from 0 before anything happened: live delivery.
    let (mut live, replayed) = watch_replay(&mut client, 0).await;
    assert!(replayed.is_empty());

    let mut seed = 0;
    let mut expected = Vec::new();
    for _ in 0..3 {
        expected.extend(compact_times(&mut client, "w-a", 2, &mut seed).await);
        expected.extend(compact_times(&mut client, "w-b", 2, &mut seed).await);
    }
    let got = read_markers(&mut live, expected.len()).await;
    assert_eq!(got, expected);
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.seq, i as u64 + 1, "contiguous from 1");
    }

    // A watcher that read part, disconnected, and resumes at last + 1.
    let (partial, _) = {
        let mut stream = client
            .watch_compactions(pb::WatchCompactionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        (read_markers(&mut stream, 5).await, ())
    };
    let last = partial.last().unwrap().seq;
    let more = compact_times(&mut client, "w-a", 3, &mut seed).await;
    expected.extend(more);
    let (mut resumed, replay) = watch_replay(&mut client, last + 1).await;
    let mut rest = replay;
    assert_eq!(rest.first().map(|m| m.seq), Some(last + 1));
    let tail = compact_times(&mut client, "w-b", 2, &mut seed).await;
    expected.extend(tail.clone());
    rest.extend(read_markers(&mut resumed, tail.len()).await);
    let mut whole = partial.clone();
    whole.extend(rest);
    assert_eq!(
        whole, expected,
        "resumed watcher: exactly the rest, no gap, no duplicate"
    );

    // The first watcher kept up live through all of it.
    let more_live = read_markers(&mut live, expected.len() - got.len()).await;
    assert_eq!([got, more_live].concat(), expected);
}

#[tokio::test]
async fn a_session_filter_delivers_only_that_session_in_order() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "f-a", window(600)).await;
    create(&mut client, "f-b", window(600)).await;
    let mut stream = client
        .watch_compactions(pb::WatchCompactionsRequest {
            session_ids: vec!["f-b".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut seed = 0;
    let mut want = Vec::new();
    for _ in 0..3 {
        compact_times(&mut client, "f-a", 1, &mut seed).await;
        want.extend(compact_times(&mut client, "f-b", 1, &mut seed).await);
    }
    let got = read_markers(&mut stream, want.len()).await;
    assert_eq!(got, want);
    assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
}

#[tokio::test]
async fn watching_from_beyond_the_head_is_refused() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let status = client
        .watch_compactions(pb::WatchCompactionsRequest {
            from_seq: 1_000,
            ..Default::default()
        })
        .await
        .expect_err("from_seq beyond the head");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("from_seq"), "{status:?}");
}

#[tokio::test]
async fn retention_trims_the_log_and_old_positions_get_out_of_range() {
    let daemon = Daemon::start_with(&["--marker-retention", "4"]).await;
    let mut client = daemon.client().await;
    create(&mut client, "r", window(600)).await;
    let mut seed = 0;
    compact_times(&mut client, "r", 7, &mut seed).await;
    let info = client
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.next_marker_seq, 8);
    assert_eq!(info.oldest_marker_seq, 4);
    let status = client
        .watch_compactions(pb::WatchCompactionsRequest {
            from_seq: 2,
            ..Default::default()
        })
        .await
        .expect_err("below retention");
    assert_eq!(status.code(), Code::OutOfRange);
    assert_eq!(status.metadata().get("oldest-seq").unwrap(), "4");
    let (_s, kept) = watch_replay(&mut client, 4).await;
    assert_eq!(kept.iter().map(|m| m.seq).collect::<Vec<_>>(), [4, 5, 6, 7]);
}

#[tokio::test]
async fn shutdown_ends_watches_with_where_to_resume() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "s", window(600)).await;
    let mut seed = 0;
    compact_times(&mut client, "s", 2, &mut seed).await;
    let (mut stream, replayed) = watch_replay(&mut client, 0).await;
    assert_eq!(replayed.len(), 2);

    let waiter = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("the stream ends within 20 s")
    });
    let status = daemon.terminate(Duration::from_secs(20));
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    let ended = waiter.await.unwrap().expect_err("ended with a status");
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    assert_eq!(ended.metadata().get("resume-from-seq").unwrap(), "3");
}

#[tokio::test]
async fn a_stalled_watcher_neither_holds_back_admissions_nor_misses_a_marker() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "busy", window(400)).await;

    // A watcher on its own connection reads its (empty) replay, then stops
    // reading while hundreds of markers are written: far more than the
    // transport's windows and the server's buffers hold.
    let mut watcher = daemon.client().await;
    let (stalled, replayed) = watch_replay(&mut watcher, 0).await;
    assert!(replayed.is_empty());

    let mut written = 0u64;
    for n in 0..600u64 {
        let text = format!("Step {n}: {}", prose(n, &["stall", "busy"], 120));
        let reply = admit(&mut client, "busy", vec![span(Role::Tool, &text)])
            .await
            .unwrap_or_else(|s| panic!("admission {n} held back or refused: {s:?}"));
        written += u64::from(reply.compaction.is_some());
    }
    assert!(written >= 300, "{written} markers");

    // When it reads again it gets every marker from 1 in order, once — or
    // a status saying where to resume, and the rest from there.
    let mut seqs = Vec::new();
    let mut stream = stalled;
    loop {
        if seqs.len() as u64 == written {
            break;
        }
        let next = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("the watcher is served within 30 s");
        match next {
            Ok(Some(event)) => {
                if let Some(pb::watch_compactions_response::Event::Marker(m)) = event.event {
                    seqs.push(m.seq);
                }
            }
            Ok(None) => panic!(
                "the watch ended without a status after {} markers",
                seqs.len()
            ),
            Err(status) => {
                let resume: u64 = status
                    .metadata()
                    .get("resume-from-seq")
                    .unwrap_or_else(|| panic!("a resumable status: {status:?}"))
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(
                    resume,
                    seqs.len() as u64 + 1,
                    "resume where delivery stopped"
                );
                stream = watch_replay(&mut watcher, resume).await.0;
            }
        }
    }
    assert_eq!(seqs, (1..=written).collect::<Vec<_>>());
    eprintln!(
        "stalled watcher: {written} markers written while it did not read, all delivered in order"
    );
    // Nothing more arrives: the watcher saw exactly the markers written.
    if let Ok(Ok(Some(pb::WatchCompactionsResponse {
        event: Some(pb::watch_compactions_response::Event::Marker(m)),
    }))) = tokio::time::timeout(Duration::from_millis(300), stream.message()).await
    {
        panic!("an extra marker {}", m.seq);
    }
}

/// A codec that sends a `WatchCompactionsRequest` and hands back each
/// response undecoded: the bytes the daemon framed.
#[derive(Debug, Clone, Copy, Default)]
struct RawWatch;

impl tonic::codec::Codec for RawWatch {
    type Encode = pb::WatchCompactionsRequest;
    type Decode = Vec<u8>;
    type Encoder = RawWatch;
    type Decoder = RawWatch;

    fn encoder(&mut self) -> RawWatch {
        RawWatch
    }

    fn decoder(&mut self) -> RawWatch {
        RawWatch
    }
}

impl tonic::codec::Encoder for RawWatch {
    type Item = pb::WatchCompactionsRequest;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: pb::WatchCompactionsRequest,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        item.encode(dst)
            .map_err(|err| tonic::Status::internal(err.to_string()))
    }
}

impl tonic::codec::Decoder for RawWatch {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// A watch whose events arrive as the bytes the daemon sent.
async fn watch_raw(
    daemon: &Daemon,
    request: pb::WatchCompactionsRequest,
) -> tonic::Streaming<Vec<u8>> {
    let mut grpc = tonic::client::Grpc::new(daemon.channel().await);
    grpc.ready().await.expect("the channel is ready");
    grpc.server_streaming(
        tonic::Request::new(request),
        tonic::codegen::http::uri::PathAndQuery::from_static(
            "/ctxbroker.v1.ContextBroker/WatchCompactions",
        ),
        RawWatch,
    )
    .await
    .expect("WatchCompactions starts")
    .into_inner()
}

/// The next event's bytes.
async fn next_raw(stream: &mut tonic::Streaming<Vec<u8>>) -> Vec<u8> {
    tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("an event within 30 s")
        .expect("the watch stays up")
        .expect("the watch does not end")
}

/// What encoding the event as the generated message writes.
fn encoded(event: pb::watch_compactions_response::Event) -> Vec<u8> {
    pb::WatchCompactionsResponse { event: Some(event) }.encode_to_vec()
}

#[tokio::test]
async fn watchers_receive_exactly_the_bytes_the_message_encodes_to() {
    use pb::watch_compactions_response::Event;

    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    create(&mut client, "x-a", window(600)).await;
    create(&mut client, "x-b", window(600)).await;
    let caught_up = |next_seq| encoded(Event::CaughtUp(pb::CaughtUp { next_seq }));

    // Two live watchers, one of them filtered: each marker is encoded once
    // and its bytes go to both.
    let mut live = watch_raw(&daemon, pb::WatchCompactionsRequest::default()).await;
    let mut filtered = watch_raw(
        &daemon,
        pb::WatchCompactionsRequest {
            session_ids: vec!["x-b".into()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(next_raw(&mut live).await, caught_up(1));
    assert_eq!(next_raw(&mut filtered).await, caught_up(1));

    // The markers as the admissions that wrote them return them.
    let mut seed = 0;
    let mut markers = Vec::new();
    for _ in 0..2 {
        markers.extend(compact_times(&mut client, "x-a", 2, &mut seed).await);
        markers.extend(compact_times(&mut client, "x-b", 1, &mut seed).await);
    }
    for marker in &markers {
        let bytes = next_raw(&mut live).await;
        assert_eq!(bytes, encoded(Event::Marker(marker.clone())), "{marker:?}");
        let decoded = pb::WatchCompactionsResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.event, Some(Event::Marker(marker.clone())));
    }
    for marker in markers.iter().filter(|m| m.session_id == "x-b") {
        assert_eq!(
            next_raw(&mut filtered).await,
            encoded(Event::Marker(marker.clone()))
        );
    }

    // The markers as the store's log holds them: a watcher from the first
    // replays them, and receives the same bytes.
    let mut replayed = watch_raw(
        &daemon,
        pb::WatchCompactionsRequest {
            from_seq: 1,
            ..Default::default()
        },
    )
    .await;
    for marker in &markers {
        assert_eq!(
            next_raw(&mut replayed).await,
            encoded(Event::Marker(marker.clone())),
            "replayed {}",
            marker.seq
        );
    }
    assert_eq!(
        next_raw(&mut replayed).await,
        caught_up(markers.len() as u64 + 1)
    );
}
