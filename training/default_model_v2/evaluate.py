"""Evaluate the default model v2 on held-out agent-shaped prompts (8-40k tokens) with greedy decoding.

    PYTHONPATH=src python -m training.default_model_v2.evaluate --model DIR               # freetoken.LLM
    python -m training.default_model_v2.evaluate --model DIR --engine transformers

Each prompt has a long system prompt, a tool catalogue in one of three client styles (as the server renders
it), a history with tool results, and the request last. Figures: tool name + exact arguments (held-out paths,
cities, expressions and tool names; target >= 95%), arithmetic exact match (held-out operand pairs; >= 95%) and
the tool-call rate on prompts no offered tool fits (missing tool, chat; <= 5%). Prompt sizes are measured with
the model's tokenizer; a drawn prompt outside [--min-tokens, --max-tokens] is drawn again.
The same sets through the server and the official OpenAI / Anthropic SDKs: evaluate_http.py.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.default_model import evaluate as v1_evaluate
from training.default_model_v2.agent_tasks import agent_conversation

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


@dataclass(frozen=True)
class Reply:
    """What a figure looks at in one reply, whatever produced it (a raw completion, an API response)."""

    call: tuple[str, dict[str, Any]] | None  # the first tool call (name, arguments); None: none that parses
    called: bool  # a tool call was made (one whose JSON does not parse counts too)
    answer: str  # the visible answer, after the thinking block
    raw: str  # what the miss listings print


def completion_reply(completion: str) -> Reply:
    """A raw completion (special tokens kept, cut at <|im_end|>) read the way v1's evaluation reads it."""
    return Reply(v1_evaluate.parse_tool_call(completion), "<tool_call>" in completion,
                 v1_evaluate.final_content(completion), completion)


Prompts = list[tuple[Conversation, str]]
Answerer = Callable[[Prompts, int], list[Reply]]  # (prompts with their rendered text, max new tokens) -> replies
MAX_NEW = {"tool": 160, "arith": 128, "none": 128}
SEEDS = {"tool": 18, "arith": 17, "none": 19}


def text_generator_answerer(gen: Callable[[list[str], int], list[str]]) -> Answerer:
    return lambda prompts, max_new: [completion_reply(o) for o in gen([t for _, t in prompts], max_new)]


def renderer(tok: Any) -> tuple[Callable[[Conversation], str], Callable[[str], int]]:
    """(render: the conversation as the chat template renders it, count: its tokens) with the model's tokenizer."""
    def render(conv: Conversation) -> str:
        return str(v1_evaluate.prompt_text(tok, conv))

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return render, count


def evaluate(answerers: dict[str, Answerer], tok: Any, n_tool: int, n_arith: int, n_none: int, lo: int, hi: int,
             show: int) -> None:
    """Each set is drawn once and answered by every answerer ({label: answerer}; label "" for one engine).
    Prints each figure as soon as its set is done (a run cut short still leaves the figures before)."""
    render, count = renderer(tok)
    for task, n in (("tool", n_tool), ("arith", n_arith), ("none", n_none)):
        if not n:
            continue
        prompts = heldout_set(task, n, SEEDS[task], render, count, lo, hi)
        sizes = [count(t) for _, t in prompts]
        for label, answer in answerers.items():
            tag = f"[eval{' ' + label if label else ''}]"
            t0 = time.time()
            replies = answer(prompts, MAX_NEW[task])
            print(f"{tag} {task}: {n} prompts of {min(sizes)}-{max(sizes)} tokens (mean {sum(sizes) // n}), "
                  f"decoded in {time.time() - t0:.0f}s", flush=True)
            score(task, [c for c, _ in prompts], replies, tag, show)


def score(task: str, convs: list[Conversation], replies: list[Reply], tag: str = "[eval]", show: int = 3) -> None:
    """Prints the set's figure: tool name + exact arguments (with the per style/kind and seen/unseen name
    breakdown), arithmetic exact match, or the tool-call rate on no-tool prompts."""
    n = len(convs)
    rows = list(zip(convs, replies))
    if task == "tool":
        ok = [r.call == (c["meta"]["name"], c["meta"]["arguments"]) for c, r in rows]
        names = sum((r.call or ("",))[0] == c["meta"]["name"] for c, r in rows)
        per: dict[str, list[bool]] = {}
        for c, k in zip(convs, ok):
            per.setdefault(f"{c['meta']['style']}/{c['meta']['kind']}", []).append(k)
            per.setdefault("client's own name" if c["meta"]["seen_name"] else "unseen name", []).append(k)
        print(f"{tag} tool name + exact arguments: {sum(ok)}/{n} ({sum(ok) / n:.1%}, target >= 95%); "
              f"name right {names}/{n}")
        print(f"{tag} per style/kind: " + ", ".join(f"{key} {sum(v)}/{len(v)}" for key, v in sorted(per.items())))
        _show(f"{tag} tool miss", [(c["meta"], r.raw) for (c, r), k in zip(rows, ok) if not k], show)
    elif task == "arith":
        bad = []
        for c, r in rows:
            nums = _INT.findall(r.answer)
            if not nums or r.called or int(nums[-1]) != c["meta"]["answer"]:
                bad.append((c["messages"][-1]["content"], r.raw))
        good = n - len(bad)
        print(f"{tag} arithmetic exact match: {good}/{n} ({good / n:.1%}, target >= 95%)")
        _show(f"{tag} arith miss", bad, show)
    else:
        calls = [(c["messages"][-1]["content"], r.raw) for c, r in rows if r.called]
        print(f"{tag} tool calls on no-tool prompts: {len(calls)}/{n} ({len(calls) / n:.1%}, target <= 5%)")
        _show(f"{tag} spurious call", calls, show)


def _show(label: str, rows: list[Any], show: int) -> None:
    for row in rows[:show]:
        print(f"{label}: {row!r}", flush=True)


def add_set_args(p: argparse.ArgumentParser) -> None:
    """The held-out set's options (sizes, prompt lengths) and how many misses to print, shared by evaluate_http."""
    p.add_argument("--n-tool", type=int, default=100)
    p.add_argument("--n-arith", type=int, default=50)
    p.add_argument("--n-none", type=int, default=50)
    p.add_argument("--min-tokens", type=int, default=8192)
    p.add_argument("--max-tokens", type=int, default=40960)
    p.add_argument("--show-misses", type=int, default=3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--engine", choices=["freetoken", "transformers"], default="freetoken")
    p.add_argument("--device", default="cpu")
    add_set_args(p)
    a = p.parse_args()
    if a.engine == "freetoken":
        gen, tok = v1_evaluate.freetoken_generator(a.model, a.device)
    else:
        gen, tok = v1_evaluate.transformers_generator(a.model, a.device, torch.float32, batch_size=4)
    evaluate({"": text_generator_answerer(gen)}, tok, a.n_tool, a.n_arith, a.n_none, a.min_tokens, a.max_tokens,
             a.show_misses)


if __name__ == "__main__":
    main()
