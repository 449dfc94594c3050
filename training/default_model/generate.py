"""Seeded synthetic conversations for the default model, and the held-out evaluation sets.

Training draws only from the training side of `split.py`; evaluation only from the held-out side.
"""

from __future__ import annotations

import random
from typing import Any

from training.default_model.pools import SYSTEM_PROMPTS
from training.default_model.tasks_chat import chat_conversation
from training.default_model.tasks_math import arithmetic_conversation, counting_conversation
from training.default_model.tasks_tools import missing_tool_conversation, tool_conversation, tool_list

Conversation = dict[str, Any]

# Mixture of training tasks (weights sum to 1).
MIXTURE = {"arith": 0.32, "count": 0.06, "tool": 0.34, "tool_call_only": 0.08, "missing_tool": 0.06,
           "chat": 0.08, "arith_nothink": 0.03, "chat_nothink": 0.03}


def _base(rng: random.Random, task: str, heldout: bool) -> Conversation:
    if task == "arith":
        return arithmetic_conversation(rng, heldout)
    if task == "arith_nothink":
        return arithmetic_conversation(rng, heldout, think=False)
    if task == "count":
        return counting_conversation(rng)
    if task == "tool":
        return tool_conversation(rng, heldout, think=rng.random() < 0.9)
    if task == "tool_call_only":
        return tool_conversation(rng, heldout, think=rng.random() < 0.7, with_result=False)
    if task == "missing_tool":
        return missing_tool_conversation(rng, heldout)
    if task == "chat":
        return chat_conversation(rng)
    return chat_conversation(rng, think=False)


def decorate(rng: random.Random, conv: Conversation, offer_tools: float = 0.3) -> Conversation:
    """Optional system prompt, an earlier exchange (its thinking is dropped) and tools not needed."""
    if "tools" not in conv and conv["meta"]["task"] in ("arith", "count", "chat") and rng.random() < offer_tools:
        conv["tools"] = tool_list(rng, None)[0]
    if rng.random() < 0.12:
        prev = chat_conversation(rng) if rng.random() < 0.5 else arithmetic_conversation(rng)
        conv["messages"] = prev["messages"] + conv["messages"]
    if rng.random() < 0.3:
        conv["messages"] = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] + conv["messages"]
    return conv


def training_conversations(n: int, seed: int) -> list[Conversation]:
    rng = random.Random(seed)
    tasks, weights = list(MIXTURE), list(MIXTURE.values())
    return [decorate(rng, _base(rng, rng.choices(tasks, weights)[0], heldout=False)) for _ in range(n)]


def heldout_arithmetic(n: int = 50, seed: int = 7) -> list[Conversation]:
    """Held-out arithmetic prompts (operand pairs never asked in training), last turn removed."""
    rng = random.Random(seed)
    return [_strip(arithmetic_conversation(rng, heldout=True)) for _ in range(n)]


def heldout_tool_prompts(n: int = 50, seed: int = 8) -> list[Conversation]:
    """Held-out tool prompts: new cities, paths and expressions; the expected call is in meta."""
    rng = random.Random(seed)
    return [_strip(tool_conversation(rng, heldout=True, with_result=False)) for _ in range(n)]


def heldout_no_tool_prompts(n: int = 50, seed: int = 9) -> list[Conversation]:
    """Prompts that need no tool, with tools offered (small arithmetic, counting, chat, missing tool)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 3:
            conv = missing_tool_conversation(rng, heldout=True)
        else:
            conv = [lambda: arithmetic_conversation(rng, heldout=True), lambda: counting_conversation(rng),
                    chat_conversation_rng(rng)][kind]()
            conv["tools"] = tool_list(rng, None)[0]
        out.append(_strip(conv))
    return out


def chat_conversation_rng(rng: random.Random) -> Any:
    return lambda: chat_conversation(rng)


def _strip(conv: Conversation) -> Conversation:
    """Keep the messages up to (not including) the first assistant turn after the last user query."""
    msgs = conv["messages"]
    first = next(i for i in range(len(msgs)) if msgs[i]["role"] == "assistant")
    conv["messages"] = msgs[:first]
    return conv
