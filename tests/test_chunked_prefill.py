"""Chunk size never changes results: chunked prefill logits equal one-shot prefill (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM
from tiny_models import save_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("chunked")
    save_checkpoint("qwen3_moe", d, seed=1)
    return d


@pytest.mark.parametrize("backend,cache", [("fused", None), ("offload", 0.5), ("hybrid", 1.0)])
def test_chunked_prefill_logits_equal_one_shot(ckpt, backend, cache):
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", moe_backend=backend, expert_cache=cache,
              fill_fraction=0.5 if backend == "hybrid" else None)
    ids = torch.randint(3, 512, (61,), generator=torch.Generator().manual_seed(5)).tolist()
    ref = llm.engine.score(ids)
    for chunk in (1, 7, 16, 60):
        got = llm.engine.score(ids, chunk=chunk)
        err = float((got - ref).abs().max()) / max(1.0, float(ref.abs().max()))
        assert err <= 1e-5, (chunk, err)
    llm.check_integrity()
