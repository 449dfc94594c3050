"""OpenAI message shapes → the internal (chat-template) message shape."""

from __future__ import annotations

import json
from typing import Any

from freetoken.server.errors import APIError


def parse_arguments(arguments: str | dict[str, Any]) -> dict[str, Any] | str:
    """Templates iterate tool-call arguments as a mapping; keep the text if it is not a JSON object."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


# Media the model cannot read. An agent that once attached a screenshot resends it on every
# later turn, so refusing it would wedge the whole session: it becomes a short note instead.
MEDIA_PARTS = frozenset({"image_url", "input_image", "input_audio", "input_file", "file", "image", "document"})


def media_placeholder(kind: str) -> str:
    return f"[{kind} omitted: this model reads text only]"


def text_of(content: Any, where: str) -> str:
    """A string, or text parts joined; anything else (images, audio) is refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for i, part in enumerate(content):
        ptype = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if ptype in ("text", "input_text", "output_text", "summary_text", "reasoning_text") and isinstance(text, str):
            texts.append(text)
        elif ptype == "refusal":
            refusal = part.get("refusal") if isinstance(part, dict) else getattr(part, "refusal", "")
            texts.append(str(refusal or ""))
        elif ptype in MEDIA_PARTS:
            texts.append(media_placeholder(str(ptype)))
        else:
            raise APIError.invalid(f"{where}[{i}]: content of type {ptype!r} is not supported (text only)", param=where)
    return "\n".join(texts)


def tool_call_dict(call_id: str, name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": parse_arguments(arguments)},
    }
