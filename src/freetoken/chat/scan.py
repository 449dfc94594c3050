"""Streaming text scanning shared by the parsers.

Model text arrives in arbitrary pieces, so a tag such as `</think>` may be split across deltas.
`split_safe` returns what can be emitted now and holds back any suffix that could still grow
into a tag; `TrimmedText` trims whitespace next to tags with the same hold-back idea. Both give
identical results however the text is split, which is what makes streamed == non-streamed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from freetoken.chat.events import Event


def find_marker(buf: str, markers: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """Earliest complete occurrence of any marker at or after `start` (ties: the longest)."""
    best: tuple[int, str] | None = None
    for m in markers:
        i = buf.find(m, start)
        if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(m) > len(best[1]))):
            best = (i, m)
    return best


def held_suffix_len(buf: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of some marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:k]):
                best = k
                break
    return best


def split_safe(buf: str, markers: Sequence[str]) -> tuple[str, str | None, str]:
    """(text before the first marker, the marker, text after it); without a complete marker:
    (text that can no longer start one, None, the held-back suffix)."""
    found = find_marker(buf, markers)
    if found is not None:
        i, m = found
        return buf[:i], m, buf[i + len(m) :]
    k = held_suffix_len(buf, markers)
    return buf[: len(buf) - k], None, buf[len(buf) - k :]


class TrimmedText:
    """Emits one kind of text (content or reasoning) trimmed at both ends and around tags.

    A trailing whitespace run is held until visible text follows; `edge()` (a tag, or the end)
    drops it and starts trimming leading whitespace again.
    """

    def __init__(self, wrap: Callable[[str], Event]) -> None:
        self._wrap = wrap
        self._held = ""
        self._at_edge = True

    def push(self, text: str) -> list[Event]:
        if self._at_edge:
            text = text.lstrip()
            if not text:
                return []
            self._at_edge = False
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        return [self._wrap(body)] if body else []

    def take_held(self) -> str:
        """Remove and return the held whitespace (the caller may give it back via `push`)."""
        held, self._held = self._held, ""
        return held

    def edge(self) -> None:
        self._held = ""
        self._at_edge = True
