"""Names, keys and ids reach the chat template as template syntax, not as protected text (sentinels.py
protects message text, reasoning, tool descriptions and argument values): one rule keeps the
model's control tokens out of all of them. A tool called ``<|im_start|>system`` would otherwise
render a real ``<|im_start|>``.

The rule: every string the caller gave that the template renders unprotected — tool and function
names, every key and non-description string of a tool's schema, tool-call ids, names and argument
keys, tool-result ids, template arguments — may not contain a control token's text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from freetoken.chat.tokenize import added_token_strings

# Message fields whose values sentinels.py protects (their keys are fixed by the server, not the caller).
_PROTECTED = frozenset({"content", "reasoning_content", "reasoning", "thinking"})
_MARKUP_CHARS = frozenset("<>[]|")


class MarkupError(ValueError):
    """A name, key or id spells a control token."""


def control_strings(tokenizer: Any) -> list[str]:
    """The texts that tokenise to control tokens: every special token, and the other added tokens that
    look like markup (``<tool_call>``, ``[TOOL_CALLS]``; not added plain words)."""
    out = []
    for text, special in added_token_strings(tokenizer):
        if special or any(c in _MARKUP_CHARS for c in text):
            out.append(text)
    return out


def check_no_markup(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    controls: list[str],
) -> None:
    """Raises MarkupError naming the first unprotected string that contains a control token."""
    if not controls:
        return
    found = [
        (where, text)
        for where, text in _unprotected(messages, tools, template_kwargs)
        if any(c in text for c in controls)
    ]
    if found:
        where, text = found[0]
        token = next(c for c in controls if c in text)
        raise MarkupError(
            f"{where} {text[:80]!r} contains the model's control token {token!r}: names, keys and ids "
            "may not spell control tokens"
        )


def _unprotected(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]
) -> Iterator[tuple[str, str]]:
    for i, tool in enumerate(tools or []):
        yield from _all(tool, f"tools[{i}]", skip_descriptions=True)
    for i, m in enumerate(messages):
        for key, value in m.items():
            if key in _PROTECTED:
                continue
            if key == "tool_calls" and isinstance(value, list):
                for j, call in enumerate(value):
                    yield from _call(call, f"messages[{i}].tool_calls[{j}]")
            else:
                yield from _all(value, f"messages[{i}].{key}", skip_descriptions=False)
    yield from _all(template_kwargs, "chat_template_kwargs", skip_descriptions=False)


def _call(call: Any, where: str) -> Iterator[tuple[str, str]]:
    """A tool call in the history: everything but its argument values (those are protected)."""
    if not isinstance(call, dict):
        return
    for key, value in call.items():
        if key == "function" and isinstance(value, dict):
            yield from _call(value, f"{where}.function")
        elif key == "arguments":
            yield from _keys(value, f"{where}.arguments")
        else:
            yield from _all(value, f"{where}.{key}", skip_descriptions=False)


def _keys(value: Any, where: str) -> Iterator[tuple[str, str]]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                yield f"{where} key", str(k)
                stack.append(x)
        elif isinstance(v, list):
            stack.extend(v)


def _all(value: Any, where: str, skip_descriptions: bool) -> Iterator[tuple[str, str]]:
    """Every key and string under ``value`` (descriptions skipped when sentinels.py protects them)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield where, v
        elif isinstance(v, dict):
            for k, x in v.items():
                yield f"{where} key", str(k)
                if not (skip_descriptions and k == "description" and isinstance(x, str)):
                    stack.append(x)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
