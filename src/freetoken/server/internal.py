"""The one internal request every protocol converts to, and what generation hands back.

Messages use the Hugging Face chat-template shape, because that is what templates render:
``{"role": "system"|"user"|"assistant"|"tool", "content": str, "reasoning_content"?: str,
"tool_calls"?: [{"id", "type": "function", "function": {"name", "arguments": dict|str}}],
"tool_call_id"?: str}``. Protocol packages (openai/, anthropic/) only translate shapes;
everything that touches the model (template, limits, parsing) lives in generation.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from freetoken.runner.sampling_params import SEED_MAX, SEED_MIN
from freetoken.server.errors import APIError

ToolChoiceMode = Literal["auto", "none", "required", "named"]

# The APIs' effort names -> the reasoning levels chat templates take (gpt-oss harmony: "Reasoning: low|medium|high" in
# the system message): OpenAI's none/minimal/xhigh and Anthropic's xhigh/max fold into the nearest level.
EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high",
           "max": "high"}  # fmt: skip


def effort_level(value: object, param: str) -> str | None:
    """An API's reasoning effort as the template's level (None: unset); a name no API has is refused, naming
    ``param`` (templates interpolate the value unchecked)."""
    if value is None:
        return None
    level = EFFORTS.get(value) if isinstance(value, str) else None
    if level is None:
        raise APIError.invalid(f"{param} must be one of {', '.join(EFFORTS)}, got {value!r}", param=param)
    return level


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    custom: bool = False
    """A Responses-API ``custom`` (free-form) tool: shown to the model as one string argument ``input``."""
    grammar_syntax: str | None = None
    """A custom tool's input grammar: "lark" or "regex" (``grammar_definition`` holds it)."""
    grammar_definition: str = ""

    def template_dict(self) -> dict[str, Any]:
        """The shape chat templates expect in ``tools=``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"] = "text"
    schema: dict[str, Any] | None = None  # json_schema
    name: str = ""


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    name: str | None = None  # set when mode == "named"


@dataclass
class ChatRequest:
    """One generation request, whatever API it came from."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    max_tokens: int | None = None  # None: whatever context is left
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # alternatives per token when logprobs are asked for (0..20)
    seed: int | None = None
    ignore_eos: bool = False  # extension (vLLM's name): keep going past end-of-sequence
    stop: list[str] = field(default_factory=list)
    reasoning: bool | None = None  # None: the template's default (enable_thinking unset)
    reasoning_effort: str | None = None  # "low" | "medium" | "high" (``effort_level``); None: the template's default
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    response_format: ResponseFormat | None = None  # a JSON answer, enforced by grammar

    def text_chars(self) -> int:
        """Characters of every string in the messages and tools (what the prompt holds at least)."""
        total = 0
        stack: list[Any] = [self.messages, [t.template_dict() for t in self.tools]]
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                total += len(v)
            elif isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)
        return total

    def validate(self) -> None:
        """Checks every protocol shares (each protocol already checked its own shapes)."""
        if not self.messages:
            raise APIError.invalid("messages must contain at least one message", param="messages")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise APIError.invalid(f"max_tokens must be at least 1, got {self.max_tokens}", param="max_tokens")
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= 2):
            raise APIError.invalid(
                "temperature must be between 0 and 2 (below 1e-5 it samples greedily)", param="temperature"
            )
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise APIError.invalid("top_p must be in (0, 1]", param="top_p")
        if not (math.isfinite(self.min_p) and 0 <= self.min_p <= 1):
            raise APIError.invalid("min_p must be in [0, 1]", param="min_p")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (math.isfinite(getattr(self, name)) and -2 <= getattr(self, name) <= 2):
                raise APIError.invalid(f"{name} must be between -2 and 2", param=name)
        if not (math.isfinite(self.repetition_penalty) and 0 < self.repetition_penalty <= 100):
            raise APIError.invalid("repetition_penalty must be in (0, 100]", param="repetition_penalty")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise APIError.invalid("top_logprobs must be between 0 and 20", param="top_logprobs")
        if self.top_k < -1:
            raise APIError.invalid("top_k must be -1, 0 (no cut) or positive", param="top_k")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise APIError.invalid("seed must fit in 64 bits: an integer in [-2**63, 2**64)", param="seed")
        if any(not s for s in self.stop):
            raise APIError.invalid("stop sequences must be non-empty strings", param="stop")
        if self.stop and self.response_format is not None and self.response_format.type != "text":
            raise APIError.invalid(
                "stop sequences cannot be combined with a JSON response format: the grammar ends the answer, "
                "and a stop sequence inside the JSON would cut it",
                param="stop",
            )
        names = {t.name for t in self.tools}
        if self.tool_choice.mode == "named" and self.tool_choice.name not in names:
            raise APIError.invalid(f"tool_choice names unknown tool {self.tool_choice.name!r}", param="tool_choice")
        if self.tool_choice.mode == "required" and not self.tools:
            raise APIError.invalid("tool_choice requires tools", param="tool_choice")
        _check_tool_results(self.messages)


def merge_leading_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One system message at the top: instructions + developer messages (Responses), or system
    blocks + ``role: system`` items (Anthropic), arrive as several; many templates accept only one."""
    n = 0
    while n < len(messages) and messages[n]["role"] == "system":
        n += 1
    if n < 2:
        return messages
    text = "\n\n".join(str(m["content"]) for m in messages[:n] if m["content"])
    return [{"role": "system", "content": text}, *messages[n:]]


def _check_tool_results(messages: list[dict[str, Any]]) -> None:
    """Every tool result must answer a tool call made earlier in the conversation."""
    seen: set[str] = set()
    for i, m in enumerate(messages):
        for tc in m.get("tool_calls") or []:
            seen.add(tc["id"])
        if m["role"] == "tool" and m.get("tool_call_id") not in seen:
            raise APIError.invalid(
                f"messages[{i}]: tool result for id {m.get('tool_call_id')!r} has no matching tool call "
                "in an earlier assistant message",
                param=f"messages.{i}",
            )


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str  # JSON text as the model wrote it


FinishReason = Literal["stop", "length", "tool_calls", "stop_sequence", "abort", "error"]


@dataclass
class Started:
    """The engine accepted the request and produced its first output (protocols may ignore it)."""


@dataclass
class Finish:
    """The last event of a generation."""

    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of the completion tokens, those of the reasoning block


@dataclass
class TokenLogprobs:
    """The logprobs of tokens the engine just produced (when the request asked for them)."""

    entries: list[tuple[int, float, list[tuple[int, float]]]]  # (token, logprob, [(alternative, logprob)])


@dataclass
class Completion:
    """A whole (non-streamed) generation, parsed."""

    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    finish: Finish
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
