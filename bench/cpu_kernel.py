"""CPU expert kernel vs torch F.linear, and vs the machine's streaming read bandwidth (same run).

Effective GB/s = expert weight bytes read / time. Qwen3-30B-A3B expert shape (D=2048, I=768, bf16),
top-8 routes per token, batch 1 and 4; routes pick random experts from a pool much larger than L3,
so every call streams its weights from DRAM. Kernel and torch calls alternate in one loop (same
noise); medians over --iters. Streaming read = a parallel uint64 sum over --read-gib of distinct
data on the kernel's own threads.

    PYTHONPATH=src python bench/cpu_kernel.py [--threads 1,2] [--read-gib 4] [--pool-gib 1.25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from freetoken.experts.cpu.kernel import CpuExpertKernel
from freetoken.hardware.cpus import physical_cores


def torch_experts(x: torch.Tensor, tok: torch.Tensor, row: torch.Tensor, w: torch.Tensor,
                  gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The baseline: per distinct expert, F.linear on its contiguous bf16 weights (bf16 activations)."""
    inter = down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32)
    xb = x.bfloat16()
    for r in torch.unique(row).tolist():
        sel = (row == r).nonzero().squeeze(1)
        t = tok[sel].long()
        gu = F.linear(xb[t], gate_up[r])
        y = F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], down[r])
        out.index_add_(0, t, y.float() * w[sel, None])
    return out


def routes(batch: int, top_k: int, num_experts: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    rows = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(batch)])
    tok = torch.arange(batch, dtype=torch.int32).repeat_interleave(top_k)
    w = torch.rand(batch * top_k, generator=gen)
    return tok, rows.reshape(-1).contiguous(), w


def stream_gbps(kern: CpuExpertKernel, buf: torch.Tensor, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        kern.stream_read(buf)
        times.append(time.perf_counter() - t0)
    return buf.numel() / statistics.median(times) / 1e9


def bench_threads(args: argparse.Namespace, n: int, banks: tuple[torch.Tensor, torch.Tensor],
                  buf: torch.Tensor) -> list[str]:  # fmt: skip
    gate_up, down = banks
    kern = CpuExpertKernel(num_threads=n, isa=args.isa)
    torch.set_num_threads(n)
    expert_bytes = (gate_up[0].numel() + down[0].numel()) * gate_up.element_size()
    read = stream_gbps(kern, buf)
    lines = []
    for batch in (1, 4):
        gen = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, gate_up.shape[2])
        ours, base = [], []
        for _ in range(args.iters):
            tok, row, w = routes(batch, args.top_k, gate_up.shape[0], gen)
            nbytes = torch.unique(row).numel() * expert_bytes
            t0 = time.perf_counter()
            kern.run(x, tok, row, w, gate_up, down)
            t1 = time.perf_counter()
            tok2, row2, w2 = routes(batch, args.top_k, gate_up.shape[0], gen)
            nbytes2 = torch.unique(row2).numel() * expert_bytes
            t2 = time.perf_counter()
            torch_experts(x, tok2, row2, w2, gate_up, down)
            t3 = time.perf_counter()
            ours.append(nbytes / (t1 - t0) / 1e9)
            base.append(nbytes2 / (t3 - t2) / 1e9)
        k, b = statistics.median(ours), statistics.median(base)
        ratios = [f"{k / b:.2f}x", f"{read:.1f}", f"{k / read:.0%}"]
        cells = [str(n), kern.isa, str(batch), f"{k:.1f}", f"{b:.1f}", *ratios]
        lines.append("| " + " | ".join(cells) + " |")
    kern.close()
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default=None, help="thread counts, e.g. 1,2 (default: 1,<cores>)")
    p.add_argument("--read-gib", type=float, default=4.0, help="GiB of distinct data for the streaming read")
    p.add_argument("--pool-gib", type=float, default=1.25, help="GiB of experts to cycle over (>> L3)")
    p.add_argument("--iters", type=int, default=20, help="calls per configuration (median reported)")
    p.add_argument("--isa", default="auto", help="auto, avx2, avx512, avx512bf16, generic")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--top-k", type=int, default=8)
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, physical_cores()})
    D, inter = args.hidden, args.inter
    expert_bytes = 3 * D * inter * 2
    num_experts = max(args.top_k * 4, int(args.pool_gib * 2**30 / expert_bytes))
    gen = torch.Generator().manual_seed(0)
    gate_up = torch.randn(num_experts, 2 * inter, D, generator=gen).div_(D**0.5).bfloat16()
    down = torch.randn(num_experts, D, inter, generator=gen).div_(inter**0.5).bfloat16()
    buf = torch.ones(int(args.read_gib * 2**30), dtype=torch.uint8)
    print(f"# {' '.join(sys.argv)}")
    pool_gib = num_experts * expert_bytes / 2**30
    mb = expert_bytes / 1e6
    print(f"# expert {D}x{inter} bf16 {mb:.1f} MB; pool {num_experts} experts, {pool_gib:.2f} GiB")
    print(f"# top-{args.top_k}, read buffer {args.read_gib} GiB, {args.iters} iters (median)")
    print("| threads | isa | batch | kernel GB/s | torch F.linear GB/s | kernel/torch | stream read GB/s "
          "| kernel/stream |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n in threads:
        for line in bench_threads(args, n, (gate_up, down), buf):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
