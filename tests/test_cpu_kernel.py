"""CPU expert kernel vs the float32 torch reference: ISAs, formats, activations, threads, async."""

from __future__ import annotations

import ctypes

import pytest
import torch

from freetoken.experts.cpu import defaults as dmod
from freetoken.experts.cpu import kernel as kmod
from freetoken.experts.cpu.kernel import ISAS, CpuExpertKernel, cpu_experts_reference
from freetoken.experts.cpu.sources import CPU_EXPERTS
from freetoken.kernels import build

# (T, D, I, N): D, I odd / not multiples of 16; the last shares 2 experts among 19 routes (4-token tiles)
SHAPES = [(1, 64, 32, 3), (3, 67, 45, 5), (4, 130, 19, 7), (6, 40, 24, 2)]


def _lib_or_skip():
    lib = kmod.load_library()
    if lib is None:
        pytest.skip("no C++ compiler: the native kernel cannot be built here")
    return lib


def _supported(isa: str) -> bool:
    lib = kmod.load_library()
    return lib is not None and bool(lib.ft_isa_supported(ISAS.index(isa)))


def make_case(T: int, D: int, inter: int, N: int, R: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    gate_up = (torch.randn(N, 2 * inter, D, generator=g) / D**0.5).to(dtype)
    down = (torch.randn(N, D, inter, generator=g) / inter**0.5).to(dtype)
    tok = torch.randint(0, T, (R,), generator=g, dtype=torch.int32)
    row = torch.randint(0, N, (R,), generator=g)
    weight = torch.rand(R, generator=g)
    return x, tok, row, weight, gate_up, down


def _tol(ref: torch.Tensor, dtype: torch.dtype) -> float:
    # fp32 banks: float32 summation-order noise only; bf16 banks: the vdpbf16ps path splits its
    # fp32 operand into two bf16 halves (~16 mantissa bits), so allow a little more.
    scale = max(1.0, float(ref.abs().max()))
    return (2e-6 if dtype == torch.float32 else 5e-5) * scale


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["silu", "gptoss", "gelu_tanh", "dsv4"])
def test_matches_reference(isa: str, dtype: torch.dtype, activation: str) -> None:
    _lib_or_skip()
    if not _supported(isa):
        pytest.skip(f"{isa} not supported on this CPU/build")
    kern = CpuExpertKernel(num_threads=2, isa=isa)
    assert kern.isa == isa and kern.backend == "native"
    for i, (T, D, inter, N) in enumerate(SHAPES):
        case = make_case(T, D, inter, N, R=3 * T + 1, dtype=dtype, seed=i)
        ref = cpu_experts_reference(*case, activation=activation)
        out = kern.run(*case, activation=activation)
        torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, dtype))


def test_gptoss_activation_clamps() -> None:
    """Large pre-activations hit the clamps (gate <= 7, |up| <= 7), which the reference applies too."""
    _lib_or_skip()
    x, tok, row, weight, gate_up, down = make_case(2, 48, 24, 2, 4, torch.float32, seed=3)
    x = x * 40.0
    ref = cpu_experts_reference(x, tok, row, weight, gate_up, down, activation="gptoss")
    unclamped = cpu_experts_reference(x, tok, row, weight, gate_up, down, activation="silu")
    assert not torch.allclose(ref, unclamped)
    out = CpuExpertKernel(1).run(x, tok, row, weight, gate_up, down, activation="gptoss")
    torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thread_count_does_not_change_bits(dtype: torch.dtype) -> None:
    _lib_or_skip()
    case = make_case(4, 200, 70, 6, 17, dtype, seed=7)  # 200 rows: several phase-2 blocks
    kernels = [CpuExpertKernel(num_threads=n, caller_helps=h) for n, h in ((1, False), (2, True), (3, False))]
    outs = [k.run(*case) for k in kernels]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inline_batches_give_the_workers_bits(dtype: torch.dtype) -> None:
    """``run`` computes batches under ``inline_bytes`` on the calling thread alone: the same bits, the same checks
    (the pool rows are checked on the C++ side), and a larger batch still goes to the workers."""
    _lib_or_skip()
    for T, R in ((1, 4), (4, 17)):
        case = make_case(T, 200, 70, 6, R, dtype, seed=T)
        routed = R * (case[4][0].nbytes + case[5][0].nbytes)
        inline = CpuExpertKernel(num_threads=2, inline_bytes=routed)
        out = inline.run(*case)
        assert torch.equal(out, CpuExpertKernel(num_threads=2).run(*case))
        assert inline._inflight is None and not inline.queued()
        x, tok, row, weight, gate_up, down = case
        with pytest.raises(ValueError, match="pool rows in"):
            inline.run(x, tok, torch.full_like(row, 6), weight, gate_up, down)
        bigger = make_case(T, 200, 70, 6, R + 1, dtype, seed=T)
        assert torch.equal(inline.run(*bigger), CpuExpertKernel(num_threads=1).run(*bigger))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_blocking_does_not_change_bits(isa: str, dtype: torch.dtype) -> None:
    """Batch-1 row blocking keeps each row's own accumulators: the same bits at every setting. Odd sizes: blocks
    of 4 and 2 rows and single rows, vector tails and scalar tails all run."""
    _lib_or_skip()
    if not _supported(isa):
        pytest.skip(f"{isa} not supported on this CPU/build")
    for T in (1, 3):  # batch 1 (row blocking) and a multi-token tile
        case = make_case(T, 300, 93, 4, 2 * T + 3, dtype, seed=11)
        ref = cpu_experts_reference(*case)
        outs = [CpuExpertKernel(num_threads=2, isa=isa, rows=r).run(*case) for r in (1, 2, 4)]
        assert all(torch.equal(outs[0], o) for o in outs[1:])
        torch.testing.assert_close(outs[0], ref, rtol=0, atol=_tol(ref, dtype))


def test_spin_setting() -> None:
    """Idle workers poll ``spin_us`` µs; unset: only on >= 8 physical cores."""
    _lib_or_skip()
    k = CpuExpertKernel(num_threads=1, spin_us=30)
    x = torch.randn(1, 16)
    gu, dn = torch.randn(2, 8, 16), torch.randn(2, 16, 4)
    out = k.run(x, torch.zeros(1, dtype=torch.int32), torch.tensor([1]), torch.ones(1), gu, dn)
    torch.testing.assert_close(out, cpu_experts_reference(x, torch.zeros(1, dtype=torch.int32), torch.tensor([1]),
                                                          torch.ones(1), gu, dn))  # fmt: skip
    assert k.spin_us == 30 and CpuExpertKernel(num_threads=1, spin_us=0).spin_us == 0
    want = kmod.DEFAULT_SPIN_US if kmod.physical_cores() >= kmod.SPIN_MIN_CORES else 0
    assert CpuExpertKernel(num_threads=1).spin_us == want


def test_rows_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 rows by default on Intel's AVX-512 paths, 1 elsewhere; the argument wins."""
    _lib_or_skip()
    k = CpuExpertKernel(num_threads=1)
    assert k.rows == dmod.default_rows(k.isa)
    assert CpuExpertKernel(num_threads=1, rows=2).rows == 2
    with pytest.raises(ValueError, match="rows"):
        CpuExpertKernel(num_threads=1, rows=8)
    monkeypatch.setattr(dmod, "cpu_vendor", lambda: "GenuineIntel")
    rows = [dmod.default_rows(isa) for isa in ("avx512bf16", "avx512vbmi", "avx512", "avx2")]
    assert rows == [4, 4, 4, 1]
    monkeypatch.setattr(dmod, "cpu_vendor", lambda: "AuthenticAMD")
    assert dmod.default_rows("avx512bf16") == 1


def test_fp4_banks_take_the_avx512_integer_path_on_intel(monkeypatch: pytest.MonkeyPatch) -> None:
    """FP4 kernels on Intel cores with AVX-512 run the AVX-512 integer path, not AVX512-BF16's (auto_isa): its
    vpdpwssd form where the core has VBMI and VNNI; where AVX-VNNI is the best ISA the plain AVX2 path (that form is
    chosen by name until timed); every other case the best ISA."""
    from freetoken.experts.cpu.library import isa_supported
    from freetoken.experts.cpu.runner import make_kernel

    _lib_or_skip()
    best = CpuExpertKernel(num_threads=1).isa
    monkeypatch.setattr(dmod, "cpu_vendor", lambda: "GenuineIntel")
    assert dmod.auto_isa(False) == "auto"
    integer = "avx512vbmi" if isa_supported("avx512vbmi") else "avx512"
    named = {"avx512": integer, "avx512vbmi": integer, "avx512bf16": integer, "avx2vnni": "avx2"}.get(best)
    assert dmod.auto_isa(True) == (named or "auto")
    fp4, bf16 = make_kernel(torch.uint8, 2), make_kernel(torch.bfloat16, 2)
    assert fp4 is not None and bf16 is not None
    assert (fp4.isa, bf16.isa) == (named or best, best)
    monkeypatch.setattr(dmod, "cpu_vendor", lambda: "AuthenticAMD")
    assert dmod.auto_isa(True) == ("avx2" if best == "avx2vnni" else "auto")
    fp4.close()
    bf16.close()


@pytest.mark.parametrize("spin_us", [0, 20])
def test_many_small_batches_back_to_back(spin_us: int) -> None:
    """Hundreds of quick jobs through the start/barrier/done handshakes (sleeping or spinning)."""
    _lib_or_skip()
    kern = CpuExpertKernel(num_threads=3, spin_us=spin_us, caller_helps=spin_us == 0)
    cases = [make_case(2, 40, 24, 4, 5, torch.float32, seed=s) for s in range(4)]
    expected = [kern.run(*c).clone() for c in cases]
    for i in range(300):
        assert torch.equal(kern.run(*cases[i % 4]), expected[i % 4])
    kern.close()
    kern.close()  # idempotent


def test_isa_choice() -> None:
    """``isa="auto"`` takes the best path this CPU and build support; an explicit path (e.g. AVX2 on an AVX-512
    machine) runs too and matches the reference."""
    _lib_or_skip()
    assert CpuExpertKernel(num_threads=1).isa == ISAS[kmod.load_library().ft_best_isa()]
    if not _supported("avx2"):
        pytest.skip("no AVX2 here")
    kern = CpuExpertKernel(num_threads=2, isa="avx2")
    assert kern.isa == "avx2"
    case = make_case(3, 67, 45, 5, 9, torch.bfloat16, seed=11)
    ref = cpu_experts_reference(*case)
    torch.testing.assert_close(kern.run(*case), ref, rtol=0, atol=_tol(ref, torch.bfloat16))


def test_repeated_tokens_and_experts_and_unrouted_tokens() -> None:
    _lib_or_skip()
    x, _, _, _, gate_up, down = make_case(5, 40, 20, 4, 1, torch.float32, seed=5)
    # token 1 routes expert 2 twice; expert 2 is shared by tokens 0, 1, 3; tokens 2 and 4 unrouted
    tok = torch.tensor([0, 1, 1, 3, 3, 0], dtype=torch.int32)
    row = torch.tensor([2, 2, 2, 2, 0, 1])
    weight = torch.tensor([0.5, 0.25, 0.75, 1.0, -0.5, 2.0])
    ref = cpu_experts_reference(x, tok, row, weight, gate_up, down)
    out = torch.full((5, 40), float("nan"))
    CpuExpertKernel(2).run(x, tok, row, weight, gate_up, down, out=out)
    torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, torch.float32))
    assert torch.all(out[2] == 0) and torch.all(out[4] == 0)
    # the doubled route equals one route with the summed weight
    merged = cpu_experts_reference(x, tok[1:2], row[1:2], torch.tensor([1.0]), gate_up, down)
    torch.testing.assert_close(out[1], merged[1], rtol=1e-5, atol=1e-6)


def test_zero_routes_zero_output() -> None:
    _lib_or_skip()
    x, _, _, _, gate_up, down = make_case(3, 33, 17, 2, 1, torch.bfloat16)
    empty_i32, empty_i64 = torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.int64)
    out = torch.full((3, 33), 7.0)
    kern = CpuExpertKernel(2)
    kern.run(x, empty_i32, empty_i64, torch.empty(0), gate_up, down, out=out)
    assert torch.all(out == 0)
    no_tokens = kern.run(x[:0], empty_i32, empty_i64, torch.empty(0), gate_up, down)
    assert no_tokens.shape == (0, 33)


def test_token_output_does_not_depend_on_the_batch() -> None:
    """A token's result is bit-identical alone or batched (fixed per-element summation order)."""
    _lib_or_skip()
    x, tok, row, weight, gate_up, down = make_case(4, 96, 40, 6, 12, torch.bfloat16, seed=9)
    kern = CpuExpertKernel(2)
    full = kern.run(x, tok, row, weight, gate_up, down).clone()
    sel = tok == 2
    tok_alone = torch.zeros(int(sel.sum()), dtype=torch.int32)
    alone = kern.run(x[2:3].contiguous(), tok_alone, row[sel], weight[sel], gate_up, down)
    assert torch.equal(alone[0], full[2])


def test_big_batch_is_chunked_without_changing_bits() -> None:
    """More routes than one chunk holds (4096): same bits per token as small batches."""
    _lib_or_skip()
    T, k = 700, 8  # 5600 routes
    x, _, _, _, gate_up, down = make_case(T, 24, 12, 16, 1, torch.float32, seed=13)
    g = torch.Generator().manual_seed(14)
    row = torch.stack([torch.randperm(16, generator=g)[:k] for _ in range(T)]).reshape(-1).contiguous()
    tok = torch.arange(T, dtype=torch.int32).repeat_interleave(k)
    weight = torch.rand(T * k, generator=g)
    kern = CpuExpertKernel(2)
    full = kern.run(x, tok, row, weight, gate_up, down).clone()
    ref = cpu_experts_reference(x, tok, row, weight, gate_up, down)
    torch.testing.assert_close(full, ref, rtol=0, atol=_tol(ref, torch.float32))
    for t0, t1 in ((0, 100), (650, 700)):  # token slices run as small batches
        sel = slice(t0 * k, t1 * k)
        part = kern.run(x[t0:t1].contiguous(), tok[sel] - t0, row[sel], weight[sel], gate_up, down)
        assert torch.equal(part, full[t0:t1])


def test_async_submit_wait() -> None:
    _lib_or_skip()
    kern = CpuExpertKernel(2)
    case_a = make_case(2, 64, 48, 4, 6, torch.float32, seed=1)
    case_b = make_case(3, 64, 48, 4, 9, torch.float32, seed=2)
    out = kern.submit(*case_a)
    with pytest.raises(RuntimeError):
        kern.submit(*case_b)  # one batch in flight at a time
    side = torch.randn(64, 64) @ torch.randn(64, 64)  # the caller keeps working meanwhile
    kern.wait()
    ref = cpu_experts_reference(*case_a)
    torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, torch.float32))
    out_b = kern.submit(*case_b)
    kern.wait()
    kern.wait()  # waiting again is harmless
    ref_b = cpu_experts_reference(*case_b)
    torch.testing.assert_close(out_b, ref_b, rtol=0, atol=_tol(ref_b, torch.float32))
    assert side.shape == (64, 64)


def _bad(kern: CpuExpertKernel, match: str, **over: object) -> None:
    x, tok, row, weight, gate_up, down = make_case(2, 32, 16, 3, 4, torch.float32)
    args: dict[str, object] = dict(x=x, tok=tok, row=row, weight=weight, gate_up=gate_up, down=down)
    args.update(over)
    with pytest.raises(ValueError, match=match):
        kern.run(**args)  # type: ignore[arg-type]


def test_bad_arguments_raise_value_error() -> None:
    kern = CpuExpertKernel(1)
    x, tok, row, weight, gate_up, down = make_case(2, 32, 16, 3, 4, torch.float32)
    _bad(kern, "x must have dtype", x=x.double())
    _bad(kern, "x must have dtype", x=x.bfloat16())
    _bad(kern, "tok must have dtype", tok=tok.long())
    _bad(kern, "row must have dtype", row=row.int())
    _bad(kern, "weight must have dtype", weight=weight.half())
    _bad(kern, "gate_up must be contiguous", gate_up=gate_up.transpose(1, 2).contiguous().transpose(1, 2))
    _bad(kern, "share a dtype", down=down.bfloat16())
    _bad(kern, "gate_up must be", gate_up=gate_up[:, :, :31].contiguous())
    _bad(kern, "down must be", down=down[:, :, :15].contiguous())
    _bad(kern, "one entry per route", weight=weight[:3].contiguous())
    _bad(kern, "pool rows in", row=torch.tensor([0, 1, 3, 0]))
    _bad(kern, "pool rows in", row=torch.tensor([0, -1, 2, 0]))
    _bad(kern, "token indices in", tok=torch.tensor([0, 2, 1, 0], dtype=torch.int32))
    _bad(kern, "activation must be", activation="relu")
    _bad(kern, "out must be", out=torch.empty(3, 32))
    _bad(kern, "must have 2 dimensions", x=x[0])
    with pytest.raises(ValueError):
        CpuExpertKernel(0)
    with pytest.raises(ValueError):
        CpuExpertKernel(1, isa="neon")


def test_torch_fallback_without_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmod, "load_library", lambda: None)
    kern = CpuExpertKernel(2)
    assert kern.backend == "torch"
    case = make_case(3, 40, 24, 4, 7, torch.bfloat16, seed=4)
    torch.testing.assert_close(kern.run(*case), cpu_experts_reference(*case), rtol=0, atol=0)
    x, tok, row, weight, gate_up, down = case
    with pytest.raises(ValueError, match="pool rows in"):
        kern.run(x, tok, torch.full_like(row, 4), weight, gate_up, down)


def test_build_is_cached_and_fails_cleanly_without_compiler(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    if build.find_compiler() is None:
        pytest.skip("no C++ compiler")
    first = build.library_path(CPU_EXPERTS)
    mtime = first.stat().st_mtime_ns
    assert build.library_path(CPU_EXPERTS) == first and first.stat().st_mtime_ns == mtime  # no rebuild
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(build.BuildError, match="no C\\+\\+ compiler"):
        build.library_path(CPU_EXPERTS, cache_dir=str(tmp_path))


def test_build_drops_an_isa_the_compiler_cannot_build(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A compiler without -mavx512bf16 still yields a library; that path is simply not offered."""
    real = build.find_compiler()
    if real is None or not build._is_x86():
        pytest.skip("needs an x86 C++ compiler")
    fake = tmp_path / "cxx-without-bf16"
    refuse = 'for a in "$@"; do [ "$a" = -mavx512bf16 ] && exit 1; done'
    fake.write_text(f'#!/bin/sh\n{refuse}\nexec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    lib = ctypes.CDLL(str(build.library_path(CPU_EXPERTS, cache_dir=str(tmp_path))))
    assert lib.ft_isa_supported(ISAS.index("avx512bf16")) == 0
    assert lib.ft_isa_supported(ISAS.index("generic")) == 1


def test_the_isa_units_run_nothing_when_the_library_loads() -> None:
    """An ISA unit's code runs only on a CPU that has the ISA: none has a load-time initializer (a table built by a
    global's constructor in an AVX-512 unit ran AVX-512 instructions at load and killed the process on AVX2 CPUs)."""
    import shutil
    import subprocess

    _lib_or_skip()
    if shutil.which("nm") is None:
        pytest.skip("no nm")
    symbols = subprocess.run(["nm", str(build.library_path(CPU_EXPERTS))], capture_output=True, text=True, check=True)
    inits = [line.split()[-1] for line in symbols.stdout.splitlines() if "_GLOBAL__sub_I_" in line]
    assert not [s for s in inits if "isa_avx" in s], inits
