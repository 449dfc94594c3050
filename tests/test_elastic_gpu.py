"""Elastic memory on CUDA: the resizable caches are driver allocations whose bytes go back to the device
the moment they are freed (torch's cache untouched); resizing the slots and the KV pool mid-generation
keeps the greedy tokens with the step and layer graphs dropped and captured again; the pinned budget
serves correctly; the VRAM watcher reads NVML. GPU only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.hardware import device_memory
from freetoken.hardware.device_memory import device_zeros, uses_driver_memory
from freetoken.memory.budget import MemorySplit
from tiny_models import save_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GIB = 1 << 30
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("elastic_gpu")
    save_checkpoint("qwen3_moe", d, seed=1)
    return d


def _allocate_and_free() -> bool:
    """One driver allocation of 1 GiB checked and freed: whether the device's free bytes rose by it at once."""
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    reserved0 = torch.cuda.memory_reserved()
    t = device_zeros((GIB // 4, 2), torch.bfloat16, CUDA)  # 1 GiB
    assert torch.cuda.memory_reserved() == reserved0  # not from torch's cache
    free1, _ = torch.cuda.mem_get_info()
    assert t.shape == (GIB // 4, 2) and t.dtype == torch.bfloat16 and t.is_cuda
    assert not t[:4096].any() and not t[-4096:].any()  # zeroed
    t[1, 1] = 3.0
    assert float(t[:2].float().sum()) == 3.0
    view = t[10:20]
    del t
    assert not view.any()  # a view keeps the allocation
    del view
    torch.cuda.synchronize()
    free2, _ = torch.cuda.mem_get_info()
    slack = 64 * (1 << 20)
    return free0 - free1 >= GIB - slack and free2 >= free1 + GIB - slack  # back without torch.cuda.empty_cache()


def test_driver_allocations_return_to_the_device_at_once() -> None:
    assert uses_driver_memory(CUDA)
    # the free bytes are the device's: other processes on it (parallel test workers) move them too, so one of a few
    # tries must see the GiB taken and given back exactly; memory that stayed held would fail every try
    assert any(_allocate_and_free() for _ in range(5))


def _generate(llm: LLM, prompts: list[list[int]], resizes: dict[int, tuple[int, int]]) -> list[list[int]]:
    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    step = 0
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
        step += 1
        if step in resizes:
            slots, pages = resizes[step]
            eng.memory.apply(MemorySplit(0, slots, pages, 0), "test", "test")
            assert (eng.memory.num_slots, eng.kv.num_pages) == (slots, pages)
            eng.check_integrity()
    return [out[f"r{i}"] for i in range(len(prompts))]


def test_a_cache_whose_last_tensor_goes_during_a_capture_is_freed_after_it() -> None:
    """cuMemFree inside a capture would void it (the step graph then ran eagerly after a resize, at random: a
    garbage collection in the capture dropped an old bank): the free waits for the capture's end."""
    if not uses_driver_memory(CUDA):
        pytest.skip("no driver allocations")
    held = [device_zeros((GIB // 4,), torch.float32, CUDA)]  # 1 GiB
    x = torch.ones(8, device=CUDA)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        y = x * 2
        held.clear()  # the last tensor on the block goes inside the capture
        assert len(device_memory._DEFERRED) == 1
    assert device_memory.release_deferred() == 1 and not device_memory._DEFERRED
    x.fill_(3.0)
    graph.replay()
    assert y.tolist() == [6.0] * 8  # the capture held


@pytest.mark.parametrize("backend", ["offload", "hybrid"])
def test_resizing_mid_generation_on_cuda_keeps_greedy_tokens(ckpt: Path, backend: str) -> None:
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (40, 70, 33)]
    kw = dict(device="cuda", dtype="float32", moe_backend=backend, page_size=8, max_model_len=128, expert_cache=8,
              kv_pages=64)  # fmt: skip
    base = _generate(LLM(str(ckpt), **kw), prompts, {})
    llm = LLM(str(ckpt), **kw)
    got = _generate(llm, prompts, {4: (4, 24), 8: (16, 100), 12: (3, 14), 16: (10, 40)})
    assert got == base
    s = llm.stats()
    assert s["preemptions"] > 0 and s["step_graphs"] >= 1 and s["step_graph_replays"] > 0  # captured again
    assert s["memory"]["resizes"] == 4


def _shrink_frees(llm: LLM) -> bool:
    """The budget back at 0.5 GiB, then 0.2: whether the device's free bytes rose by the KV pages given up."""
    llm.engine.set_vram_budget(0.5)
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    llm.engine.set_vram_budget(0.2)
    free1, _ = torch.cuda.mem_get_info()
    return free1 - free0 >= 0.25 * GIB


def test_budget_start_and_shrink_free_device_memory(ckpt: Path) -> None:
    llm = LLM(str(ckpt), device="cuda", dtype="float32", moe_backend="hybrid", page_size=8, max_model_len=128,
              vram_budget=0.5, vram_reserve=0.1)  # fmt: skip
    m = llm.stats()["memory"]
    assert m["slots"] == 16 and m["kv_gib"] > 0.3
    # the device's free bytes: other processes on it (parallel test workers) move them too, so one of a few shrinks
    # from 0.5 GiB must see the pages given up come back; pages that stayed held would fail every try
    assert any(_shrink_frees(llm) for _ in range(5))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert len(llm.generate([[5, 6, 7, 8]], params)[0].token_ids) == 8
    llm.check_integrity()


def test_half_pinned_pool_serves_on_cuda(ckpt: Path) -> None:
    prompts = [[5 + i, 40 + 3 * i, 77, 100 + i, 9, 30 + i] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    kw = dict(device="cuda", dtype="float32", moe_backend="hybrid", expert_cache=8, fill_fraction=0.5)
    full = [r.token_ids for r in LLM(str(ckpt), **kw).generate(prompts, params)]
    llm = LLM(str(ckpt), pinned_budget=8 * 3 * 64 * 32 * 4 / GIB, **kw)
    assert [r.token_ids for r in llm.generate(prompts, params)] == full
    backend = llm.engine.setup.loaded.backend
    assert backend.pool.pinned_rows == 8 and max(backend.cache.resident()) < 8  # type: ignore[union-attr]


def test_nvml_source_reads_the_device() -> None:
    from freetoken.engine.vram_watch import NvmlSource

    src = NvmlSource.open(CUDA)
    if src is None:
        pytest.skip("nvidia-ml-py is not installed here")
    free, _ = torch.cuda.mem_get_info()
    assert abs(src.free_bytes() - free) < GIB


def test_a_capture_that_runs_out_of_memory_is_tried_again(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after a shrink another program may hold every free byte: a step capture that runs out of memory
    leaves graphs on, the bucket runs eagerly for a while, then is captured."""
    real, calls = torch.cuda.graph, {"n": 0}

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("the other program took it")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.cuda, "graph", flaky)
    llm = LLM(str(ckpt), device="cuda", dtype="float32", moe_backend="offload", expert_cache=8)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    assert len(llm.generate([[5, 6, 7, 8]], params)[0].token_ids) == 48
    s = llm.stats()
    assert calls["n"] >= 2 and llm.engine.runner.graphs.enabled  # type: ignore[union-attr]
    assert s["step_graphs"] >= 1 and s["step_graph_replays"] > 0
