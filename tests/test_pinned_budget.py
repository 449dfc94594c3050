"""A pinned-memory budget below the pool (CPU, fp32): only the first experts (eid order) are ever filled, the
others run on the CPU branch, and the greedy tokens equal the fully pinned run's; backends without a CPU
branch refuse such a budget."""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from tiny_models import save_checkpoint

EXPERT_BYTES = 3 * 64 * 32 * 4  # the tiny qwen3_moe's expert: gate, up, down of 64 x 32 in fp32


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("pinned")
    save_checkpoint("qwen3_moe", d, seed=1)  # 2 MoE layers x 8 experts: 16 pool rows
    return str(d)


def test_half_pinned_pool_fills_only_pinned_experts_and_keeps_the_tokens(ckpt: str) -> None:
    g = torch.Generator().manual_seed(8)  # free of near ties: tests/test_elastic_memory.py checks these prompts
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (40, 70, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    kw = dict(model=ckpt, device="cpu", dtype="float32", moe_backend="hybrid", expert_cache=8, fill_fraction=0.5)
    full = LLM(**kw)
    half = LLM(pinned_budget=8 * EXPERT_BYTES / 2**30, **kw)
    want = [r.token_ids for r in full.generate(prompts, params)]
    assert [r.token_ids for r in half.generate(prompts, params)] == want
    backend = half.engine.setup.loaded.backend
    assert backend is not None and backend.pool.pinned_rows == 8 and half.stats()["pinned_experts"] == 8
    resident = backend.cache.resident()
    assert resident and max(resident) < 8  # layer 1's experts (eids 8..15) never reached the cache
    assert half.stats()["expert_cpu_runs"] > full.stats()["expert_cpu_runs"]
    half.check_integrity()


def test_a_partial_pin_needs_a_cpu_branch(ckpt: str) -> None:
    with pytest.raises(ValueError, match="needs the hybrid backend"):
        LLM(model=ckpt, device="cpu", dtype="float32", moe_backend="offload", pinned_budget=1e-5)
