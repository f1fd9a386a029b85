"""Python client for the ctxbroker daemon.

``ctxbroker_client.pb`` holds the messages generated from
``proto/ctxbroker/v1/broker.proto`` when this package was built;
:class:`Broker` wraps the common flow of an agent (create a session, admit
turns, build the prompt from the live context, watch compaction markers with
automatic resume); :class:`AsyncBroker` is the same client for asyncio;
:mod:`ctxbroker_client.errors` turns the daemon's statuses and google.rpc
details into exceptions.
"""

from . import errors
from .aio import AsyncBroker, aio_channel
from .client import (
    CHANNEL_OPTIONS,
    SESSION_HEADER,
    Admission,
    Broker,
    Context,
    Retry,
    Tls,
    assistant,
    channel,
    span,
    system,
    tool,
    user,
)
from .daemon import DaemonFailed, LocalDaemon, find_binary
from .errors import BrokerError
from .replicas import REPLICA_HEADER, ReplicaMarker, ReplicaWatch, replica_broker
from .v1 import broker_pb2 as pb
from .v1 import broker_pb2_grpc as pb_grpc
from .v1._contract import CONTRACT_DIGEST
from .watch import AsyncMarkerWatch, MarkerSequenceError, MarkerWatch, watch_in_thread

__all__ = [
    "CHANNEL_OPTIONS",
    "CONTRACT_DIGEST",
    "REPLICA_HEADER",
    "SESSION_HEADER",
    "Admission",
    "AsyncBroker",
    "AsyncMarkerWatch",
    "Broker",
    "BrokerError",
    "Context",
    "DaemonFailed",
    "LocalDaemon",
    "MarkerSequenceError",
    "MarkerWatch",
    "ReplicaMarker",
    "ReplicaWatch",
    "Retry",
    "Tls",
    "aio_channel",
    "assistant",
    "channel",
    "errors",
    "find_binary",
    "pb",
    "pb_grpc",
    "replica_broker",
    "span",
    "system",
    "tool",
    "user",
    "watch_in_thread",
]
