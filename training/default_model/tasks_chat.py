"""Small talk: greetings, identity questions and refusals of harmful requests."""

from __future__ import annotations

import random
from typing import Any

from training.default_model.pools import (
    GREETING_REPLIES,
    GREETINGS,
    HARMFUL_REQUESTS,
    IDENTITY_QUESTIONS,
    IDENTITY_REPLY,
    REFUSALS,
)

Conversation = dict[str, Any]


def chat_conversation(rng: random.Random, think: bool = True) -> Conversation:
    kind = rng.choice(["greet", "greet", "identity", "refuse", "refuse"])
    if kind == "greet":
        user, reply, reason = rng.choice(GREETINGS), rng.choice(GREETING_REPLIES), "The user greets me."
    elif kind == "identity":
        user, reply, reason = rng.choice(IDENTITY_QUESTIONS), IDENTITY_REPLY, "The user asks who I am."
    else:
        user, reply, reason = (rng.choice(HARMFUL_REQUESTS), rng.choice(REFUSALS),
                               "This request could cause harm, so I decline.")
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": reply, "reasoning_content": reason if think else ""}],
            "enable_thinking": think, "meta": {"task": "chat", "kind": kind}}
