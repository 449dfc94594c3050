"""Record a model's decode routing as a trace ([tokens, layers, k] uint8) for ``ft bench decode``.

``ft bench record-routing`` (``python -m freetoken.bench.record_routing``).

Runs greedy generation through ``LLM`` one prompt at a time and records, for every decode token, the
sorted expert ids each MoE layer routes it to: a ``uint8`` array ``[tokens, layers, k]`` saved with
``numpy.save`` (the format of ``bench/traces/``). Prefill tokens are not recorded.

    python -m freetoken.bench.record_routing --model /path/to/Qwen3-30B-A3B --tokens 2000 --out trace.npy
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from freetoken.bench.routing_trace import moe_layers
from freetoken.config import EngineConfig, add_config_args, config_kwargs
from freetoken.experts.base import ExpertBackend
from freetoken.layers.moe import MoELayer

DEFAULT_PROMPTS = (
    "Write a Python function that parses an ISO 8601 date string and returns a datetime. Add tests.",
    "Explain step by step how a radix tree supports prefix reuse in a key-value cache.",
    "You are a coding agent. The build fails with 'undefined reference to main'. What do you check first?",
    "Summarise the trade-offs between tensor parallelism and expert parallelism for MoE inference.",
)


def chat_prompt(i: int) -> str:
    """The i-th of a fixed, varied stream of questions (arithmetic, counting, chat) for chat models."""
    a, b = (37 * i + 11) % 100, (53 * i + 29) % 100
    forms = (
        f"What is {a} + {b}?", f"{a} minus {b}", f"multiply {a % 10} by {b}", "Hello! Who are you?",
        f"How many items are in this list: {', '.join(['cat', 'dog', 'sun', 'tree', 'car'][: 2 + i % 4])}?",
        f"add {a} and {b}", f"What is {a} * {b % 10}?", "Tell me a joke about computers.",
    )  # fmt: skip
    return forms[i % len(forms)]


class RecordingBackend(ExpertBackend):
    """Delegates to the real backend and keeps the routed ids of single-token decode steps."""

    def __init__(self, inner: ExpertBackend, num_layers: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.num_layers = num_layers
        self.rows: list[np.ndarray] = []  # one [layers, k] per recorded token
        self._decode = False
        self._current: dict[int, np.ndarray] = {}

    def begin_step(self, num_tokens: int, is_decode: bool) -> None:
        self._flush()
        self._decode = is_decode and num_tokens == 1
        self.inner.begin_step(num_tokens, is_decode)

    def _flush(self) -> None:
        if len(self._current) == self.num_layers:
            self.rows.append(np.stack([self._current[i] for i in range(self.num_layers)]))
        self._current = {}

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        if self._decode:
            self._current[layer] = np.sort(topk_ids[0].cpu().numpy()).astype(np.uint8)
        return self.inner.forward(layer, x, topk_ids, topk_w)

    def trace(self) -> np.ndarray:
        self._flush()
        if not self.rows:
            raise RuntimeError("no decode token was recorded")
        return np.stack(self.rows)  # [tokens, layers, k]

    def stats(self) -> dict[str, int | float]:
        return self.inner.stats()

    def check_integrity(self) -> None:
        self.inner.check_integrity()


R = TypeVar("R", bound=RecordingBackend)


def install_wrapper(llm: Any, wrap: Callable[[ExpertBackend, list[MoELayer]], R]) -> R:
    """Wrap the LLM's expert backend (``wrap(inner, the MoE layers)``), everywhere the engine holds it."""
    engine = llm.engine
    inner = engine.setup.loaded.backend
    if inner is None:
        raise ValueError("this model has no MoE layers: nothing to record")
    moe = moe_layers(engine.runner.model)
    rec = wrap(inner, moe)
    for m in moe:
        m.backend = rec
    engine.runner.backend = rec
    engine.setup.loaded.backend = rec
    return rec


def install_recorder(llm: Any) -> RecordingBackend:
    """Wrap the LLM's expert backend in a recorder, everywhere the engine holds it."""
    return install_wrapper(llm, lambda inner, moe: RecordingBackend(inner, len(moe)))


def decode(llm: Any, rec: RecordingBackend, tokens: int, chat: bool, prompts: list[str] | None = None,
           temperature: float = 0.0) -> None:  # fmt: skip
    """Decode until ``rec`` holds ``tokens`` decode tokens: chat-formatted built-in questions (each answer stops at
    the model's own end of turn), else the prompts (default: built-in; a checkpoint without a tokenizer, such as the
    synthetic presets, gets 32 random token ids each), ``temperature`` > 0 sampled with a seed per prompt."""
    from freetoken import SamplingParams

    if chat:
        i = 0
        while len(rec.rows) < tokens:
            msgs = [{"role": "user", "content": chat_prompt(i)}]
            ids = llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
            llm.generate([list(ids)], SamplingParams(temperature=temperature, max_tokens=256, seed=i))
            i += 1
        return
    texts = list(prompts or DEFAULT_PROMPTS)
    per = -(-tokens // len(texts)) + 1  # the first generated token comes from prefill
    g = torch.Generator().manual_seed(0)
    for i, text in enumerate(texts):
        ids = torch.randint(3, llm.engine.hf.vocab_size, (32,), generator=g).tolist()
        prompt: str | list[int] = text if llm.tokenizer is not None else ids
        llm.generate([prompt], SamplingParams(temperature=temperature, max_tokens=per, ignore_eos=True, seed=i))


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--tokens", type=int, default=2000, help="decode tokens to record in all")
    p.add_argument("--chat", action="store_true", help="chat-formatted built-in questions, stopping at EOS")
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable; default: built-in)")
    p.add_argument("--out", required=True, help="output .npy file")
    add_config_args(p, EngineConfig, only=("model", "device", "dtype", "moe_backend", "expert_cache"))
    return p


def run(args: argparse.Namespace) -> int:
    from freetoken import LLM

    llm = LLM(**config_kwargs(EngineConfig, args))
    rec = install_recorder(llm)
    decode(llm, rec, args.tokens, args.chat, args.prompt)
    trace = rec.trace()[: args.tokens]
    np.save(args.out, trace)
    print(f"recorded {trace.shape[0]} tokens x {trace.shape[1]} MoE layers x top-{trace.shape[2]} -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(add_arguments(argparse.ArgumentParser(prog="ft bench record-routing")).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
