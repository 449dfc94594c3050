"""Reasoning parser, then tool-call parser: the shape of every family except harmony.

Raw text -> ThinkReasoningParser -> (reasoning text | content text); content text ->
ToolCallParser -> content and tool-call events.
"""

from __future__ import annotations

from freetoken.chat.base import StreamParser
from freetoken.chat.events import ContentDelta, Event, ReasoningDelta, coalesce
from freetoken.chat.reasoning.think import Segment, ThinkReasoningParser
from freetoken.chat.scan import TrimmedText
from freetoken.chat.tools.base import ToolCallParser


class ChainedStreamParser(StreamParser):
    def __init__(
        self,
        reasoning: ThinkReasoningParser | None,
        tools: ToolCallParser,
        emit_reasoning: bool = True,
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._emit_reasoning = emit_reasoning
        self._thought = TrimmedText(ReasoningDelta)

    def feed(self, delta: str) -> list[Event]:
        if self._reasoning is None:
            return coalesce(self._tools.feed(delta))
        return coalesce(self._route(self._reasoning.feed(delta)))

    def finish(self) -> list[Event]:
        out = self._route(self._reasoning.finish()) if self._reasoning is not None else []
        self._thought.edge()
        return coalesce(out + self._tools.finish())

    def _route(self, segments: list[Segment]) -> list[Event]:
        out: list[Event] = []
        for is_reasoning, text in segments:
            if is_reasoning:
                if self._emit_reasoning:
                    out += self._thought.push(text)
            else:
                out += self._tools.feed(text)
        return out


class PassthroughStreamParser(StreamParser):
    """No family: the text is the content, untouched."""

    def feed(self, delta: str) -> list[Event]:
        return [ContentDelta(delta)] if delta else []

    def finish(self) -> list[Event]:
        return []
