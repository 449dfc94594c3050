"""TTFT of a long prompt on the CPU with v2's shape (an untrained Qwen3.5-MoE hybrid built from
training/default_model_v2/hybrid_config.py), then the next turn (the prompt reused, a few new tokens), with the
time split per part (the chunked delta rule, prefill attention, everything else).

    PYTHONPATH=src:. python3 bench/cpu_hybrid_prefill.py [--tokens 8192 32768] [--turn 200] [--dir /tmp/v2_random]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

VOCAB = 16384
SPENT: dict[str, float] = defaultdict(float)


def build(path: Path) -> None:
    if (path / "config.json").exists():
        return
    from transformers import Qwen3_5MoeForCausalLM

    from training.default_model_v2.hybrid_config import build_config

    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(build_config(VOCAB, [1], 0)).to(torch.bfloat16)
    model.save_pretrained(path)


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - t

    return wrapper


def instrument() -> None:
    """Wraps the functions the layers call by name (the modules' own references)."""
    import freetoken.layers.deltanet as deltanet
    from freetoken.kernels.attention.torch_backend import TorchAttention  # the CPU backend's prefill is its

    deltanet.chunk_gated_delta = timed("delta rule", deltanet.chunk_gated_delta)  # type: ignore[assignment]
    TorchAttention.prefill = timed("attention", TorchAttention.prefill)  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--turn", type=int, default=200, help="new tokens of the next turn")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/v2_random"))
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's top ops of the first prompt")
    a = ap.parse_args()
    build(a.dir)
    instrument()
    from freetoken import LLM, SamplingParams

    longest = max(a.tokens) + a.turn + 16
    llm = LLM(str(a.dir), device="cpu", max_model_len=longest)
    one = SamplingParams(max_tokens=1, temperature=0.0)
    gen = torch.Generator().manual_seed(1)
    llm.generate(torch.randint(2, VOCAB, (64,), generator=gen).tolist(), one)  # warm
    print(f"threads {torch.get_num_threads()}")
    for n in a.tokens:
        ids = torch.randint(2, VOCAB, (n + a.turn,), generator=gen).tolist()
        for label, prompt in (("first", ids[:n]), ("next turn", ids)):
            SPENT.clear()
            prof = torch.profiler.profile() if a.profile and label == "first" else None
            if prof is not None:
                prof.__enter__()
            t = time.perf_counter()
            llm.generate(prompt, one)
            ttft = time.perf_counter() - t
            if prof is not None:
                prof.__exit__(None, None, None)
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
            parts = ", ".join(f"{k} {v:.2f} s" for k, v in SPENT.items())
            rest = ttft - sum(SPENT.values())
            print(f"{n:>6} tokens {label:>9}: TTFT {ttft:7.2f} s ({parts}, rest {rest:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
