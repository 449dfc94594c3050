"""Shared checks for the output-parser tests: stream a sample at every split point and one character at
a time, require well-formed events, and compare with the non-streaming parse. Modules bind their own
tool list: ``check = functools.partial(parser_harness.check, tools=TOOLS)``."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from typing import Any

from freetoken.chat import (
    ParsedMessage,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    accumulate,
    make_stream_parser,
    parse,
)


def counter_ids() -> Callable[[], str]:
    n = itertools.count()
    return lambda: f"call_{next(n):024x}"


def assert_well_formed(events: list[Any]) -> None:
    """Tool calls open one at a time with consecutive indices; argument deltas and ends name the open one."""
    open_index, next_index = None, 0
    for ev in events:
        if isinstance(ev, ToolCallStart):
            assert open_index is None and ev.index == next_index
            open_index, next_index = ev.index, next_index + 1
        elif isinstance(ev, ToolCallArgsDelta):
            assert ev.index == open_index
        elif isinstance(ev, ToolCallEnd):
            assert ev.index == open_index
            open_index = None
    assert open_index is None


def run(pieces: Iterable[str], family: str, tools: Any, sir: bool = False, reasoning: bool = True) -> ParsedMessage:
    p = make_stream_parser(family, tools, sir, reasoning, id_factory=counter_ids())
    events: list[Any] = []
    for piece in pieces:
        events += p.feed(piece)
    events += p.finish()
    assert_well_formed(events)
    return accumulate(events)


def check(text: str, family: str, tools: Any, sir: bool = False, reasoning: bool = True) -> ParsedMessage:
    whole = parse(text, family, tools, sir, reasoning, id_factory=counter_ids())
    for i in range(len(text) + 1):
        assert run([text[:i], text[i:]], family, tools, sir, reasoning) == whole, f"split at {i}"
    assert run(list(text), family, tools, sir, reasoning) == whole, "char by char"
    return whole


def calls(msg: ParsedMessage) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]
