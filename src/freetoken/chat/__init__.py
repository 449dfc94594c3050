"""Chat: templates, reasoning parsers and tool-call parsers (one file per model family)."""

from __future__ import annotations

from freetoken.chat.base import StreamParser
from freetoken.chat.events import (
    ContentDelta,
    Event,
    ParsedMessage,
    ReasoningDelta,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    accumulate,
    new_call_id,
)
from freetoken.chat.reasoning.think import prompt_opens_reasoning
from freetoken.chat.registry import (
    detect_family,
    family_names,
    make_stream_parser,
    parse,
    reasoning_parser_names,
    tool_parser_names,
)
from freetoken.chat.template import (
    TemplateRenderError,
    pick_template,
    render,
    render_and_tokenize,
    render_pieces,
)

__all__ = [
    "ContentDelta",
    "Event",
    "ParsedMessage",
    "ReasoningDelta",
    "StreamParser",
    "TemplateRenderError",
    "ToolCall",
    "ToolCallArgsDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "accumulate",
    "detect_family",
    "family_names",
    "make_stream_parser",
    "new_call_id",
    "parse",
    "pick_template",
    "prompt_opens_reasoning",
    "reasoning_parser_names",
    "render",
    "render_and_tokenize",
    "render_pieces",
    "tool_parser_names",
]
