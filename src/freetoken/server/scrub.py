"""``tool_choice: "none"``: no tool call and none of the family's markup (tool-call and reasoning tags) reaches the
answer. The parser reads calls with the request's tools and their events are dropped here; stray tags (a second
``</think>``, a call that does not parse, chat tokens) are cut from the content, held back while a tag may still
be forming."""

from __future__ import annotations

import importlib
from typing import Any

from freetoken.chat import events as ev
from freetoken.chat.reasoning.think import CLOSE, GEMMA4_TAGS, OPEN
from freetoken.chat.registry import TOOL_PARSERS
from freetoken.chat.tokenize import special_token_strings

CALL_EVENTS = (ev.ToolCallStart, ev.ToolCallArgsDelta, ev.ToolCallEnd)


def markup_tags(tool_parser: str | None, reasoning_parser: str | None, tokenizer: Any = None) -> list[str]:
    """The tags of the family's reasoning block and tool calls (harmony's channels are its parser's own), and the
    tokenizer's special tokens (``<|im_start|>`` and the like: chat markup, never an answer's text)."""
    tags = [OPEN, CLOSE] if reasoning_parser == "think" else list(GEMMA4_TAGS) if reasoning_parser == "gemma4" else []
    if tokenizer is not None:
        tags += special_token_strings(tokenizer)
    if tool_parser and tool_parser != "harmony":
        fmt = getattr(importlib.import_module(TOOL_PARSERS[tool_parser]), "FORMAT", None)
        if fmt is not None:
            tags += [fmt.opener, fmt.closer, fmt.section_open or "", fmt.section_close or ""]
    return sorted({t for t in tags if t}, key=len, reverse=True)


class NoMarkup:
    def __init__(self, tags: list[str]) -> None:
        self.tags = tags
        self.held = ""

    def apply(self, events: list[Any]) -> list[Any]:
        out: list[Any] = []
        for e in events:
            if isinstance(e, CALL_EVENTS):
                continue
            if not isinstance(e, ev.ContentDelta):
                out += self.flush()
                out.append(e)
                continue
            text = self._cut(self.held + e.text)
            keep = max((k for t in self.tags for k in range(1, len(t)) if text.endswith(t[:k])), default=0)
            self.held = text[len(text) - keep :]
            if len(text) > keep:
                out.append(ev.ContentDelta(text[: len(text) - keep]))
        return out

    def flush(self) -> list[Any]:
        text, self.held = self.held, ""
        return [ev.ContentDelta(text)] if text else []

    def _cut(self, text: str) -> str:
        while True:
            before = text
            for t in self.tags:
                text = text.replace(t, "")
            if text == before:
                return text
