"""The Python API: ``LLM(model).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from freetoken.config import EngineConfig
from freetoken.engine.engine import LLMEngine
from freetoken.engine.errors import InputError
from freetoken.engine.outputs import CompletionResult
from freetoken.runner.sampling_params import SamplingParams

Prompt = str | Sequence[int]


class LLM:
    """One model, one engine; ``generate`` runs every prompt together (continuous batching)."""

    def __init__(
        self,
        model: str | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        moe_backend: str = "auto",
        expert_cache: int | float | None = None,
        **kwargs: Any,
    ) -> None:
        unknown = set(kwargs) - EngineConfig.field_names()
        if unknown:
            raise TypeError(f"unknown LLM option(s): {', '.join(sorted(unknown))}")
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        self.config = EngineConfig(
            model=model, device=device, dtype=dtype, moe_backend=moe_backend, expert_cache=expert_cache, **kwargs
        )
        self.engine = LLMEngine(self.config)
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError("this checkpoint has no tokenizer: pass token ids")
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        return [int(t) for t in prompt]

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[CompletionResult]:
        plist: list[Prompt]
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            plist = [prompts]  # type: ignore[list-item]
        else:
            plist = list(prompts)  # type: ignore[arg-type]
        params = sampling_params or SamplingParams()
        per = list(params) if isinstance(params, Sequence) else [params] * len(plist)
        if len(per) != len(plist):
            raise ValueError("one SamplingParams per prompt, or a single one for all")
        results: dict[str, CompletionResult] = {}
        order: list[str] = []
        for prompt, p in zip(plist, per):
            ids = self._encode(prompt)
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, ids, p)
            results[rid] = CompletionResult(rid, ids)
            order.append(rid)
        while self.engine.has_unfinished():
            for out in self.engine.step():
                r = results.get(out.request_id)
                if r is None:
                    continue
                r.token_ids += out.new_token_ids
                r.text += out.new_text
                if out.finished:
                    r.finish_reason = out.finish_reason
        return [results[rid] for rid in order]

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def check_integrity(self) -> None:
        self.engine.check_integrity()
