"""Streaming events produced by the output parsers, and the parsed message they add up to.

A parser turns model text into a flat list of events. Accumulating them (`accumulate`) gives the
same `ParsedMessage` as the non-streaming `parse`: that equality is the parsers' contract.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int  # 0-based position of the call in this message
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgsDelta:
    index: int
    text: str  # a piece of the arguments JSON string


@dataclass(frozen=True)
class ToolCallEnd:
    index: int


Event = ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArgsDelta | ToolCallEnd


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text


@dataclass
class ParsedMessage:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def new_call_id() -> str:
    """`call_` + 24 random hex digits; the server may swap the prefix (e.g. Anthropic `toolu_`)."""
    return "call_" + secrets.token_hex(12)


IdFactory = Callable[[], str]


def call_events(index: int, call_id: str, name: str, arguments: str) -> list[Event]:
    """The three events of one complete call (arguments arrive in one piece)."""
    return [ToolCallStart(index, call_id, name), ToolCallArgsDelta(index, arguments), ToolCallEnd(index)]


def coalesce(events: Iterable[Event]) -> list[Event]:
    """Merge neighbouring text deltas of the same kind (fewer, larger SSE chunks)."""
    out: list[Event] = []
    for ev in events:
        prev = out[-1] if out else None
        if isinstance(ev, ContentDelta) and isinstance(prev, ContentDelta):
            out[-1] = ContentDelta(prev.text + ev.text)
        elif isinstance(ev, ReasoningDelta) and isinstance(prev, ReasoningDelta):
            out[-1] = ReasoningDelta(prev.text + ev.text)
        elif (
            isinstance(ev, ToolCallArgsDelta)
            and isinstance(prev, ToolCallArgsDelta)
            and prev.index == ev.index
        ):
            out[-1] = ToolCallArgsDelta(ev.index, prev.text + ev.text)
        else:
            out.append(ev)
    return out


def accumulate(events: Iterable[Event]) -> ParsedMessage:
    """Fold events into the message a non-streaming client receives."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, ToolCall] = {}
    for ev in events:
        if isinstance(ev, ContentDelta):
            content.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            reasoning.append(ev.text)
        elif isinstance(ev, ToolCallStart):
            calls[ev.index] = ToolCall(ev.id, ev.name, "")
        elif isinstance(ev, ToolCallArgsDelta):
            calls[ev.index].arguments += ev.text
    ordered = [calls[i] for i in sorted(calls)]
    return ParsedMessage("".join(content), "".join(reasoning), ordered)
