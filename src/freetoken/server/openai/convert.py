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


# Media the model cannot read. In a message's own content it is refused (a 400 naming the part: an answer
# about nothing would be a silent wrong answer). In a tool's result it becomes a short note instead: an
# agent whose tool returned a screenshot resends it on every later turn, and a refusal would wedge the session.
MEDIA_PARTS = frozenset({"image_url", "input_image", "input_audio", "input_file", "file", "image", "document", "audio"})


def media_placeholder(kind: str) -> str:
    return f"[{kind} omitted: this model reads text only]"


def refuse_media(kind: str, where: str) -> APIError:
    """The 400 for a part the engine cannot read, naming the part and where it is."""
    return APIError.invalid(
        f"{where}: content of type {kind!r} cannot be read by this model (it reads text only); "
        "send the content as text",
        param=where,
    )


def text_of(content: Any, where: str, tool_result: bool = False) -> str:
    """A string, or text parts joined; media parts are refused (``tool_result``: a note instead), any other
    part type is refused."""
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
        elif ptype in MEDIA_PARTS and tool_result:
            texts.append(media_placeholder(str(ptype)))
        elif ptype in MEDIA_PARTS:
            raise refuse_media(str(ptype), f"{where}.{i}")
        else:
            raise APIError.invalid(f"{where}[{i}]: content of type {ptype!r} is not supported (text only)", param=where)
    return "\n".join(texts)


def tool_call_dict(call_id: str, name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": parse_arguments(arguments)},
    }
