"""Every expert backend equals ``moe_reference`` on random banks and routing, and counts what it did: the slot
backends on the CPU and on CUDA, the split policy, the expert cache's bounds, the automatic choice and the pinned
host pool. (The grouped GEMMs: test_backends_grouped.py; fused: test_backends_fused.py; through the engine:
test_backends_engine.py.)"""

from __future__ import annotations

import logging

import pytest
import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.auto import choose_backend
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.backends.split_policy import DEFAULT_SHARE, SplitPolicy
from freetoken.experts.base import ExpertBanks
from freetoken.experts.reference import moe_reference
from random_experts import HAS_CUDA, K_TOP, SLOT_BACKENDS, D, assert_did_work, make_banks, random_routing, run_steps

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.mark.parametrize("expert_cache", [0.2, 0.5])
@pytest.mark.parametrize("name", SLOT_BACKENDS)
def test_backend_equals_reference(name: str, expert_cache: float) -> None:
    L, E = (3, 12) if expert_cache == 0.2 else (2, 16)
    banks = make_banks(L, E, seed=1)
    fill = 0.5 if name == "hybrid" else None
    cfg = EngineConfig(moe_backend=name, expert_cache=expert_cache, fill_fraction=fill)
    backend = create_backend(cfg, banks, torch.device("cpu"), torch.float32)
    assert backend.name == name
    worst = run_steps(backend, banks, steps=20, seed=2, device=torch.device("cpu"))
    assert worst < 1e-5
    s = backend.stats()
    assert s["expert_slots"] == (0 if name == "cpu" else round(expert_cache * L * E))
    if name == "offload":
        assert s["expert_fills"] > 0 and s["expert_cpu_runs"] == 0
        assert s["pcie_bytes"] == s["expert_fills"] * banks.expert_bytes
    if name == "cpu":
        assert s["expert_cpu_runs"] > 0 and s["expert_fills"] == 0 and s["expert_hits"] == 0
    if name == "hybrid":
        assert s["expert_fills"] > 0 and s["expert_cpu_runs"] > 0
        assert s["expert_fills"] + s["expert_cpu_runs"] == s["expert_misses"]
        assert 1 <= s["q_mean"] <= s["expert_misses"] / s["layer_steps"]
    if name.startswith("static"):
        assert s["expert_fills"] == 0 and s["expert_cpu_runs"] > 0


@pytest.mark.parametrize("name", ["hybrid", "cpu"])
def test_float16_pool_runs_the_cpu_branch_by_the_reference(name: str) -> None:
    """The C++ kernel takes float32/bfloat16 banks; a float16 pool's CPU branch runs its torch reference."""
    banks = make_banks(2, 8, seed=4)
    half = ExpertBanks(banks.gate_up.half(), banks.down.half(), 2, 8)
    cfg = EngineConfig(moe_backend=name, expert_cache=0.25, fill_fraction=0.5 if name == "hybrid" else None)
    backend = create_backend(cfg, half, torch.device("cpu"), torch.float16)
    runner = backend.cpu  # type: ignore[attr-defined]
    assert runner.kernel is None
    g = torch.Generator().manual_seed(5)
    gu, dn = half.gate_up.float(), half.down.float()
    for layer in range(2):
        x = torch.randn(6, D, generator=g).half()
        ids, w = random_routing(6, 8, g, torch.device("cpu"))
        out = backend.forward(layer, x, ids, w)
        ref = moe_reference(x.float(), ids + layer * 8, w, gu, dn)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.float(), ref, rtol=0, atol=2e-3 * float(ref.abs().max()))
    assert backend.stats()["expert_cpu_runs"] > 0


def test_offload_serves_more_misses_than_slots_in_rounds() -> None:
    banks = make_banks(2, 16, seed=5)
    cfg = EngineConfig(moe_backend="offload", expert_cache=K_TOP)  # as small as allowed
    backend = create_backend(cfg, banks, torch.device("cpu"), torch.float32)
    assert run_steps(backend, banks, steps=6, seed=6, device=torch.device("cpu")) < 1e-5
    s = backend.stats()
    assert s["expert_fills"] == s["expert_misses"] > 0  # every miss filled, some in later rounds


def test_hybrid_split_follows_fill_fraction() -> None:
    banks = make_banks(2, 16, seed=7)
    for frac in (0.0, 1.0):
        cfg = EngineConfig(moe_backend="hybrid", expert_cache=0.5, fill_fraction=frac)
        backend = create_backend(cfg, banks, torch.device("cpu"), torch.float32)
        run_steps(backend, banks, steps=5, seed=8, device=torch.device("cpu"), max_t=3)
        s = backend.stats()
        m, layers = s["expert_misses"], s["layer_steps"]
        if frac == 0.0:  # q = 1 whenever m > 0: the cache keeps warming
            assert s["expert_fills"] <= layers and s["expert_cpu_runs"] == m - s["expert_fills"]
        else:  # 3 tokens x 2 experts fit the 16 slots: every miss is filled
            assert s["expert_cpu_runs"] == 0 and s["expert_fills"] == m


def test_hybrid_prefill_fills_every_miss_that_fits() -> None:
    banks = make_banks(2, 16, seed=12)
    backend = create_backend(
        EngineConfig(moe_backend="hybrid", expert_cache=1.0), banks, torch.device("cpu"), torch.float32
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, D, generator=g)
    ids, w = random_routing(24, 16, g, torch.device("cpu"))
    backend.streamer.mode = "off"  # on-demand prefill (whole-layer streaming: tests/test_prefill_stream.py)
    backend.begin_step(24, False)  # prefill of >= stream_min_tokens(16, 2) = 21 tokens: share 1
    out = backend.forward(0, x, ids, w)
    torch.testing.assert_close(out, moe_reference(x, ids, w, banks.gate_up, banks.down), rtol=1e-5, atol=1e-6)
    s = backend.stats()
    assert s["expert_cpu_runs"] == 0 and s["expert_fills"] == s["expert_misses"] > 1
    backend.policy = SplitPolicy(share=0.5, fixed=False)  # whatever this machine's profile says
    backend.begin_step(1, True)  # decode: the split (m = 2 -> q = 1)
    ids = torch.tensor([[0, 1]])  # both miss in layer 1
    backend.forward(1, x[:1], ids, w[:1])
    s2 = backend.stats()
    assert s2["expert_fills"] - s["expert_fills"] == 1 and s2["expert_cpu_runs"] == 1


def test_expert_cache_bounds() -> None:
    banks = make_banks(2, 8, seed=9)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="top-k|fewer than"):
        b = create_backend(EngineConfig(moe_backend="offload", expert_cache=1), banks, cpu, torch.float32)
        run_steps(b, banks, steps=1, seed=0, device=cpu)
    with pytest.raises(ValueError):
        create_backend(EngineConfig(moe_backend="hybrid", expert_cache=0), banks, cpu, torch.float32)
    big = create_backend(EngineConfig(moe_backend="offload", expert_cache=1000), banks, cpu, torch.float32)
    assert big.stats()["expert_slots"] == 16


def test_expert_cache_clamp_warns(caplog: pytest.LogCaptureFixture) -> None:
    banks = make_banks(2, 8, seed=9)
    with caplog.at_level(logging.WARNING):
        create_backend(EngineConfig(moe_backend="offload", expert_cache=99), banks, torch.device("cpu"), torch.float32)
    assert any("exceeds" in r.getMessage() for r in caplog.records)


def test_split_policy_sources() -> None:
    assert SplitPolicy.create(None, None).share == DEFAULT_SHARE
    assert SplitPolicy.create(0.3, {"b_p": 50.0, "b_h": 25.0}).share == 0.3
    p = SplitPolicy.create(None, {"b_p_concurrent": 55.0, "b_h_concurrent": 24.0, "b_p": 99.0})
    assert p.share == pytest.approx(55.0 / 79.0)
    for _ in range(60):  # the CPU measured as fast as the link: the share converges to 1/2
        p.observe(copy_bytes=int(55e9), copy_s=1.0, cpu_bytes=int(55e9), cpu_s=1.0)
    assert p.share == pytest.approx(0.5, abs=1e-3)
    fixed = SplitPolicy.create(0.25, None)
    assert fixed.observe(int(1e9), 1.0, int(1e6), 1.0) == 0.25


def test_auto_choice() -> None:
    banks = make_banks(2, 8, seed=1)
    cuda = torch.device("cuda")
    assert choose_backend(banks, torch.device("cpu"))[0] == "fused"
    assert choose_backend(banks, cuda, pool_fits=True, load_profile=False)[0] == "fused"
    assert choose_backend(banks, cuda, pool_fits=False, load_profile=False)[0] == "offload"
    # with a machine profile: tests/test_hardware.py::test_auto_follows_the_saved_profiles_recommendation


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("expert_cache", [0.2, 0.5])
@pytest.mark.parametrize("name", SLOT_BACKENDS)
def test_backend_equals_reference_cuda(name: str, expert_cache: float) -> None:
    banks = make_banks(3, 12, seed=1)
    fill = 0.5 if name == "hybrid" else None
    cfg = EngineConfig(moe_backend=name, expert_cache=expert_cache, fill_fraction=fill)
    dev = torch.device("cuda")
    backend = create_backend(cfg, banks, dev, torch.float32)
    assert backend.name == name  # not the pageable fallback: the pool was pinned
    assert run_steps(backend, banks, steps=20, seed=2, device=dev) < 1e-5
    s = backend.stats()
    assert_did_work(name, s)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", ["offload", "hybrid"])
def test_backend_bf16_cuda_close_to_reference(name: str) -> None:
    """bf16: kernels round differently from the reference, so only closeness is asserted."""
    banks = make_banks(2, 16, seed=11)
    bf = ExpertBanks(banks.gate_up.bfloat16(), banks.down.bfloat16(), 2, 16)
    dev = torch.device("cuda")
    backend = create_backend(EngineConfig(moe_backend=name, expert_cache=0.25), bf, dev, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    for T in (1, 3, 40):
        x = torch.randn(T, D, generator=g).to(dev, torch.bfloat16)
        ids, w = random_routing(T, 16, g, dev)
        ref = moe_reference(x.float(), ids + 16, w, banks.gate_up.to(dev), banks.down.to(dev))
        out = backend.forward(1, x, ids, w).float()
        assert float((out - ref).abs().max() / ref.abs().max()) < 3e-2
    backend.check_integrity()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_offload_decode_step_never_syncs() -> None:
    banks = make_banks(3, 16, seed=3)
    dev = torch.device("cuda")
    backend = create_backend(EngineConfig(moe_backend="offload", expert_cache=0.25), banks, dev, torch.float32)
    g = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(4, D, generator=g).to(dev), *random_routing(4, 16, g, dev)) for _ in range(6)]
    backend.forward(0, *inputs[0])  # first launches compile the Triton kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i, (x, ids, w) in enumerate(inputs[1:]):
            backend.forward(i % 3, x, ids, w)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    backend.check_integrity()
    assert backend.stats()["expert_fills"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_pool_pins_in_place_and_gpu_reads_it() -> None:
    from freetoken.experts.host_pool import HostExpertPool

    banks = make_banks(2, 8, seed=1)
    cuda = torch.device("cuda")
    pool = HostExpertPool(banks, pin=True)
    assert pool.pinned and pool.gate_up.data_ptr() == banks.gate_up.data_ptr()  # no second copy
    second = HostExpertPool(banks, pin=True)  # same banks: the registration is shared and counted
    pool.close()
    gu, dn = second.device_views(cuda)
    idx = torch.tensor([3, 0, 15], device=cuda)
    assert torch.equal(gu.index_select(0, idx).cpu(), banks.gate_up[[3, 0, 15]])
    assert torch.equal(dn.index_select(0, idx).cpu(), banks.down[[3, 0, 15]])
    second.close()
    assert not banks.gate_up.is_pinned()
