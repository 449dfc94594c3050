"""CPU expert kernel on fp8 e4m3 experts with 128x128 block scales, vs torch dequantise-then-F.linear, vs the bf16
kernel on the same shape, vs the machine's streaming read (same run).

GB/s count the bytes as the pool holds them: packed fp8 bytes plus scales for the fp8 figures, bf16 bytes for
the bf16 kernel (so fp8/bf16 experts per second is the gain the format brings). Qwen3-30B-A3B expert shape (D=2048,
I=768), top-8 routes per token, batch 1 and 4, routes walking a pool much larger than L3 in order (every call
streams from DRAM), variants alternating in one loop, medians over --iters (``bench/cpu_kernel.py`` says more on
the method; its helpers are used here).

    PYTHONPATH=src python bench/cpu_fp8.py [--threads 2] [--iters 15] [--pool-gib 1.0] [--read-gib 2]

The torch baseline dequantises each routed expert with the format's reference (``quant/fp8_block.py``) to bf16
and runs F.linear on it: what an engine without an fp8 CPU kernel does.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_kernel import OMP_SETTLE_S, Routes, StreamRead, queued_run, strip_threads, timed  # noqa: E402
from freetoken.experts.cpu.kernel import CpuExpertKernel  # noqa: E402
from freetoken.hardware.cpus import physical_cores  # noqa: E402
from freetoken.hardware.huge_pages import advise_huge_pages  # noqa: E402
from freetoken.quant import FP8_BLOCK_128  # noqa: E402

Fp8Banks = tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


def torch_dequant_experts(x: torch.Tensor, tok: torch.Tensor, row: torch.Tensor, w: torch.Tensor,
                          b: Fp8Banks) -> torch.Tensor:  # fmt: skip
    """The baseline: per distinct expert, dequantise to bf16 (the format's reference), then F.linear."""
    gate_up, down, (gs, ds) = b
    inter = down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32)
    xb = x.bfloat16()
    for r in torch.unique(row).tolist():
        sel = (row == r).nonzero().squeeze(1)
        t = tok[sel].long()
        gu = F.linear(xb[t], FP8_BLOCK_128.dequantize(gate_up[r], gs[r], torch.bfloat16))
        dn = FP8_BLOCK_128.dequantize(down[r], ds[r], torch.bfloat16)
        out.index_add_(0, t, F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], dn).float() * w[sel, None])
    return out


def make_fp8_banks(num_experts: int, D: int, inter: int) -> Fp8Banks:
    """Random experts rounded to e4m3 with their block scales, on huge pages (as the engine's pool)."""
    gen = torch.Generator().manual_seed(0)
    gate_up = torch.empty(num_experts, 2 * inter, D, dtype=torch.float8_e4m3fn)
    down = torch.empty(num_experts, D, inter, dtype=torch.float8_e4m3fn)
    gs = torch.empty(num_experts, 2 * inter // 128, D // 128)
    ds = torch.empty(num_experts, D // 128, inter // 128)
    for t in (gate_up, down):
        advise_huge_pages(t)
    for e in range(num_experts):
        for bank, scale, k in ((gate_up, gs, D), (down, ds, inter)):
            q, s = FP8_BLOCK_128.quantize(torch.randn(bank.shape[1:], generator=gen).div_(k**0.5))
            assert s is not None
            bank[e].view(torch.uint8).copy_(q.view(torch.uint8))
            scale[e] = s
    return gate_up, down, (gs, ds)


def run_threads(args: argparse.Namespace, n: int) -> list[str]:
    D, inter = args.hidden, args.inter
    fp8_bytes = 3 * D * inter + (3 * D * inter // (128 * 128)) * 4
    bf16_bytes = 3 * D * inter * 2
    experts = max(args.top_k * 4, int(args.pool_gib * 2**30 / fp8_bytes))
    fp8 = make_fp8_banks(experts, D, inter)
    bf16_experts = max(args.top_k * 4, int(args.pool_gib * 2**30 / bf16_bytes))
    gen = torch.Generator().manual_seed(1)
    bf16 = tuple(torch.randn(bf16_experts, *s, generator=gen).div_(k**0.5).bfloat16()
                 for s, k in (((2 * inter, D), D), ((D, inter), inter)))  # fmt: skip
    buf = torch.empty(int(args.read_gib * 2**30), dtype=torch.uint8)
    advise_huge_pages(buf)
    buf.fill_(1)
    kern = CpuExpertKernel(num_threads=n, isa=args.isa, caller_helps=False)
    # as decode drives it (cpu_threads = n): n - 1 workers + the helping feeder, every layer's batch queued at once
    queue = CpuExpertKernel(num_threads=max(1, n - 1), isa=args.isa)
    torch.set_num_threads(n)
    stream = StreamRead(kern, buf)
    for _ in range(buf.numel() // stream.chunk // 2):  # warm-up: touch the whole buffer once
        stream.gbps()

    def gbps(walk: Routes, x: torch.Tensor, fn: Callable[..., object], nbytes_per_expert: int,
             queued: bool = False) -> float:  # fmt: skip
        calls = [walk.next(x.shape[0]) for _ in range(args.seq)]
        nbytes = sum(torch.unique(row).numel() for _, row, _ in calls) * nbytes_per_expert
        if queued:
            return nbytes / timed(queued_run(queue, x, calls, (gu8, dn8), scales)) / 1e9

        def run() -> None:
            for tok, row, w in calls:
                fn(x, tok, row, w)

        return nbytes / timed(run) / 1e9

    gu8, dn8, scales = fp8
    lines = []
    for batch in (1, 4):
        w8, w16 = Routes(experts, args.top_k, seed=batch), Routes(bf16_experts, args.top_k, seed=batch)
        x = torch.randn(batch, D)
        k8, k16, q8, base, reads = [], [], [], [], []
        for it in range(args.iters):
            kernels = [(k8, w8, lambda x, t, r, w: kern.run(x, t, r, w, gu8, dn8, scales=scales), fp8_bytes),
                       (k16, w16, lambda x, t, r, w: kern.run(x, t, r, w, *bf16), bf16_bytes)]  # fmt: skip
            for vals, walk, fn, nb in kernels[:: 1 if it % 2 else -1]:  # alternate: no variant always runs first
                vals.append(gbps(walk, x, fn, nb))
            q8.append(gbps(w8, x, kern.run, fp8_bytes, queued=True))
            base.append(gbps(w8, x, lambda x, t, r, w: torch_dequant_experts(x, t, r, w, fp8), fp8_bytes))
            time.sleep(OMP_SETTLE_S)
            reads.append(stream.gbps())
        g8, g16, gq, b, r = (statistics.median(v) for v in (k8, k16, q8, base, reads))
        per_expert = (g8 / fp8_bytes) / (g16 / bf16_bytes)
        cells = [str(n), kern.isa, str(batch), f"{g8:.1f}", f"{b:.2f}", f"{g8 / b:.1f}x", f"{r:.1f}", f"{g8 / r:.0%}",
                 f"{gq:.1f}", f"{gq / r:.0%}", f"{g16:.1f}", f"{per_expert:.2f}x"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    kern.close()
    queue.close()
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default=None, help="thread counts, e.g. 6,16 (default: <physical cores>)")
    p.add_argument("--read-gib", type=float, default=2.0, help="GiB of distinct data for the streaming read")
    p.add_argument("--pool-gib", type=float, default=1.0, help="GiB of experts to cycle over, per format (>> L3)")
    p.add_argument("--iters", type=int, default=15, help="measurements per variant (median reported)")
    p.add_argument("--isa", default="auto", help="auto, avx2, avx512, avx512bf16, generic")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--seq", type=int, default=4, help="calls timed back to back per measurement")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process: one thread count
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else [physical_cores()]
    if not args.one:
        print(f"# {' '.join(sys.argv)}")
        print(f"# expert {args.hidden}x{args.inter}, fp8 e4m3 + 128x128 scales vs bf16; top-{args.top_k}; "
              f"{args.iters} iters (median), {args.seq} calls each")  # fmt: skip
        print("| threads | isa | batch | fp8 kernel GB/s | torch dequant+F.linear GB/s | kernel/torch "
              "| stream read GB/s | fp8 kernel/stream | fp8 queued GB/s | queued/stream | bf16 kernel GB/s "
              "| fp8/bf16 experts/s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    if len(threads) > 1 or not args.one:
        for n in threads:  # one process per thread count (torch's OpenMP team must not linger)
            cmd = [sys.executable, __file__, *strip_threads(argv), "--threads", str(n), "--one"]
            subprocess.run(cmd, check=True)
        return 0
    for line in run_threads(args, threads[0]):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
