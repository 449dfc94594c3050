"""opencode: one inline config in ``OPENCODE_CONFIG_CONTENT`` (no file is written).

opencode merges that variable over its config files, so the user's own
``opencode.json`` stays as it is. The provider uses the ``@ai-sdk/openai-compatible``
package against ``/v1`` (chat completions). Model limits must be given: for a custom
provider opencode otherwise takes context 0 (no auto-compaction) and output 0 (every
request rejected).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from freetoken.launch.base import LaunchPlan, ServerInfo
from freetoken.launch.files import deep_merge

BINARY = "opencode"
INSTALL_HINT = (
    "opencode is not installed (no `opencode` on PATH). Install it with\n"
    "  npm install -g opencode-ai\n"
    "or see https://opencode.ai/docs, then run this again."
)
PROVIDER = "freetoken"
# Text characters of its first request (system prompt, messages, 10 tool definitions): opencode 1.18.33.
FIRST_REQUEST_CHARS = 27_440


def config(server: ServerInfo) -> dict[str, object]:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "FreeToken",
                "options": {"baseURL": server.openai_base, "apiKey": server.api_key},
                "models": {
                    server.model: {
                        "name": server.model,
                        "tool_call": server.tool_calls,
                        "reasoning": server.reasoning,
                        "limit": {"context": server.context_length, "output": server.max_output_tokens},
                    }
                },
            }
        },
        "model": f"{PROVIDER}/{server.model}",
        "small_model": f"{PROVIDER}/{server.model}",
    }


def plan(server: ServerInfo, env: Mapping[str, str], args: Sequence[str]) -> LaunchPlan:
    content = config(server)
    notes: tuple[str, ...] = ()
    inherited = env.get("OPENCODE_CONFIG_CONTENT")
    if inherited:
        try:
            parsed = json.loads(inherited)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            content = deep_merge(parsed, content)  # keep the user's inline settings
            notes = ("merged into the OPENCODE_CONFIG_CONTENT already set in your shell",)
        else:
            notes = ("OPENCODE_CONFIG_CONTENT in your shell is not a JSON object; replaced for this run",)
    return LaunchPlan(
        agent="opencode",
        binary=BINARY,
        args=tuple(args),
        env_set={"OPENCODE_CONFIG_CONTENT": json.dumps(content, separators=(",", ":"))},
        notes=notes,
    )
