"""Responses kept in memory (``store``): ``previous_response_id`` continues one, ``GET /v1/responses/{id}``
returns it. Bounded (``ServerConfig.responses_store`` entries, least recently used dropped first) and
lost on restart: agents that need more send the whole conversation (``store: false``), as Codex does."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from freetoken.server.openai.convert import tool_call_dict


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]
    messages: list[dict[str, Any]]
    """The conversation so far (template messages, without instructions), this response's turn included."""


class ResponseStore:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None:
                self._items.move_to_end(response_id)
            return item

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._items[str(response["id"])] = Stored(response, messages)
            self._items.move_to_end(str(response["id"]))
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def conversation(messages: list[dict[str, Any]], output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` without system turns (instructions are not carried over), then the response's
    output as one assistant turn."""
    turn: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in output:
        kind = item.get("type")
        if kind == "reasoning":
            text = "".join(p.get("text", "") for p in item.get("content") or item.get("summary") or [])
            turn["reasoning_content"] = turn.get("reasoning_content", "") + text
        elif kind == "message":
            turn["content"] += "".join(p.get("text", "") for p in item.get("content") or [])
        elif kind == "function_call":
            call = tool_call_dict(item["call_id"], item["name"], item.get("arguments") or "")
            turn.setdefault("tool_calls", []).append(call)
        elif kind == "custom_tool_call":
            args = json.dumps({"input": item.get("input", "")}, ensure_ascii=False)
            turn.setdefault("tool_calls", []).append(tool_call_dict(item["call_id"], item["name"], args))
    return [m for m in messages if m["role"] != "system"] + [turn]
