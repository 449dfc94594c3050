"""Parser families by name, picked from the checkpoint or overridden by flags.

A family pairs a reasoning parser with a tool-call parser. `--tool-parser` and
`--reasoning-parser` override the pair's halves; adding a format is one file in `tools/` or
`reasoning/` plus one line here (imported lazily).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from freetoken.chat.base import StreamParser
from freetoken.chat.events import IdFactory, ParsedMessage, new_call_id

# tool parser name -> module holding its CallFormat as FORMAT ("harmony" is its own parser).
TOOL_PARSERS: dict[str, str] = {
    "hermes": "freetoken.chat.tools.hermes",
    "qwen3_coder": "freetoken.chat.tools.qwen3_coder",
    "deepseek_v3": "freetoken.chat.tools.deepseek",
    "glm45": "freetoken.chat.tools.glm",
    "minimax_m2": "freetoken.chat.tools.minimax",
    "kimi_k2": "freetoken.chat.tools.kimi",
    "harmony": "freetoken.chat.harmony",
    "gemma4": "freetoken.chat.tools.gemma4",
}
REASONING_PARSERS: tuple[str, ...] = ("think", "harmony", "gemma4")


@dataclass(frozen=True)
class Family:
    tool_parser: str | None
    reasoning_parser: str | None


FAMILIES: dict[str, Family] = {
    "qwen3": Family("hermes", "think"),
    "qwen3_coder": Family("qwen3_coder", "think"),
    "hermes": Family("hermes", None),
    "gpt_oss": Family("harmony", "harmony"),
    "deepseek_v3": Family("deepseek_v3", "think"),
    "glm45": Family("glm45", "think"),
    "minimax_m2": Family("minimax_m2", "think"),
    "kimi_k2": Family("kimi_k2", "think"),
    "gemma4": Family("gemma4", "gemma4"),
}
ALIASES: dict[str, str] = {
    "harmony": "gpt_oss",
    "deepseek_r1": "deepseek_v3",
    "deepseek_v31": "deepseek_v3",
    "glm": "glm45",
    "glm46": "glm45",
    "glm47": "glm45",
    "minimax": "minimax_m2",
}

# HF config `model_type` -> family, used when the template says nothing decisive.
MODEL_TYPES: dict[str, str] = {
    "gpt_oss": "gpt_oss",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "qwen3_next": "qwen3",
    "qwen3_5_moe": "qwen3_coder",  # Qwen3.5/3.6 call tools in Qwen3-Coder's XML form
    "qwen3_5_moe_text": "qwen3_coder",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v32": "deepseek_v3",
    "glm4_moe": "glm45",
    "glm4_moe_lite": "glm45",  # GLM-4.7-Flash: GLM-4.7's template and tool calls
    "glm_moe_dsa": "glm45",  # GLM-5: GLM-4.7's template and tool calls
    "minimax_m2": "minimax_m2",
    "kimi_k2": "kimi_k2",
    "gemma4": "gemma4",
    "gemma4_text": "gemma4",
}


def family_names() -> list[str]:
    return sorted(FAMILIES) + sorted(ALIASES)


def tool_parser_names() -> list[str]:
    return sorted(TOOL_PARSERS)


def reasoning_parser_names() -> list[str]:
    return list(REASONING_PARSERS)


def resolve_family(name: str) -> Family:
    key = ALIASES.get(name, name)
    if key in FAMILIES:
        return FAMILIES[key]
    if key in TOOL_PARSERS:  # a bare tool-parser name: that parser, no reasoning parser
        return Family(key, None)
    raise ValueError(f"unknown chat parser family {name!r}; known: {', '.join(family_names())}")


def detect_family(model_type: str | None = None, chat_template: str | None = None) -> str | None:
    """Family from the chat template's markup first (it is what the model was taught), then from
    the HF `model_type`; None when nothing matches (plain text output)."""
    t = chat_template or ""
    if "<|tool_call>" in t or "<|channel>thought" in t:
        return "gemma4"
    if "<|channel|>" in t:
        return "gpt_oss"
    if "<|tool_calls_section_begin|>" in t:
        return "kimi_k2"
    if "<minimax:tool_call>" in t:
        return "minimax_m2"
    if "<arg_key>" in t:
        return "glm45"
    if "<｜tool▁calls▁begin｜>" in t or "tool▁calls▁begin" in t:
        return "deepseek_v3"
    if "<tool_call>" in t:
        if "<function=" in t:
            return "qwen3_coder"
        return "qwen3" if "<think>" in t else "hermes"
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    return None


def make_stream_parser(
    family: str | None,
    tools: list[dict[str, Any]] | None,
    starts_in_reasoning: bool,
    reasoning: bool = True,
    *,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
    id_factory: IdFactory = new_call_id,
) -> StreamParser:
    """The parser for one response. `tools` empty/None: tool markup stays content.
    `reasoning=False`: reasoning is still cut out of the content but not emitted.
    `tool_parser` / `reasoning_parser` ("none" disables) override the family's halves."""
    from freetoken.chat.chained import ChainedStreamParser, PassthroughStreamParser
    from freetoken.chat.harmony import HarmonyStreamParser
    from freetoken.chat.reasoning.think import GEMMA4_TAGS, ThinkReasoningParser
    from freetoken.chat.tools.base import ToolCallParser

    fam = resolve_family(family) if family else Family(None, None)
    tp = _override(fam.tool_parser, tool_parser, TOOL_PARSERS)
    rp = _override(fam.reasoning_parser, reasoning_parser, REASONING_PARSERS)
    if tp == "harmony" or rp == "harmony":
        return HarmonyStreamParser(bool(tools) and tp == "harmony", reasoning, id_factory)
    if tp is None and rp is None:
        return PassthroughStreamParser()
    fmt = importlib.import_module(TOOL_PARSERS[tp]).FORMAT if tp and tools else None
    think = ThinkReasoningParser(starts_in_reasoning) if rp == "think" else None
    if rp == "gemma4":
        think = ThinkReasoningParser(starts_in_reasoning, GEMMA4_TAGS)
    return ChainedStreamParser(think, ToolCallParser(fmt, tools, id_factory), reasoning)


def _override(default: str | None, override: str | None, known: Any) -> str | None:
    if override is None:
        return default
    if override == "none":
        return None
    if override not in known:
        raise ValueError(f"unknown parser {override!r}; known: {', '.join(sorted(known))}")
    return override


def parse(
    text: str,
    family: str | None,
    tools: list[dict[str, Any]] | None = None,
    starts_in_reasoning: bool = False,
    reasoning: bool = True,
    **kwargs: Any,
) -> ParsedMessage:
    """Non-streaming parse: exactly the accumulation of the streamed events."""
    return make_stream_parser(family, tools, starts_in_reasoning, reasoning, **kwargs).parse_all(text)
