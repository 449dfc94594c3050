"""One expert per layer step shared by the GPU and CPU branches (``experts/share_split.py``): the plan's
floor rounding, the choice and cut, the partial slot copy, and the backend's exact output."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.config import EngineConfig
from freetoken.experts.base import ExpertBanks
from freetoken.experts.pool import HostExpertPool
from freetoken.experts.reference import expert_ffn
from freetoken.experts.registry import create_backend
from freetoken.experts.share_split import share_granule, share_one_expert
from freetoken.experts.slot_cache import SlotCache
from freetoken.experts.slot_copy import partial_fill, partial_fill_torch
from test_backends import ENGINE_STEPS, HAS_CUDA, make_banks, run_steps, tiny_moe  # noqa: F401 - fixture

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def test_granule() -> None:
    assert share_granule(768) == 64 and share_granule(512) == 64
    assert share_granule(32) == 8 and share_granule(3) == 1 and share_granule(100) == 25


def _cache(L: int = 1, E: int = 8, inter: int = 32, slots: int = 6) -> SlotCache:
    banks = make_banks(L, E, seed=3)
    assert banks.down.shape[2] == inter
    return SlotCache(HostExpertPool(banks, pin=False), slots, CPU)


def test_choice_cut_and_codes() -> None:
    cache = _cache()
    N, S, inter = cache.pool.num_rows, cache.num_slots, cache.pool.inter
    ids = torch.tensor([[5, 1, 3, 6]])  # four misses in an empty cache, one token
    share = torch.tensor(0.6)  # m * share = 2.4: two whole fills, 0.4 of the next miss on the GPU
    plan = cache.group_and_plan(0, ids, share, 1)
    assert int(plan.copy_count) == 2 and plan.copy_src[:2].tolist() == [1, 3]  # the fill order: lower eid
    sh = share_one_expert(plan, share, inter, N, S)
    step = share_granule(inter)
    assert int(sh.eid) == 5 and int(sh.rows) == round(0.4 * inter / step) * step  # next in the fill order
    g = int(sh.group)
    assert int(plan.groups.eid[g]) == 5 and int(plan.slot[g]) == S  # the GPU reads the scratch slot
    codes = plan.route_code.tolist()
    assert codes[0] == -1 - (5 + N * int(sh.rows))  # eid 5 carries its cut to the CPU
    assert codes[3] == -1 - 6  # eid 6 stays whole on the CPU
    assert codes[1] >= 0 and codes[2] >= 0  # filled
    assert int(cache.tables.slot_of[5]) == -1  # the shared expert is not cached


@pytest.mark.parametrize(
    ("ids", "share", "q"),
    [
        ([2, 4], 1.0, 2),  # every miss filled: nothing left to share
        ([3, 5, 6], 0.9, 3),  # round(2.7) = 3: nothing left to share
        ([0, 1, 7], 0.6, 2),  # round(1.8) = 2 > 1.8: the GPU has its share already, the CPU keeps eid 7 whole
    ],
)
def test_no_share_unless_the_gpu_is_short(ids: list[int], share: float, q: int) -> None:
    cache = _cache()
    N, S, inter = cache.pool.num_rows, cache.num_slots, cache.pool.inter
    plan = cache.group_and_plan(0, torch.tensor([ids]), torch.tensor(share), 1)
    assert int(plan.copy_count) == q
    before = plan.route_code.clone()
    sh = share_one_expert(plan, torch.tensor(share), inter, N, S)
    assert int(sh.rows) == 0 and torch.equal(plan.route_code, before) and S not in plan.slot.tolist()


def test_no_share_on_hits() -> None:
    cache = _cache()
    N, S, inter = cache.pool.num_rows, cache.num_slots, cache.pool.inter
    cache.group_and_plan(0, torch.tensor([[2, 4]]), torch.tensor(1.0), 1)
    plan = cache.group_and_plan(0, torch.tensor([[2, 4]]), torch.tensor(0.3), 1)  # all hits now
    sh = share_one_expert(plan, torch.tensor(0.3), inter, N, S)
    assert int(plan.num_misses) == 0 and int(sh.rows) == 0 and (plan.route_code >= 0).all()


def test_full_cut_is_a_gpu_only_route() -> None:
    cache = _cache(slots=2)
    N, S, inter = cache.pool.num_rows, cache.num_slots, cache.pool.inter
    share = torch.tensor(1.0)  # m = 4 but only 2 slots: q = 2 < x = 4, the fraction clamps to a whole expert
    plan = cache.group_and_plan(0, torch.tensor([[0, 7, 3, 5]]), share, 1)
    assert int(plan.copy_count) == 2
    sh = share_one_expert(plan, share, inter, N, S)
    assert int(sh.rows) == inter
    assert plan.route_code.tolist() == [plan.route_code[0].item(), -1 - 7, plan.route_code[2].item(), S]
    assert int(sh.eid) == 5 and plan.route_code[0] >= 0 and plan.route_code[2] >= 0  # fills: 0, 3; shared: 5


@pytest.mark.parametrize("rows", [0, 8, 31, 32])
def test_partial_fill_matches_reference_and_sums_exactly(rows: int) -> None:
    banks = make_banks(1, 4, seed=5)
    gu, dn = banks.gate_up, banks.down
    inter = dn.shape[2]
    dst = (torch.full_like(gu[0], 7.0), torch.full_like(dn[0], 7.0))  # stale content must go
    ref = (torch.empty_like(gu[0]), torch.empty_like(dn[0]))
    partial_fill(gu, dn, *dst, torch.tensor(2), torch.tensor(rows))
    partial_fill_torch(gu, dn, *ref, torch.tensor(2), torch.tensor(rows))
    assert torch.equal(dst[0], ref[0]) and torch.equal(dst[1], ref[1])
    # GPU part (zero rows beyond the cut) + CPU part (rows [cut, I)) = the whole expert
    x = torch.randn(3, gu.shape[2])
    rest_gu = torch.cat((gu[2, rows:inter], gu[2, inter + rows :]))
    cpu = expert_ffn(x, rest_gu, dn[2][:, rows:]) if rows < inter else torch.zeros(3, gu.shape[2])
    torch.testing.assert_close(expert_ffn(x, *dst) + cpu, expert_ffn(x, gu[2], dn[2]), rtol=1e-5, atol=1e-5)


def test_partial_fill_without_expert_zeroes_the_slot() -> None:
    banks = make_banks(1, 4, seed=6)
    dst = (torch.ones_like(banks.gate_up[0]), torch.ones_like(banks.down[0]))
    partial_fill(banks.gate_up, banks.down, *dst, torch.tensor(4), torch.tensor(16))  # eid N: none
    assert dst[0].abs().sum() == 0 and dst[1].abs().sum() == 0


def _shared_backend(banks: ExpertBanks, cache: float, device: torch.device) -> object:
    cfg = EngineConfig(moe_backend="hybrid", expert_cache=cache, fill_fraction=0.5, hybrid_share_expert=True)
    return create_backend(cfg, banks, device, torch.float32)


@pytest.mark.parametrize("expert_cache", [0.2, 0.5])
def test_hybrid_with_shared_expert_equals_reference(expert_cache: float) -> None:
    L, E = (3, 12) if expert_cache == 0.2 else (2, 16)
    banks = make_banks(L, E, seed=1)
    backend = _shared_backend(banks, expert_cache, CPU)
    assert run_steps(backend, banks, steps=20, seed=2, device=CPU) < 1e-5  # type: ignore[arg-type]
    s = backend.stats()  # type: ignore[attr-defined]
    assert s["expert_shared"] > 0 and s["expert_fills"] > 0 and s["expert_cpu_runs"] > 0
    assert s["expert_fills"] + s["expert_cpu_runs"] == s["expert_misses"]
    eb = banks.expert_bytes
    assert s["expert_fills"] * eb < s["pcie_bytes"] < (s["expert_fills"] + s["expert_shared"]) * eb


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("expert_cache", [0.2, 0.5])
def test_hybrid_with_shared_expert_equals_reference_cuda(expert_cache: float) -> None:
    banks = make_banks(3, 12, seed=1)
    dev = torch.device("cuda")
    backend = _shared_backend(banks, expert_cache, dev)
    assert run_steps(backend, banks, steps=20, seed=2, device=dev) < 1e-5  # type: ignore[arg-type]
    assert backend.stats()["expert_shared"] > 0  # type: ignore[attr-defined]


def _fill_with_partial(src: tuple, slots: tuple, eid: int, rows: int, dev: torch.device) -> tuple:
    """The Triton fill of pool rows 0 and 2 into slots 1 and 0 plus expert ``eid``'s first ``rows`` rows into
    the scratch slot, and the reference (whole copies, then ``partial_fill_torch``) on copies of the slots."""
    from freetoken.experts.triton_copy import gather_rows_triton

    ref = tuple(t.clone() for t in slots)
    copy_src, copy_dst = torch.tensor([0, 2, 0], device=dev), torch.tensor([1, 0, 2], device=dev)
    count, e, r = torch.tensor(2, device=dev), torch.tensor(eid, device=dev), torch.tensor(rows, device=dev)
    gather_rows_triton(*src, *slots, copy_src, copy_dst, count, partial=(e, r))
    for i in range(2):
        ref[0][int(copy_dst[i])] = src[0][int(copy_src[i])].to(dev)
        ref[1][int(copy_dst[i])] = src[1][int(copy_src[i])].to(dev)
    if rows > 0:  # rows 0: the scratch slot is not read and stays as it was
        partial_fill_torch(*src, ref[0][-1], ref[1][-1], e, r)
    return ref


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rows", [0, 8, 32])
def test_fill_with_partial_triton_equals_torch_cuda(rows: int) -> None:
    """The fills and a shared expert's GPU rows in one Triton launch, read from the pinned pool's mapped view
    (``batched_fill``'s path on CUDA)."""
    banks = make_banks(1, 4, seed=7)
    pool = HostExpertPool(banks, pin=True)
    dev = torch.device("cuda")
    src = pool.device_views(dev)
    slots = tuple(torch.full((4, *b.shape[1:]), 7.0, device=dev) for b in (banks.gate_up, banks.down))
    ref = _fill_with_partial(src, slots, 3, rows, dev)
    torch.cuda.synchronize()
    assert torch.equal(slots[0], ref[0]) and torch.equal(slots[1], ref[1])
    pool.close()


@pytest.mark.parametrize("expert_cache", [0.2, 0.5])
def test_engine_greedy_tokens_match_with_shared_expert(tiny_moe: tuple, expert_cache: float) -> None:  # noqa: F811
    from freetoken import LLM, SamplingParams

    path, prompts, refs = tiny_moe
    llm = LLM(path, device="cpu", dtype="float32", moe_backend="hybrid", expert_cache=expert_cache,
              fill_fraction=0.5, hybrid_share_expert=True)  # fmt: skip
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=ENGINE_STEPS, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()
    s = llm.stats()
    assert s["expert_shared"] > 0 and s["expert_fills"] > 0 and s["expert_cpu_runs"] > 0


@TRITON_INTERPRETER
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fill_with_partial_triton_in_interpreter(dtype: torch.dtype) -> None:
    """The fill kernel with a partial row on the CPU through Triton's interpreter (TRITON_INTERPRET=1)."""
    g = torch.Generator().manual_seed(0)
    N, inter, d = 5, 96, 64
    gu, dn = torch.randn(N, 2 * inter, d, generator=g).to(dtype), torch.randn(N, d, inter, generator=g).to(dtype)
    for eid, rows in ((3, 0), (3, 32), (1, 95), (0, 96)):
        slots = (torch.full((4, 2 * inter, d), 7.0, dtype=dtype), torch.full((4, d, inter), 7.0, dtype=dtype))
        ref = _fill_with_partial((gu, dn), slots, eid, rows, CPU)
        assert torch.equal(slots[0], ref[0]) and torch.equal(slots[1], ref[1]), (eid, rows)
