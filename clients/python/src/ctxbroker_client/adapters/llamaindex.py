"""ctxbroker as a LlamaIndex chat memory.

:class:`CtxbrokerMemory` is a ``BaseMemory``: a chat engine or agent that
``put``\\ s each message into it and ``get``\\ s its history back sees the
broker's live context, compacted at admission by token budget, with the
user's constraints pinned and tool calls kept with their results.

How messages map to spans: a message becomes a span of its role (``user``,
``assistant``, ``system``, ``tool``; others count as ``user``) holding its
text, with the message itself, serialised, in the span's metadata, so a
message still standing as admitted comes back exactly. A tool message's
``tool_call_id`` (in ``additional_kwargs``) becomes the span's
``tool_call_id``, and an assistant message that makes tool calls takes its
first call's id, so the broker keeps or evicts the call and its result
together. A summary the broker wrote, or a constraint it shortened, comes
back as a plain message of its role and text.

Needs the ``llamaindex`` extra: ``pip install 'ctxbroker-client[llamaindex]'``.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.memory.types import BaseMemory

from ..client import Broker, span
from ..errors import BrokerError
from ..v1 import broker_pb2 as pb

#: The metadata key holding the message a span was admitted from.
MESSAGE_KEY = "llamaindex.message"

_ROLES = {
    MessageRole.USER: pb.ROLE_USER,
    MessageRole.ASSISTANT: pb.ROLE_ASSISTANT,
    MessageRole.SYSTEM: pb.ROLE_SYSTEM,
    MessageRole.DEVELOPER: pb.ROLE_SYSTEM,
    MessageRole.TOOL: pb.ROLE_TOOL,
    MessageRole.FUNCTION: pb.ROLE_TOOL,
}
_BACK = {
    pb.ROLE_USER: MessageRole.USER,
    pb.ROLE_ASSISTANT: MessageRole.ASSISTANT,
    pb.ROLE_SYSTEM: MessageRole.SYSTEM,
    pb.ROLE_TOOL: MessageRole.TOOL,
}


def _call_id(message: ChatMessage) -> str:
    """The tool exchange a message belongs to, or ""."""
    kwargs = message.additional_kwargs
    direct = kwargs.get("tool_call_id")
    if isinstance(direct, str):
        return direct
    calls = kwargs.get("tool_calls")
    if isinstance(calls, list) and calls:
        first = calls[0]
        found = first.get("id") if isinstance(first, dict) else getattr(first, "id", None)
        if isinstance(found, str):
            return found
    return ""


def message_to_span(message: ChatMessage) -> pb.SpanInput:
    """The span a message is admitted as."""
    name = message.additional_kwargs.get("name")
    return span(
        _ROLES.get(message.role, pb.ROLE_USER),
        message.content or "(empty)",
        tool_call_id=_call_id(message),
        tool_name=name if isinstance(name, str) else "",
        metadata={MESSAGE_KEY: message.model_dump_json()},
    )


def span_to_message(s: pb.Span) -> ChatMessage:
    """The message a live span stands for."""
    stored = s.metadata.get(MESSAGE_KEY)
    if stored is not None and s.span_class != pb.SPAN_CLASS_SUMMARY and not s.original_text:
        try:
            return ChatMessage.model_validate_json(stored)
        except ValueError:
            pass
    kwargs: dict[str, Any] = {"tool_call_id": s.tool_call_id} if s.role == pb.ROLE_TOOL else {}
    return ChatMessage(
        role=_BACK.get(s.role, MessageRole.USER), content=s.text, additional_kwargs=kwargs
    )


class CtxbrokerMemory(BaseMemory):
    """A chat memory kept by the broker's session ``session_id``."""

    session_id: str
    _broker: Broker = PrivateAttr()

    def __init__(self, broker: Broker, session_id: str) -> None:
        # BaseMemory is a pydantic model: its fields are keyword arguments.
        super().__init__(session_id=session_id)  # type: ignore[call-arg]
        self._broker = broker

    @classmethod
    def class_name(cls) -> str:
        return "CtxbrokerMemory"

    @classmethod
    def from_defaults(cls, **kwargs: Any) -> CtxbrokerMemory:
        """``from_defaults(broker=..., session_id=..., window_tokens=...)``:
        the memory of session ``session_id``, created with ``window_tokens``
        (and the rest of ``config``, a ``SessionConfig``) when it does not
        exist."""
        broker = kwargs.pop("broker")
        session_id = kwargs.pop("session_id")
        window_tokens = kwargs.pop("window_tokens", None)
        config = kwargs.pop("config", None)
        if not isinstance(broker, Broker) or not isinstance(session_id, str):
            raise TypeError("from_defaults needs broker (a Broker) and session_id (a str)")
        if kwargs:
            raise TypeError(f"from_defaults: unknown arguments {sorted(kwargs)}")
        if window_tokens is not None:
            try:
                broker.create_session(session_id, window_tokens=int(window_tokens), config=config)
            except BrokerError as err:
                if err.reason != "SESSION_EXISTS":
                    raise
        return cls(broker, session_id)

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The broker's live context, as messages."""
        return [span_to_message(s) for s in self._broker.get_context(self.session_id).spans]

    def get_all(self) -> list[ChatMessage]:
        """The live context: what compaction evicted is in the broker's
        archive (``search_spans``), not in the history."""
        return self.get()

    def put(self, message: ChatMessage) -> None:
        """Admits one message as one turn."""
        self.put_messages([message])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Admits the messages as one turn."""
        if messages:
            self._broker.admit(self.session_id, [message_to_span(m) for m in messages])

    def set(self, messages: list[ChatMessage]) -> None:
        """Replaces the history: a reset, then the messages as one turn."""
        self.reset()
        self.put_messages(messages)

    def reset(self) -> None:
        """Empties the broker's session, keeping its settings."""
        self._broker.reset_session(self.session_id)
