"""DeepSeek-V4's clamped SiLU (``dsv4``: gate clamped above at 10, up to [-10, 10]) in the slot GEMM's torch paths and
the Triton grouped GEMM (in Triton's interpreter), against ``moe_reference``, on inputs wide enough that it binds."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.experts.reference import ExpertAct, moe_reference
from freetoken.experts.slots.gemm import grouped_experts_gather, grouped_experts_loop
from freetoken.experts.slots.plan import group_routes
from random_experts import D, make_banks, random_routing

E = 12


def _case(T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    banks = make_banks(1, E, seed)
    x = torch.randn(T, D, generator=g) * 60.0
    ids, w = random_routing(T, E, g, torch.device("cpu"))
    act = ExpertAct.of("dsv4", None, torch.device("cpu"))
    assert act is not None
    groups = group_routes(ids.reshape(-1), E)
    slot = torch.where(groups.valid, groups.eid.clamp(max=E - 1), -1)
    ref = moe_reference(x, ids, w, banks.gate_up, banks.down, act).float()
    silu = moe_reference(x, ids, w, banks.gate_up, banks.down).float()
    assert not torch.allclose(ref, silu, atol=1e-3)  # the clamp binds
    return x, w, groups, slot, banks, act, ref


@pytest.mark.parametrize("T", [1, 4, 33])
def test_torch_paths(T: int) -> None:
    from freetoken.experts.slots.weights import SlotWeights

    x, w, groups, slot, banks, act, ref = _case(T, seed=T)
    for fn in (grouped_experts_gather, grouped_experts_loop):
        out = fn(x, groups, slot, w, SlotWeights(banks.gate_up, banks.down, act=act))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4 * max(1.0, float(ref.abs().max())))


@TRITON_INTERPRETER
@pytest.mark.parametrize("T", [1, 5, 40])
def test_triton_grouped_gemm_in_the_interpreter(T: int) -> None:
    from freetoken.experts.slots.gemm_triton import grouped_experts_triton

    x, w, groups, slot, banks, act, ref = _case(T, seed=T)
    out = grouped_experts_triton(x, groups, slot, w, banks.gate_up, banks.down, max_groups=E, act=act)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4 * max(1.0, float(ref.abs().max())))
