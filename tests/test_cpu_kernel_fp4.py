"""The CPU expert kernel on FP4 banks (MXFP4: e8m0 per 32; NVFP4: e4m3 per 16 and a per-row multiplier), against
the torch reference (which dequantises with ``quant/mxfp4.py`` / ``quant/nvfp4.py``): every ISA path that runs
here (AVX2 forced; AVX-512 where the CPU has it), every e2m1 code, batch 1 (row-blocked) and tiles, both
activations, and the argument checks."""

from __future__ import annotations

import pytest
import torch

from freetoken.experts.cpu import kernel as kmod
from freetoken.experts.cpu.kernel import ISAS, CpuExpertKernel, cpu_experts_reference
from freetoken.quant import MXFP4, NVFP4, WeightFormat

# (T, D, I, N): one token (the row-blocked path), a few, a 4-token tile; D, I multiples of 32 only
SHAPES = [(1, 64, 96, 3), (3, 96, 64, 4), (4, 128, 160, 2), (1, 640, 352, 2), (5, 352, 640, 2)]
FORMATS = {"mxfp4": MXFP4, "nvfp4": NVFP4}


def _supported(isa: str) -> bool:
    lib = kmod.load_library()
    return lib is not None and bool(lib.ft_isa_supported(ISAS.index(isa)))


def _banks(fmt: WeightFormat, N: int, rows: int, cols: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Every byte value (so every pair of e2m1 codes) and scales spread over several octaves."""
    packed = torch.randint(0, 256, (N, rows, cols // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    if fmt is MXFP4:  # 2^-8 .. 2^-3 around 1/(6 sqrt(K))
        scale = torch.randint(127 - 8, 127 - 2, (N, rows, cols // 32), generator=g, dtype=torch.int32).to(torch.uint8)
        return packed, scale
    s8 = (torch.rand(N, rows, cols // 16, generator=g) * 3 + 0.25).to(torch.float8_e4m3fn)
    mult = torch.rand(N, 1, generator=g) / (6 * cols**0.5) + 1e-3  # one per expert tensor
    return packed, NVFP4.bank_scale(s8, mult)


def make_fp4_case(fmt: WeightFormat, T: int, D: int, inter: int, N: int, R: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    gate_up, gs = _banks(fmt, N, 2 * inter, D, g)
    down, ds = _banks(fmt, N, D, inter, g)
    tok = torch.randint(0, T, (R,), generator=g, dtype=torch.int32)
    row = torch.randint(0, N, (R,), generator=g)
    weight = torch.rand(R, generator=g)
    return (x, tok, row, weight, gate_up, down), (gs.contiguous(), ds.contiguous())


def _close(out: torch.Tensor, ref: torch.Tensor, isa: str) -> None:
    # float32 paths: summation order only (the dequantised values are exact); AVX512-BF16 takes the FP4 codes as bf16
    # (exact) against the operand's bf16 hi/lo halves (~16 mantissa bits), as for bf16 banks (test_cpu_kernel.py);
    # AVX2 and AVX-512 against the operand as int16 per 32-block of its max (quantize_q16i: measured 2.6-6.4e-5 of the
    # max here)
    rel = {"avx512bf16": 5e-5, "avx2": 1e-4, "avx2vnni": 1e-4, "avx512": 1e-4, "avx512vbmi": 1e-4}.get(isa, 2e-6)
    tol = rel * max(1.0, float(ref.abs().max()))
    err = float((out - ref).abs().max())
    assert err <= tol, f"{err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation", ["silu", "gptoss"])
def test_fp4_matches_reference(fmt: str, isa: str, activation: str) -> None:
    if not _supported(isa):
        pytest.skip(f"{isa} not supported on this CPU/build")
    kern = CpuExpertKernel(num_threads=2, isa=isa)
    for i, (T, D, inter, N) in enumerate(SHAPES):
        case, scales = make_fp4_case(FORMATS[fmt], T, D, inter, N, R=3 * T + 1, seed=i)
        ref = cpu_experts_reference(*case, activation=activation, scales=scales)
        assert ref.abs().max() > 0.1  # not a vacuous comparison
        _close(kern.run(*case, activation=activation, scales=scales), ref, isa)
    kern.close()


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("isa", ISAS)
def test_fp4_row_blocking_does_not_change_bits(fmt: str, isa: str) -> None:
    """Batch-1 row blocking (1, 2, 4 rows at once) keeps each FP4 row's accumulators: the same bits. D and I are odd
    multiples of 32 above 128, so whole 128-code blocks and 32-code tails both run."""
    if not _supported(isa):
        pytest.skip(f"{isa} not supported on this CPU/build")
    for T in (1, 3):
        case, scales = make_fp4_case(FORMATS[fmt], T, 224, 352, 3, R=2 * T + 3, seed=13)
        outs = [CpuExpertKernel(num_threads=2, isa=isa, rows=r).run(*case, scales=scales) for r in (1, 2, 4)]
        assert all(torch.equal(outs[0], o) for o in outs[1:])
        _close(outs[0], cpu_experts_reference(*case, scales=scales), isa)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("plain, vnni", [("avx512", "avx512vbmi"), ("avx2", "avx2vnni")])
def test_fp4_vnni_forms_are_the_plain_paths_bits(fmt: str, plain: str, vnni: str) -> None:
    """The vpdpwssd forms (AVX-512 with VBMI's vpermb decode; AVX2 with AVX-VNNI) compute the plain integer paths'
    integer sums: the same output bits, batch 1 and 3, whole 128-code blocks and 32-code tails, gpt-oss's
    activation too."""
    if not (_supported(plain) and _supported(vnni)):
        pytest.skip(f"no {vnni} on this CPU/build")
    for T, act in ((1, "silu"), (3, "gptoss")):
        case, scales = make_fp4_case(FORMATS[fmt], T, 224, 352, 3, R=2 * T + 3, seed=17)
        a, b = (CpuExpertKernel(num_threads=2, isa=isa) for isa in (plain, vnni))
        assert torch.equal(a.run(*case, activation=act, scales=scales), b.run(*case, activation=act, scales=scales))
        a.close()
        b.close()


def test_avx2_is_tested_here() -> None:
    """The AVX2 path (the byte-shuffle decode) must run on this machine's CI, not be skipped."""
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX"):
        pytest.skip("not an x86 CPU with AVX")
    assert _supported("avx2")


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp4_default_isa(fmt: str) -> None:
    """The kernel as the engine builds it (the ISA it picks for this CPU)."""
    kern = CpuExpertKernel(num_threads=2)
    case, scales = make_fp4_case(FORMATS[fmt], 2, 64, 64, 3, R=4, seed=7)
    ref = cpu_experts_reference(*case, scales=scales)
    _close(kern.run(*case, scales=scales), ref, kern.isa)
    kern.close()


def test_fp4_argument_checks() -> None:
    case, scales = make_fp4_case(MXFP4, 1, 64, 64, 2, R=2)
    kern = CpuExpertKernel(num_threads=1)
    with pytest.raises(ValueError, match="uint8 \\(FP4\\) banks need their scale banks"):
        kern.run(*case)
    with pytest.raises(ValueError, match="neither mxfp4 nor nvfp4"):
        kern.run(*case, scales=(scales[0][..., :1].contiguous(), scales[1]))
    with pytest.raises(ValueError, match="down_scale must be"):
        kern.run(*case, scales=(scales[0], scales[1][:, :, :1].contiguous()))
    kern.close()
