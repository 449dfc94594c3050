"""DeepSeek-V4's hash layers know their experts from the token ids before they run (``tid2eid[input_ids]``): the slot
backends fill them ahead (``experts/slots/prefetch.py``) and hold them until their layer has planned. On the tiny
checkpoint (``tiny_dsv4.py``: layers 0 and 1 hash-routed, 8 experts a layer, 16 slots at ``expert_cache=0.5``): a
prefetched layer runs on hits with the same output; held slots survive earlier layers' evictions; a step too large to
hold skips; generation counts its prefetches, keeps its tokens and leaves no lock behind."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from freetoken import LLM, SamplingParams
from tiny_dsv4 import save_dsv4_checkpoint

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

E = 8


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("dsv4p")
    save_dsv4_checkpoint(d, 0)
    return d


def _llm(d: Any, backend: str, device: str = "cpu", cache: float | None = 0.5, fill: float | None = None) -> LLM:
    return LLM(model=str(d), device=device, dtype="float32", moe_backend=backend, expert_cache=cache,
               fill_fraction=fill)  # fmt: skip


def _layer_input(T: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((T, 64), generator=g).to(device), torch.randint(3, 512, (T,), generator=g).to(device)


def _eids(llm: LLM, layer: int, ids: torch.Tensor) -> list[int]:
    moe = llm.engine.setup.loaded.model.layers[layer].ffn
    return sorted({layer * E + int(e) for e in moe.tid2eid[ids].reshape(-1)})


@pytest.mark.parametrize("backend,fill", [("offload", None), ("hybrid", 0.5)])
def test_prefetched_layer_runs_on_hits(ckpt, backend, fill):
    llm, ref = _llm(ckpt, backend, fill=fill), _llm(ckpt, "cpu", cache=None)
    b = llm.engine.setup.loaded.backend
    x, ids = _layer_input(3, "cpu")
    moe = llm.engine.setup.loaded.model.layers[0].ffn
    b.begin_step(3, True)
    moe.prefetch(ids)
    eids = _eids(llm, 0, ids)
    slots = b.cache.lookup(eids)
    assert bool((slots >= 0).all()) and bool(b.cache.tables.locked[slots].all())
    before = b.counters.read()
    out = moe.forward_ids(x, ids)
    after = b.counters.read()
    assert after["misses"] == before["misses"] and after["hits"] - before["hits"] == len(eids)
    assert not bool(b.cache.tables.locked.any())  # the hold ends once the layer has planned
    want = ref.engine.setup.loaded.model.layers[0].ffn.forward_ids(x, ids)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert b.stats()["expert_prefetches"] == len(eids) and b.stats()["prefetch_layers"] == 1
    b.check_integrity()


def test_held_slots_survive_earlier_layers(ckpt):
    """Layer 1's experts held while layers 2 and 3 take turns filling 8 misses each into the other slots: once the
    held ones are no longer among the last plans' (offload's recent slots), they would be the first victims."""
    llm = _llm(ckpt, "offload")
    b = llm.engine.setup.loaded.backend
    _, ids = _layer_input(4, "cpu", seed=1)
    b.begin_step(4, True)
    llm.engine.setup.loaded.model.layers[1].ffn.prefetch(ids)
    held = _eids(llm, 1, ids)
    x = torch.randn(4, 64)
    every = torch.arange(E).reshape(4, 2)  # all 8 experts of a layer: 8 misses
    w = torch.full((4, 2), 0.5)
    for layer in (2, 3) * 4:
        b.forward(layer, x, every, w)
        assert bool((b.cache.lookup(held) >= 0).all()), f"layer {layer} evicted a held expert"
    before = b.counters.read()
    b.forward(1, x, llm.engine.setup.loaded.model.layers[1].ffn.tid2eid[ids], w)
    assert b.counters.read()["misses"] == before["misses"]
    assert not bool(b.cache.tables.locked.any())
    b.check_integrity()


def test_a_step_too_large_to_hold_skips(ckpt):
    """8 tokens x top-2 name all 8 experts of a layer: one held layer and one running fill the 16 slots, a second
    held layer would not fit beside them."""
    llm = _llm(ckpt, "offload")
    b = llm.engine.setup.loaded.backend
    _, ids = _layer_input(8, "cpu", seed=2)
    b.begin_step(8, True)
    layers = llm.engine.setup.loaded.model.layers
    layers[0].ffn.prefetch(ids)
    layers[1].ffn.prefetch(ids)
    s = b.stats()
    assert (s["prefetch_layers"], s["prefetch_skipped"]) == (1, 1)
    b.begin_step(1, False)  # a step that never ran the held layer lets it go
    assert not bool(b.cache.tables.locked.any())
    b.begin_step(8, False)  # prefill steps do not prefetch
    layers[0].ffn.prefetch(ids)
    assert b.stats()["prefetch_layers"] == 1


def _generate(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    return [o.token_ids for o in llm.generate([[5, 6, 7, 8, 9], [300, 2, 77]], params)]


@pytest.mark.parametrize("backend,fill", [("offload", None), ("hybrid", 0.5)])
def test_generation_prefetches_and_keeps_its_tokens(ckpt, backend, fill):
    llm = _llm(ckpt, backend, fill=fill)
    assert _generate(llm) == _generate(_llm(ckpt, "cpu", cache=None))
    s = llm.stats()
    assert s["expert_prefetches"] > 0 and s["prefetch_layers"] >= 2 * 9  # 2 hash layers, 9 decode steps or more
    assert not bool(llm.engine.setup.loaded.backend.cache.tables.locked.any())
    llm.check_integrity()


@pytest.mark.gpu
@pytest.mark.parametrize("backend,fill", [("offload", None), ("hybrid", 0.5)])
def test_cuda_side_stream_prefetch(ckpt, backend, fill):
    """On a GPU the copies run on the side stream: the held layer's output and the generated tokens as on the CPU."""
    llm, ref = _llm(ckpt, backend, "cuda", fill=fill), _llm(ckpt, "cpu", cache=None)
    b = llm.engine.setup.loaded.backend
    assert b.prefetcher.stream is not None
    x, ids = _layer_input(3, "cpu")
    moe = llm.engine.setup.loaded.model.layers[0].ffn
    b.begin_step(3, True)
    moe.prefetch(ids.cuda())
    out = moe.forward_ids(x.cuda(), ids.cuda()).cpu()
    want = ref.engine.setup.loaded.model.layers[0].ffn.forward_ids(x, ids)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert _generate(llm) == _generate(ref)
    assert llm.stats()["expert_prefetches"] > 0
    llm.check_integrity()



@pytest.mark.gpu
@pytest.mark.parametrize("backend,fill", [("offload", None), ("hybrid", 0.5)])
def test_replayed_steps_prefetch(ckpt, backend, fill):
    """The prefetch is part of the captured decode step. Over 8 replayed steps of 2 sequences (16 slots, up to 16
    experts a step: the LRU churns, the non-hash layers miss): the hash layers plan on hits only, the device count of
    experts filled ahead grows though no Python prefetch ran (the host's count stays), and the tokens are the CPU's."""
    llm, ref = _llm(ckpt, backend, "cuda", fill=fill), _llm(ckpt, "cpu", cache=None)
    eng, b = llm.engine, llm.engine.setup.loaded.backend
    prompts = [[5, 6, 7, 8, 9], [300, 2, 77]]
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    got: dict[str, list[int]] = {"r0": [], "r1": []}

    def step() -> None:
        for o in eng.step():
            got[o.request_id] += o.new_token_ids

    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    for _ in range(4):  # the prefill, then the batch of 2's first decode steps (its capture among them)
        step()
    s0, m0 = llm.stats(), b.layer_counts()["misses"]
    for _ in range(8):
        step()
    s1, m1 = llm.stats(), b.layer_counts()["misses"]
    d = {k: s1[k] - s0[k] for k in ("step_graph_replays", "step_graph_captures", "step_graph_eager_fallbacks")}
    assert d["step_graph_replays"] >= 6, (s0, s1)
    assert m1[2] + m1[3] > m0[2] + m0[3], (m0, m1)  # the cache churns: routed layers miss
    assert (m1[0], m1[1]) == (m0[0], m0[1]), (m0, m1)  # the hash layers' experts were resident before they planned
    # Python issues the 2 hash layers' prefetches only in eager steps (a capture runs the step, then records it)
    python_runs = d["step_graph_eager_fallbacks"] + 2 * d["step_graph_captures"]
    assert s1["prefetch_layers"] - s0["prefetch_layers"] == 2 * python_runs, (s0, s1)
    assert s1["expert_prefetches"] > s0["expert_prefetches"]  # ... and the replays filled ahead too
    while eng.has_unfinished():
        step()
    assert [got["r0"], got["r1"]] == [o.token_ids for o in ref.generate(prompts, params)]
    assert not bool(b.cache.tables.locked.any())
    llm.check_integrity()
