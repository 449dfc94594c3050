"""Builds a Responses-API answer from generation events, as SSE events and as the final object.

The streamed and the non-streamed answers come from this one builder, so they cannot diverge.
Output items open and close in the order the model writes them: reasoning, message, calls.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from freetoken.chat import events as ev
from freetoken.server.internal import ChatRequest, Finish

Frame = tuple[str, dict[str, Any]]  # (event type, payload without "type"/"sequence_number")


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    def __init__(
        self,
        req: ChatRequest,
        model: str,
        tools_in: list[dict[str, Any]] | None,
        echo: dict[str, Any] | None = None,
        summary: bool = False,
    ) -> None:
        """``echo``: request fields the response object repeats (instructions, reasoning, text, store,
        previous_response_id, metadata). ``summary``: the client asked for reasoning summaries; the
        reasoning text is sent as the summary (there is no separate summariser)."""
        self.req = req
        self.echo = echo or {}
        self.summary = summary
        self.model = model
        self.id = _id("resp")
        self.created_at = int(time.time())
        self.custom = {t.name for t in req.tools if t.custom}
        self.tools_in = tools_in or []
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written
        self.buf = ""  # text of the open item (reasoning text, output text, or call arguments)
        self.frames: list[Frame] = []
        self.seq = 0
        self.status = "in_progress"
        self.usage: dict[str, Any] | None = None
        self.incomplete: dict[str, Any] | None = None

    # ---- the response object ------------------------------------------------------------
    def response(self) -> dict[str, Any]:
        req = self.req
        choice: Any = req.tool_choice.mode
        if choice == "named":
            choice = {"type": "function", "name": req.tool_choice.name}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "output": [dict(o) for o in self.output],
            "error": None,
            "incomplete_details": self.incomplete,
            "instructions": None,
            "metadata": {},
            "parallel_tool_calls": req.parallel_tool_calls,
            "tool_choice": choice,
            "tools": self.tools_in,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "max_output_tokens": req.max_tokens,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "store": False,
            "usage": self.usage,
            **self.echo,
        }

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        self.frames.append((kind, payload))

    def take(self) -> list[dict[str, Any]]:
        """The events built since the last call, numbered."""
        out = []
        for kind, payload in self.frames:
            out.append({"type": kind, "sequence_number": self.seq, **payload})
            self.seq += 1
        self.frames = []
        return out

    # ---- events -------------------------------------------------------------------------
    def start(self) -> None:
        self.emit("response.created", {"response": self.response()})
        self.emit("response.in_progress", {"response": self.response()})

    def feed(self, e: Any) -> None:
        if isinstance(e, ev.ReasoningDelta):
            if self._open_type() != "reasoning":
                self._open({"id": _id("rs"), "type": "reasoning", "summary": [], "content": []})
                if self.summary:
                    self._summary_part("response.reasoning_summary_part.added", "")
            if self.summary:
                self._delta("response.reasoning_summary_text.delta", e.text, summary_index=0)
            else:
                self._delta("response.reasoning_text.delta", e.text, content_index=0)
        elif isinstance(e, ev.ContentDelta):
            if self._open_type() != "message":
                self._open(
                    {
                        "id": _id("msg"),
                        "type": "message",
                        "role": "assistant",
                        "status": "in_progress",
                        "content": [],
                    }
                )
                self._part("response.content_part.added", "")
            self._delta("response.output_text.delta", e.text, content_index=0, logprobs=[])
        elif isinstance(e, ev.ToolCallStart):
            if e.name in self.custom:
                item = {
                    "id": _id("ctc"),
                    "type": "custom_tool_call",
                    "call_id": e.id,
                    "name": e.name,
                    "input": "",
                    "status": "in_progress",
                }
            else:
                item = {
                    "id": _id("fc"),
                    "type": "function_call",
                    "call_id": e.id,
                    "name": e.name,
                    "arguments": "",
                    "status": "in_progress",
                }
            self._open(item)
        elif isinstance(e, ev.ToolCallArgsDelta):
            self.buf += e.text
            if self.open is not None and self.open["type"] == "function_call" and e.text:
                self.emit(
                    "response.function_call_arguments.delta",
                    {"item_id": self.open["id"], "output_index": len(self.output), "delta": e.text},
                )
        elif isinstance(e, ev.ToolCallEnd):
            self._close()
        elif isinstance(e, Finish):
            self.finish(e)

    def finish(self, f: Finish) -> None:
        self._close()
        out_reasoning = f.reasoning_tokens
        self.usage = {
            "input_tokens": f.prompt_tokens,
            "input_tokens_details": {"cached_tokens": f.cached_tokens},
            "output_tokens": f.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": out_reasoning},
            "total_tokens": f.prompt_tokens + f.completion_tokens,
        }
        if f.reason == "length":
            self.status = "incomplete"
            self.incomplete = {"reason": "max_output_tokens"}
            self.emit("response.incomplete", {"response": self.response()})
        else:
            self.status = "completed"
            self.emit("response.completed", {"response": self.response()})

    # ---- item plumbing ------------------------------------------------------------------
    def _open_type(self) -> str | None:
        return None if self.open is None else str(self.open["type"])

    def _open(self, item: dict[str, Any]) -> None:
        self._close()
        self.open, self.buf = item, ""
        self.emit("response.output_item.added", {"output_index": len(self.output), "item": dict(item)})

    def _delta(self, kind: str, text: str, **extra: Any) -> None:
        assert self.open is not None
        self.buf += text
        self.emit(kind, {"item_id": self.open["id"], "output_index": len(self.output), "delta": text, **extra})

    def _part(self, kind: str, text: str) -> None:
        assert self.open is not None
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        self.emit(
            kind,
            {"item_id": self.open["id"], "output_index": len(self.output), "content_index": 0, "part": part},
        )

    def _summary_part(self, kind: str, text: str) -> None:
        assert self.open is not None
        part = {"type": "summary_text", "text": text}
        where = {"item_id": self.open["id"], "output_index": len(self.output)}
        self.emit(kind, {**where, "summary_index": 0, "part": part})

    def _close(self) -> None:
        item, text = self.open, self.buf
        if item is None:
            return
        where = {"item_id": item["id"], "output_index": len(self.output)}
        kind = item["type"]
        if kind == "reasoning" and self.summary:
            item["summary"] = [{"type": "summary_text", "text": text}]
            self.emit("response.reasoning_summary_text.done", {**where, "summary_index": 0, "text": text})
            self._summary_part("response.reasoning_summary_part.done", text)
        elif kind == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            self.emit("response.reasoning_text.done", {**where, "content_index": 0, "text": text})
        elif kind == "message":
            item["content"] = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
            self.emit("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []})
            self._part("response.content_part.done", text)
        elif kind == "function_call":
            item["arguments"] = text
            self.emit("response.function_call_arguments.done", {**where, "name": item["name"], "arguments": text})
        else:  # custom_tool_call: the model wrote {"input": "..."}; the client wants the raw input
            item["input"] = _custom_input(text)
            self.emit("response.custom_tool_call_input.delta", {**where, "delta": item["input"]})
            self.emit("response.custom_tool_call_input.done", {**where, "input": item["input"]})
        item["status"] = "completed"
        self.emit("response.output_item.done", {"output_index": len(self.output), "item": dict(item)})
        self.output.append(item)
        self.open, self.buf = None, ""


def _custom_input(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments
