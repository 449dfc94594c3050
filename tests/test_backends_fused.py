"""The fused backend on the CPU against ``moe_reference``: the C++ kernel in place over the banks (decode-sized
steps) and torch's per-expert matmuls (larger ones), the grouped GEMM over pool rows, and bf16 banks under float32
steps keeping the bits of float32 ones."""

from __future__ import annotations

import pytest
import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.base import ExpertBanks
from freetoken.experts.reference import moe_reference
from random_experts import K_TOP, D, make_banks, random_routing

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


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
