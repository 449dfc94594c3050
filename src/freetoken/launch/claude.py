"""Claude Code: everything goes through environment variables (no file is written).

Claude Code talks the Anthropic Messages API to ``ANTHROPIC_BASE_URL`` (it appends
``/v1/messages``). Every model tier it may pick on its own (main, opus/sonnet/haiku
aliases, the small/fast background model, sub-agents) is pinned to the served model,
else it would ask for Anthropic model ids the server does not have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from freetoken.launch.base import LaunchPlan, ServerInfo

BINARY = "claude"
INSTALL_HINT = (
    "Claude Code is not installed (no `claude` on PATH). Install it with\n"
    "  npm install -g @anthropic-ai/claude-code\n"
    "or see https://code.claude.com/docs for the native installer, then run this again."
)

# Text characters of its first request (system prompt, messages, 24 tool definitions): Claude Code 2.1.197.
FIRST_REQUEST_CHARS = 66_945
MODEL_VARS = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",  # older releases' name for the background model
    "CLAUDE_CODE_SUBAGENT_MODEL",
)


def plan(server: ServerInfo, env: Mapping[str, str], args: Sequence[str]) -> LaunchPlan:
    env_set = {
        "ANTHROPIC_BASE_URL": server.base_url,
        # Sent as "Authorization: Bearer ..."; the user's real API key is removed below
        # so it never reaches the local server (and Claude Code sees no auth conflict).
        "ANTHROPIC_AUTH_TOKEN": server.api_key,
        **{var: server.model for var in MODEL_VARS},
        # The per-request attribution header changes every turn and defeats prefix reuse.
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # Compact before the served window is full, and never ask for more output than fits.
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(server.context_length),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(server.max_output_tokens),
    }
    notes: tuple[str, ...] = ()
    if env.get("ANTHROPIC_API_KEY"):
        notes = ("ANTHROPIC_API_KEY is set in your shell; it is left out of Claude Code's environment",)
    return LaunchPlan(
        agent="claude",
        binary=BINARY,
        args=tuple(args),
        env_set=env_set,
        env_unset=("ANTHROPIC_API_KEY",),
        notes=notes,
    )
