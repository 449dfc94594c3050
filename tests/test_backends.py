"""Every expert backend equals ``moe_reference`` on random banks and routing, and counts what it did."""

from __future__ import annotations

import logging

import pytest
import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.auto import choose_backend
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.backends.split_policy import DEFAULT_SHARE, SplitPolicy
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.reference import moe_reference
from freetoken.experts.slots.gemm import grouped_experts_gather, grouped_experts_loop
from freetoken.experts.slots.plan import group_routes
from freetoken.experts.slots.weights import SlotWeights

D, I, K_TOP = 64, 32, 2
SLOT_BACKENDS = ["offload", "cpu", "hybrid", "static-layers", "static-freq"]
HAS_CUDA = torch.cuda.is_available()

from devices import DEVICES, TRITON_INTERPRETER  # noqa: E402
from freetoken.bench.placements import register  # noqa: E402

register()  # the static-layers and static-freq backends

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def make_banks(L: int, E: int, seed: int, device: str = "cpu") -> ExpertBanks:
    g = torch.Generator().manual_seed(seed)
    gu = torch.randn(L * E, 2 * I, D, generator=g) / D**0.5
    dn = torch.randn(L * E, D, I, generator=g) / I**0.5
    return ExpertBanks(gu.to(device), dn.to(device), L, E)


def assert_did_work(name: str, s: dict) -> None:
    """Fills for the backends that copy, CPU runs for those that compute on the host."""
    if name in ("offload", "hybrid"):
        assert s["expert_fills"] > 0
    if name in ("cpu", "hybrid"):
        assert s["expert_cpu_runs"] > 0


def random_routing(T: int, E: int, g: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K_TOP]
    w = torch.softmax(torch.randn(T, K_TOP, generator=g), dim=-1)
    return ids.to(device), w.to(device)


def run_steps(
    backend: ExpertBackend, banks: ExpertBanks, steps: int, seed: int, device: torch.device, max_t: int = 40
) -> float:
    """Random steps through every layer; returns the worst relative error against the reference."""
    g = torch.Generator().manual_seed(seed)
    L, E = banks.num_layers, banks.num_experts
    gu, dn = banks.gate_up.to(device), banks.down.to(device)
    worst = 0.0
    for _ in range(steps):
        T = int(torch.randint(1, max_t + 1, (1,), generator=g))
        backend.begin_step(T, True)
        for layer in range(L):
            x = torch.randn(T, D, generator=g).to(device)
            ids, w = random_routing(T, E, g, device)
            ref = moe_reference(x, ids + layer * E, w, gu, dn)
            out = backend.forward(layer, x, ids, w)
            assert out.shape == ref.shape and out.dtype == ref.dtype
            worst = max(worst, float((out - ref).abs().max() / ref.abs().max()))
        backend.check_integrity()
    return worst


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


def _groups_case(T: int, E: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    banks = make_banks(1, E, seed)
    x = torch.randn(T, D, generator=g)
    ids, w = random_routing(T, E, g, torch.device("cpu"))
    groups = group_routes(ids.reshape(-1), E)
    # Slot of each group: the expert itself (slots = pool), but every third group runs elsewhere (-1).
    slot = torch.where(torch.arange(T * K_TOP) % 3 == 2, -1, groups.eid.clamp(max=E - 1))
    slot = torch.where(groups.valid, slot, -1)
    gu = torch.cat([banks.gate_up, torch.zeros_like(banks.gate_up[:1])])  # + scratch slot
    dn = torch.cat([banks.down, torch.zeros_like(banks.down[:1])])
    on = slot[groups.route_group] >= 0
    w_on = torch.where(on.view(T, K_TOP), w, torch.zeros_like(w))
    ref = moe_reference(x, ids, w_on, banks.gate_up, banks.down).float()
    return x, groups, slot, w, gu, dn, ref


@pytest.mark.parametrize("T", [1, 4, 33])
def test_grouped_experts_torch_paths(T: int) -> None:
    x, groups, slot, w, gu, dn, ref = _groups_case(T, 12, seed=T)
    for fn in (grouped_experts_gather, grouped_experts_loop):
        out = fn(x, groups, slot, w, SlotWeights(gu, dn))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@TRITON_INTERPRETER
@pytest.mark.parametrize("T", [1, 5, 40, 600])
def test_triton_kernels_in_interpreter(T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton kernels run on the CPU through Triton's interpreter (TRITON_INTERPRET=1)."""
    from freetoken.experts.slots.copy_triton import gather_rows_triton
    from freetoken.experts.slots.gemm_triton import grouped_experts_triton

    x, groups, slot, w, gu, dn, ref = _groups_case(T, 12, seed=T)
    torch.testing.assert_close(grouped_experts_triton(x, groups, slot, w, gu, dn), ref, rtol=1e-5, atol=1e-5)
    out = grouped_experts_triton(x, groups, slot, w, gu, dn, max_groups=12)  # grid bounded by E
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out16 = grouped_experts_triton(x, groups, slot, w, gu, dn, max_groups=12, out_dtype=torch.bfloat16)
    assert out16.dtype == torch.bfloat16  # the combine's cast (the interpreter's may truncate: one ulp)
    torch.testing.assert_close(out16.float(), out, rtol=2**-7, atol=1e-30)
    dst_gu, dst_dn = torch.zeros(6, *gu.shape[1:]), torch.zeros(6, *dn.shape[1:])
    src, dst = torch.tensor([3, 7, 0, 0]), torch.tensor([2, 0, 5, 5])
    gather_rows_triton((gu, dn), (dst_gu, dst_dn), src, dst, torch.tensor(2))
    assert torch.equal(dst_gu[2], gu[3]) and torch.equal(dst_dn[0], dn[7])
    assert dst_gu[5].abs().sum() == 0 and dst_gu[1].abs().sum() == 0  # padding skipped


def _check_routed(device: str) -> None:
    """The fused backend's decode path: the gate_up launch groups the routes itself (one program writes the tables
    the down launch reads), the down launch sums them; against the reference, layer 1 of a 2-layer pool."""
    from freetoken.experts.slots.gemm_triton import grouped_experts_routed_triton
    from freetoken.experts.slots.plan_triton import group_routes_triton

    E = 12
    banks = make_banks(2, E, seed=7, device=device)
    g = torch.Generator().manual_seed(7)
    for T in (1, 3, 8):  # 8 tokens x top-k: 64 routes, the bound
        x = torch.randn(T, D, generator=g).to(device)
        ids, w = random_routing(T, E, g, torch.device(device))
        out = grouped_experts_routed_triton(x, ids, E, w, banks.gate_up, banks.down, E)
        ref = moe_reference(x, ids + E, w, banks.gate_up, banks.down).float()
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        out16 = grouped_experts_routed_triton(x, ids, E, w, banks.gate_up, banks.down, E, out_dtype=torch.bfloat16)
        torch.testing.assert_close(out16.float(), out, rtol=2**-7, atol=1e-30)
        groups = group_routes_triton(ids, E, banks.gate_up.shape[0])  # the same tables as the grouping launch
        assert int(groups.n_groups) == len(set((ids + E).reshape(-1).tolist()))


@TRITON_INTERPRETER
def test_routed_experts_in_the_interpreter() -> None:
    _check_routed("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_routed_experts_on_cuda() -> None:
    _check_routed("cuda")


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


# -- engine level: the same greedy tokens through LLM for every backend (tiny qwen3_moe, fp32) ----------
ENGINE_STEPS = 12


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from reference import LOGIT_MARGIN, ROUTER_MARGIN, reference_greedy
    from tiny_models import save_checkpoint

    d = tmp_path_factory.mktemp("qwen3_moe")
    model = save_checkpoint("qwen3_moe", d, seed=1)  # 2 MoE layers x 8 experts, top-2
    g = torch.Generator().manual_seed(1001)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (5, 13)]
    refs = [reference_greedy(model, p, ENGINE_STEPS, top_k=2) for p in prompts]
    for r in refs:  # the near-tie rule (DESIGN §8): this seed is free of ties
        assert r.min_logit_margin > LOGIT_MARGIN and r.min_router_margin > ROUTER_MARGIN
    return str(d), prompts, refs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("expert_cache", [0.2, 0.5])
@pytest.mark.parametrize("name", ["fused", *SLOT_BACKENDS])
def test_engine_greedy_tokens_match(tiny_moe: tuple, name: str, expert_cache: float, device: str) -> None:
    from freetoken import LLM, SamplingParams

    path, prompts, refs = tiny_moe
    fill = 0.5 if name == "hybrid" else None
    llm = LLM(path, device=device, dtype="float32", moe_backend=name, expert_cache=expert_cache, fill_fraction=fill)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=ENGINE_STEPS, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()
    s = llm.stats()
    assert s["moe_backend"] == name
    assert_did_work(name, s)


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


def test_cache_below_top_k_is_refused_when_the_engine_starts(tmp_path) -> None:
    from freetoken import LLM
    from tiny_models import save_checkpoint

    save_checkpoint("qwen3_moe", tmp_path, seed=1)  # top-2
    with pytest.raises(ValueError, match="fewer than the 2 experts"):
        LLM(str(tmp_path), device="cpu", moe_backend="offload", expert_cache=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_on_cpu_runs_the_cpu_kernel_in_place(dtype: torch.dtype) -> None:
    """On a CPU device fused runs decode-sized steps on the C++ kernel over the banks (no weight gather) and
    many-token steps on torch's per-expert matmuls; both match the reference."""
    from freetoken.experts.backends.fused import FusedBackend
    from freetoken.experts.cpu.kernel import load_library
    from freetoken.experts.reference import ExpertAct

    banks = make_banks(2, 8, seed=3)
    backend = FusedBackend(banks, torch.device("cpu"), dtype)
    assert (backend.kernel is not None) == (load_library() is not None)
    g = torch.Generator().manual_seed(4)
    for T in (1, 3, 40):  # 40 tokens x top-2 > 4 routes per expert of 8: torch
        x = torch.randn(T, D, generator=g).to(dtype)
        ids = torch.rand(T, 8, generator=g).argsort(dim=1)[:, :K_TOP]
        w = torch.softmax(torch.randn(T, K_TOP, generator=g), dim=-1)
        ref = moe_reference(x.float(), ids + 8, w, banks.gate_up.float(), banks.down.float())
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(backend.forward(1, x, ids, w).float(), ref.float(), rtol=tol, atol=tol)
    backend.close()
    # gpt-oss's clamped activation after gate/up biases: the kernel and the torch paths alike
    bias = torch.randn(16, 2 * banks.intermediate_size, generator=g)
    gptoss = ExpertBanks(banks.gate_up, banks.down, 2, 8, activation="gptoss", gate_up_bias=bias)
    backend = FusedBackend(gptoss, torch.device("cpu"), dtype)
    assert (backend.kernel is not None) == (load_library() is not None)
    act = ExpertAct.of("gptoss", bias, torch.device("cpu"))
    for T in (1, 3, 40):
        x = (torch.randn(T, D, generator=g) * 4).to(dtype)
        ids = torch.rand(T, 8, generator=g).argsort(dim=1)[:, :K_TOP]
        w = torch.softmax(torch.randn(T, K_TOP, generator=g), dim=-1)
        ref = moe_reference(x.float(), ids + 8, w, banks.gate_up.float(), banks.down.float(), act)
        tol = (1e-5 if dtype == torch.float32 else 3e-2) * max(1.0, float(ref.abs().max()))  # bf16: gu rounded
        torch.testing.assert_close(backend.forward(1, x, ids, w).float(), ref.float(), rtol=0, atol=tol)
    backend.close()


@pytest.mark.parametrize("T", [1, 4])
def test_fused_grouped_gemm_over_pool_rows(T: int) -> None:
    """fused on CUDA reads the routed experts in place (the grouped GEMM over pool rows): the same sums."""
    from freetoken.experts.backends.fused import FusedBackend
    from freetoken.experts.reference import moe_reference

    banks = make_banks(3, 12, seed=3)
    fused = FusedBackend(banks, torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, banks.hidden_size, generator=g)
    ids = torch.stack([torch.randperm(12, generator=g)[:4] for _ in range(T)])
    w = torch.softmax(torch.randn(T, 4, generator=g), dim=-1)
    for layer in range(3):
        ref = moe_reference(x, ids + layer * 12, w, banks.gate_up, banks.down)
        torch.testing.assert_close(fused._grouped(layer, x, ids, w), ref, rtol=1e-5, atol=1e-5)


def test_fused_cpu_float32_steps_keep_bf16_banks_with_the_same_bits() -> None:
    """bf16 values under float32 steps on a CPU (bf16 banks, or float32 ones holding bf16 values): the banks stay bf16
    for the C++ kernel's widening path, which gives the bits of float32 banks (decode-sized steps); the torch paths
    widen per expert (larger ones). Other float32 banks stay float32."""
    from freetoken.experts.cpu.defaults import widening_isa
    from freetoken.experts.cpu.kernel import CpuExpertKernel

    banks = make_banks(2, 16, seed=5)
    bf = ExpertBanks(banks.gate_up.bfloat16(), banks.down.bfloat16(), 2, 16)
    wide = ExpertBanks(bf.gate_up.float(), bf.down.float(), 2, 16)
    cpu, cfg = torch.device("cpu"), EngineConfig(moe_backend="fused")
    backends = [create_backend(cfg, b, cpu, torch.float32) for b in (bf, wide, banks)]
    if any(b.kernel is None for b in backends):  # type: ignore[attr-defined]
        pytest.skip("no C++ compiler: the native kernel cannot be built here")
    dtypes = [b.gate_up.dtype for b in backends]  # type: ignore[attr-defined]
    assert dtypes == [torch.bfloat16, torch.bfloat16, torch.float32]
    kern = CpuExpertKernel(2, isa=widening_isa())
    g = torch.Generator().manual_seed(0)
    for T in (1, 4, 40):  # the kernel's steps, then per-expert matmuls
        x = torch.randn(T, D, generator=g)
        ids, w = random_routing(T, 16, g, cpu)
        out = backends[0].forward(1, x, ids, w)
        assert out.dtype == torch.float32 and torch.equal(out, backends[1].forward(1, x, ids, w))
        rows = (ids + 16).reshape(-1)
        if T * ids.shape[1] <= 64:
            tok = torch.arange(T, dtype=torch.int32).repeat_interleave(ids.shape[1])
            want = kern.run(x, tok, rows, w.reshape(-1).float().contiguous(), wide.gate_up, wide.down)
        else:
            want = moe_reference(x, ids + 16, w, wide.gate_up, wide.down)
        assert torch.equal(out, want)
