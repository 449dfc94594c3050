"""gpt-oss's experts (gate/up biases by eid, the clamped activation) in the slot GEMM's every form: the torch gather and
loop paths and the Triton grouped GEMM (in Triton's interpreter), over slots some of which run elsewhere, and the
fused backend's routed launch (the gate_up launch grouping the routes itself), against ``moe_reference``; and the
down biases added once per route on the MoE layer, so partial sums of two branches still add up exactly."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.experts.reference import ExpertAct, moe_reference
from freetoken.experts.slots.gemm import grouped_experts_gather, grouped_experts_loop
from freetoken.experts.slots.weights import SlotWeights
from freetoken.layers.moe import routed_down_bias
from random_experts import K_TOP, D, make_banks, random_routing, thirds_elsewhere

E = 12


def _case(T: int, seed: int):
    """Wide inputs (the clamps bind), biases, every third group served elsewhere (slot -1)."""
    g = torch.Generator().manual_seed(seed)
    banks = make_banks(1, E, seed)
    x = torch.randn(T, D, generator=g) * 6.0
    ids, w = random_routing(T, E, g, torch.device("cpu"))
    bias = torch.randn(E, 2 * banks.intermediate_size, generator=g) * 2.0
    act = ExpertAct.of("gptoss", bias, torch.device("cpu"))
    assert act is not None
    groups, slot, gu, dn, w_on = thirds_elsewhere(ids, w, banks)
    ref = moe_reference(x, ids, w_on, banks.gate_up, banks.down, act).float()
    silu = moe_reference(x, ids, w_on, banks.gate_up, banks.down).float()
    assert not torch.allclose(ref, silu, atol=1e-3)  # not SiLU's sums
    return x, ids, w, groups, slot, gu, dn, act, ref, banks


@pytest.mark.parametrize("T", [1, 4, 33])
def test_torch_paths(T: int) -> None:
    x, _, w, groups, slot, gu, dn, act, ref, _ = _case(T, seed=T)
    for fn in (grouped_experts_gather, grouped_experts_loop):
        torch.testing.assert_close(fn(x, groups, slot, w, SlotWeights(gu, dn, act=act)), ref, rtol=1e-5, atol=1e-4)


@TRITON_INTERPRETER
@pytest.mark.parametrize("T", [1, 5, 40])
def test_triton_grouped_gemm_in_the_interpreter(T: int) -> None:
    from freetoken.experts.slots.gemm_triton import grouped_experts_triton

    x, _, w, groups, slot, gu, dn, act, ref, _ = _case(T, seed=T)
    out = grouped_experts_triton(x, groups, slot, w, gu, dn, max_groups=E, act=act)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


@TRITON_INTERPRETER
def test_triton_routed_launch_in_the_interpreter() -> None:
    """The fused backend's decode path, layer 1 of a 2-layer pool: the biases are the pool rows' (eid)."""
    from freetoken.experts.slots.gemm_triton import grouped_experts_routed_triton

    banks = make_banks(2, E, seed=7)
    g = torch.Generator().manual_seed(7)
    bias = torch.randn(2 * E, 2 * banks.intermediate_size, generator=g) * 2.0
    act = ExpertAct.of("gptoss", bias, torch.device("cpu"))
    for T in (1, 3, 8):
        x = torch.randn(T, D, generator=g) * 6.0
        ids, w = random_routing(T, E, g, torch.device("cpu"))
        out = grouped_experts_routed_triton(x, ids, E, w, banks.gate_up, banks.down, E, act=act)
        ref = moe_reference(x, ids + E, w, banks.gate_up, banks.down, act).float()
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


def test_down_biases_once_per_route() -> None:
    """``sum_j w_j * down_bias[id_j]``: what transformers adds inside each expert before weighting, added once on
    the layer whichever branch ran the expert."""
    g = torch.Generator().manual_seed(0)
    down_bias = torch.randn(E, D, generator=g)
    ids, w = random_routing(5, E, g, torch.device("cpu"))
    want = torch.stack([sum(w[t, j] * down_bias[ids[t, j]] for j in range(K_TOP)) for t in range(5)])
    torch.testing.assert_close(routed_down_bias(down_bias, ids, w), want)
