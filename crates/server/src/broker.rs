//! The broker: admission (DESIGN §4) and the session lifecycle, between the
//! wire (converted in `service`) and the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ctxbroker_core::admission::{self, AdmissionInput, Decision};
use ctxbroker_core::config::{ClassifierMode, SessionConfig, SessionMode, TokenizerKind};
use ctxbroker_core::marker::{CompactionTrigger, Marker, Outcome};
use ctxbroker_core::plan::{Plan, Sizes};
use ctxbroker_core::relevance::{self, RelevanceWeights};
use ctxbroker_core::span::{
    ClassSource, Classification, Predicate, PredicateSource, Role, SpanClass,
};
use ctxbroker_core::{Span, classify, predicate, tokens};
use ctxbroker_proto::v1 as pb;
use ctxbroker_store::{
    AdmitWrite, CompactionWrite, SessionRecord, SpanState, Store, StoredSpan, WriteOp,
};
use tracing::{info, warn};

use crate::config::Limits;
use crate::convert::{self, tokens32};
use crate::error::{ApiError, BadField, Escalation};
use crate::sessions::{Loaded, Sessions};
use crate::validate;

/// Texts at least this long are counted on the blocking pool, so that one
/// 120k-token tool result does not stall the runtime's workers.
const BLOCKING_COUNT_BYTES: usize = 64 << 10;

/// The broker's state: the store, the sessions in memory and the policy's
/// settings.
#[derive(Debug)]
pub struct Broker {
    store: Store,
    sessions: Sessions,
    limits: Limits,
    weights: RelevanceWeights,
    /// Sessions that exist or are being created: reserved before a create is
    /// written, so concurrent creates cannot overshoot `max_sessions`.
    session_count: AtomicU64,
}

/// A span counted and classified, before it has an id.
#[derive(Debug)]
struct Prepared {
    role: Role,
    text: String,
    tokens: u32,
    classification: Classification,
    predicate: Option<Predicate>,
    relevance_hint: Option<f64>,
    /// The caller left the class unspecified.
    unclassified: bool,
}

/// The result of an admission, for the wire.
#[derive(Debug)]
pub struct Admitted {
    /// The admitted spans.
    pub spans: Vec<Span>,
    /// The committed compaction marker, when one ran.
    pub marker: Option<Marker>,
    /// The record after the admission.
    pub record: SessionRecord,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Broker {
    /// A broker over an open store.
    pub fn new(store: Store, limits: Limits) -> Self {
        let session_count = AtomicU64::new(store.session_count());
        Broker {
            store,
            sessions: Sessions::default(),
            limits,
            weights: RelevanceWeights::default(),
            session_count,
        }
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Sessions held in memory now.
    pub fn resident_sessions(&self) -> usize {
        self.sessions.resident()
    }

    /// Creates a session.
    pub async fn create_session(
        &self,
        id: &str,
        config: SessionConfig,
    ) -> Result<SessionRecord, ApiError> {
        let mut slot = self.sessions.lock_for_create(id).await;
        if slot.is_some() {
            return Err(ApiError::SessionExists(id.to_owned()));
        }
        let max = self.limits.max_sessions;
        if self.session_count.fetch_add(1, Ordering::SeqCst) >= max {
            self.session_count.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::SessionLimit { max });
        }
        let record = SessionRecord::new(id, config, now_ms());
        let written = self
            .store
            .write(WriteOp::CreateSession {
                record: record.clone(),
            })
            .await;
        if let Err(err) = written {
            self.session_count.fetch_sub(1, Ordering::SeqCst);
            return Err(err.into());
        }
        self.sessions
            .remember_tokenizer(id, record.config.tokenizer);
        *slot = Some(Loaded {
            record: record.clone(),
            spans: Vec::new(),
            stale: false,
            gone: false,
        });
        info!(
            session_id = id,
            window = record.config.window_tokens,
            "session created"
        );
        Ok(record)
    }

    /// A session's record.
    pub async fn session(&self, id: &str) -> Result<SessionRecord, ApiError> {
        let session = self.sessions.lock(&self.store, id).await?;
        Ok(session.record.clone())
    }

    /// Sessions in id order after `after`, at most `limit`.
    pub fn list_sessions(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, ApiError> {
        Ok(self.store.sessions(after, limit)?)
    }

    /// Applies a configuration patch.
    pub async fn update_session(
        &self,
        id: &str,
        patch: &pb::SessionConfig,
    ) -> Result<SessionRecord, ApiError> {
        let mut session = self.sessions.lock(&self.store, id).await?;
        let config = validate::update_config(&session.record.config, patch, &self.limits)?;
        let budget = u64::from(config.budget_tokens());
        if session.record.live_tokens > budget {
            return Err(ApiError::ConfigBelowLive {
                live: session.record.live_tokens,
                budget,
            });
        }
        let mut record = session.record.clone();
        record.config = config;
        record.revision += 1;
        record.updated_at_ms = now_ms();
        // Cancel-safe: if this future is dropped while the writer holds the
        // write, the next request reloads from disk.
        session.stale = true;
        let written = self
            .store
            .write(WriteOp::UpdateSession {
                expected_revision: session.record.revision,
                record: record.clone(),
            })
            .await;
        written?;
        session.record = record.clone();
        session.stale = false;
        info!(
            session_id = id,
            revision = record.revision,
            "session updated"
        );
        Ok(record)
    }

    /// Deletes a session and everything it holds but its markers.
    pub async fn delete_session(&self, id: &str) -> Result<u64, ApiError> {
        let mut session = self.sessions.lock(&self.store, id).await?;
        session.stale = true;
        let ack = self
            .store
            .write(WriteOp::DeleteSession { id: id.to_owned() })
            .await?;
        self.sessions.remove(id, &mut session);
        self.session_count.fetch_sub(1, Ordering::SeqCst);
        info!(
            session_id = id,
            spans = ack.spans_deleted,
            "session deleted"
        );
        Ok(ack.spans_deleted)
    }

    /// The live context with relevance as of the latest turn.
    pub async fn context(&self, id: &str) -> Result<(SessionRecord, Vec<(Span, f64)>), ApiError> {
        let session = self.sessions.lock(&self.store, id).await?;
        let latest = session.record.turns;
        let query: Vec<&str> = session
            .spans
            .iter()
            .filter(|s| s.turn == latest && s.class() != SpanClass::Summary)
            .map(|s| s.text.as_str())
            .collect();
        let query = query.join("\n");
        let scores = relevance::score(&session.spans, &query, latest, &self.weights);
        let spans = session.spans.iter().cloned().zip(scores).collect();
        Ok((session.record.clone(), spans))
    }

    /// One span, live or archived.
    pub async fn span(&self, id: &str, span_id: u64) -> Result<StoredSpan, ApiError> {
        let session = self.sessions.lock(&self.store, id).await?;
        if let Some(span) = session.spans.iter().find(|s| s.id == span_id) {
            return Ok(StoredSpan {
                span: span.clone(),
                state: SpanState::Live,
            });
        }
        match self.store.span(id, span_id)? {
            Some(stored) => Ok(stored),
            None => Err(ApiError::SpanNotFound {
                session_id: id.to_owned(),
                span_id,
            }),
        }
    }

    /// Admits one turn: DESIGN §4. Counting and classification happen
    /// before the session's turn is taken; the decision, the write and the
    /// memory update happen within it.
    pub async fn admit(&self, id: &str, inputs: Vec<pb::SpanInput>) -> Result<Admitted, ApiError> {
        let tokenizer = self.sessions.tokenizer(&self.store, id)?;
        let mut prepared = prepare(inputs, tokenizer).await?;

        let mut session = self.sessions.lock(&self.store, id).await?;
        let actual = session.record.config.tokenizer;
        if actual != tokenizer {
            // Deleted and created again with another tokenizer while this
            // turn was being counted.
            self.sessions.remember_tokenizer(id, actual);
            if actual == TokenizerKind::Client || tokenizer == TokenizerKind::Client {
                return Err(ApiError::StaleRevision {
                    session_id: id.to_owned(),
                    expected: 0,
                    actual: session.record.revision,
                });
            }
            let counter = tokens::counter(actual);
            for p in &mut prepared {
                p.tokens = counter.count(&p.text);
            }
        }
        match self.admit_locked(&mut session, prepared).await {
            Ok(admitted) => Ok(admitted),
            Err(AdmitError::Clean(err)) => Err(err),
            Err(AdmitError::Dirty(err)) => {
                // The write may or may not have landed: the next request
                // starts from what is on disk.
                session.stale = true;
                Err(err)
            }
        }
    }

    async fn admit_locked(
        &self,
        session: &mut Loaded,
        prepared: Vec<Prepared>,
    ) -> Result<Admitted, AdmitError> {
        let now = now_ms();
        let before = &session.record;
        let config = &before.config;
        let turn = before.turns + 1;
        let first_id = before.next_span_id;
        let incoming: Vec<Span> = prepared
            .iter()
            .zip(first_id..)
            .map(|(p, id)| Span {
                id,
                position: id,
                role: p.role,
                classification: p.classification.clone(),
                text: p.text.clone(),
                tokens: p.tokens,
                generation: 0,
                turn,
                predicate: p.predicate.clone(),
                summary: None,
                relevance_hint: p.relevance_hint,
                admitted_at_ms: now,
                original: None,
            })
            .collect();
        let next_span_id = first_id + incoming.len() as u64;
        let approval_required = before.approval_required
            || config.mode == SessionMode::Approval
            || (config.classifier == ClassifierMode::CallerOnly
                && prepared.iter().any(|p| p.unclassified));

        let counter = tokens::counter(config.tokenizer);
        let decision = admission::decide(
            &AdmissionInput {
                config,
                live: &session.spans,
                incoming: &incoming,
                next_span_id,
                turn,
                now_ms: now,
            },
            &self.weights,
            counter,
        );

        let incoming_tokens: u64 = incoming.iter().map(|s| u64::from(s.tokens)).sum();
        let mut record = before.clone();
        record.turns = turn;
        record.next_span_id = next_span_id;
        record.revision += 1;
        record.updated_at_ms = now;
        record.last_admit_ms = now;
        record.approval_required = approval_required && config.mode != SessionMode::Approval;

        let (post, compaction) = match decision {
            Decision::Fits => (None, None),
            Decision::Compact(c) => {
                if approval_required {
                    return Err(AdmitError::Clean(ApiError::ApprovalRequired {
                        session_id: before.id.clone(),
                        live: before.live_tokens,
                        incoming: incoming_tokens,
                        budget: u64::from(config.budget_tokens()),
                    }));
                }
                let summary_id = c.plan.summary.as_ref().map(|s| s.id);
                if let Some(id) = summary_id {
                    record.next_span_id = record.next_span_id.max(id + 1);
                }
                record.compactions += 1;
                record.archived_spans += c.plan.evicted.len() as u64;
                record.marker_count += 1;
                record.last_compaction_turn = turn;
                let marker = committed_marker(before, &record, &c.plan, &c.post, now);
                let write = CompactionWrite {
                    evict: c.plan.evicted.iter().map(|e| e.span_id).collect(),
                    summary: c.plan.summary.clone(),
                    replace: Vec::new(),
                    marker,
                };
                (Some(c.post), Some(write))
            }
            Decision::Refuse(refusal) => {
                return Err(self
                    .record_refusal(session, refusal.sizes, refusal.violations, now)
                    .await);
            }
        };

        let mut live = post.unwrap_or_else(|| session.spans.clone());
        live.extend(incoming.iter().cloned());
        record.live_tokens = live.iter().map(|s| u64::from(s.tokens)).sum();
        record.live_spans = live.len() as u64;
        record.pinned_tokens = live
            .iter()
            .filter(|s| s.is_pinned())
            .map(|s| u64::from(s.tokens))
            .sum();
        record.pinned_spans = live.iter().filter(|s| s.is_pinned()).count() as u64;

        // Cancel-safe: if this future is dropped while the writer holds the
        // write, the next request reloads from disk.
        session.stale = true;
        let ack = self
            .store
            .write(WriteOp::Admit(AdmitWrite {
                expected_revision: before.revision,
                record: record.clone(),
                append: incoming.clone(),
                compaction: compaction.clone(),
            }))
            .await
            .map_err(|err| AdmitError::Dirty(err.into()))?;

        let marker = compaction.map(|write| {
            let mut marker = write.marker;
            marker.seq = ack.marker_seq.unwrap_or(0);
            info!(
                session_id = %record.id,
                seq = marker.seq,
                evicted = marker.evicted.len(),
                tokens_before = marker.tokens_before,
                tokens_after = marker.tokens_after,
                incoming = marker.incoming_tokens,
                "compaction committed"
            );
            marker
        });
        session.record = record.clone();
        session.spans = live;
        session.stale = false;
        Ok(Admitted {
            spans: incoming,
            marker,
            record,
        })
    }

    /// Writes the ABORTED marker of a refused turn and returns the
    /// escalation for the caller. Nothing but the session's marker count
    /// changes.
    async fn record_refusal(
        &self,
        session: &mut Loaded,
        sizes: Sizes,
        violations: Vec<ctxbroker_core::plan::Violation>,
        now: u64,
    ) -> AdmitError {
        let before = &session.record;
        let mut record = before.clone();
        record.marker_count += 1;
        let pinned_total = session.spans.iter().filter(|s| s.is_pinned()).count() as u32;
        let marker = Marker {
            seq: 0,
            session_id: before.id.clone(),
            session_seq: record.marker_count,
            trigger: CompactionTrigger::HardBudget,
            outcome: Outcome::Aborted,
            tokens_before: tokens32(before.live_tokens),
            tokens_after: tokens32(before.live_tokens),
            incoming_tokens: tokens32(sizes.incoming),
            window_tokens: before.config.window_tokens,
            budget_tokens: before.config.budget_tokens(),
            pinned_tokens: tokens32(sizes.pinned),
            evicted: Vec::new(),
            compressed: Vec::new(),
            summary_span_id: None,
            summary_generation: 0,
            pinned_retained: pinned_total,
            pinned_total,
            anchors_carried: 0,
            anchors_dropped: 0,
            violations: violations.clone(),
            at_ms: now,
            session_revision: before.revision,
            actor: String::new(),
            detail: format!(
                "turn refused: live {} + incoming {} tokens, pinned {}, budget {}, window {}",
                sizes.live, sizes.incoming, sizes.pinned, sizes.budget, sizes.window
            ),
        };
        session.stale = true;
        let written = self
            .store
            .write(WriteOp::Abort {
                session_id: before.id.clone(),
                marker,
                record: record.clone(),
            })
            .await;
        match written {
            Ok(ack) => {
                let marker_seq = ack.marker_seq.unwrap_or(0);
                warn!(
                    session_id = %record.id,
                    seq = marker_seq,
                    live = sizes.live,
                    incoming = sizes.incoming,
                    pinned = sizes.pinned,
                    budget = sizes.budget,
                    "admission escalated: compaction aborted"
                );
                session.record = record;
                session.stale = false;
                AdmitError::Clean(ApiError::Escalation(Box::new(Escalation {
                    session_id: session.record.id.clone(),
                    sizes,
                    violations,
                    marker_seq,
                })))
            }
            Err(err) => AdmitError::Dirty(err.into()),
        }
    }
}

/// Why an admission did not go through, and whether memory still mirrors
/// the disk.
enum AdmitError {
    /// Memory is current: nothing was written, or the write (an ABORTED
    /// marker) was acknowledged and mirrored.
    Clean(ApiError),
    /// A write failed: memory may differ from disk.
    Dirty(ApiError),
}

fn committed_marker(
    before: &SessionRecord,
    after: &SessionRecord,
    plan: &Plan,
    post: &[Span],
    now: u64,
) -> Marker {
    let pinned_retained = post.iter().filter(|s| s.is_pinned()).count() as u32;
    let summary = plan.summary.as_ref();
    Marker {
        seq: 0,
        session_id: before.id.clone(),
        session_seq: after.marker_count,
        trigger: CompactionTrigger::HardBudget,
        outcome: Outcome::Committed,
        tokens_before: tokens32(plan.tokens_before),
        tokens_after: tokens32(plan.tokens_after),
        incoming_tokens: tokens32(plan.incoming_tokens),
        window_tokens: before.config.window_tokens,
        budget_tokens: before.config.budget_tokens(),
        pinned_tokens: tokens32(
            post.iter()
                .filter(|s| s.is_pinned())
                .map(|s| u64::from(s.tokens))
                .sum(),
        ),
        evicted: plan.evicted.iter().map(|e| e.span_id).collect(),
        compressed: plan.compressed.iter().map(|c| c.span_id).collect(),
        summary_span_id: summary.map(|s| s.id),
        summary_generation: summary.map(|s| s.generation).unwrap_or(0),
        pinned_retained,
        pinned_total: tokens32(before.pinned_spans),
        anchors_carried: plan.anchors_carried,
        anchors_dropped: plan.anchors_dropped,
        violations: Vec::new(),
        at_ms: now,
        session_revision: after.revision,
        actor: String::new(),
        detail: format!(
            "evicted {} spans ({} -> {} live tokens) to admit {} tokens",
            plan.evicted.len(),
            plan.tokens_before,
            plan.tokens_after,
            plan.incoming_tokens
        ),
    }
}

/// Counts and classifies a turn's spans. Runs before the session's turn is
/// taken; large texts are counted on the blocking pool.
async fn prepare(
    inputs: Vec<pb::SpanInput>,
    tokenizer: TokenizerKind,
) -> Result<Vec<Prepared>, ApiError> {
    let mut bad = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        match (tokenizer, input.token_count) {
            (TokenizerKind::Client, None) => bad.push(BadField::new(
                format!("spans[{i}].token_count"),
                "is required: the session's tokenizer is CLIENT",
            )),
            (TokenizerKind::Client, Some(0)) => bad.push(BadField::new(
                format!("spans[{i}].token_count"),
                "must be greater than 0",
            )),
            (TokenizerKind::Client, Some(_)) | (_, None) => {}
            (_, Some(_)) => bad.push(BadField::new(
                format!("spans[{i}].token_count"),
                "is only accepted when the session's tokenizer is CLIENT; the broker counts this session's tokens itself",
            )),
        }
    }
    validate::finish(bad)?;

    let large = inputs.iter().map(|s| s.text.len()).sum::<usize>() >= BLOCKING_COUNT_BYTES;
    if large {
        tokio::task::spawn_blocking(move || prepare_now(inputs, tokenizer))
            .await
            .map_err(|err| ApiError::Internal(format!("token counting failed: {err}")))
    } else {
        Ok(prepare_now(inputs, tokenizer))
    }
}

fn prepare_now(inputs: Vec<pb::SpanInput>, tokenizer: TokenizerKind) -> Vec<Prepared> {
    let counter = tokens::counter(tokenizer);
    inputs
        .into_iter()
        .map(|input| {
            // Validated beforehand: role is known and specified.
            let role = convert::role_from_pb(input.role()).unwrap_or(Role::User);
            let tokens = match (tokenizer, input.token_count) {
                (TokenizerKind::Client, Some(n)) => n,
                _ => counter.count(&input.text),
            };
            let unclassified = input.span_class() == pb::SpanClass::Unspecified;
            let classification = match input.span_class() {
                pb::SpanClass::Constraint => Classification {
                    class: SpanClass::Constraint,
                    source: ClassSource::Caller,
                    rule: String::new(),
                },
                pb::SpanClass::Narrative | pb::SpanClass::Summary => Classification {
                    class: SpanClass::Narrative,
                    source: ClassSource::Caller,
                    rule: String::new(),
                },
                pb::SpanClass::Unspecified => classify::classify(role, &input.text),
            };
            let predicate = (classification.class == SpanClass::Constraint)
                .then(|| constraint_predicate(&input.text, input.predicate.as_ref()));
            Prepared {
                role,
                text: input.text,
                tokens,
                classification,
                predicate,
                relevance_hint: input.relevance_hint,
                unclassified,
            }
        })
        .collect()
}

/// The caller's predicate where given, its unset parts derived.
fn constraint_predicate(text: &str, given: Option<&pb::Predicate>) -> Predicate {
    let modality = given.and_then(|p| convert::modality_from_pb(p.modality()));
    let derived = predicate::derive(text, modality);
    match given {
        Some(p) if !p.required_terms.is_empty() => Predicate {
            modality: derived.modality,
            required_terms: p.required_terms.clone(),
            source: PredicateSource::Caller,
        },
        Some(_) if modality.is_some() => Predicate {
            source: PredicateSource::Caller,
            ..derived
        },
        _ => derived,
    }
}

/// Shared ownership of the broker by services and background tasks.
pub type SharedBroker = Arc<Broker>;
