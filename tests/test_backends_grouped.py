"""The slot backends' grouped expert GEMMs equal ``moe_reference``: the torch paths (gather, loop), the Triton
kernels and the row gather in Triton's interpreter, and the routed decode launches (interpreter, CUDA)."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.experts.reference import moe_reference
from freetoken.experts.slots.gemm import grouped_experts_gather, grouped_experts_loop
from freetoken.experts.slots.weights import SlotWeights
from random_experts import HAS_CUDA, D, make_banks, random_routing, thirds_elsewhere

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _groups_case(T: int, E: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    banks = make_banks(1, E, seed)
    x = torch.randn(T, D, generator=g)
    ids, w = random_routing(T, E, g, torch.device("cpu"))
    groups, slot, gu, dn, w_on = thirds_elsewhere(ids, w, banks)  # slots = pool, every third group elsewhere
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
