"""The C++ expert kernel with gpt-oss's gate/up biases (float32 [N, 2I], added before the clamped activation): every
ISA, float32 and bf16 banks, batch 1 and 4, the synchronous and the queued (stream-ordered) paths, against the torch
reference; biases of the wrong shape or dtype are refused before any pointer crosses."""

from __future__ import annotations

import pytest
import torch

from flags import wait_flag
from freetoken.experts.cpu import kernel as kmod
from freetoken.experts.cpu.kernel import ISAS, CpuExpertKernel, cpu_experts_reference


def _lib_or_skip() -> None:
    if kmod.load_library() is None:
        pytest.skip("no C++ compiler: the native kernel cannot be built here")


def _case(T: int, D: int, inter: int, N: int, R: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g) * 4.0  # wide: some gate/up values pass the clamps
    gate_up = (torch.randn(N, 2 * inter, D, generator=g) / D**0.5).to(dtype)
    down = (torch.randn(N, D, inter, generator=g) / inter**0.5).to(dtype)
    tok = torch.randint(0, T, (R,), generator=g, dtype=torch.int32)
    row = torch.randint(0, N, (R,), generator=g)
    weight = torch.rand(R, generator=g)
    bias = torch.randn(N, 2 * inter, generator=g) * 2.0
    return (x, tok, row, weight, gate_up, down), bias


def _tol(ref: torch.Tensor, dtype: torch.dtype) -> float:
    return (2e-6 if dtype == torch.float32 else 5e-5) * max(1.0, float(ref.abs().max()))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 4])
def test_biases_match_the_reference(isa: str, dtype: torch.dtype, T: int) -> None:
    _lib_or_skip()
    lib = kmod.load_library()
    if lib is None or not lib.ft_isa_supported(ISAS.index(isa)):
        pytest.skip(f"{isa} not supported on this CPU/build")
    kern = CpuExpertKernel(num_threads=2, isa=isa)
    case, bias = _case(T, 67, 45, 5, 2 * T + 1, dtype, seed=T)
    ref = cpu_experts_reference(*case, activation="gptoss", gate_up_bias=bias)
    unbiased = cpu_experts_reference(*case, activation="gptoss")
    assert not torch.allclose(ref, unbiased, atol=1e-3)  # the biases matter here
    out = kern.run(*case, activation="gptoss", bias=bias)
    torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, dtype))


def test_queued_batches_take_the_biases() -> None:
    _lib_or_skip()
    kern = CpuExpertKernel(num_threads=2)
    (x, tok, row, weight, gate_up, down), bias = _case(3, 40, 24, 4, 6, torch.float32, seed=9)
    k = 2
    codes = torch.arange(6) * 100  # every route elsewhere, then half of them here
    here = torch.tensor([True, False, True, True, False, True])
    rows = torch.tensor([0, 1, 2, 3, 0, 1])
    codes = torch.where(here, -1 - rows, codes)
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    out = torch.empty(3, 40)
    kern.enqueue(x, codes, weight, gate_up, down, out, ready=(ready, 1), done=(done, 1), activation="gptoss", bias=bias)
    ready[0] = 1
    wait_flag(done, 1)
    t = (torch.arange(6) // k)[here].to(torch.int32)
    ref = cpu_experts_reference(x, t, rows[here], weight[here], gate_up, down, "gptoss", gate_up_bias=bias)
    torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, torch.float32))


@pytest.mark.parametrize(
    "bad,match", [(torch.zeros(5, 48), "gate_up_bias must be"), (torch.zeros(5, 90, dtype=torch.bfloat16), "dtype")]
)
def test_bad_biases_are_refused(bad: torch.Tensor, match: str) -> None:
    case, _ = _case(2, 67, 45, 5, 3, torch.float32, seed=0)
    with pytest.raises(ValueError, match=match):
        CpuExpertKernel(1).run(*case, activation="gptoss", bias=bad)
