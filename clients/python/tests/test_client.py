"""The typed wrapper against the real daemon: sessions, admission,
compaction by class, the archive, errors with their google.rpc details."""

from __future__ import annotations

import grpc
import pytest
from conftest import CONSTRAINT, admit_tools, small_session, tool_output

from ctxbroker_client import Broker, errors, pb, tool, user


def test_create_session_spells_out_the_effective_configuration(broker: Broker) -> None:
    session = broker.create_session("cfg", window_tokens=400)
    assert session.session_id == "cfg"
    assert session.config.window_tokens == 400
    assert session.config.alpha == pytest.approx(0.85)
    assert session.config.trigger == pb.TRIGGER_POLICY_TOKEN_BUDGET
    assert session.config.tokenizer == pb.TOKENIZER_KIND_O200K_BASE
    assert session.totals.budget_tokens == 340  # floor(0.85 * 400)
    assert session.totals.live_tokens == 0
    assert [s.session_id for s in broker.list_sessions()] == ["cfg"]

    custom = broker.create_session(
        "cfg2", window_tokens=1000, alpha=0.5, reserved_overhead_tokens=100
    )
    assert custom.totals.budget_tokens == 400  # floor(0.5 * 1000) - 100
    assert broker.get_session("cfg2").config.reserved_overhead_tokens == 100


def test_errors_carry_their_code_reason_and_details(broker: Broker) -> None:
    broker.create_session("dup", window_tokens=400)
    with pytest.raises(errors.AlreadyExists) as exists:
        broker.create_session("dup", window_tokens=400)
    assert exists.value.reason == "SESSION_EXISTS"
    assert exists.value.domain == "ctxbroker.v1"
    assert exists.value.metadata["session_id"] == "dup"

    with pytest.raises(errors.SessionNotFound) as missing:
        broker.get_context("nobody")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert missing.value.metadata["session_id"] == "nobody"

    with pytest.raises(errors.InvalidArgument) as bad:
        broker.create_session("bad id with spaces", window_tokens=0)
    fields = {v.field for v in bad.value.field_violations}
    assert "session_id" in fields
    assert any("window_tokens" in f for f in fields), fields

    with pytest.raises(errors.InvalidArgument) as empty:
        broker.admit("dup", [])
    assert any(v.field == "spans" for v in empty.value.field_violations)

    with pytest.raises(errors.SpanNotFound):
        broker.get_span("dup", 999)


def test_admission_counts_classifies_and_orders_the_context(broker: Broker) -> None:
    broker.create_session("agent", window_tokens=100_000)
    first = broker.admit("agent", [user(CONSTRAINT)])
    (constraint,) = first.spans
    assert constraint.span_id == 1
    assert constraint.span_class == pb.SPAN_CLASS_CONSTRAINT
    assert constraint.class_source == pb.CLASS_SOURCE_RULES
    assert constraint.class_rule.startswith("standing ")
    assert constraint.tokens == 12
    assert constraint.predicate.modality == pb.MODALITY_PROHIBITION
    assert {"prod", "stage"} <= set(constraint.predicate.required_terms)
    assert first.turn == 1 and first.compaction is None and not first.replayed

    second = broker.admit("agent", [user("Deploy web to staging."), tool(tool_output(1))])
    ids = [s.span_id for s in second.spans]
    assert ids == [2, 3]
    assert second.spans[1].span_class == pb.SPAN_CLASS_NARRATIVE
    assert second.spans[1].class_rule == "role:tool"
    assert second.spans[1].tokens == 83
    assert second.turn == 2

    context = broker.get_context("agent")
    assert [s.span_id for s in context.spans] == [1, 2, 3]
    assert context.totals.live_tokens == sum(s.tokens for s in context.spans)
    assert context.totals.pinned_tokens == 12
    assert context.totals.live_tokens == second.totals.live_tokens
    assert context.messages()[0] == ("user", CONSTRAINT)
    assert [s.span_id for s in context.constraints()] == [1]
    assert all(0.0 <= s.relevance <= 1.0 for s in context.spans)


def test_compaction_keeps_the_constraint_verbatim_and_archives_narrative(broker: Broker) -> None:
    small_session(broker, "cliff")
    markers = admit_tools(broker, "cliff", range(1, 11))
    # Admissions 4..10 each needed room.
    assert [m.seq for m in markers] == list(range(1, 8))
    for marker in markers:
        assert marker.session_id == "cliff"
        assert marker.trigger == pb.COMPACTION_TRIGGER_HARD_BUDGET
        assert marker.outcome == pb.COMPACTION_OUTCOME_COMMITTED
        assert marker.tokens_after < marker.tokens_before
        assert marker.tokens_after + marker.incoming_tokens <= marker.budget_tokens
        assert marker.pinned_retained == marker.pinned_total == 1
        assert marker.evicted_span_ids

    context = broker.get_context("cliff")
    assert context.totals.live_tokens <= context.totals.budget_tokens == 340
    first = context.spans[0]
    assert first.span_id == 1 and first.text == CONSTRAINT  # verbatim, first
    assert first.span_class == pb.SPAN_CLASS_CONSTRAINT
    summaries = [s for s in context.spans if s.span_class == pb.SPAN_CLASS_SUMMARY]
    assert len(summaries) == 1 and summaries[0].generation >= 1
    assert summaries[0].summarized_span_ids

    evicted = markers[0].evicted_span_ids[0]
    archived = broker.get_span("cliff", evicted)
    assert archived.state == pb.SPAN_STATE_ARCHIVED
    assert archived.archived_by_seq == markers[0].seq
    assert archived.text.startswith("kubectl -n staging apply")


def test_an_evicted_turn_is_found_again_by_an_anchor(broker: Broker) -> None:
    small_session(broker, "anchors")
    markers = admit_tools(broker, "anchors", range(1, 11))
    evicted = markers[0].evicted_span_ids[0]
    original = broker.get_span("anchors", evicted)
    # The anchor of that turn, as the agent would have it: its manifest.
    anchor = next(w for w in original.text.split() if w.startswith("k8s/"))
    hits = list(
        broker.search_spans("anchors", anchor.rstrip(":"), roles=[pb.ROLE_TOOL], page_size=2)
    )
    assert hits[0].span_id == evicted
    assert hits[0].state == pb.SPAN_STATE_ARCHIVED
    assert hits[0].archived_by_seq == markers[0].seq
    assert anchor.rstrip(":") in hits[0].snippet
    assert broker.get_span("anchors", hits[0].span_id).text == original.text
    # Listing walks every span once, in id order, across pages.
    listed = [s.span_id for s in broker.list_spans("anchors", page_size=3)]
    assert listed == sorted(set(listed)) and evicted in listed
    with pytest.raises(errors.InvalidArgument):
        list(broker.search_spans("anchors", "", page_size=2))


def test_a_turn_that_can_never_fit_is_refused_whole(broker: Broker) -> None:
    small_session(broker, "burst")
    admit_tools(broker, "burst", range(1, 5))
    before = broker.get_session("burst")
    with pytest.raises(errors.CompactionInvariant) as refused:
        broker.admit("burst", [tool("log line " * 200)])
    err = refused.value
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.incoming_tokens == 401
    assert err.budget_tokens == 340 and err.window_tokens == 400
    assert err.pinned_tokens == 12
    assert err.live_tokens == before.totals.live_tokens
    assert err.violations == ["VIOLATION_KIND_TURN_TOO_LARGE"]
    assert err.precondition_violations[0].type == "VIOLATION_KIND_TURN_TOO_LARGE"
    after = broker.get_session("burst")
    assert after.revision == before.revision
    assert after.totals.live_tokens == before.totals.live_tokens
    # The refusal is recorded as an ABORTED marker.
    with broker.watch(from_seq=err.marker_seq) as watch:
        aborted = next(watch)
    assert aborted.seq == err.marker_seq
    assert aborted.outcome == pb.COMPACTION_OUTCOME_ABORTED
    assert aborted.tokens_after == aborted.tokens_before


def test_plan_then_commit_and_stale_plans(broker: Broker) -> None:
    small_session(broker, "plan")
    admit_tools(broker, "plan", range(1, 4))
    planned = broker.plan_compaction("plan", target_tokens=150)
    assert planned.verification.passed
    plan = planned.plan
    assert plan.tokens_after <= 150 < plan.tokens_before
    assert 1 in plan.kept_span_ids  # the constraint is never evicted
    assert all(e.span_id != 1 for e in plan.evicted)

    committed = broker.commit_compaction("plan", plan.plan_id, actor="reviewer")
    assert committed.marker.trigger == pb.COMPACTION_TRIGGER_MANUAL
    assert committed.marker.actor == "reviewer"
    assert committed.totals.live_tokens == plan.tokens_after

    with pytest.raises(errors.StalePlan) as stale:
        broker.commit_compaction("plan", plan.plan_id, actor="reviewer")
    assert stale.value.code == grpc.StatusCode.ABORTED


def test_retried_turns_are_admitted_once(broker: Broker) -> None:
    broker.create_session("retry", window_tokens=10_000)
    turn = [tool(tool_output(1), idempotency_key="call-1")]
    first = broker.admit("retry", turn)
    again = broker.admit("retry", turn)
    assert not first.replayed and again.replayed
    assert [s.span_id for s in again.spans] == [s.span_id for s in first.spans]
    assert broker.get_session("retry").turns == 1


def test_server_info_reports_limits_and_marker_bounds(broker: Broker) -> None:
    info = broker.server_info()
    assert info.version
    assert info.durability == "flush"
    assert info.limits.max_spans_per_turn > 0
    assert info.next_marker_seq == 1 and info.oldest_marker_seq == 1
    assert pb.TOKENIZER_KIND_O200K_BASE in info.tokenizers
