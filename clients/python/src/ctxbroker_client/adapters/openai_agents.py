"""A ctxbroker session as an OpenAI Agents SDK ``Session``.

``Runner.run(agent, input, session=BrokerSession(...))`` then keeps the
agent's history in the broker: every batch of items the runner adds is
admitted as one turn (compacted at admission by token budget, constraints
pinned), and the history the runner reads back is the broker's live
context, so the model sees what the broker kept.

How items map to spans:

* a message (``{"role": ..., "content": ...}``) becomes a span of that role
  (``developer`` counts as ``system``) holding its text; the broker's rules
  classify user and system text, so a user's "never write to prod" is
  pinned without anybody labelling it;
* a ``function_call`` becomes an assistant span and its
  ``function_call_output`` a tool span, both with the item's ``call_id`` as
  ``tool_call_id``: the broker keeps or evicts the two together, so the
  history never holds a call without its output or the reverse, which the
  model APIs refuse;
* any other item (reasoning, say) becomes an assistant span of its JSON.

Each span keeps the item, as JSON, in its metadata, so that an item still
standing as admitted comes back exactly as it was added. What compaction
wrote (a summary) or shortened (a compressed constraint) comes back as a
plain message of the span's role and text.

Needs the ``openai-agents`` extra: ``pip install 'ctxbroker-client[openai-agents]'``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory.session import SessionABC

from ..aio import AsyncBroker
from ..client import span
from ..errors import BrokerError
from ..v1 import broker_pb2 as pb

#: The metadata key holding the item a span was admitted from.
ITEM_KEY = "openai_agents.item"

_ROLES = {
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_SYSTEM,
}
_NAMES = {
    pb.ROLE_USER: "user",
    pb.ROLE_ASSISTANT: "assistant",
    pb.ROLE_SYSTEM: "system",
    pb.ROLE_TOOL: "user",
}


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or its parts' texts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable):
        texts = [
            str(part["text"])
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ]
        if texts:
            return "\n".join(texts)
    return json.dumps(content, sort_keys=True, default=str)


def item_to_span(item: Mapping[str, Any]) -> pb.SpanInput:
    """The span an item is admitted as (see the module's documentation)."""
    metadata = {ITEM_KEY: json.dumps(item, sort_keys=True, default=str)}
    kind = item.get("type")
    if kind == "function_call":
        name = str(item.get("name", ""))
        return span(
            pb.ROLE_ASSISTANT,
            f"call {name}({item.get('arguments', '')})",
            tool_call_id=str(item.get("call_id", "")),
            tool_name=name,
            metadata=metadata,
        )
    if kind == "function_call_output":
        output = item.get("output", "")
        text = output if isinstance(output, str) else _text_of(output)
        return span(
            pb.ROLE_TOOL,
            text or "(no output)",
            tool_call_id=str(item.get("call_id", "")),
            metadata=metadata,
        )
    role = item.get("role")
    if isinstance(role, str) and role in _ROLES:
        text = _text_of(item.get("content", ""))
        return span(_ROLES[role], text or "(empty)", metadata=metadata)
    return span(pb.ROLE_ASSISTANT, json.dumps(item, sort_keys=True, default=str), metadata=metadata)


def span_to_item(s: pb.Span) -> TResponseInputItem:
    """The item a live span stands for: the one it was admitted from when
    it stands as admitted, else a message of its role and text."""
    as_admitted = s.span_class != pb.SPAN_CLASS_SUMMARY and not s.original_text
    stored = s.metadata.get(ITEM_KEY)
    if as_admitted and stored is not None:
        try:
            loaded = json.loads(stored)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            return cast(TResponseInputItem, loaded)
    if s.role == pb.ROLE_TOOL and s.tool_call_id:
        return cast(
            TResponseInputItem,
            {"type": "function_call_output", "call_id": s.tool_call_id, "output": s.text},
        )
    return cast(TResponseInputItem, {"role": _NAMES.get(s.role, "user"), "content": s.text})


class BrokerSession(SessionABC):
    """An Agents SDK session whose history the broker keeps.

    ``broker`` is an :class:`~ctxbroker_client.AsyncBroker` created in the
    event loop that runs the agent; the broker's session ``session_id``
    must exist (see :meth:`open`).
    """

    def __init__(self, broker: AsyncBroker, session_id: str) -> None:
        self.broker = broker
        self.session_id = session_id

    @classmethod
    async def open(
        cls,
        broker: AsyncBroker,
        session_id: str,
        *,
        window_tokens: int,
        config: pb.SessionConfig | None = None,
    ) -> BrokerSession:
        """The session ``session_id``, created with ``window_tokens`` (and
        the rest of ``config``) when it does not exist."""
        try:
            await broker.create_session(session_id, window_tokens=window_tokens, config=config)
        except BrokerError as err:
            if err.reason != "SESSION_EXISTS":
                raise
        return cls(broker, session_id)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The live context as items, the latest ``limit`` of them."""
        context = await self.broker.get_context(self.session_id)
        items = [span_to_item(s) for s in context.spans]
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Admits the items as one turn (nothing for an empty list)."""
        if items:
            spans = [item_to_span(cast(Mapping[str, Any], item)) for item in items]
            await self.broker.admit(self.session_id, spans)

    async def pop_item(self) -> TResponseInputItem | None:
        """Takes back the newest item; ``None`` when there is none to take
        back (an empty session, or a summary standing last)."""
        try:
            reply = await self.broker.retract_last_turn(self.session_id, spans=1)
        except BrokerError as err:
            if err.reason == "NOT_RETRACTABLE":
                return None
            raise
        return span_to_item(reply.spans[-1]) if reply.spans else None

    async def clear_session(self) -> None:
        """Empties the broker's session, keeping its settings."""
        await self.broker.reset_session(self.session_id)
