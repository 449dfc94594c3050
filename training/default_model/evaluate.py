"""Evaluate the default model on the held-out sets with greedy decoding.

    python -m training.default_model.evaluate --model src/freetoken/assets/default_model

Prints arithmetic exact-match (target >= 90%), tool name + argument accuracy (>= 90%) and the
tool-call rate on prompts that need no tool (<= 10%). `--engine transformers` (default) decodes
with transformers' `generate`; `--engine freetoken` with `freetoken.LLM` once the engine exists.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from training.default_model.generate import heldout_arithmetic, heldout_no_tool_prompts, heldout_tool_prompts

Generate = Callable[[list[str], int], list[str]]
_INT = re.compile(r"-?\d+")
_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def prompt_text(tok: Any, conv: dict[str, Any]) -> str:
    kw = {} if conv.get("enable_thinking", True) else {"enable_thinking": False}
    return tok.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False,
                                   add_generation_prompt=True, **kw)


def transformers_generator(model_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
                           batch_size: int = 64) -> tuple[Generate, Any]:
    """(generate(prompts, max_new_tokens) -> completions with special tokens, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.to(device).eval()

    @torch.no_grad()
    def run(prompts: list[str], max_new_tokens: int) -> list[str]:
        outs: list[str] = []
        for s in range(0, len(prompts), batch_size):
            enc = tok(prompts[s:s + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(device) for k, v in enc.items()}
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            outs += [t.split("<|im_end|>")[0] for t in tok.batch_decode(new, skip_special_tokens=False)]
        return outs

    return run, tok


def freetoken_generator(model_dir: Path, device: str = "cpu") -> tuple[Generate, Any]:
    """The same through FreeToken's own engine (greedy)."""
    from transformers import AutoTokenizer

    from freetoken import LLM, SamplingParams

    llm = LLM(model=str(model_dir), device=device, max_running_requests=64)

    def run(prompts: list[str], max_new_tokens: int) -> list[str]:
        sp = SamplingParams(max_tokens=max_new_tokens, temperature=0.0, skip_special_tokens=False)
        return [r.text.split("<|im_end|>")[0] for r in llm.generate(prompts, sp)]

    return run, AutoTokenizer.from_pretrained(model_dir)


def final_content(completion: str) -> str:
    """The visible answer: what follows the thinking block."""
    return completion.split("</think>")[-1].strip()


def parse_tool_call(completion: str) -> tuple[str, dict[str, Any]] | None:
    m = _CALL.search(completion)
    if not m:
        return None
    try:
        call = json.loads(m.group(1))
        return str(call["name"]), dict(call["arguments"])
    except (ValueError, KeyError, TypeError):
        return None


def arithmetic_accuracy(gen: Generate, tok: Any, n: int = 50) -> tuple[float, list[tuple[str, str, int]]]:
    """Exact match of the last integer of the visible answer; also returns the misses."""
    convs = heldout_arithmetic(n)
    outs = gen([prompt_text(tok, c) for c in convs], 96)
    misses = []
    for c, o in zip(convs, outs):
        nums = _INT.findall(final_content(o))
        if not nums or int(nums[-1]) != c["meta"]["answer"]:
            misses.append((c["messages"][-1]["content"], o, c["meta"]["answer"]))
    return 1 - len(misses) / len(convs), misses


def tool_accuracy(gen: Generate, tok: Any, n: int = 50) -> tuple[float, list[tuple[str, str]], str]:
    """Share of held-out tool prompts whose first call has the offered name and the exact arguments;
    also the misses and a breakdown (name-only accuracy, exact accuracy per tool kind)."""
    convs = heldout_tool_prompts(n)
    outs = gen([prompt_text(tok, c) for c in convs], 128)
    misses, names_ok = [], 0
    per_kind: dict[str, list[int]] = {}
    for c, o in zip(convs, outs):
        call = parse_tool_call(o)
        ok = call == (c["meta"]["name"], c["meta"]["arguments"])
        names_ok += call is not None and call[0] == c["meta"]["name"]
        per_kind.setdefault(c["meta"]["kind"], []).append(ok)
        if not ok:
            misses.append((c["messages"][-1]["content"], o))
    kinds = ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in sorted(per_kind.items()))
    return 1 - len(misses) / len(convs), misses, f"name right {names_ok}/{len(convs)}; exact per tool: {kinds}"


def no_tool_call_rate(gen: Generate, tok: Any, n: int = 50) -> tuple[float, list[tuple[str, str]]]:
    """Share of prompts needing no tool (tools offered) where the model still emits a tool call."""
    convs = heldout_no_tool_prompts(n)
    outs = gen([prompt_text(tok, c) for c in convs], 128)
    calls = [(c["messages"][-1]["content"], o) for c, o in zip(convs, outs) if "<tool_call>" in o]
    return len(calls) / len(convs), calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("src/freetoken/assets/default_model"))
    p.add_argument("--engine", choices=["transformers", "freetoken"], default="transformers")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--show-misses", type=int, default=3)
    a = p.parse_args()
    if a.engine == "freetoken":
        gen, tok = freetoken_generator(a.model, a.device)
    else:
        gen, tok = transformers_generator(a.model, a.device, getattr(torch, a.dtype))
    acc, amiss = arithmetic_accuracy(gen, tok)
    tacc, tmiss, tdetail = tool_accuracy(gen, tok)
    rate, calls = no_tool_call_rate(gen, tok)
    print(f"[eval] arithmetic exact-match on 50 held-out prompts: {acc:.1%} (target >= 90%)")
    print(f"[eval] tool name + arguments on 50 held-out tool prompts: {tacc:.1%} (target >= 90%); {tdetail}")
    print(f"[eval] tool-call rate on 50 no-tool prompts: {rate:.1%} (target <= 10%)")
    for label, rows in (("arith miss", amiss), ("tool miss", tmiss), ("spurious call", calls)):
        for row in rows[:a.show_misses]:
            print(f"[eval] {label}: {row!r}")


if __name__ == "__main__":
    main()
