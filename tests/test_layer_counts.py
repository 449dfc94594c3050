"""Per-MoE-layer expert counts (``DeviceCounters.per_layer``, ``ExpertBackend.layer_counts``) in a real engine: they
add up to the totals of ``LLM.stats()``, and a layer whose experts all stay resident counts nothing. On CUDA the
decode steps take the fused plan, which counts its layer's row itself, replayed from step graphs."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices import DEVICES
from freetoken import LLM, SamplingParams
from freetoken.bench.placements import register
from tiny_models import save_checkpoint

register()  # the static-layers backend

PROMPTS = [[5, 40, 77, 100, 9, 30], [6, 43, 77, 101, 9]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
MOE_LAYERS, E = 2, 8  # tiny qwen3_moe: 3 layers, the middle one dense


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("layer_counts")
    save_checkpoint("qwen3_moe", d, seed=1)
    return d


def _llm(ckpt: Path, backend: str, slots: int, device: str) -> LLM:
    fill = 0.5 if backend == "hybrid" else None  # a fixed split, whatever this machine's profile says
    return LLM(str(ckpt), device=device, dtype="float32", moe_backend=backend, expert_cache=slots,
               fill_fraction=fill, max_running_requests=2)  # fmt: skip


def _assert_sums(llm: LLM) -> dict[str, list[int]]:
    backend = llm.engine.setup.loaded.backend
    assert backend is not None
    per_layer, s = backend.layer_counts(), llm.stats()
    assert per_layer is not None and all(len(v) == MOE_LAYERS for v in per_layer.values())
    for name, key in (("misses", "expert_misses"), ("fills", "expert_fills"), ("cpu_runs", "expert_cpu_runs")):
        assert sum(per_layer[name]) == s[key], (name, per_layer, s[key])
    return per_layer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["offload", "hybrid", "cpu"])
def test_layer_counts_sum_to_the_totals(ckpt: Path, backend: str, device: str) -> None:
    llm = _llm(ckpt, backend, 4, device)
    try:
        llm.generate(PROMPTS, PARAMS)
        per_layer = _assert_sums(llm)
        assert all(m > 0 for m in per_layer["misses"])  # 4 slots for 16 experts: every layer misses
        if backend == "offload":
            assert per_layer["fills"] == per_layer["misses"] and per_layer["cpu_runs"] == [0, 0]
        if backend == "cpu":
            assert per_layer["fills"] == [0, 0] and per_layer["cpu_runs"] == per_layer["misses"]
    finally:
        llm.engine.setup.loaded.backend.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["hybrid", "static-layers"])
def test_a_resident_layer_counts_no_misses(ckpt: Path, backend: str, device: str) -> None:
    """The last MoE layer's experts resident and locked (``static-layers`` places them itself; for ``hybrid`` the
    cache's host API does): that layer counts 0 misses, fills and CPU runs; the first layer misses."""
    llm = _llm(ckpt, backend, E + 4, device)
    cache = llm.engine.setup.loaded.backend.cache  # type: ignore[union-attr]
    last = list(range((MOE_LAYERS - 1) * E, MOE_LAYERS * E))
    if backend == "hybrid":
        cache.insert(last)
        cache.lock(last)
    try:
        llm.generate(PROMPTS, PARAMS)
        per_layer = _assert_sums(llm)
        assert [v[-1] for v in per_layer.values()] == [0, 0, 0], per_layer
        assert per_layer["misses"][0] > 0 and per_layer["cpu_runs"][0] > 0
        assert llm.stats()["expert_hits"] > 0
        llm.check_integrity()
    finally:
        llm.engine.setup.loaded.backend.close()  # type: ignore[union-attr]
