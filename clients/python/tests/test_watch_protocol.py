"""The watcher against a scripted server that breaks the contract: it must
resume from the right sequence and refuse a gap or a repeat instead of
passing it on. (The real daemon's behaviour is tested in test_watch.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from ctxbroker_client import Broker, MarkerSequenceError, pb, pb_grpc

Script = Callable[
    [pb.WatchCompactionsRequest, grpc.ServicerContext], Iterator[pb.WatchCompactionsResponse]
]


def marker(seq: int) -> pb.WatchCompactionsResponse:
    return pb.WatchCompactionsResponse(marker=pb.CompactionMarker(seq=seq, session_id="s"))


def caught_up(next_seq: int) -> pb.WatchCompactionsResponse:
    return pb.WatchCompactionsResponse(caught_up=pb.CaughtUp(next_seq=next_seq))


class Scripted(pb_grpc.ContextBrokerServicer):
    """Answers the n-th WatchCompactions call with the n-th script."""

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.requests: list[pb.WatchCompactionsRequest] = []

    def WatchCompactions(self, request, context):  # noqa: N802 (generated name)
        self.requests.append(request)
        index = min(len(self.requests), len(self.scripts)) - 1
        yield from self.scripts[index](request, context)


@pytest.fixture
def serve():
    servers = []

    def start(scripts: list[Script]) -> tuple[Broker, Scripted]:
        servicer = Scripted(scripts)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ContextBrokerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return Broker(f"127.0.0.1:{port}"), servicer

    yield start
    for server in servers:
        server.stop(None)


def test_resumes_from_the_last_seq_plus_one(serve) -> None:
    def first(request, context):
        yield marker(1)
        yield caught_up(2)
        yield marker(2)
        context.set_trailing_metadata((("resume-from-seq", "3"),))
        context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")

    def second(request, context):
        yield caught_up(request.from_seq)
        yield marker(3)

    broker, servicer = serve([first, second])
    with broker.watch(from_seq=1, max_backoff=0.1) as watch:
        assert [next(watch).seq for _ in range(3)] == [1, 2, 3]
    assert [(r.start, r.from_seq) for r in servicer.requests] == [
        (pb.WATCH_START_FROM_SEQ, 1),
        (pb.WATCH_START_FROM_SEQ, 3),
    ]
    assert watch.resume_hints == [3]
    assert watch.reconnects == 1


def test_a_stream_that_ends_without_status_is_resumed(serve) -> None:
    def first(request, context):
        yield marker(5)

    def second(request, context):
        yield marker(request.from_seq)

    broker, servicer = serve([first, second])
    with broker.watch(from_seq=5, max_backoff=0.1) as watch:
        assert [next(watch).seq for _ in range(2)] == [5, 6]
    assert [r.from_seq for r in servicer.requests] == [5, 6]


@pytest.mark.parametrize("sent", [[1, 2, 4], [1, 2, 2], [1, 3]])
def test_a_gap_or_a_repeat_is_refused(serve, sent: list[int]) -> None:
    def script(request, context):
        for seq in sent:
            yield marker(seq)

    broker, _ = serve([script])
    watch = broker.watch(from_seq=1)
    with pytest.raises(MarkerSequenceError):
        for _ in sent:
            next(watch)


def test_a_resume_that_replays_old_markers_is_refused(serve) -> None:
    def first(request, context):
        yield marker(1)
        yield marker(2)
        context.abort(grpc.StatusCode.UNAVAILABLE, "gone")

    def replays_from_one(request, context):
        yield marker(1)

    broker, _ = serve([first, replays_from_one])
    watch = broker.watch(from_seq=1, max_backoff=0.1)
    assert [next(watch).seq, next(watch).seq] == [1, 2]
    with pytest.raises(MarkerSequenceError, match="expected marker 3"):
        next(watch)


def test_start_now_resumes_from_its_caught_up_position(serve) -> None:
    def first(request, context):
        yield caught_up(10)
        context.abort(grpc.StatusCode.UNAVAILABLE, "gone")

    def second(request, context):
        yield caught_up(request.from_seq)
        yield marker(request.from_seq)

    broker, servicer = serve([first, second])
    with broker.watch(start=pb.WATCH_START_NOW, max_backoff=0.1) as watch:
        assert next(watch).seq == 10
    assert [(r.start, r.from_seq) for r in servicer.requests] == [
        (pb.WATCH_START_NOW, 0),
        (pb.WATCH_START_FROM_SEQ, 10),
    ]


def test_out_of_range_is_not_retried(serve) -> None:
    def script(request, context):
        yield from ()
        context.abort(grpc.StatusCode.OUT_OF_RANGE, "below retention")

    broker, servicer = serve([script])
    with pytest.raises(Exception) as raised:
        next(broker.watch(from_seq=1))
    assert getattr(raised.value, "code", None) == grpc.StatusCode.OUT_OF_RANGE
    assert len(servicer.requests) == 1
