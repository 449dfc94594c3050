"""Pydantic schemas for the OpenAI routes. Unknown fields are accepted and ignored; known ones are strict
(fields.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from freetoken.server.fields import Int32, Seed
from freetoken.server.fields import Strict as _Open


# ---- /v1/chat/completions ---------------------------------------------------------------
class ContentPart(_Open):
    type: str
    text: str | None = None


class FunctionCallIn(_Open):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCallIn(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(_Open):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Open):
    include_usage: bool = False


class ChatCompletionRequest(_Open):
    model: str
    messages: list[ChatMessage]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Int32 | None = None
    max_completion_tokens: Int32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    min_p: float | None = None  # extension (vLLM's name)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # extension (vLLM's name)
    logprobs: bool | None = None
    top_logprobs: Int32 | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    n: Int32 = 1
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    ignore_eos: bool = False
    response_format: ResponseFormat | None = None


# ---- /v1/responses ----------------------------------------------------------------------
class ReasoningConfig(_Open):
    effort: str | None = None
    summary: str | None = None


class ResponsesPart(_Open):
    """A content part of an input item (input_text, output_text, summary_text, refusal, input_image, ...)."""

    type: str
    text: str | None = None
    refusal: str | None = None


class ResponsesItem(_Open):
    """One input item. One open shape for every item type: the fields each type reads are typed, so a
    field of the wrong type is a 400 naming it (responses_input.py checks what each type requires)."""

    type: str | None = None
    role: str | None = None
    content: str | list[ResponsesPart] | None = None  # message, reasoning
    summary: list[ResponsesPart] | None = None  # reasoning
    call_id: str | None = None  # function_call(_output), custom_tool_call(_output)
    name: str | None = None
    arguments: str | dict[str, Any] | None = None  # function_call
    input: str | None = None  # custom_tool_call
    output: str | list[ResponsesPart] | None = None  # function_call_output, custom_tool_call_output


class CustomToolFormat(_Open):
    type: str
    syntax: str | None = None
    definition: str | None = None


class ResponsesTool(_Open):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None  # function
    format: CustomToolFormat | None = None  # custom


class ResponsesRequest(_Open):
    model: str
    input: str | list[ResponsesItem] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    max_output_tokens: Int32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: Seed | None = None
    reasoning: ReasoningConfig | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    ignore_eos: bool = False  # extension (vLLM's name): keep going past end-of-sequence


# ---- /v1/completions, /v1/tokenize, /v1/detokenize ---------------------------------------
Prompt = str | list[int] | list[str] | list[list[int]]
"""A string or token ids; a list of one of either (one prompt per request)."""


class CompletionRequest(_Open):
    model: str
    prompt: Prompt
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Int32 | None = 16  # the legacy route's default; 0 with echo: score the prompt only
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: Int32 | None = None  # the legacy shape: how many alternatives per token
    echo: bool = False
    stop: str | list[str] | None = None
    seed: Seed | None = None
    n: Int32 = 1
    suffix: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True  # extension (vLLM's name)


class TokenizeRequest(_Open):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolDef] | None = None
    add_special_tokens: bool = True  # a prompt's BOS, where the tokenizer adds one
    add_generation_prompt: bool = True  # messages: end with the assistant's turn opened
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Open):
    model: str | None = None
    tokens: list[int]
