"""``tool_choice`` required / named without constrained decoding: prefill the call's opening tag.

The prompt is extended with the family's tool-call opener (e.g. ``<tool_call>``, as the special
token the model was taught), so the model's next tokens are a call body; the same text is fed to
the output parser first, so it reads the continuation as a call. Named choices also show the
model only that tool. Families without a tag-delimited format (harmony) are left unforced.
"""

from __future__ import annotations

import importlib

from freetoken.chat.reasoning.think import CLOSE as THINK_CLOSE
from freetoken.chat.registry import TOOL_PARSERS, resolve_family
from freetoken.server.internal import ToolChoice


def call_opener(family: str | None, tool_parser: str | None) -> str | None:
    """The text that opens a tool call in this family's output format, or None."""
    parser = tool_parser if tool_parser is not None else (resolve_family(family).tool_parser if family else None)
    if parser is None or parser == "none" or parser not in TOOL_PARSERS:
        return None
    fmt = getattr(importlib.import_module(TOOL_PARSERS[parser]), "FORMAT", None)
    if fmt is None:  # harmony: channel-based, not a tag format
        return None
    return (fmt.section_open or "") + fmt.opener


def forced_prefix(choice: ToolChoice, family: str | None, tool_parser: str | None, starts_in_reasoning: bool) -> str:
    """Text to append to the prompt (and to feed the parser first); "" when nothing is forced."""
    if choice.mode not in ("required", "named"):
        return ""
    opener = call_opener(family, tool_parser)
    if opener is None:
        return ""
    # A template that opened a think block: close it before the call.
    return (f"\n{THINK_CLOSE}\n\n" if starts_in_reasoning else "") + opener
