"""Stop sequences on the answer: applied to the parsed content only, never inside the reasoning block and never
to a tool call's markup (the engine's own stop strings see the raw text, markup and reasoning included).

``StopFilter.apply`` takes the parser's events and passes them on, with content text held back while it could
still grow into a stop sequence; once a stop sequence matches, the content before it (right-trimmed, as the parsers
trim the answer's end) is the last event and ``matched`` names the sequence (the caller ends generation there)."""

from __future__ import annotations

from typing import Any

from freetoken.chat import events as ev


class StopFilter:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""  # content that could be the start of a stop sequence
        self.matched: str | None = None

    def apply(self, events: list[Any]) -> list[Any]:
        out: list[Any] = []
        for e in events:
            if self.matched is not None:
                break
            if not isinstance(e, ev.ContentDelta) or not self.stops:
                out += self.flush()
                out.append(e)
                continue
            text = self.held + e.text
            hit = self._first_match(text)
            if hit is not None:
                at, self.matched = hit
                self.held = ""
                if text[:at].rstrip():  # the answer's end is trimmed, as the parsers trim it
                    out.append(ev.ContentDelta(text[:at].rstrip()))
                break
            keep = self._held_length(text)
            self.held = text[len(text) - keep :]
            if len(text) > keep:
                out.append(ev.ContentDelta(text[: len(text) - keep]))
        return out

    def flush(self) -> list[Any]:
        """Held content once no stop sequence can follow it (a non-content event, the end)."""
        if not self.held or self.matched is not None:
            return []
        text, self.held = self.held, ""
        return [ev.ContentDelta(text)]

    def _first_match(self, text: str) -> tuple[int, str] | None:
        hits = [(text.find(s), -len(s), s) for s in self.stops if s in text]
        if not hits:
            return None
        at, _, stop = min(hits)
        return at, stop

    def _held_length(self, text: str) -> int:
        """The longest suffix of ``text`` that is a proper prefix of a stop sequence, with the whitespace before
        it (trimmed if the stop sequence follows)."""
        keep = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        while 0 < keep < len(text) and text[len(text) - keep - 1].isspace():
            keep += 1
        return keep
