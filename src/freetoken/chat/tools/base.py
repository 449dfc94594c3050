"""The streaming machine shared by every tag-delimited tool-call format.

A format names its tags and how to read one call body; the machine finds the tags in streamed
text. Shapes handled:
    text  <opener> body <closer>  text                       (Hermes, Qwen3-Coder, GLM)
    text  <section_open> (<opener> body <closer>)* <section_close>  (DeepSeek, MiniMax)
A call is emitted whole when its closer arrives (its arguments are validated first), so a
malformed or unclosed call is never half-announced: it becomes plain content, tags included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from freetoken.chat.events import ContentDelta, Event, IdFactory, call_events, new_call_id
from freetoken.chat.scan import TrimmedText, split_safe
from freetoken.chat.tools.schema import Schemas, tool_schemas

if TYPE_CHECKING:
    from freetoken.chat.grammar.lark import Rules, Tags
    from freetoken.chat.grammar.tool import CallTool

# One parsed call: (function name, arguments as a JSON object text).
Call = tuple[str, str]
BodyParser = Callable[[str, Schemas], list[Call] | None]
CallGrammar = Callable[["Rules", "Tags", "CallTool"], str]
"""Lark for one whole call of a tool in the format (opener to closer), adding the rules it needs."""


@dataclass(frozen=True)
class CallFormat:
    name: str
    opener: str
    closer: str
    parse_body: BodyParser  # None: the body is malformed
    section_open: str | None = None  # optional wrapper around a run of calls
    section_close: str | None = None
    bare_calls: bool = True  # the opener also counts outside a section
    grammar: CallGrammar | None = None  # how a call is written, for forced calls (chat/grammar/)
    separator: str = "\n"  # between parallel calls
    section_separator: str = ""  # after the section opener and before its closer


class ToolCallParser:
    """Content text in, content and tool-call events out. `fmt=None`: content only."""

    def __init__(
        self,
        fmt: CallFormat | None,
        tools: list[dict[str, Any]] | None,
        id_factory: IdFactory = new_call_id,
    ) -> None:
        self._fmt = fmt
        self._schemas = tool_schemas(tools)
        self._ids = id_factory
        self._out = TrimmedText(ContentDelta)
        self._mode = "text"  # text | section | call
        self._buf = ""
        self._in_section = False
        self._section_ok = False  # a call in the current section has parsed
        self._pending = ""  # raw section text kept until a call in it parses
        self._call_open = ""
        self._saved_ws = ""  # whitespace before a call's opener, restored if the call fails
        self._scan_from = 0
        self._index = 0

    def feed(self, text: str) -> list[Event]:
        if self._fmt is None:
            return self._out.push(text)
        self._buf += text
        out: list[Event] = []
        while self._step(self._fmt, out):
            pass
        return out

    def finish(self) -> list[Event]:
        """Held text is plain content; an unclosed call or section is surfaced raw."""
        buf, self._buf = self._buf, ""
        if self._mode == "call":
            buf = self._call_open + buf
            if self._section_pending():
                buf = self._saved_ws + self._pending + buf
            elif not self._in_section:
                buf = self._saved_ws + buf
        elif self._mode == "section" and not self._section_ok:
            buf = self._saved_ws + self._pending + buf
        out = self._out.push(buf)
        self._out.edge()
        self._mode = "text"
        return out

    def _section_pending(self) -> bool:
        return self._in_section and not self._section_ok

    def _step(self, fmt: CallFormat, out: list[Event]) -> bool:
        if self._mode == "call":
            return self._step_call(fmt, out)
        in_section = self._mode == "section"
        if in_section:
            markers = [fmt.opener] + ([fmt.section_close] if fmt.section_close else [])
        else:
            markers = [fmt.opener] if fmt.bare_calls or not fmt.section_open else []
            markers += [fmt.section_open] if fmt.section_open else []
        before, tag, self._buf = split_safe(self._buf, markers)
        if in_section and not self._section_ok:
            self._pending += before
        else:
            out += self._out.push(before)
        if tag is None:
            return False
        if tag == fmt.opener:
            self._mode, self._in_section, self._call_open = "call", in_section, tag
            if not in_section:
                self._saved_ws = self._out.take_held()
            self._scan_from = 0
        elif tag == fmt.section_open:
            self._mode, self._section_ok, self._pending = "section", False, tag
            self._saved_ws = self._out.take_held()
        else:  # section close
            if self._section_ok:
                self._out.edge()
            else:
                out += self._out.push(self._saved_ws + self._pending + tag)
            self._mode = "text"
        return True

    def _step_call(self, fmt: CallFormat, out: list[Event]) -> bool:
        i = self._buf.find(fmt.closer, self._scan_from)
        if i < 0:
            self._scan_from = max(0, len(self._buf) - len(fmt.closer) + 1)
            return False
        body, self._buf = self._buf[:i], self._buf[i + len(fmt.closer) :]
        calls = fmt.parse_body(body, self._schemas)
        raw = self._call_open + body + fmt.closer
        if calls:
            if self._section_pending():
                self._out.edge()
                out += self._out.push(self._pending[len(fmt.section_open or "") :])
                self._section_ok = True
            for name, args in calls:
                out += call_events(self._index, self._ids(), name, args)
                self._index += 1
            self._out.edge()
        elif self._section_pending():
            self._pending += raw
        elif self._in_section:
            out += self._out.push(raw)
        else:
            out += self._out.push(self._saved_ws + raw)
        self._mode = "section" if self._in_section else "text"
        return True
