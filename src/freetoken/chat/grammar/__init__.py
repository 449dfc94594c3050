"""Grammars for structured output in the model's own syntax (Lark in llguidance's dialect): forced tool
calls written the way the family's parser reads them, JSON answers, custom tools' input grammars.
The engine compiles and enforces them (``engine/grammar.py``); nothing here imports the engine."""

from freetoken.chat.grammar.compose import (
    GrammarError,
    ReasoningMode,
    forced_calls,
    json_answer,
    tool_calls_anywhere,
)
from freetoken.chat.grammar.lark import Tags
from freetoken.chat.grammar.tool import CallTool

__all__ = [
    "CallTool",
    "GrammarError",
    "ReasoningMode",
    "Tags",
    "forced_calls",
    "json_answer",
    "tool_calls_anywhere",
]
