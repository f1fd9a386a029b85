"""ctxbroker for LangChain: a chat message history and an agent middleware.

* :class:`CtxbrokerChatMessageHistory` is a ``BaseChatMessageHistory``
  whose messages are the broker's live context: ``add_messages`` admits
  them as one turn (compacted at admission by token budget, constraints
  pinned), ``messages`` reads what the broker kept, ``clear`` resets the
  session.
* :class:`CtxbrokerMiddleware` is a LangChain v1 agent middleware
  (``create_agent(model, tools, middleware=[...])``): before every model
  call it admits the agent state's messages the broker has not seen yet
  and gives the model the broker's context instead of the whole history.
  The agent's state keeps everything; the model sees what fits.

How messages map to spans: a message becomes a span of its role (human:
user, AI: assistant, system: system, tool: tool) holding its text, and
keeps itself, serialised, in the span's metadata, so that a message still
standing as admitted comes back exactly. An AI message's tool calls and
the tool messages answering them share one ``tool_call_id`` (the message's
first call id), so the broker keeps or evicts the call and all its
results together: the model never sees a tool result without its call, or
a call without its results, which the providers refuse. A summary the
broker wrote, or a constraint it shortened, comes back as a plain message
of its role and text.

Needs the ``langchain`` extra: ``pip install 'ctxbroker-client[langchain]'``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)

from ..client import Broker, span
from ..errors import BrokerError
from ..v1 import broker_pb2 as pb

#: The metadata key holding the message a span was admitted from.
MESSAGE_KEY = "langchain.message"
#: The metadata key holding the message's id, when it has one.
ID_KEY = "langchain.id"

_ROLES = {"human": pb.ROLE_USER, "ai": pb.ROLE_ASSISTANT, "system": pb.ROLE_SYSTEM}


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = [p if isinstance(p, str) else str(p.get("text", "")) for p in content]
    return "\n".join(p for p in parts if p)


class CtxbrokerChatMessageHistory(BaseChatMessageHistory):
    """A chat history kept by the broker's session ``session_id``, which
    must exist (see :meth:`open`)."""

    def __init__(self, broker: Broker, session_id: str) -> None:
        self.broker = broker
        self.session_id = session_id
        # Tool call id → the id of the exchange it belongs to: the first
        # call id of the AI message that made it.
        self._exchange: dict[str, str] = {}
        self._learned = False

    @classmethod
    def open(
        cls,
        broker: Broker,
        session_id: str,
        *,
        window_tokens: int,
        config: pb.SessionConfig | None = None,
    ) -> CtxbrokerChatMessageHistory:
        """The history of session ``session_id``, created with
        ``window_tokens`` (and the rest of ``config``) when it does not
        exist."""
        try:
            broker.create_session(session_id, window_tokens=window_tokens, config=config)
        except BrokerError as err:
            if err.reason != "SESSION_EXISTS":
                raise
        return cls(broker, session_id)

    def span_of(self, message: BaseMessage) -> pb.SpanInput:
        """The span a message is admitted as."""
        metadata = {MESSAGE_KEY: json.dumps(message_to_dict(message), default=str)}
        if message.id:
            metadata[ID_KEY] = str(message.id)
        text = _text(message)
        if isinstance(message, AIMessage) and message.tool_calls:
            calls = [str(c["id"]) for c in message.tool_calls if c.get("id")]
            exchange = calls[0] if calls else ""
            for call in calls:
                self._exchange[call] = exchange
            rendered = "; ".join(
                f"call {c['name']}({json.dumps(c.get('args', {}), sort_keys=True)})"
                for c in message.tool_calls
            )
            return span(
                pb.ROLE_ASSISTANT,
                f"{text}\n{rendered}".strip(),
                tool_call_id=exchange,
                tool_name=message.tool_calls[0]["name"],
                metadata=metadata,
            )
        if isinstance(message, ToolMessage):
            call = message.tool_call_id
            return span(
                pb.ROLE_TOOL,
                text or "(no output)",
                tool_call_id=self._exchange.get(call, call),
                tool_name=message.name or "",
                metadata=metadata,
            )
        role = _ROLES.get(message.type, pb.ROLE_USER)
        return span(role, text or "(empty)", metadata=metadata)

    @staticmethod
    def message_of(s: pb.Span) -> BaseMessage:
        """The message a live span stands for."""
        stored = s.metadata.get(MESSAGE_KEY)
        if stored is not None and s.span_class != pb.SPAN_CLASS_SUMMARY and not s.original_text:
            try:
                return messages_from_dict([json.loads(stored)])[0]
            except (ValueError, KeyError, TypeError):
                pass
        if s.role == pb.ROLE_ASSISTANT:
            return AIMessage(content=s.text)
        if s.role == pb.ROLE_SYSTEM:
            return SystemMessage(content=s.text)
        if s.role == pb.ROLE_TOOL and s.tool_call_id:
            return ToolMessage(content=s.text, tool_call_id=s.tool_call_id)
        return HumanMessage(content=s.text)

    def _learn(self, spans: Sequence[pb.Span]) -> list[BaseMessage]:
        """The messages of ``spans``, learning the exchanges of the AI
        messages among them."""
        self._learned = True
        messages = []
        for s in spans:
            message = self.message_of(s)
            if isinstance(message, AIMessage):
                for call in message.tool_calls:
                    if call.get("id"):
                        self._exchange.setdefault(str(call["id"]), s.tool_call_id)
            messages.append(message)
        return messages

    def learn_once(self) -> None:
        """Learns the live exchanges once, so that a tool message answering
        a call admitted before this process started joins its exchange."""
        if not self._learned:
            self._learn(self.broker.get_context(self.session_id).spans)

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The broker's live context, as messages."""
        return self._learn(self.broker.get_context(self.session_id).spans)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Admits the messages as one turn (nothing when there are none)."""
        if messages:
            self.learn_once()
            self.broker.admit(self.session_id, [self.span_of(m) for m in messages])

    def clear(self) -> None:
        """Empties the broker's session, keeping its settings."""
        self.broker.reset_session(self.session_id)
        self._exchange.clear()


class CtxbrokerMiddleware(AgentMiddleware):
    """Admits the agent's new messages before each model call and gives
    the model the broker's context in place of the state's history.

    Messages are told apart by their ids (the agent's state gives every
    message one); each is admitted once, with idempotency keys made from
    its id, so a retried call cannot admit it twice.
    """

    def __init__(self, history: CtxbrokerChatMessageHistory) -> None:
        super().__init__()
        self.history = history
        self._admitted: set[str] = set()

    def admit_new(self, messages: Sequence[BaseMessage]) -> None:
        """Admits, as one turn, the messages not admitted before."""
        new = [m for m in messages if not m.id or m.id not in self._admitted]
        if not new:
            return
        self.history.learn_once()
        spans = [self.history.span_of(m) for m in new]
        if all(m.id for m in new):
            for m, s in zip(new, spans, strict=True):
                s.idempotency_key = f"lc.{m.id}"[:128]
        self.history.broker.admit(self.history.session_id, spans)
        self._admitted.update(str(m.id) for m in new if m.id)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> Any:
        self.admit_new(request.messages)
        messages = cast(list[AnyMessage], self.history.messages)
        return handler(request.override(messages=messages))
