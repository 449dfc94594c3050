"""The CPU expert kernel on part of an expert: route s computes intermediate rows [i_begin[s], I) only
(the CPU share of an expert split with the GPU by rows). Checked against the float32 torch reference on
every ISA this machine runs, bit-for-bit against the whole-expert path for i_begin = 0, and through the
queued path's route codes and stats."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flags import wait_flag
from freetoken.experts.cpu import build
from freetoken.experts.cpu import kernel as kmod
from freetoken.experts.cpu.kernel import ISAS, CpuExpertKernel, cpu_experts_reference, decode_codes, encode_code

# T tokens, D hidden (odd), I intermediate (70: 5 phase-1 blocks of 16, the last partial), N pool rows
D, INTER, N = 67, 70, 6
# per pool row: whole, odd splits inside and at block edges, the last row only, nothing at all
ROW_IBEGIN = torch.tensor([0, 1, 17, INTER - 1, INTER, 32], dtype=torch.int32)


def _native_or_skip() -> None:
    if kmod.load_library() is None:
        pytest.skip("no C++ compiler: the native kernel cannot be built here")


def _isa_or_skip(isa: str) -> None:
    _native_or_skip()
    lib = kmod.load_library()
    if lib is None or not lib.ft_isa_supported(ISAS.index(isa)):
        pytest.skip(f"{isa} not supported on this CPU/build")


def _case(T: int, R: int, dtype: torch.dtype, seed: int, inter: int = INTER):
    """x [T, D], tok int32 [R], row int64 [R] (every row used when R >= N), weight [R], banks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    gate_up = (torch.randn(N, 2 * inter, D, generator=g) / D**0.5).to(dtype)
    down = (torch.randn(N, D, inter, generator=g) / inter**0.5).to(dtype)
    tok = torch.randint(0, T, (R,), generator=g, dtype=torch.int32)
    row = torch.cat([torch.arange(N), torch.randint(0, N, (max(0, R - N),), generator=g)])[:R]
    row = row[torch.randperm(R, generator=g)].contiguous()
    weight = torch.rand(R, generator=g)
    return x, tok, row, weight, gate_up, down


def _tol(ref: torch.Tensor, dtype: torch.dtype) -> float:
    # as in test_cpu_kernel.py: fp32 summation-order noise; the bf16 vdpbf16ps path's hi/lo split
    return (2e-6 if dtype == torch.float32 else 5e-5) * max(1.0, float(ref.abs().max()))


def _poison_below(gate_up: torch.Tensor, down: torch.Tensor, ib_of_row: torch.Tensor) -> None:
    """NaN into every weight a route of row r must not read: gate rows [0, ib), up rows [I, I + ib), down
    columns [0, ib). Any read of them would turn the output into NaN."""
    inter = down.shape[2]
    for r, ib in enumerate(ib_of_row.tolist()):
        gate_up[r, :ib] = float("nan")
        gate_up[r, inter : inter + ib] = float("nan")
        down[r, :, :ib] = float("nan")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["silu", "gptoss"])
@pytest.mark.parametrize("T", [1, 4])
def test_split_routes_match_reference(isa: str, dtype: torch.dtype, activation: str, T: int) -> None:
    """Mixed routes (whole experts and splits at 1, 17, 32, I-1, I) vs the reference, on weights that
    are NaN wherever a route must not read."""
    _isa_or_skip(isa)
    x, tok, row, weight, gate_up, down = _case(T, 3 * T + N, dtype, seed=T)
    _poison_below(gate_up, down, ROW_IBEGIN)
    i_begin = ROW_IBEGIN[row].contiguous()
    ref = cpu_experts_reference(x, tok, row, weight, gate_up, down, activation, i_begin=i_begin)
    assert torch.isfinite(ref).all()
    out = CpuExpertKernel(num_threads=2, isa=isa).run(x, tok, row, weight, gate_up, down, activation, i_begin=i_begin)
    torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, dtype))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_i_begin_zero_is_bit_identical_to_whole_experts(isa: str, dtype: torch.dtype) -> None:
    _isa_or_skip(isa)
    case = _case(4, 17, dtype, seed=11)
    kern = CpuExpertKernel(num_threads=2, isa=isa)
    whole = kern.run(*case).clone()
    zeros = kern.run(*case, i_begin=torch.zeros(17, dtype=torch.int32))
    assert torch.equal(whole, zeros)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thread_count_does_not_change_bits(dtype: torch.dtype) -> None:
    _native_or_skip()
    x, tok, row, weight, gate_up, down = _case(4, 21, dtype, seed=5)
    i_begin = ROW_IBEGIN[row].contiguous()
    kernels = [CpuExpertKernel(num_threads=n, caller_helps=h) for n, h in ((1, False), (2, True), (2, False))]
    outs = [k.run(x, tok, row, weight, gate_up, down, i_begin=i_begin) for k in kernels]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_empty_share_contributes_exactly_zero() -> None:
    """i_begin == I: the route adds nothing (a token with only such routes gets exact zeros)."""
    _native_or_skip()
    x, _, _, _, gate_up, down = _case(2, N, torch.float32, seed=3)
    tok = torch.tensor([0, 1, 1], dtype=torch.int32)
    row = torch.tensor([4, 4, 2])  # ROW_IBEGIN[4] == I
    i_begin = ROW_IBEGIN[row].contiguous()
    out = CpuExpertKernel(2).run(x, tok, row, torch.rand(3), gate_up, down, i_begin=i_begin)
    assert torch.all(out[0] == 0)
    alone = CpuExpertKernel(1).run(x, tok[2:], row[2:], torch.ones(1), gate_up, down, i_begin=i_begin[2:])
    assert torch.any(out[1] != 0) and torch.any(alone[1] != 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("c", [1, 17, 64, 128, 191])
def test_cpu_share_plus_gpu_share_is_the_whole_expert(dtype: torch.dtype, c: int) -> None:
    """The idea itself: the kernel's rows [c, I) plus the rows [0, c) (computed as the whole expert with
    gate/up rows >= c and down columns >= c zeroed) equal the whole expert."""
    _native_or_skip()
    inter = 192
    x, tok, row, weight, gate_up, down = _case(3, 9, dtype, seed=c, inter=inter)
    whole = cpu_experts_reference(x, tok, row, weight, gate_up, down)
    gpu_gu, gpu_down = gate_up.clone(), down.clone()
    gpu_gu[:, c:inter] = 0
    gpu_gu[:, inter + c :] = 0
    gpu_down[:, :, c:] = 0
    gpu_part = cpu_experts_reference(x, tok, row, weight, gpu_gu, gpu_down)
    i_begin = torch.full((9,), c, dtype=torch.int32)
    cpu_part = CpuExpertKernel(2).run(x, tok, row, weight, gate_up, down, i_begin=i_begin)
    # the same bound as the whole-expert kernel vs the reference (bf16: torch's float32 GEMM order differs)
    torch.testing.assert_close(cpu_part + gpu_part, whole, rtol=0, atol=_tol(whole, dtype))


def test_big_chunked_batch_with_splits() -> None:
    """More routes than one plan chunk holds (4096): every chunk keeps its rows' i_begin."""
    _native_or_skip()
    T, k = 1100, 4  # 4400 routes
    x, _, _, _, gate_up, down = _case(T, N, torch.float32, seed=2)
    g = torch.Generator().manual_seed(3)
    row = torch.stack([torch.randperm(N, generator=g)[:k] for _ in range(T)]).reshape(-1).contiguous()
    tok = torch.arange(T, dtype=torch.int32).repeat_interleave(k)
    weight = torch.rand(row.numel(), generator=g)
    i_begin = ROW_IBEGIN[row].contiguous()
    ref = cpu_experts_reference(x, tok, row, weight, gate_up, down, i_begin=i_begin)
    out = CpuExpertKernel(2).run(x, tok, row, weight, gate_up, down, i_begin=i_begin)
    torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, torch.float32))


@pytest.mark.parametrize("native", [True, False])
def test_bad_i_begin_raises_value_error(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if native:
        _native_or_skip()
    else:
        monkeypatch.setattr(kmod, "load_library", lambda: None)
    kern = CpuExpertKernel(1)
    assert kern.backend == ("native" if native else "torch")
    case = _case(2, 8, torch.float32, seed=4)
    row = case[2]
    good = ROW_IBEGIN[row].contiguous()
    torch.testing.assert_close(
        kern.run(*case, i_begin=good), cpu_experts_reference(*case, i_begin=good), rtol=0, atol=1e-5
    )
    for bad, match in (
        (torch.full((8,), -1, dtype=torch.int32), "in \\[0, I=70\\]"),
        (torch.full((8,), INTER + 1, dtype=torch.int32), "in \\[0, I=70\\]"),
        (good.long(), "i_begin must have dtype"),
        (good[:7].contiguous(), "one entry per route"),
    ):
        with pytest.raises(ValueError, match=match):
            kern.submit(*case, i_begin=bad)
    vals, counts = torch.unique(row, return_counts=True)  # 8 routes on 6 rows: some row repeats
    twice = torch.nonzero(row == vals[counts > 1][0]).squeeze(1)
    mixed = good.clone()
    mixed[twice[1]] = (int(good[twice[0]]) + 1) % (INTER + 1)  # in range, but not its row's value
    with pytest.raises(ValueError, match="pool row"):
        kern.submit(*case, i_begin=mixed)
    kern.wait()  # nothing was started


def test_codes_round_trip() -> None:
    rows = torch.tensor([0, 5, 3, 5, 0])
    ibs = torch.tensor([0, 64, 1, 64, 70])
    codes = encode_code(rows, ibs, N)
    codes = torch.stack([codes, torch.tensor([7, 0, 2, 9, 1])], dim=1).reshape(-1)  # interleave GPU routes
    mine, r, ib = decode_codes(codes, N)
    assert mine.tolist() == [True, False] * 5
    assert torch.equal(r, rows) and torch.equal(ib, ibs.to(torch.int32)) and ib.dtype == torch.int32
    assert encode_code(3, 0, N) == -4  # the whole-expert code is the old one: -1 - row
    assert encode_code(3, 2, N) == -1 - (2 * N + 3)
    with pytest.raises(ValueError):
        decode_codes(codes, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_queued_codes_carry_i_begin_and_stats_count_the_work(dtype: torch.dtype) -> None:
    """Encoded codes through the feeder: same output as a direct submit with i_begin, and stats[4] = the
    sum over distinct rows of (I - i_begin)."""
    _native_or_skip()
    T, k = 3, 4
    x, _, _, w, gate_up, down = _case(T, T * k, dtype, seed=8)
    g = torch.Generator().manual_seed(9)
    rows = torch.randint(0, N, (T * k,), generator=g)
    here = torch.rand(T * k, generator=g) < 0.7
    codes = torch.where(here, encode_code(rows, ROW_IBEGIN[rows].long(), N), torch.randint(0, 50, (T * k,)))
    kern = CpuExpertKernel(2)
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    out, stats = torch.full((T, D), float("nan")), torch.zeros(5, dtype=torch.int64)
    kern.enqueue(x, codes, w, gate_up, down, out=out, ready=(ready, 1), done=(done, 1), stats=stats)
    ready[0] = 1
    wait_flag(done, 1)
    assert kern.queue_error() is None and int(stats[3]) == 0
    mine, r, ib = decode_codes(codes, N)
    tok = (torch.arange(T * k) // k)[mine].to(torch.int32)
    direct = kern.run(x, tok, r, w[mine].contiguous(), gate_up, down, i_begin=ib)
    assert torch.equal(out, direct)  # same plan, same bits
    ref = cpu_experts_reference(x, tok, r, w[mine], gate_up, down, i_begin=ib)
    torch.testing.assert_close(out, ref, rtol=0, atol=_tol(ref, dtype))
    distinct = torch.unique(r)
    assert int(stats[0]) == distinct.numel() and int(stats[1]) == int(mine.sum())
    assert int(stats[4]) == int((INTER - ROW_IBEGIN[distinct]).sum())


def test_queued_mismatched_i_begin_is_reported() -> None:
    """Two routes of one row with different i_begin: the batch fails (zeros, done set, error reported)."""
    _native_or_skip()
    x, _, _, _, gate_up, down = _case(2, N, torch.float32, seed=12)
    codes = torch.tensor([encode_code(2, 0, N), encode_code(2, 16, N), 5, encode_code(1, 3, N)])
    ready, done = torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    out = torch.full((2, D), 5.0)
    kern = CpuExpertKernel(2)
    kern.enqueue(x, codes, torch.rand(4), gate_up, down, out=out, ready=(ready, 1), done=(done, 1))
    kern.drain()
    assert int(done[0]) == 1 and torch.equal(out, torch.zeros(2, D))
    err = kern.queue_error()
    assert err is not None and "differing within a pool row" in err


# Run in a child process: gate/up weight rows below each row's i_begin lie on pages made unreadable
# (PROT_NONE; one weight row = one page), so reading any of them kills the child with SIGSEGV.
_NO_READ_CHILD = """
import ctypes, mmap, sys
import torch
from freetoken.experts.cpu.kernel import CpuExpertKernel, cpu_experts_reference
dtype = getattr(torch, sys.argv[1])
esize = torch.empty(0, dtype=dtype).element_size()
D, I, N, T = mmap.PAGESIZE // esize, 48, 3, 4
ib_of_row = [17, 32, 48]
buf = mmap.mmap(-1, N * 2 * I * D * esize)
gate_up = torch.frombuffer(buf, dtype=dtype).view(N, 2 * I, D)
g = torch.Generator().manual_seed(0)
gate_up.copy_(torch.randn(N, 2 * I, D, generator=g) / D**0.5)
down = (torch.randn(N, D, I, generator=g) / I**0.5).to(dtype)
x = torch.randn(T, D, generator=g)
tok = torch.arange(T, dtype=torch.int32).repeat_interleave(N)
row = torch.arange(N).repeat(T)
w = torch.rand(T * N, generator=g)
ib = torch.tensor(ib_of_row, dtype=torch.int32)[row].contiguous()
ref = cpu_experts_reference(x, tok, row, w, gate_up.clone(), down, i_begin=ib)
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
row_bytes = D * esize
for r, b in enumerate(ib_of_row):
    for first in (r * 2 * I, r * 2 * I + I):  # gate rows [0, b), up rows [I, I + b) of expert r
        assert libc.mprotect(gate_up.data_ptr() + first * row_bytes, b * row_bytes, 0) == 0
out = CpuExpertKernel(2).run(x, tok, row, w, gate_up, down, i_begin=ib)
tol = (2e-6 if dtype == torch.float32 else 5e-5) * max(1.0, float(ref.abs().max()))
print("max err", float((out - ref).abs().max()), "tol", tol)
sys.exit(0 if float((out - ref).abs().max()) <= tol else 3)
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_below_i_begin_are_never_read(dtype: str) -> None:
    _native_or_skip()
    src = str(Path(kmod.__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", _NO_READ_CHILD, dtype], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != -signal.SIGSEGV, "the kernel read a weight row below i_begin"
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


def test_every_isa_translation_unit_compiles(tmp_path) -> None:
    """AVX-512 code cannot run on a machine without it, but it must still build (a TU that fails to compile
    is silently left out of the library)."""
    cxx = build.find_compiler()
    if cxx is None or not build._is_x86():
        pytest.skip("needs an x86 C++ compiler")
    for src, (flags, _) in build.ISA_SOURCES.items():
        ok, err = build._compile(cxx, src, flags, tmp_path / f"{src}.o")
        assert ok, f"{src} failed to compile:\n{err}"
