"""Render conversations with the chat template and cut them into context and trainable pieces.

The environment mirrors transformers' chat-template environment (sandboxed, trim_blocks,
lstrip_blocks, `tojson` = json.dumps(ensure_ascii=False) without key sorting).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                  "</tool_call>", "<tool_response>", "</tool_response>"]


def template_source() -> str:
    return TEMPLATE_PATH.read_text().strip()


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=2)
def compiled(plain: bool = False) -> Template:
    """The template; `plain` uses an untouched sandboxed environment (Jinja's own tojson)."""
    if plain:
        return ImmutableSandboxedEnvironment().from_string(template_source())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    return env.from_string(template_source())


def render(conv: dict[str, Any], n_messages: int | None = None, add_generation_prompt: bool = False,
           plain: bool = False) -> str:
    msgs = conv["messages"][:n_messages]
    kwargs: dict[str, Any] = {"messages": msgs, "tools": conv.get("tools"),
                              "add_generation_prompt": add_generation_prompt}
    if not conv.get("enable_thinking", True):
        kwargs["enable_thinking"] = False
    return compiled(plain).render(**kwargs)


def _last_query_index(msgs: list[dict[str, Any]]) -> int:
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i]["role"] == "user":
            return i
    return -1


def pieces(conv: dict[str, Any]) -> list[tuple[str, bool]]:
    """Split the full render into (text, trainable) pieces.

    An assistant turn after the last user query is trainable when the text generation would
    produce (render up to it with a generation prompt, then the turn up to <|im_end|>) sits at
    the same place in the full render; the rest is context. Concatenated, the pieces are the
    full render.
    """
    msgs = conv["messages"]
    full = render(conv)
    out: list[tuple[str, bool]] = []
    pos = 0
    for i in range(_last_query_index(msgs) + 1, len(msgs)):
        if msgs[i]["role"] != "assistant":
            continue
        prefix = render(conv, i, add_generation_prompt=True)
        turn = render(conv, i + 1)[len(prefix):]
        end = turn.find("<|im_end|>") + len("<|im_end|>")
        if end < len("<|im_end|>") or not full.startswith(prefix + turn[:end]) or len(prefix) < pos:
            continue
        out.append((full[pos:len(prefix)], False))
        out.append((turn[:end], True))
        pos = len(prefix) + end
    out.append((full[pos:], False))
    return [(t, m) for t, m in out if t]
