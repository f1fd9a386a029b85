"""Watching markers against the real daemon: replay then live, resume
across kill -9 and orderly restarts with no gap and no repeat, retention,
start positions and session filters."""

from __future__ import annotations

import pytest
from conftest import Collector, admit_tools, small_session

from ctxbroker_client import Broker, LocalDaemon, errors, pb


def test_replay_then_caught_up_then_live(broker: Broker) -> None:
    small_session(broker, "live")
    replied = admit_tools(broker, "live", range(1, 6))  # markers 1, 2
    watch = broker.watch(from_seq=1)
    collector = Collector(watch)
    collector.until(2)
    assert watch.caught_up.wait(10)
    assert watch.next_seq == 3
    replied += admit_tools(broker, "live", range(6, 8))  # live: 3, 4
    collector.until(4)
    collector.stop()
    assert [m.seq for m in collector.markers] == [1, 2, 3, 4]
    for seen, sent in zip(collector.markers, replied, strict=True):
        assert seen == sent  # every field, as the Admit reply carried it


@pytest.mark.parametrize("how", ["kill", "term"])
def test_resume_across_restarts_has_no_gap_and_no_repeat(
    daemon: LocalDaemon, broker: Broker, how: str
) -> None:
    small_session(broker, "restart")
    replied = admit_tools(broker, "restart", range(1, 6))
    reconnects: list[tuple[int | None, object]] = []
    watch = broker.watch(
        from_seq=1, max_backoff=0.5, on_reconnect=lambda s, e: reconnects.append((s, e))
    )
    collector = Collector(watch)
    collector.until(2)

    daemon.restart(kill=(how == "kill"))
    replied += admit_tools(broker, "restart", range(6, 9))
    collector.until(5)
    daemon.restart(kill=(how == "kill"))
    replied += admit_tools(broker, "restart", range(9, 11))
    collector.until(7)
    collector.stop()

    assert daemon.starts == 3
    assert [m.seq for m in collector.markers] == list(range(1, 8))
    assert [m.seq for m in replied] == list(range(1, 8))
    for seen, sent in zip(collector.markers, replied, strict=True):
        assert seen == sent
    assert len(reconnects) >= 2
    assert watch.reconnects >= 2
    if how == "term":
        # Each orderly shutdown said where to resume, and it was right.
        hinted = [
            (seq, err.resume_from_seq)
            for seq, err in reconnects
            if isinstance(err, errors.Unavailable) and err.resume_from_seq is not None
        ]
        assert hinted == [(3, 3), (6, 6)]
        assert watch.resume_hints == [3, 6]


def test_a_watch_below_retention_is_out_of_range(binary) -> None:
    with (
        LocalDaemon(binary, args=["--marker-retention", "2"]) as daemon,
        Broker(daemon.address) as broker,
    ):
        small_session(broker, "old")
        admit_tools(broker, "old", range(1, 9))  # markers 1..5
        info = broker.server_info()
        assert info.next_marker_seq == 6
        assert info.oldest_marker_seq > 1
        with pytest.raises(errors.MarkerOutOfRange) as gone:
            next(broker.watch(from_seq=1))
        assert gone.value.oldest_seq == info.oldest_marker_seq
        # OLDEST starts where retention does.
        with broker.watch(start=pb.WATCH_START_OLDEST) as watch:
            assert next(watch).seq == info.oldest_marker_seq


def test_start_now_sees_only_new_markers(broker: Broker) -> None:
    small_session(broker, "now")
    admit_tools(broker, "now", range(1, 6))  # markers 1, 2
    watch = broker.watch(start=pb.WATCH_START_NOW)
    collector = Collector(watch)
    assert watch.caught_up.wait(10)
    assert watch.next_seq == 3
    admit_tools(broker, "now", range(6, 7))
    collector.until(3)
    collector.stop()
    assert [m.seq for m in collector.markers] == [3]


def test_a_session_filter_skips_other_sessions(broker: Broker) -> None:
    small_session(broker, "a")
    small_session(broker, "b")
    admit_tools(broker, "a", range(1, 5))  # a: marker 1
    admit_tools(broker, "b", range(1, 6))  # b: markers 2, 3
    admit_tools(broker, "a", range(5, 6))  # a: marker 4
    with broker.watch(session_ids=["a"]) as watch:
        seen = [next(watch), next(watch)]
    assert [(m.seq, m.session_id, m.session_seq) for m in seen] == [(1, "a", 1), (4, "a", 2)]


def test_a_watch_gives_up_when_told_to(daemon: LocalDaemon, broker: Broker) -> None:
    watch = broker.watch(max_backoff=0.1, give_up_after=1.0)
    collector = Collector(watch)
    assert watch.caught_up.wait(10)
    daemon.kill()
    daemon.close()  # nothing listens on the address any more
    collector.thread.join(20)
    assert not collector.thread.is_alive()
    assert collector.failures and isinstance(collector.failures[0], errors.Unavailable)
