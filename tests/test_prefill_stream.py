"""Prefill through whole-layer double buffering (experts/prefill/streamer.py) equals the reference, and is chosen
only when it pays off and the pool can spare two whole layers of unlocked slots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.backends.slot_backend import SlotBackend
from freetoken.experts.prefill.streamer import LayerStreamer
from freetoken.experts.reference import moe_reference
from freetoken.experts.slots.copy import copy_runs

CPU = torch.device("cpu")
L, E = 4, 8  # 4 MoE layers x 8 experts, top-2: 16 slots (cache 0.5) hold exactly two whole layers

from devices import DEVICES  # noqa: E402
from random_experts import K_TOP, D, make_banks, random_routing  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def make(name: str, expert_cache: float | int, seed: int = 1, L: int = L, E: int = E) -> tuple[SlotBackend, Any]:
    banks = make_banks(L, E, seed=seed)
    fill = 0.5 if name == "hybrid" else None
    cfg = EngineConfig(moe_backend=name, expert_cache=expert_cache, fill_fraction=fill)
    backend = create_backend(cfg, banks, CPU, torch.float32)
    assert isinstance(backend, SlotBackend) and backend.name == name
    return backend, banks


def step(backend: SlotBackend, banks: Any, T: int, is_decode: bool, g: torch.Generator) -> float:
    """One step through every layer; the worst relative error against ``moe_reference``."""
    Lb, Eb = banks.num_layers, banks.num_experts
    backend.begin_step(T, is_decode)
    worst = 0.0
    for layer in range(Lb):
        x = torch.randn(T, D, generator=g)
        ids, w = random_routing(T, Eb, g, CPU)
        ref = moe_reference(x, ids + layer * Eb, w, banks.gate_up, banks.down)
        out = backend.forward(layer, x, ids, w)
        worst = max(worst, float((out - ref).abs().max() / ref.abs().max()))
    return worst


def stats(backend: SlotBackend) -> dict[str, int | float]:
    return backend.stats()


@pytest.mark.parametrize("name", ["offload", "hybrid"])
def test_streamed_prefill_equals_reference_and_seeds_decode(name: str) -> None:
    backend, banks = make(name, 0.5)
    g = torch.Generator().manual_seed(3)
    assert step(backend, banks, 20, True, g) < 1e-5  # decode-sized warm-up: on-demand fills
    s0 = stats(backend)
    assert s0["prefill_layers_streamed"] == 0
    assert step(backend, banks, 20, False, g) < 1e-5  # 20 tokens x top-2 = 40 routes >= E
    s1 = stats(backend)
    assert s1["prefill_steps_streamed"] == 1 and s1["prefill_layers_streamed"] == L
    for key in ("expert_fills", "expert_misses", "expert_hits", "layer_steps"):  # streamed: not cache traffic
        assert s1[key] == s0[key], key
    assert s1["expert_cpu_runs"] == s0["expert_cpu_runs"]  # hybrid: no CPU branch for streamed layers
    assert 0 < s1["prefill_experts_streamed"] <= L * E
    backend.check_integrity()
    # At the next safe point the last two layers stay resident (2E slots = the whole cache here), newest stamps.
    backend.streamer.finish()
    cache = backend.cache
    last = list(range((L - 2) * E, L * E))
    slots = cache.lookup(last)
    assert bool((slots >= 0).all())
    stamps = cache.tables.stamp[: cache.num_slots]
    assert int(stamps[slots].min()) == int(cache.tables.tick) == int(stamps.max())
    for eid, slot in zip(last, slots.tolist()):  # the slots hold the right weights
        assert torch.equal(cache.slot_gate_up[slot], banks.gate_up[eid])
        assert torch.equal(cache.slot_down[slot], banks.down[eid])
    assert step(backend, banks, 2, True, g) < 1e-5  # decode after prefill
    backend.check_integrity()


@pytest.mark.parametrize("name", ["offload", "hybrid"])
def test_on_demand_when_few_routes_or_no_room(name: str) -> None:
    g = torch.Generator().manual_seed(4)
    backend, banks = make(name, 0.5, L=2, E=16)
    assert step(backend, banks, 20, False, g) < 1e-5  # 20 tokens < stream_min_tokens(16, 2) = 21
    s = stats(backend)
    assert s["prefill_steps_ondemand"] == 1 and s["prefill_layers_streamed"] == 0 and s["expert_fills"] > 0
    assert step(backend, banks, 21, False, g) < 1e-5  # 21 tokens = stream_min_tokens(16, 2), but 16 slots < 2E
    assert stats(backend)["prefill_layers_streamed"] == 0
    small, banks = make(name, 0.25)  # 8 slots < 2E
    assert step(small, banks, 30, False, g) < 1e-5
    s = stats(small)
    assert s["prefill_steps_ondemand"] == 1 and s["prefill_layers_streamed"] == 0
    big, banks = make(name, 0.5)
    assert step(big, banks, 8, False, g) < 1e-5  # 8 tokens = stream_min_tokens(8, 2), 16 slots = 2E: streamed
    assert stats(big)["prefill_layers_streamed"] == L
    small.check_integrity()
    big.check_integrity()


def test_locked_slots_are_never_taken() -> None:
    backend, banks = make("offload", 24)  # 24 slots: 2E = 16 buffers + 8 others
    cache = backend.cache
    locked = [1 * E + 0, 1 * E + 5, 3 * E + 2]  # a running decode's experts
    cache.insert(locked)
    cache.lock(locked)
    where = cache.lookup(locked).tolist()
    g = torch.Generator().manual_seed(5)
    assert step(backend, banks, 30, False, g) < 1e-5
    s = stats(backend)
    assert s["prefill_layers_streamed"] == L
    assert s["prefill_experts_streamed"] == L * E - len(locked)  # resident ones are used in place
    assert cache.lookup(locked).tolist() == where
    assert bool(cache.tables.locked[torch.tensor(where)].all())
    for eid, slot in zip(locked, where):
        assert torch.equal(cache.slot_gate_up[slot], banks.gate_up[eid])
    backend.check_integrity()
    # With 16 slots and one locked, the pool cannot spare two whole layers: on-demand fills.
    tight, banks = make("offload", 16)
    tight.cache.insert([0])
    tight.cache.lock([0])
    assert step(tight, banks, 30, False, g) < 1e-5
    s = stats(tight)
    assert s["prefill_steps_ondemand"] == 1 and s["prefill_layers_streamed"] == 0
    assert int(tight.cache.lookup([0])) >= 0
    tight.check_integrity()


def test_buffers_are_the_least_recently_used_slots() -> None:
    backend, banks = make("offload", 24)
    cache = backend.cache
    old = list(range(0, E))  # layer 0 in slots 0..7
    keep = list(range(2 * E, 3 * E))  # layer 2 in slots 8..15, inserted later: newer
    cache.insert(old)
    cache.insert(keep)
    where = cache.lookup(keep).tolist()
    # Buffer 0 holds layer 0 first: its experts are used in place (not copied); the other buffer takes the
    # 8 free slots; layer 2 stays where it is and is not copied.
    g = torch.Generator().manual_seed(6)
    assert step(backend, banks, 30, False, g) < 1e-5
    assert stats(backend)["prefill_experts_streamed"] == L * E - len(keep) - len(old)
    assert cache.lookup(keep).tolist() == where
    assert bool((cache.lookup(old) < 0).all())  # layer 0's slots were buffer 0's: it moved on to layer 2
    backend.check_integrity()


@pytest.mark.parametrize("name", ["offload", "hybrid"])
def test_free_room_keeps_every_layer_and_a_warm_pool_fills_on_demand(name: str) -> None:
    backend, banks = make(name, 1.0)  # 32 slots: the whole pool, cold
    g = torch.Generator().manual_seed(11)
    assert step(backend, banks, 30, False, g) < 1e-5
    s1 = stats(backend)
    assert s1["prefill_layers_streamed"] == L
    backend.begin_step(1, True)  # the next safe point closes the stream
    assert backend.streamer.num_buffers == 0
    assert s1["prefill_experts_streamed"] == L * E
    assert backend.cache.size() == L * E  # L free layers of room: L buffers, every layer stays resident
    backend.check_integrity()
    assert step(backend, banks, 30, False, g) < 1e-5  # nothing absent: on-demand, and every route hits
    s2 = stats(backend)
    assert s2["prefill_steps_ondemand"] == 1 and s2["prefill_experts_streamed"] == L * E
    assert s2["expert_fills"] == s1["expert_fills"] and s2["expert_misses"] == s1["expert_misses"]
    backend.check_integrity()


@pytest.mark.parametrize("mode", ["serial", "off"])
def test_modes(mode: str) -> None:
    backend, banks = make("offload", 0.5)
    backend.streamer.mode = mode
    g = torch.Generator().manual_seed(7)
    assert step(backend, banks, 30, False, g) < 1e-5
    s = stats(backend)
    assert s["prefill_layers_streamed"] == (L if mode == "serial" else 0)
    assert s["prefill_steps_ondemand"] == 0  # "off" is never armed
    backend.check_integrity()


def test_layer_order_is_not_assumed() -> None:
    backend, banks = make("hybrid", 0.5)
    g = torch.Generator().manual_seed(8)
    backend.begin_step(12, False)
    for layer in (1, 0, 3, 2):  # every out-of-order layer is loaded when it comes
        x = torch.randn(12, D, generator=g)
        ids, w = random_routing(12, E, g, CPU)
        ref = moe_reference(x, ids + layer * E, w, banks.gate_up, banks.down)
        torch.testing.assert_close(backend.forward(layer, x, ids, w), ref, rtol=1e-5, atol=1e-6)
    backend.begin_step(1, True)  # closes the stream
    assert not backend.streamer.active
    backend.check_integrity()


def test_copy_runs() -> None:
    assert copy_runs([(8, 0), (9, 1), (10, 2), (12, 3), (13, 4), (14, 9)]) == [(8, 0, 3), (12, 3, 2), (14, 9, 1)]
    assert copy_runs([]) == []


def test_streamer_rejects_unknown_mode() -> None:
    backend, _ = make("offload", 0.5)
    with pytest.raises(ValueError):
        LayerStreamer(backend.cache, L, mode="fast")


# -- engine level: tiny qwen3_moe with 4 MoE layers, expert_cache 0.5 = two whole layers ------------------
def _save_tiny_moe(directory: Path, seed: int) -> Any:
    import transformers as tf

    from tiny_models import COMMON

    shape: dict[str, Any] = dict(
        num_hidden_layers=4, head_dim=16, num_experts=E, num_experts_per_tok=K_TOP,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[],
    )  # fmt: skip
    cfg = tf.Qwen3MoeConfig(**COMMON, **shape)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # wide weights, like tiny_models.make_model
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    model.eval().save_pretrained(directory)
    return model


@pytest.mark.parametrize("device", DEVICES)
def test_engine_prompt_is_streamed(tmp_path: Path, device: str) -> None:
    from freetoken import LLM, SamplingParams
    from reference import LOGIT_MARGIN, ROUTER_MARGIN, reference_greedy

    steps = 8
    model = _save_tiny_moe(tmp_path, seed=2)
    g = torch.Generator().manual_seed(2002)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (11, 17)]
    refs = [reference_greedy(model, p, steps, top_k=K_TOP) for p in prompts]
    for r in refs:  # the near-tie rule (DESIGN §8)
        assert r.min_logit_margin > LOGIT_MARGIN and r.min_router_margin > ROUTER_MARGIN
    llm = LLM(str(tmp_path), device=device, dtype="float32", moe_backend="offload", expert_cache=0.5)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()
    s = llm.stats()
    assert s["prefill_layers_streamed"] >= 4 and s["prefill_steps_streamed"] >= 1
    assert s["expert_fills"] > 0  # decode fills on demand after the prompt


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["stream", "serial"])
@pytest.mark.parametrize("name", ["offload", "hybrid"])
def test_streamed_prefill_cuda(name: str, mode: str) -> None:
    """Copy stream + events: the same outputs; the buffers come out of the slot pool (no new device memory)."""
    banks = make_banks(L, E, seed=9)
    fill = 0.5 if name == "hybrid" else None
    cfg = EngineConfig(moe_backend=name, expert_cache=0.5, fill_fraction=fill)
    dev = torch.device("cuda")
    backend = create_backend(cfg, banks, dev, torch.float32)
    assert isinstance(backend, SlotBackend) and backend.name == name  # the pool was pinned
    backend.streamer.mode = mode
    g = torch.Generator().manual_seed(10)
    gu, dn = banks.gate_up.to(dev), banks.down.to(dev)
    for T, is_decode in ((64, False), (2, True), (40, False)):
        backend.begin_step(T, is_decode)
        for layer in range(L):
            x = torch.randn(T, D, generator=g).to(dev)
            ids, w = random_routing(T, E, g, dev)
            before = torch.cuda.memory_allocated(dev)
            out = backend.forward(layer, x, ids, w)
            ref = moe_reference(x, ids + layer * E, w, gu, dn)
            assert float((out - ref).abs().max() / ref.abs().max()) < 1e-5
            # transient step tensors only: far less than one whole layer of experts
            assert torch.cuda.memory_allocated(dev) - before < E * banks.expert_bytes
        backend.check_integrity()
    s = backend.stats()
    assert s["prefill_steps_streamed"] == 2 and s["prefill_layers_streamed"] == 2 * L


def test_bench_prefill_plumbing() -> None:
    """``ft bench prefill`` on a tiny shape: its figures mean nothing on the CPU, its bookkeeping does."""
    import argparse

    from freetoken.bench.prefill import add_arguments, run_mode
    from freetoken.bench.presets import MoEShape
    from freetoken.bench.synthetic import random_banks

    shape = MoEShape("tiny", hidden=64, inter=32, experts=16, top_k=2, layers=3)
    args = add_arguments(argparse.ArgumentParser()).parse_args(["--layers", "3", "--chunk", "24"])
    args.token_list, args.slots = [48], 2 * shape.experts
    banks = random_banks(shape, 3, torch.float32)
    res = {m: run_mode(m, shape, banks, args, CPU, torch.float32) for m in ("stream", "serial", "ondemand")}
    for mode, (rs, bw) in res.items():
        (r,) = rs
        assert bw > 0 and r.tokens == 48 and r.chunks == 2 and len(r.chunk_ms_each) == 2
        # both chunks of 24 tokens >= stream_min_tokens(16, 2) = 21: whole layers
        assert r.layers_streamed == (0 if mode == "ondemand" else 2 * 3)
        assert r.pcie_gb_per_chunk > 0
    # 32 slots = the two buffers: chunk 1 copies each of the 3 x 16 experts once; chunk 2 finds layer 1 (one of
    # the last two, left resident) where its buffer wants it and copies layers 0 and 2 only.
    for mode in ("stream", "serial"):
        r = res[mode][0][0]
        assert r.pcie_gb_per_chunk == pytest.approx((48 + 32) / 2 * banks.expert_bytes / 1e9)
        assert r.stats["prefill_experts_streamed"] == 48 + 48 + 32  # the one-chunk warm-up prompt, then 2 chunks


def _pass(backend: SlotBackend, banks: Any, layers: list[int], T: int, g: torch.Generator) -> float:
    """``forward`` over ``layers`` in order (no begin_step: the caller's), the worst relative error."""
    worst = 0.0
    for layer in layers:
        x = torch.randn(T, D, generator=g)
        ids, w = random_routing(T, E, g, CPU)
        ref = moe_reference(x, ids + layer * E, w, banks.gate_up, banks.down)
        worst = max(worst, float((backend.forward(layer, x, ids, w) - ref).abs().max() / ref.abs().max()))
    return worst


def test_layer_major_passes_stream_the_pool_once() -> None:
    """Every layer computed in three passes (three chunks, layer-major): each layer is copied once."""
    backend, banks = make("offload", 0.5)
    g = torch.Generator().manual_seed(12)
    backend.begin_step(20, False)
    assert _pass(backend, banks, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3], 20, g) < 1e-5
    s = stats(backend)
    assert s["prefill_layers_streamed"] == L and s["prefill_experts_streamed"] == L * E and s["expert_fills"] == 0
    backend.begin_step(1, True)
    backend.check_integrity()


def test_restarted_stream_keeps_the_next_layers_in_place_and_decode_hot_experts() -> None:
    """A layer-major prefill paused after layer 1 (decode steps ran) restarts at layer 2: the experts of layers
    2 and 3 already resident are used where they are, and decode's most recent experts are taken last."""
    backend, banks = make("offload", 24)  # three layers of room
    cache = backend.cache
    g = torch.Generator().manual_seed(13)
    backend.begin_step(20, False)
    assert _pass(backend, banks, [0, 1, 2], 20, g) < 1e-5  # the pause: layer 2 was prefetched already
    backend.begin_step(1, True)  # a decode step's safe point closes the stream: layers 1 and 2 stay resident
    t = cache.tables
    stamps = t.stamp.clone()
    assert step(backend, banks, 1, True, g) < 1e-5  # decode: one token, its experts newest
    moved = (t.stamp != stamps).tolist()
    hot = [int(e) for e, m in zip(t.eid_of.tolist(), moved) if 0 <= e < 2 * E and m]
    assert len(hot) >= 2  # the decode step's routes in layers 0 and 1 (hits: stamped this step)
    before = stats(backend)["prefill_experts_streamed"]
    backend.begin_step(20, False)  # the prefill resumes at layer 2
    assert _pass(backend, banks, [2, 3], 20, g) < 1e-5
    copied = stats(backend)["prefill_experts_streamed"] - before
    assert copied <= E + 2  # layer 3, and what the decode step evicted of layer 2 (2 routes per token)
    assert bool((cache.lookup(hot) >= 0).all())  # decode's experts of the done layers 0 and 1 stay
    backend.begin_step(1, True)
    backend.check_integrity()
