"""Keeping untrusted message text out of the chat template's special-token syntax.

Every untrusted string (message content, reasoning, tool results, tool-call argument values) is
replaced by a sentinel `\\ue000<nonce>:<i>\\ue001` before rendering. The rendered string is then
cut at the sentinels: template text between them may hold special tokens, the values may not.
A value rendered through `tojson` is marked `\\ue002` (or `\\ue003` with ensure_ascii), so it is put
back JSON-escaped. The result is checked against a plain render; where a template transforms a
value (strip, split on `</think>`, ...) the plain render is aligned on the template text instead.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

RAW, JSON, JSON_ASCII, CLOSE = "\ue000", "\ue002", "\ue003", "\ue001"
# Digits only, so case filters (`upper`, `title`) leave a sentinel intact.
_SENTINEL = re.compile("([\ue000\ue002\ue003])([0-9]{8}):([0-9]+)\ue001")
_ESCAPED_RAW = re.compile(r"\\ue000([0-9]{8}:[0-9]+)\\ue001")
_UNTRUSTED_KEYS = ("content", "reasoning_content", "reasoning", "thinking")
_MAX_ALIGN_STEPS = 200_000

# A piece of the final prompt: (text, is_untrusted).
Piece = tuple[str, bool]


def mark_json(dumped: str, ensure_ascii: bool) -> str:
    """Called by the `tojson` filter: sentinels inside JSON are re-marked as JSON-escaped."""
    if ensure_ascii:
        return _ESCAPED_RAW.sub(JSON_ASCII + r"\1" + CLOSE, dumped)
    return _SENTINEL.sub(lambda m: (JSON if m.group(1) == RAW else m.group(1)) + m.group(0)[1:], dumped)


@dataclass
class _Slot:
    value: str
    kind: str  # RAW | JSON | JSON_ASCII

    @property
    def text(self) -> str:
        if self.kind == RAW:
            return self.value
        return json.dumps(self.value, ensure_ascii=self.kind == JSON_ASCII)[1:-1]


class Sentinels:
    def __init__(self) -> None:
        self.nonce = f"{secrets.randbelow(10**8):08d}"
        self.values: list[str] = []

    def wrap(self, value: Any) -> Any:
        """A sentinel for non-blank strings; blank ones cannot smuggle tokens and steer `if`s."""
        if not isinstance(value, str) or not value.strip():
            return value
        self.values.append(value)
        return f"{RAW}{self.nonce}:{len(self.values) - 1}{CLOSE}"

    def protect(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self._message(m) for m in messages]

    def protect_tools(self, tools: Any) -> Any:
        """Descriptions anywhere in tool definitions (MCP servers write them); names, types and
        enums stay real, since templates branch on them."""
        if isinstance(tools, dict):
            return {
                k: self.wrap(v) if k == "description" else self.protect_tools(v) for k, v in tools.items()
            }
        if isinstance(tools, list):
            return [self.protect_tools(x) for x in tools]
        return tools

    def _message(self, m: dict[str, Any]) -> dict[str, Any]:
        out = dict(m)
        for key in _UNTRUSTED_KEYS:
            v = out.get(key)
            if isinstance(v, list):
                out[key] = [
                    {**p, "text": self.wrap(p.get("text"))} if isinstance(p, dict) else self.wrap(p)
                    for p in v
                ]
            elif v is not None:
                out[key] = self.wrap(v)
        if isinstance(out.get("tool_calls"), list):
            out["tool_calls"] = [self._call(c) for c in out["tool_calls"]]
        return out

    def _call(self, call: Any) -> Any:
        if not isinstance(call, dict):
            return call
        out = dict(call)
        if isinstance(out.get("function"), dict):
            out["function"] = self._call(out["function"])
        if "arguments" in out:
            out["arguments"] = self._deep(out["arguments"])
        return out

    def _deep(self, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: self._deep(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self._deep(x) for x in v]
        return self.wrap(v)

    def split(self, rendered: str) -> tuple[list[str], list[_Slot]]:
        """Template texts t0..tn and the n slots between them (t_i may be empty)."""
        texts, slots, pos = [], [], 0
        for m in _SENTINEL.finditer(rendered):
            if m.group(2) != self.nonce or int(m.group(3)) >= len(self.values):
                continue
            texts.append(rendered[pos : m.start()])
            slots.append(_Slot(self.values[int(m.group(3))], m.group(1)))
            pos = m.end()
        texts.append(rendered[pos:])
        return texts, slots


def pieces_from(texts: list[str], slots: list[_Slot], plain: str) -> list[Piece] | None:
    """Template/untrusted pieces whose concatenation is exactly `plain`, or None."""
    direct = _interleave(texts, [s.text for s in slots])
    if "".join(t for t, _ in direct) == plain:
        return direct
    gaps = _align(texts, [s.text for s in slots], plain)
    return _interleave(texts, gaps) if gaps is not None else None


def _interleave(texts: list[str], gaps: list[str]) -> list[Piece]:
    out: list[Piece] = []
    for i, t in enumerate(texts):
        if t:
            out.append((t, False))
        if i < len(gaps) and gaps[i]:
            if out and out[-1][1]:  # adjacent untrusted values: one piece
                out[-1] = (out[-1][0] + gaps[i], True)
            else:
                out.append((gaps[i], True))
    return out


def _align(texts: list[str], preferred: list[str], plain: str) -> list[str] | None:
    """Find gaps g with plain == t0 g0 t1 g1 ... tn, preferring g_i == preferred[i].

    Depth-first over the occurrences of the next template text (backtracking, step-bounded).
    Neighbouring gaps with empty template text between them are merged first.
    """
    ts: list[str] = [texts[0]]
    merged: list[str] = []
    for t, p in zip(texts[1:], preferred):
        if merged and not ts[-1]:
            merged[-1] += p
            ts[-1] = t
        else:
            merged.append(p)
            ts.append(t)
    n = len(merged)
    if n == 0 or not plain.startswith(ts[0]):
        return None
    gaps: list[str] = []
    stack = [_candidates(ts, merged, plain, 0, len(ts[0]))]
    starts = [len(ts[0])]
    steps = 0
    while stack:
        steps += 1
        if steps > _MAX_ALIGN_STEPS:
            return None
        end = next(stack[-1], None)
        if end is None:
            stack.pop()
            starts.pop()
            if gaps:
                gaps.pop()
            continue
        k = len(stack) - 1
        gaps.append(plain[starts[-1] : end])
        nxt = end + len(ts[k + 1])
        if k + 1 == n:
            if nxt == len(plain):
                return _unmerge(texts, preferred, gaps)
            gaps.pop()
            continue
        stack.append(_candidates(ts, merged, plain, k + 1, nxt))
        starts.append(nxt)
    return None


def _candidates(ts: list[str], merged: list[str], plain: str, k: int, start: int) -> Iterator[int]:
    """Possible ends of gap k (which starts at `start`): the preferred value first."""
    nxt = ts[k + 1]
    if plain.startswith(merged[k], start) and plain.startswith(nxt, start + len(merged[k])):
        yield start + len(merged[k])
    if not nxt:  # the last template text is empty: the gap runs to the end
        yield len(plain)
        return
    i = plain.find(nxt, start)
    while i >= 0:
        yield i
        i = plain.find(nxt, i + 1)


def _unmerge(texts: list[str], preferred: list[str], gaps: list[str]) -> list[str]:
    """Gaps per original slot: a merged gap goes to the first slot of its run."""
    out: list[str] = []
    it = iter(gaps)
    for i in range(len(preferred)):
        out.append(next(it) if i == 0 or texts[i] else "")
    return out
