"""gpt-oss harmony output: channels carry reasoning, answer and tool calls (our own reader).

The prompt ends with `<|start|>assistant`, so output is a run of messages:
    <|channel|>analysis<|message|>THOUGHT<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
A header is everything before `<|message|>`; the recipient (`to=`) may sit in the role part or
the channel part. analysis -> reasoning; final and commentary without recipient (preambles) ->
content; a message with a recipient -> a tool call (`functions.` stripped), emitted whole once
its body ends. The stop tokens (`<|call|>`, `<|return|>`) are often cut off by the engine, so
the end of the text also ends the last message. Text that is not harmony at all is content.
"""

from __future__ import annotations

import json
import re

from freetoken.chat.base import StreamParser
from freetoken.chat.events import (
    ContentDelta,
    Event,
    IdFactory,
    ReasoningDelta,
    call_events,
    coalesce,
    new_call_id,
)
from freetoken.chat.scan import split_safe
from freetoken.chat.tools.schema import dump_args

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
BODY_ENDS = [END, CALL, RETURN, START, CHANNEL]
HEADER_OPENERS = (START, CHANNEL)

_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


class HarmonyStreamParser(StreamParser):
    def __init__(self, tools_enabled: bool, emit_reasoning: bool = True, id_factory: IdFactory = new_call_id):
        self._tools_enabled = tools_enabled
        self._emit_reasoning = emit_reasoning
        self._ids = id_factory
        self._mode = "header"  # header | body
        self._kind = "content"  # body kind: reasoning | content | call | raw
        self._buf = ""
        self._header = ""
        self._body = ""  # a call's (or raw message's) body, kept whole
        self._recipient = ""
        self._index = 0

    def feed(self, delta: str) -> list[Event]:
        self._buf += delta
        out: list[Event] = []
        while self._step(out):
            pass
        return coalesce(out)

    def finish(self) -> list[Event]:
        out: list[Event] = []
        buf, self._buf = self._buf, ""
        if self._mode == "header":
            raw = self._header + buf
            if raw.strip():
                out.append(ContentDelta(raw))
        elif self._kind in ("call", "raw"):
            self._body += buf
            out += self._close_whole("")
        else:
            out += self._text(buf)
        self._mode, self._header = "header", ""
        return coalesce(out)

    def _step(self, out: list[Event]) -> bool:
        if self._mode == "header":
            return self._step_header(out)
        before, tag, self._buf = split_safe(self._buf, BODY_ENDS)
        if self._kind in ("call", "raw"):
            self._body += before
        else:
            out += self._text(before)
        if tag is None:
            return False
        if self._kind in ("call", "raw"):
            out += self._close_whole(tag if tag not in HEADER_OPENERS else "")
        self._mode = "header"
        self._header = tag if tag in HEADER_OPENERS else ""
        return True

    def _step_header(self, out: list[Event]) -> bool:
        text = (self._header + self._buf).lstrip()
        if not text.startswith(HEADER_OPENERS) and not any(o.startswith(text) for o in HEADER_OPENERS):
            # Not a harmony header: read it as a content body up to the next harmony token.
            self._buf, self._header = text, ""
            self._mode, self._kind = "body", "content"
            return True
        before, tag, self._buf = split_safe(self._buf, [MESSAGE])
        self._header += before
        if tag is None:
            return False
        self._open_body()
        return True

    def _open_body(self) -> None:
        m = _RECIPIENT.search(self._header)
        channel_m = _CHANNEL.search(self._header)
        channel = channel_m.group(1) if channel_m else ""
        self._recipient = m.group(1) if m else ""
        if self._recipient:
            self._kind = "call" if self._tools_enabled else "raw"
        else:
            self._kind = "reasoning" if channel == "analysis" else "content"
        self._mode, self._body = "body", ""

    def _text(self, text: str) -> list[Event]:
        if not text:
            return []
        if self._kind == "reasoning":
            return [ReasoningDelta(text)] if self._emit_reasoning else []
        return [ContentDelta(text)]

    def _close_whole(self, end_tag: str) -> list[Event]:
        """A call message ended: a valid JSON object becomes a call, anything else content."""
        body, self._body = self._body, ""
        if self._kind == "call":
            try:
                args = json.loads(body)
            except ValueError:
                args = None
            if isinstance(args, dict):
                name = self._recipient.removeprefix("functions.")
                ev = call_events(self._index, self._ids(), name, dump_args(args))
                self._index += 1
                return ev
        return [ContentDelta(self._header + MESSAGE + body + end_tag)]
