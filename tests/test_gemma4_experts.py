"""Gemma-4's experts (``gelu_tanh(gate) * up``) in the slot GEMM's every form: the torch gather and loop paths, the
Triton grouped GEMM and the fused backend's routed launch (in Triton's interpreter), against ``moe_reference``, which
is transformers' ``gelu_pytorch_tanh``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from devices import TRITON_INTERPRETER
from freetoken.experts.reference import ExpertAct, activate, moe_reference
from freetoken.experts.slots.gemm import grouped_experts_gather, grouped_experts_loop
from freetoken.experts.slots.plan import group_routes
from freetoken.experts.slots.weights import SlotWeights
from random_experts import D, make_banks, random_routing

E = 12


def test_activation_is_transformers_gelu_tanh():
    from transformers.activations import ACT2FN

    g = torch.linspace(-12, 12, 97)
    u = torch.randn(97, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(activate(g, u, "gelu_tanh"), ACT2FN["gelu_pytorch_tanh"](g) * u)
    assert not torch.allclose(activate(g, u, "gelu_tanh"), F.silu(g) * u, atol=1e-2)


def _case(T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    banks = make_banks(1, E, seed)
    x = torch.randn(T, D, generator=g) * 3.0
    ids, w = random_routing(T, E, g, torch.device("cpu"))
    act = ExpertAct.of("gelu_tanh", None, torch.device("cpu"))
    assert act is not None
    groups = group_routes(ids.reshape(-1), E)
    slot = torch.where(groups.valid, groups.eid.clamp(max=E - 1), -1)
    ref = moe_reference(x, ids, w, banks.gate_up, banks.down, act).float()
    assert not torch.allclose(ref, moe_reference(x, ids, w, banks.gate_up, banks.down).float(), atol=1e-3)
    return x, ids, w, groups, slot, act, ref, banks


@pytest.mark.parametrize("T", [1, 33])
def test_torch_paths(T: int) -> None:
    x, _, w, groups, slot, act, ref, b = _case(T, seed=T)
    for fn in (grouped_experts_gather, grouped_experts_loop):
        torch.testing.assert_close(fn(x, groups, slot, w, SlotWeights(b.gate_up, b.down, act=act)), ref, rtol=1e-5,
                                   atol=1e-4)  # fmt: skip


@TRITON_INTERPRETER
@pytest.mark.parametrize("T", [1, 8, 40])
def test_triton_grouped_gemm_in_the_interpreter(T: int) -> None:
    from freetoken.experts.slots.gemm_triton import grouped_experts_routed_triton, grouped_experts_triton

    x, ids, w, groups, slot, act, ref, b = _case(T, seed=T)
    out = grouped_experts_triton(x, groups, slot, w, b.gate_up, b.down, max_groups=E, act=act)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    if T <= 8:  # the fused backend's decode launch (it groups at most 64 routes itself)
        routed = grouped_experts_routed_triton(x, ids, 0, w, b.gate_up, b.down, E, act=act)
        torch.testing.assert_close(routed, ref, rtol=1e-5, atol=1e-4)

