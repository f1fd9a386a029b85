//! Builders shared by the store's integration tests: a session that
//! computes its own next record, the way the server does.

#![allow(dead_code, unreachable_pub, missing_docs, clippy::await_holding_lock)]

use ctxbroker_core::marker::{CompactionTrigger, Outcome};
use ctxbroker_core::plan::{Violation, ViolationKind};
use ctxbroker_core::span::{
    ClassSource, Classification, Modality, Predicate, PredicateSource, Role, SpanClass, SummaryInfo,
};
use ctxbroker_core::{Marker, SessionConfig, Span, SpanId};
use ctxbroker_store::{Change, SessionRecord, WriteOp};

pub fn record(id: &str) -> SessionRecord {
    SessionRecord::new(id, SessionConfig::with_window(100_000), 1_700_000_000_000)
}

pub fn span(id: SpanId, text: &str) -> Span {
    Span {
        id,
        position: id,
        role: Role::Tool,
        classification: Classification {
            class: SpanClass::Narrative,
            source: ClassSource::Rules,
            rule: "role:tool".into(),
        },
        text: text.to_owned(),
        tokens: text.len() as u32,
        generation: 0,
        turn: id,
        predicate: None,
        summary: None,
        relevance_hint: Some(0.5),
        admitted_at_ms: 1_700_000_000_000 + id,
        original: None,
        attributes: None,
    }
}

pub fn constraint(id: SpanId, text: &str) -> Span {
    Span {
        role: Role::User,
        classification: Classification {
            class: SpanClass::Constraint,
            source: ClassSource::Rules,
            rule: "prohibition:never".into(),
        },
        predicate: Some(Predicate {
            modality: Modality::Prohibition,
            required_terms: vec!["prod".into()],
            source: PredicateSource::Derived,
        }),
        relevance_hint: None,
        ..span(id, text)
    }
}

pub fn marker(session: &str, session_seq: u64, outcome: Outcome) -> Marker {
    Marker {
        seq: 0,
        session_id: session.to_owned(),
        session_seq,
        trigger: CompactionTrigger::HardBudget,
        outcome,
        tokens_before: 900,
        tokens_after: 400,
        incoming_tokens: 100,
        window_tokens: 1000,
        budget_tokens: 850,
        pinned_tokens: 20,
        evicted: vec![],
        tier_evicted: vec![],
        compressed: vec![],
        summary_span_id: None,
        summary_generation: 0,
        pinned_retained: 1,
        pinned_total: 1,
        anchors_carried: 2,
        anchors_dropped: 0,
        violations: if outcome == Outcome::Aborted {
            vec![Violation {
                kind: ViolationKind::PinnedMissing,
                span_id: Some(2),
                detail: "constraint 2 is missing".into(),
                missing_terms: vec!["prod".into()],
            }]
        } else {
            vec![]
        },
        at_ms: 1_700_000_000_500,
        session_revision: 0,
        turn: 0,
        actor: String::new(),
        detail: "test".into(),
    }
}

/// A change planned against `expected_revision` that leaves `record` and
/// changes nothing else until its other fields are set.
pub fn change(expected_revision: u64, record: SessionRecord) -> Change {
    Change {
        expected_revision,
        record,
        append: vec![],
        evict: vec![],
        summary: None,
        replace: vec![],
        marker: None,
    }
}

/// The write of `change` with the idempotency `keys` of its spans.
pub fn write(change: Change, keys: Vec<(String, SpanId)>) -> WriteOp {
    WriteOp::Change { change, keys }
}

/// A session as the server tracks it: each write computes the next record.
#[derive(Debug, Clone)]
pub struct Session {
    pub record: SessionRecord,
}

impl Session {
    pub fn new(id: &str) -> Session {
        Session { record: record(id) }
    }

    pub fn id(&self) -> &str {
        &self.record.id
    }

    pub fn create(&self) -> WriteOp {
        WriteOp::CreateSession {
            record: self.record.clone(),
        }
    }

    fn bump(&mut self, spans: &[Span]) {
        let r = &mut self.record;
        r.revision += 1;
        r.turns += 1;
        r.updated_at_ms += 1;
        r.last_admit_ms = r.updated_at_ms;
        for s in spans {
            r.next_span_id = r.next_span_id.max(s.id + 1);
            r.live_spans += 1;
            r.live_tokens += u64::from(s.tokens);
            if s.classification.class == SpanClass::Constraint {
                r.pinned_spans += 1;
                r.pinned_tokens += u64::from(s.tokens);
            }
        }
    }

    /// New narrative spans with the next ids.
    pub fn next_spans(&self, n: usize) -> Vec<Span> {
        (0..n as u64)
            .map(|i| {
                let id = self.record.next_span_id + i;
                span(id, &format!("{} span {id}", self.record.id))
            })
            .collect()
    }

    /// An admission of `n` new narrative spans.
    pub fn admit_next(&mut self, n: usize) -> WriteOp {
        let spans = self.next_spans(n);
        self.admit(spans)
    }

    /// An admission of `spans`, with no compaction.
    pub fn admit(&mut self, spans: Vec<Span>) -> WriteOp {
        let expected_revision = self.record.revision;
        self.bump(&spans);
        let record = self.record.clone();
        write(
            Change {
                append: spans,
                ..change(expected_revision, record)
            },
            vec![],
        )
    }

    /// An admission that first evicts `evict` into a summary standing at
    /// `summary_position`.
    pub fn admit_compacting(
        &mut self,
        evict: Vec<SpanId>,
        summary_position: u64,
        replace: Vec<Span>,
        append: Vec<Span>,
    ) -> (WriteOp, Span) {
        let expected_revision = self.record.revision;
        let summary_id = self.record.next_span_id;
        let summary = Span {
            id: summary_id,
            position: summary_position,
            role: Role::System,
            classification: Classification {
                class: SpanClass::Summary,
                source: ClassSource::Broker,
                rule: String::new(),
            },
            text: format!("summary of {evict:?}"),
            tokens: 10,
            generation: 1,
            turn: self.record.turns + 1,
            predicate: None,
            summary: Some(SummaryInfo {
                covers: evict.clone(),
                anchors: vec!["/etc/hosts".into()],
                anchors_dropped: 0,
            }),
            relevance_hint: None,
            admitted_at_ms: 1_700_000_000_999,
            original: None,
            attributes: None,
        };
        self.record.next_span_id = summary_id + 1;
        let r = &mut self.record;
        r.live_spans = r.live_spans + 1 - evict.len() as u64;
        r.archived_spans += evict.len() as u64;
        r.compactions += 1;
        r.marker_count += 1;
        r.last_compaction_turn = r.turns + 1;
        let mut m = marker(&r.id, r.marker_count, Outcome::Committed);
        m.evicted = evict.clone();
        m.compressed = replace.iter().map(|s| s.id).collect();
        m.summary_span_id = Some(summary_id);
        m.summary_generation = 1;
        m.session_revision = r.revision + 1;
        let append: Vec<Span> = append
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let id = summary_id + 1 + i as u64;
                Span {
                    id,
                    position: id,
                    ..s
                }
            })
            .collect();
        self.bump(&append);
        let op = write(
            Change {
                expected_revision,
                record: self.record.clone(),
                append,
                evict,
                summary: Some(summary.clone()),
                replace,
                marker: Some(m),
            },
            vec![],
        );
        (op, summary)
    }

    /// An aborted compaction: only the marker counter moves.
    pub fn abort(&mut self) -> WriteOp {
        self.record.marker_count += 1;
        let mut m = marker(&self.record.id, self.record.marker_count, Outcome::Aborted);
        m.session_revision = self.record.revision;
        let record = self.record.clone();
        write(
            Change {
                marker: Some(m),
                ..change(record.revision, record)
            },
            vec![],
        )
    }
}

/// A temporary directory for one store.
pub fn tempdir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("no temp dir: {e}"),
    }
}

/// Queues `ops` one after the other (each is in the queue before the next
/// is sent) and returns their pending outcomes, in order.
pub async fn queue_in_order(
    store: &ctxbroker_store::Store,
    ops: Vec<WriteOp>,
) -> Vec<tokio::task::JoinHandle<Result<ctxbroker_store::WriteAck, ctxbroker_store::StoreError>>> {
    let base = store.stats().queued;
    let mut handles = Vec::new();
    for op in ops {
        let store2 = store.clone();
        handles.push(tokio::spawn(async move { store2.write(op).await }));
        let want = base + handles.len() as u64;
        wait_until(|| store.stats().queued >= want).await;
    }
    handles
}

/// Polls `done` every millisecond; fails the test after 10 s.
pub async fn wait_until(done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !done() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "condition not reached within 10 s");
}
