"""What the CPU expert kernel runs by default on this CPU: the ISA path per kind of bank and the batch-1 row blocking,
each chosen by measurement (figures in docs/benchmarks.md)."""

from __future__ import annotations

from freetoken.experts.cpu.library import best_isa, isa_supported
from freetoken.hardware.cpus import cpu_vendor


def widening_isa() -> str:
    """The best ISA whose bf16 banks widen to float32 exactly (the same bits as float32 banks): the best one but
    AVX512-BF16, whose dot-product path splits the float32 operand into two bf16 halves."""
    best = best_isa()
    return "avx512" if best == "avx512bf16" else best


def auto_isa(fp4: bool) -> str:
    """``isa="auto"`` for a kernel: the best ISA, except that FP4 banks on Intel cores with AVX-512 take the AVX-512
    integer path (``dot_fp4_avx512.h``: ``vpshufb`` decode, int16 operands), not AVX512-BF16's. There ``vpermw``
    (the AVX512-BF16 path's decode, ``dot_fp4_dp.h``) is two port-5 uops where AMD's Zen 4 runs it in one: on the GPU
    box's Intel host AVX2's ``vpshufb`` decode beat it in every row (2026-12-07, 0b63574: one thread in L2 9.7 vs 6.4
    packed GB/s MXFP4, 7.9 vs 5.9 NVFP4), and the AVX-512 integer path beats or ties AVX2 (2026-12-07, 687c3b7,
    ``bench/cpu_formats.py``, packed GB/s AVX-512 / AVX2: 6 threads batch 1 MXFP4 22.8 / 22.4, NVFP4 28.3 / 21.0,
    batch 4 25.6 / 24.9, 32.5 / 22.4; 16 threads batch 1 MXFP4 34.9 / 39.4 (queued as decode runs it 44.8 / 44.1),
    NVFP4 43.9 / 38.8, batch 4 55.8 / 55.7, 68.9 / 50.6; one thread in L2, K 2,048: 11.9 / 8.7 and 11.1 / 4.0).
    Where the core also has AVX512-VBMI and VNNI, FP4 takes that path's ``vpdpwssd`` form (``isa_avx512vbmi.h``: the
    same bits, ``vpermb`` decode; ``run.sh vbmi``, 2026-12-08, 3cca14c: the dot products alone 1.1-1.35x the plain
    form at 6 threads, the kernel 0.93-1.11x per row, 1.03x on average, gpt-oss's experts 1.00-1.09x). AVX-VNNI's
    form of the AVX2 path (``isa_avx2vnni.h``) is chosen by name until ``run.sh vbmi`` with ``PAIR=avx2`` has timed
    it: FP4 banks where AVX-VNNI is the best ISA take AVX2."""
    best = best_isa()
    if fp4 and best == "avx2vnni":
        return "avx2"
    if not (fp4 and best in ("avx512", "avx512vbmi", "avx512bf16") and cpu_vendor() == "GenuineIntel"):
        return "auto"
    return "avx512vbmi" if isa_supported("avx512vbmi") else "avx512"


ROW_BLOCKS = (1, 2, 4)  # batch-1 weight rows streamed at once per thread (CpuExpertKernel rows)


def default_rows(isa: str) -> int:
    """Batch-1 row blocking by default: 4 on the AVX-512 paths of Intel cores, 1 elsewhere (where 4 was
    slower or no faster: ``bench/cpu_kernel.py --rows``, figures per machine in docs/benchmarks.md)."""
    return 4 if isa in ("avx512", "avx512vbmi", "avx512bf16") and cpu_vendor() == "GenuineIntel" else 1


# FP4 rows decode more than they read (a quarter of a bf16 row's bytes): one row alone leaves the vector units
# waiting on its own chain, so FP4 banks stream 4 rows at once (the ISA's cap: 2 on AVX2) on every CPU (dev box,
# whole kernel, 2 threads: 1.5x the packed GB/s of 1 row on AVX512-BF16; AVX2 no slower; docs/benchmarks.md).
DEFAULT_ROWS_FP4 = 4
