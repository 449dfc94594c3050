"""Builds an Anthropic message from generation events, as SSE events and as the final object.

One builder serves streamed and non-streamed answers, so they cannot diverge.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from freetoken.chat import events as ev
from freetoken.server.internal import Finish

_STOP = {
    "stop": "end_turn",
    "abort": "end_turn",
    "stop_sequence": "stop_sequence",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "error": "end_turn",
}


def signature(thinking: str) -> str:
    """Thinking blocks need a signature; ours just fingerprints the text (nothing is verified)."""
    return "ft-" + hashlib.sha256(thinking.encode()).hexdigest()[:32]


def tool_use_id(call_id: str) -> str:
    """Our generated ``call_…`` ids look like Anthropic's ``toolu_…``; ids the model itself wrote
    (Kimi's ``functions.NAME:IDX``) are kept, since the template renders them back in history."""
    return "toolu_" + call_id.removeprefix("call_") if call_id.startswith("call_") else call_id


class MessageBuilder:
    def __init__(self, model: str, input_tokens: int) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model
        self.input_tokens = input_tokens
        self.content: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.buf = ""
        self.frames: list[tuple[str, dict[str, Any]]] = []
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.output_tokens = 0
        self.cache_read = 0  # prompt tokens served from the prefix cache (Anthropic counts them apart)

    def message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [dict(b) for b in self.content],
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": {
                "input_tokens": self.input_tokens - self.cache_read,
                "output_tokens": self.output_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cache_read,
            },
        }

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        out, self.frames = self.frames, []
        return out

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        self.frames.append((kind, {"type": kind, **payload}))

    def start(self) -> None:
        self.emit("message_start", {"message": self.message()})
        self.emit("ping", {})

    def feed(self, e: Any) -> None:
        if isinstance(e, ev.ReasoningDelta):
            if self._open_type() != "thinking":
                self._open({"type": "thinking", "thinking": "", "signature": ""})
            self._delta({"type": "thinking_delta", "thinking": e.text})
        elif isinstance(e, ev.ContentDelta):
            if self._open_type() != "text":
                self._open({"type": "text", "text": ""})
            self._delta({"type": "text_delta", "text": e.text})
        elif isinstance(e, ev.ToolCallStart):
            self._open({"type": "tool_use", "id": tool_use_id(e.id), "name": e.name, "input": {}})
        elif isinstance(e, ev.ToolCallArgsDelta):
            if self._open_type() == "tool_use" and e.text:
                self._delta({"type": "input_json_delta", "partial_json": e.text})
        elif isinstance(e, ev.ToolCallEnd):
            self._close()
        elif isinstance(e, Finish):
            self._close()
            self.stop_reason = _STOP[e.reason]
            self.stop_sequence = e.stop_sequence
            self.output_tokens = e.completion_tokens
            self.input_tokens = e.prompt_tokens
            self.cache_read = e.cached_tokens
            self.emit(
                "message_delta",
                {
                    "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
                    "usage": {
                        "input_tokens": self.input_tokens - self.cache_read,
                        "output_tokens": self.output_tokens,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": self.cache_read,
                    },
                },
            )
            self.emit("message_stop", {})

    def _open_type(self) -> str | None:
        return None if self.open is None else str(self.open["type"])

    def _open(self, block: dict[str, Any]) -> None:
        self._close()
        self.open, self.buf = block, ""
        self.emit("content_block_start", {"index": len(self.content), "content_block": dict(block)})

    def _delta(self, delta: dict[str, Any]) -> None:
        self.buf += delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
        self.emit("content_block_delta", {"index": len(self.content), "delta": delta})

    def _close(self) -> None:
        block, text = self.open, self.buf
        if block is None:
            return
        index = len(self.content)
        if block["type"] == "thinking":
            block["thinking"] = text
            block["signature"] = signature(text)
            self.emit(
                "content_block_delta",
                {"index": index, "delta": {"type": "signature_delta", "signature": block["signature"]}},
            )
        elif block["type"] == "text":
            block["text"] = text
        else:
            block["input"] = _json_object(text)
        self.emit("content_block_stop", {"index": index})
        self.content.append(block)
        self.open, self.buf = None, ""


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
