"""Will the agent's first request fit the model? Agents open with a long system prompt and their tool
definitions; when that alone fills the context, every request is refused and agents that compact and
retry on a context error loop. ``ft launch`` checks before it starts one.

An agent's first request is given in characters of text (system prompt, messages, tool
definitions), measured with the real client (``FIRST_REQUEST_CHARS`` in each agent's module); the
server's own tokenizer says how many characters a token holds (``count_tokens`` of a sample).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass

from freetoken.launch.base import ServerInfo, opener_for

# English prose and code words, the mix of an agent's system prompt and tool schemas.
SAMPLE = (
    "You are an interactive coding agent. Use the tools below to read files, search the workspace, run shell "
    "commands and edit code. Keep answers short. When you change a file, show the diff. Never invent paths.\n"
    '{"name": "read_file", "description": "Read a file from the local filesystem.", "parameters": {"type": '
    '"object", "properties": {"path": {"type": "string", "description": "Absolute path of the file"}, '
    '"offset": {"type": "integer"}, "limit": {"type": "integer"}}, "required": ["path"]}}\n'
) * 8
FALLBACK_CHARS_PER_TOKEN = 3.0  # when the server cannot count (a low guess: it errs towards "does not fit")
MARGIN = 1.1  # the estimate is a ratio of averages
MIN_OUTPUT = 1024  # fewer output tokens than this and an agent cannot write one edit


@dataclass(frozen=True)
class Fit:
    first_request_tokens: int
    output_tokens: int  # the output limit to write: leaves the agent its first request and some turns
    fits: bool
    message: str


def chars_per_token(server: ServerInfo, timeout: float = 5.0) -> float:
    """Characters per token of the served model's tokenizer, from ``/v1/messages/count_tokens``."""
    body = {"model": server.model, "messages": [{"role": "user", "content": SAMPLE}]}
    req = urllib.request.Request(
        server.base_url + "/v1/messages/count_tokens",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"},
    )
    try:
        with opener_for(server.base_url).open(req, timeout=timeout) as resp:
            tokens = int(json.loads(resp.read().decode())["input_tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        return FALLBACK_CHARS_PER_TOKEN
    return len(SAMPLE) / tokens if tokens > 0 else FALLBACK_CHARS_PER_TOKEN


def check(agent: str, first_request_chars: int, server: ServerInfo, per_token: float) -> Fit:
    ctx, out = server.context_length, server.max_output_tokens
    first = int(first_request_chars / per_token * MARGIN)
    room = ctx - first
    if room >= out + MIN_OUTPUT:
        return Fit(first, out, True, "")
    if room >= 2 * MIN_OUTPUT:  # fits with a smaller output limit: the agent still compacts in time
        return Fit(first, room // 2, True, "")
    need = first + 2 * MIN_OUTPUT
    return Fit(
        first,
        out,
        False,
        f"{agent}'s first request alone is about {first} tokens (its system prompt and tool definitions), "
        f"but {server.model!r} at {server.base_url} has a context of {ctx} tokens: every request would be "
        f"refused. Serve a model with a context of at least {need} tokens, or pass --force to launch anyway.",
    )
