"""The CPU expert kernel on fp8 e4m3 banks with 128x128 block scales, against the torch reference (which dequantises
with ``quant/fp8_block.py``): every ISA path that runs here, every e4m3 code, threads, row blocking, queued batches,
and the argument checks."""

from __future__ import annotations

import pytest
import torch

from freetoken.experts.cpu import kernel as kmod
from freetoken.experts.cpu.kernel import ISAS, CpuExpertKernel, cpu_experts_reference

# (T, D, I, N): one token (the row-blocked path), a few, and a 4-token tile
SHAPES = [(1, 128, 128, 3), (3, 256, 128, 4), (4, 128, 256, 2)]


def _supported(isa: str) -> bool:
    lib = kmod.load_library()
    return lib is not None and bool(lib.ft_isa_supported(ISAS.index(isa)))


def fp8_codes(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Uniform over every finite e4m3 code (both signs, subnormals, zeros): 0x7F and 0xFF are NaN."""
    b = torch.randint(0, 254, shape, generator=g, dtype=torch.int32)
    b = torch.where(b >= 0x7F, b + 1, b).to(torch.uint8)
    return b.view(torch.float8_e4m3fn)


def make_fp8_case(T: int, D: int, inter: int, N: int, R: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    gate_up, down = fp8_codes((N, 2 * inter, D), g), fp8_codes((N, D, inter), g)
    # scales spread over four octaves around 1/(448 * sqrt(K)): activations stay O(1)
    gs = torch.rand(N, 2 * inter // 128, D // 128, generator=g) * 3 + 0.5
    ds = torch.rand(N, D // 128, inter // 128, generator=g) * 3 + 0.5
    scales = ((gs / (448 * D**0.5)).contiguous(), (ds / (448 * inter**0.5)).contiguous())
    tok = torch.randint(0, T, (R,), generator=g, dtype=torch.int32)
    row = torch.randint(0, N, (R,), generator=g)
    weight = torch.rand(R, generator=g)
    return (x, tok, row, weight, gate_up, down), scales


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    tol = 2e-6 * max(1.0, float(ref.abs().max()))  # float32 summation order only: the dequantised values are exact
    err = float((out - ref).abs().max())
    assert err <= tol, f"{err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ["silu", "gptoss"])
def test_fp8_matches_reference(isa: str, activation: str) -> None:
    if not _supported(isa):
        pytest.skip(f"{isa} not supported on this CPU/build")
    kern = CpuExpertKernel(num_threads=2, isa=isa)
    for i, (T, D, inter, N) in enumerate(SHAPES):
        case, scales = make_fp8_case(T, D, inter, N, R=3 * T + 1, seed=i)
        ref = cpu_experts_reference(*case, activation=activation, scales=scales)
        _close(kern.run(*case, activation=activation, scales=scales), ref)
    kern.close()


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "avx512bf16"])
def test_fp8_threads_and_row_blocking_do_not_change_bits(isa: str) -> None:
    if not _supported(isa):
        pytest.skip(f"{isa} not supported on this CPU/build")
    case, scales = make_fp8_case(1, 256, 256, 6, R=6, seed=5)
    outs = []
    for threads, rows in ((1, 1), (3, 2), (2, 4)):
        kern = CpuExpertKernel(num_threads=threads, isa=isa, rows=rows)
        outs.append(kern.run(*case, scales=scales))
        kern.close()
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_fp8_queued_batch_matches_reference() -> None:
    if kmod.load_library() is None:
        pytest.skip("no C++ compiler")
    T, k, D, inter, N = 2, 3, 128, 128, 5
    (x, _tok, _row, _w, gu, dn), scales = make_fp8_case(T, D, inter, N, R=1, seed=9)
    rows = torch.tensor([0, 3, 4, 1, 3, 2])
    codes = torch.where(torch.arange(T * k) % 2 == 0, -1 - rows, rows)  # odd routes run elsewhere
    w = torch.rand(T * k)
    out = torch.empty(T, D)
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    kern = CpuExpertKernel(num_threads=2)
    kern.enqueue(x, codes, w, gu, dn, out, (ready, 1), (done, 1), scales=scales)
    ready[0] = 1
    kern.drain()
    assert int(done[0]) == 1 and kern.queue_error() is None
    mine = codes < 0
    tok = (torch.arange(T * k) // k)[mine].to(torch.int32)
    ref = cpu_experts_reference(x, tok, -1 - codes[mine], w[mine], gu, dn, scales=scales)
    _close(out, ref)
    kern.close()


def test_fp8_arguments_are_checked() -> None:
    case, scales = make_fp8_case(1, 128, 128, 2, R=2)
    kern = CpuExpertKernel(num_threads=1)
    with pytest.raises(ValueError, match="need their block scales"):
        kern.run(*case)
    with pytest.raises(ValueError, match=r"gate_up_scale must be \[2, 2, 1\], got \[2, 1, 1\]"):
        kern.run(*case, scales=(scales[0][:, :1].contiguous(), scales[1]))
    x, tok, row, w, gu, dn = case
    with pytest.raises(ValueError, match="take no scales"):
        kern.run(x, tok, row, w, gu.float(), dn.float(), scales=scales)
    odd = make_fp8_case(1, 128, 128, 2, R=2)[0][4][:, :, :100].contiguous()
    with pytest.raises(ValueError, match="gate_up must be"):
        kern.run(x, tok, row, w, odd, dn, scales=scales)
    kern.close()
