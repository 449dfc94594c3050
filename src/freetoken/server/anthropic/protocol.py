"""Pydantic schemas for the Anthropic routes. Unknown fields (and betas) are accepted and ignored; known ones
are strict (fields.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from freetoken.server.fields import Int32
from freetoken.server.fields import Strict as _Open


class Part(_Open):
    """A part of a tool result's content (text, image, ...)."""

    type: str
    text: str | None = None


class ContentBlock(_Open):
    type: str
    text: str | None = None
    # tool_use
    id: str | None = None
    name: str | None = None
    input: Any = None
    # tool_result
    tool_use_id: str | None = None
    content: str | list[Part] | None = None
    is_error: bool | None = None
    # thinking / redacted_thinking
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class Message(_Open):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(_Open):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Open):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Int32 | None = None


class OutputConfig(_Open):
    effort: str | None = None  # low | medium | high | xhigh | max: the reasoning level (gpt-oss harmony)


class Conversation(_Open):
    """What /v1/messages and /v1/messages/count_tokens share: the conversation ``convert.to_internal`` reads."""

    model: str
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class OutputFormat(_Open):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class MessagesRequest(Conversation):
    max_tokens: Int32
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    ignore_eos: bool = False  # extension (vLLM's name): keep going past end-of-sequence
    output_format: OutputFormat | None = None  # structured outputs: the answer is JSON of this schema


class CountTokensRequest(Conversation):
    pass
