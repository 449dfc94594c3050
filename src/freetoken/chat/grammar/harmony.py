"""Forced calls in gpt-oss harmony: an optional analysis message, then one commentary message to the
function (``<|call|>`` ends generation, so there is one call per turn):

    <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>commentary to=functions.NAME
    <|constrain|>json<|message|>{ARGS}<|call|>
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from freetoken.chat.grammar.lark import Rules, Tags, json_value, lit, text_until

if TYPE_CHECKING:
    from freetoken.chat.grammar.tool import CallTool


def harmony_calls(rules: Rules, tags: Tags, tools: list[CallTool], budget: int | None) -> str:
    ch, msg = tags("<|channel|>"), tags("<|message|>")
    thought = text_until(rules, "<|end|>", tags, budget)
    analysis = f'({ch} "analysis" {msg} {thought} {tags("<|start|>")} "assistant")?'
    calls = " | ".join(
        f'({ch} {lit("commentary to=functions." + t.name)} " " {tags("<|constrain|>")} "json" {msg} '
        f"{json_value(t.arguments_schema())} {tags('<|call|>')})"
        for t in tools
    )
    return f"{analysis} ({calls})"
