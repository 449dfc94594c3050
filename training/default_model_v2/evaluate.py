"""Evaluate the default model v2 on held-out agent-shaped prompts (8-40k tokens) with greedy decoding.

    PYTHONPATH=src python training/default_model_v2/evaluate.py --model DIR               # freetoken.LLM
    python training/default_model_v2/evaluate.py --model DIR --engine transformers

Each prompt has a long system prompt, a tool catalogue in one of three client styles (as the server renders
it), a history with tool results, and the request last. Figures: tool name + exact arguments (held-out paths,
cities, expressions and tool names; target >= 95%), arithmetic exact match (held-out operand pairs; >= 95%) and
the tool-call rate on prompts no offered tool fits (missing tool, chat; <= 5%). Prompt sizes are measured with
the model's tokenizer; a drawn prompt outside [--min-tokens, --max-tokens] is drawn again.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import v1
from agent_tasks import agent_conversation

V1E = v1.load("evaluate")
_INT = re.compile(r"-?\d+")
Conversation = dict[str, Any]


def strip_reply(conv: Conversation) -> Conversation:
    """Keep the messages up to the first assistant turn after the last user query (the reply to predict)."""
    msgs = conv["messages"]
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    first = next(i for i in range(last_user, len(msgs)) if msgs[i]["role"] == "assistant")
    conv["messages"] = msgs[:first]
    return conv


def heldout_set(task: str, n: int, seed: int, render: Callable[[Conversation], str], count: Callable[[str], int],
                lo: int, hi: int) -> list[tuple[Conversation, str]]:
    """n held-out prompts of `task` ("tool", "arith", "none": missing tool or chat), each with its rendered text."""
    rng = random.Random(seed)
    out: list[tuple[Conversation, str]] = []
    while len(out) < n:
        t = task if task != "none" else ("missing" if len(out) % 2 == 0 else "chat")
        want = int(math.exp(rng.uniform(math.log(lo * 0.9), math.log(hi * 0.9))))
        conv = strip_reply(agent_conversation(rng, want, t, heldout=True, with_result=False))
        text = render(conv)
        if lo <= count(text) <= hi:
            out.append((conv, text))
    return out


def evaluate(gen: Any, tok: Any, n_tool: int, n_arith: int, n_none: int, lo: int, hi: int, show: int) -> None:
    """Prints each figure as soon as its set is done (a run cut short still leaves the figures before)."""
    def render(conv: Conversation) -> str:
        return str(V1E.prompt_text(tok, conv))

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    def run(task: str, n: int, seed: int, max_new: int) -> list[tuple[Conversation, str]]:
        prompts = heldout_set(task, n, seed, render, count, lo, hi)
        sizes = [count(t) for _, t in prompts]
        t0 = time.time()
        outs = gen([t for _, t in prompts], max_new)
        print(f"[eval] {task}: {n} prompts of {min(sizes)}-{max(sizes)} tokens (mean {sum(sizes) // n}), "
              f"decoded in {time.time() - t0:.0f}s", flush=True)
        return [(c, o) for (c, _), o in zip(prompts, outs)]

    if n_tool:
        rows = run("tool", n_tool, 18, 160)
        ok = [V1E.parse_tool_call(o) == (c["meta"]["name"], c["meta"]["arguments"]) for c, o in rows]
        names = sum((V1E.parse_tool_call(o) or ("",))[0] == c["meta"]["name"] for c, o in rows)
        per: dict[str, list[bool]] = {}
        for (c, _), k in zip(rows, ok):
            per.setdefault(f"{c['meta']['style']}/{c['meta']['kind']}", []).append(k)
            per.setdefault("client's own name" if c["meta"]["seen_name"] else "unseen name", []).append(k)
        print(f"[eval] tool name + exact arguments: {sum(ok)}/{n_tool} ({sum(ok) / n_tool:.1%}, target >= 95%); "
              f"name right {names}/{n_tool}")
        print("[eval] per style/kind: " + ", ".join(f"{key} {sum(v)}/{len(v)}" for key, v in sorted(per.items())))
        _show("tool miss", [(c["meta"], o) for (c, o), k in zip(rows, ok) if not k], show)
    if n_arith:
        rows = run("arith", n_arith, 17, 128)
        bad = []
        for c, o in rows:
            nums = _INT.findall(V1E.final_content(o))
            if not nums or "<tool_call>" in o or int(nums[-1]) != c["meta"]["answer"]:
                bad.append((c["messages"][-1]["content"], o))
        good = n_arith - len(bad)
        print(f"[eval] arithmetic exact match: {good}/{n_arith} ({good / n_arith:.1%}, target >= 95%)")
        _show("arith miss", bad, show)
    if n_none:
        rows = run("none", n_none, 19, 128)
        calls = [(c["messages"][-1]["content"], o) for c, o in rows if "<tool_call>" in o]
        print(f"[eval] tool calls on no-tool prompts: {len(calls)}/{n_none} ({len(calls) / n_none:.1%}, "
              f"target <= 5%)")
        _show("spurious call", calls, show)


def _show(label: str, rows: list[Any], show: int) -> None:
    for row in rows[:show]:
        print(f"[eval] {label}: {row!r}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--engine", choices=["freetoken", "transformers"], default="freetoken")
    p.add_argument("--device", default="cpu")
    p.add_argument("--n-tool", type=int, default=100)
    p.add_argument("--n-arith", type=int, default=50)
    p.add_argument("--n-none", type=int, default=50)
    p.add_argument("--min-tokens", type=int, default=8192)
    p.add_argument("--max-tokens", type=int, default=40960)
    p.add_argument("--show-misses", type=int, default=3)
    a = p.parse_args()
    if a.engine == "freetoken":
        gen, tok = V1E.freetoken_generator(a.model, a.device)
    else:
        gen, tok = V1E.transformers_generator(a.model, a.device, torch.float32, batch_size=4)
    evaluate(gen, tok, a.n_tool, a.n_arith, a.n_none, a.min_tokens, a.max_tokens, a.show_misses)


if __name__ == "__main__":
    main()
