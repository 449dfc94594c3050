"""Keeping untrusted message text out of the chat template's special-token syntax.

Every untrusted string (message content, reasoning, tool results, tool-call argument values,
tool descriptions) is rendered as a sentinel `\\ue000<nonce>:<i>\\ue001` and the rendered string
is cut at the sentinels: template text between them may hold special tokens, the values may not.

A sentinel is a `Tainted` str: its characters are the marker, but what templates ask of it
(`'</think>' in x`, `x.startswith(..)`, `x|length`, `x == ..`) is answered from the real value,
and what they derive from it (`x.split(..)[-1].lstrip()`, `x|trim`, `x[:n]`) is a new sentinel
for the derived value. So templates take the same branches as with the real text. Values that
reach `tojson` are re-marked `\\ue002` (`\\ue003` with ensure_ascii) and put back JSON-escaped.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

RAW, JSON, JSON_ASCII, CLOSE = "\ue000", "\ue002", "\ue003", "\ue001"
# Digits only, so case filters applied to the marker itself would leave it intact.
_SENTINEL = re.compile("([\ue000\ue002\ue003])([0-9]{8}):([0-9]+)\ue001")
_ESCAPED_RAW = re.compile(r"\\ue000([0-9]{8}:[0-9]+)\\ue001")
_UNTRUSTED_KEYS = ("content", "reasoning_content", "reasoning", "thinking")

# str methods whose string results are derived values (new sentinels); the asking ones answer from
# the value with bools and ints only. Nothing may hand the real text back as another type (no
# `encode`): a template could turn it back into plain, trusted-looking text.
_DERIVING = (
    "strip lstrip rstrip lower upper title capitalize casefold swapcase replace removeprefix "
    "removesuffix expandtabs center ljust rjust zfill"
).split()
_SPLITTING = ("split", "rsplit", "splitlines", "partition", "rpartition")
_ASKING = (
    "startswith endswith find rfind index rindex count isspace isdigit isalpha isalnum isnumeric "
    "isdecimal islower isupper istitle isidentifier isprintable isascii"
).split()


def mark_json(dumped: str, ensure_ascii: bool) -> str:
    """Called by the `tojson` filter: sentinels inside JSON are re-marked as JSON-escaped."""
    if ensure_ascii:
        return _ESCAPED_RAW.sub(JSON_ASCII + r"\1" + CLOSE, dumped)
    return _SENTINEL.sub(lambda m: (JSON if m.group(1) == RAW else m.group(1)) + m.group(0)[1:], dumped)


class Tainted(str):
    """Untrusted text as a template sees it (see the module doc). Attributes start with `_`, so
    the sandbox keeps templates from reading the real value directly."""

    _ft_value: str
    _ft_table: Sentinels

    def __new__(cls, marker: str, value: str, table: Sentinels) -> Tainted:
        obj = super().__new__(cls, marker)
        obj._ft_value, obj._ft_table = value, table
        return obj

    def __len__(self) -> int:
        return len(self._ft_value)

    def __bool__(self) -> bool:
        return bool(self._ft_value)

    def __contains__(self, sub: object) -> bool:
        return _plain(sub) in self._ft_value

    def __eq__(self, other: object) -> bool:
        return self._ft_value == _plain(other)

    def __ne__(self, other: object) -> bool:
        return self._ft_value != _plain(other)

    def __hash__(self) -> int:
        return hash(self._ft_value)

    def __getitem__(self, key: Any) -> Tainted:
        return self._ft_table.wrap(self._ft_value[key])

    def __iter__(self) -> Iterator[Tainted]:
        return (self._ft_table.wrap(c) for c in self._ft_value)


def _plain(v: Any) -> Any:
    if isinstance(v, Tainted):
        return v._ft_value
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    return v


def _deriving(name: str) -> Any:
    def method(self: Tainted, *args: Any, **kwargs: Any) -> Any:
        out = getattr(self._ft_value, name)(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})
        return self._ft_table.wrap(out)

    return method


def _splitting(name: str) -> Any:
    def method(self: Tainted, *args: Any, **kwargs: Any) -> Any:
        parts = getattr(self._ft_value, name)(*_plain(args), **kwargs)
        wrapped = [self._ft_table.wrap(p) for p in parts]
        return tuple(wrapped) if isinstance(parts, tuple) else wrapped

    return method


def _asking(name: str) -> Any:
    def method(self: Tainted, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._ft_value, name)(*_plain(args), **kwargs)

    return method


for _name in _DERIVING:
    setattr(Tainted, _name, _deriving(_name))
for _name in _SPLITTING:
    setattr(Tainted, _name, _splitting(_name))
for _name in _ASKING:
    setattr(Tainted, _name, _asking(_name))


class Sentinels:
    """The table of one render: sentinel i stands for `values[i]`."""

    def __init__(self) -> None:
        self.nonce = f"{secrets.randbelow(10**8):08d}"
        self.values: list[str] = []

    def wrap(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if isinstance(value, Tainted):
            value = value._ft_value
        self.values.append(value)
        return Tainted(f"{RAW}{self.nonce}:{len(self.values) - 1}{CLOSE}", value, self)

    def protect(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self._message(m) for m in messages]

    def protect_tools(self, tools: Any) -> Any:
        """Descriptions anywhere in tool definitions (MCP servers write them); names, types and
        enums stay plain, since templates build syntax from them."""
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
                out[key] = [{**p, "text": self.wrap(p.get("text"))} if isinstance(p, dict) else p for p in v]
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

    def split(self, rendered: str) -> tuple[list[str], list[str]]:
        """Template texts t0..tn and the n values between them, as they must read in place
        (JSON-escaped where a sentinel went through `tojson`)."""
        texts, values, pos = [], [], 0
        for m in _SENTINEL.finditer(rendered):
            if m.group(2) != self.nonce or int(m.group(3)) >= len(self.values):
                continue
            value = self.values[int(m.group(3))]
            if m.group(1) != RAW:
                value = json.dumps(value, ensure_ascii=m.group(1) == JSON_ASCII)[1:-1]
            texts.append(rendered[pos : m.start()])
            values.append(value)
            pos = m.end()
        texts.append(rendered[pos:])
        return texts, values
