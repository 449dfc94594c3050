"""CPU expert kernel per quantised expert format (fp8 e4m3 + 128x128 block scales, MXFP4, NVFP4), vs torch
dequantise-then-F.linear, vs the bf16 kernel on the same shape, vs the machine's streaming read (same run).

GB/s count the bytes as the pool holds them: packed bytes plus scales for a quantised format, bf16 bytes for the
bf16 kernel (so format/bf16 experts per second is the gain the format brings). Qwen3-30B-A3B expert shape (D=2048,
I=768), top-8 routes per token, batch 1 and 4, routes walking a pool much larger than L3 in order (every call
streams from DRAM), variants alternating in one loop, medians over --iters (``bench/cpu_kernel.py`` says more on
the method; its helpers are used here). Banks are the benchmark's synthetic ones (``bench/synthetic.py``: random
experts rounded by the format's own quantiser), on huge pages as the engine's pool.

    PYTHONPATH=src python bench/cpu_formats.py [--formats fp8_block,mxfp4,nvfp4] [--threads 2] [--iters 15]
        [--pool-gib 1.0] [--read-gib 2] [--isa avx2]

A second table gives the queued batches' median timeline per format, thread count and batch (the feeder's batch
trace: the plan, the operands' step, the three phases, the busy time): where a call's time goes beside its bytes.

The torch baseline dequantises each routed expert with the format's reference (``quant/``) to bf16 and runs
F.linear on it: what an engine without a kernel for the format does.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_kernel import OMP_SETTLE_S, Routes, StreamRead, queued_run, strip_threads, timed  # noqa: E402
from freetoken.bench.presets import MoEShape  # noqa: E402
from freetoken.bench.synthetic import random_banks  # noqa: E402
from freetoken.experts.base import ExpertBanks  # noqa: E402
from freetoken.experts.cpu.kernel import CpuExpertKernel  # noqa: E402
from freetoken.hardware.cpus import physical_cores  # noqa: E402
from freetoken.hardware.huge_pages import advise_huge_pages  # noqa: E402

TRACE = "#trace "  # a child process's timeline rows, which the parent prints as a table of their own


def torch_dequant_experts(x: torch.Tensor, tok: torch.Tensor, row: torch.Tensor, w: torch.Tensor,
                          banks: ExpertBanks) -> torch.Tensor:  # fmt: skip
    """The baseline: per distinct expert, dequantise to bf16 (the format's reference), then F.linear."""
    inter = banks.intermediate_size
    out = torch.zeros(x.shape, dtype=torch.float32)
    xb = x.bfloat16()
    for r in torch.unique(row).tolist():
        sel = (row == r).nonzero().squeeze(1)
        t = tok[sel].long()
        gu, dn = banks.dequantized(slice(r, r + 1), torch.bfloat16)
        h = F.linear(xb[t], gu[0])
        out.index_add_(0, t, F.linear(F.silu(h[:, :inter]) * h[:, inter:], dn[0]).float() * w[sel, None])
    return out


def make_banks(fmt: str, D: int, inter: int, pool_gib: float, top_k: int) -> ExpertBanks:
    """Random experts in ``fmt`` (rounded by its quantiser, scales and all), enough to fill ``pool_gib``."""
    shape = MoEShape(fmt, D, inter, experts=1, top_k=top_k, layers=1, weights=fmt)
    experts = max(top_k * 4, int(pool_gib * 2**30 / shape.expert_bytes()))
    shape = MoEShape(fmt, D, inter, experts=experts, top_k=top_k, layers=1, weights=fmt)
    return random_banks(shape, 1, torch.bfloat16)


def run_threads(args: argparse.Namespace, n: int) -> tuple[list[str], list[str]]:
    """(the kernel table's rows, the queued batches' timeline rows) on ``n`` threads."""
    D, inter = args.hidden, args.inter
    banks = {f: make_banks(f, D, inter, args.pool_gib, args.top_k) for f in args.formats.split(",")}
    bf16 = make_banks("bf16", D, inter, args.pool_gib, args.top_k)
    buf = torch.empty(int(args.read_gib * 2**30), dtype=torch.uint8)
    advise_huge_pages(buf)
    buf.fill_(1)
    kern = CpuExpertKernel(num_threads=n, isa=args.isa, caller_helps=False)
    # as decode drives it (cpu_threads = n): n - 1 workers + the helping feeder, every layer's batch queued at once
    queue = CpuExpertKernel(num_threads=max(1, n - 1), isa=args.isa)
    queue.trace(1 << 12)  # the queued batches' timelines: where a batch's time goes (experts/cpu/batch_trace.py)
    traces: dict[tuple[str, int], list[torch.Tensor]] = {}
    torch.set_num_threads(n)
    stream = StreamRead(kern, buf)
    for _ in range(buf.numel() // stream.chunk // 2):  # warm-up: touch the whole buffer once
        stream.gbps()

    def scales(b: ExpertBanks) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if b.gate_up_scale is None or b.down_scale is None else (b.gate_up_scale, b.down_scale)

    def gbps(walk: Routes, x: torch.Tensor, b: ExpertBanks, how: str) -> float:
        """``how``: "kernel" (one call after another), "queued" (as decode queues a step's layers) or "torch"."""
        calls = [walk.next(x.shape[0]) for _ in range(args.seq)]
        nbytes = sum(torch.unique(row).numel() for _, row, _ in calls) * b.expert_bytes
        if how == "queued":
            queue.take_trace()  # drop what earlier runs left
            g = nbytes / timed(queued_run(queue, x, calls, (b.gate_up, b.down), scales(b))) / 1e9
            traces.setdefault((b.fmt.name, x.shape[0]), []).append(queue.take_trace())
            return g

        def run() -> None:
            for tok, row, w in calls:
                if how == "torch":
                    torch_dequant_experts(x, tok, row, w, b)
                else:
                    kern.run(x, tok, row, w, b.gate_up, b.down, scales=scales(b))

        return nbytes / timed(run) / 1e9

    lines = []
    for batch in (1, 4):
        x = torch.randn(batch, D)
        walks = {f: Routes(b.gate_up.shape[0], args.top_k, seed=batch) for f, b in {**banks, "bf16": bf16}.items()}
        vals: dict[tuple[str, str], list[float]] = {}
        reads = []
        for it in range(args.iters):
            order = [*banks, "bf16"]
            for f in order[:: 1 if it % 2 else -1]:  # alternate: no variant always runs first
                vals.setdefault((f, "kernel"), []).append(gbps(walks[f], x, banks.get(f, bf16), "kernel"))
            for f, b in banks.items():
                vals.setdefault((f, "queued"), []).append(gbps(walks[f], x, b, "queued"))
            # the torch baselines last: torch's OpenMP threads spin on after it for a while, and a queued run right
            # after one shared the cores with them (NVFP4 queued read half its rate at 16 threads, 2026-12-07)
            for f, b in banks.items():
                if it < 2:  # the baseline is 100x+ slower: two measurements say enough
                    vals.setdefault((f, "torch"), []).append(gbps(walks[f], x, b, "torch"))
            time.sleep(OMP_SETTLE_S)
            reads.append(stream.gbps())
        med = {k: statistics.median(v) for k, v in vals.items()}
        r, g16 = statistics.median(reads), med[("bf16", "kernel")]
        for f, b in banks.items():
            g, gq, base = med[(f, "kernel")], med[(f, "queued")], med[(f, "torch")]
            per_expert = (g / b.expert_bytes) / (g16 / bf16.expert_bytes)
            cells = [f, str(n), kern.isa, str(batch), f"{g:.1f}", f"{base:.2f}", f"{g / base:.1f}x", f"{r:.1f}",
                     f"{g / r:.0%}", f"{gq:.1f}", f"{gq / r:.0%}", f"{g16:.1f}", f"{per_expert:.2f}x"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    kern.close()
    queue.close()
    return lines, trace_lines(traces, banks, n)


def trace_lines(traces: dict[tuple[str, int], list[torch.Tensor]], banks: dict[str, ExpertBanks], n: int) -> list[str]:
    """The queued batches' median timeline per format and batch (``batch_trace.summarize``), as table rows: the
    start (the plan), the operands' step (x in the path's form), the three phases, the busy time and its GB/s."""
    from freetoken.experts.cpu.batch_trace import summarize

    lines = []
    for (fmt, batch), ts in traces.items():
        b = next(v for v in banks.values() if v.fmt.name == fmt)
        for r in summarize(torch.cat(ts), b.expert_bytes):
            parts = [f"{r.us[k]:.1f}" for k in ("start", "split", "phase1", "phase2", "phase3", "done", "busy")]
            cells = [fmt, str(n), str(batch), str(r.experts), str(r.batches), *parts, f"{r.gb_s:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default="fp8_block,mxfp4,nvfp4", help="quantised formats (quant.format_by_name)")
    p.add_argument("--threads", default=None, help="thread counts, e.g. 6,16 (default: <physical cores>)")
    p.add_argument("--read-gib", type=float, default=2.0, help="GiB of distinct data for the streaming read")
    p.add_argument("--pool-gib", type=float, default=1.0, help="GiB of experts to cycle over, per format (>> L3)")
    p.add_argument("--iters", type=int, default=15, help="measurements per variant (median reported)")
    p.add_argument("--isa", default="auto", help="auto, avx2, avx2vnni, avx512, avx512vbmi, avx512bf16, generic")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=768)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--seq", type=int, default=4, help="calls timed back to back per measurement")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process: one thread count
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else [physical_cores()]
    if not args.one:
        print(f"# {' '.join(sys.argv)}")
        print(f"# expert {args.hidden}x{args.inter}, each format vs bf16; top-{args.top_k}; "
              f"{args.iters} iters (median), {args.seq} calls each; GB/s of packed bytes + scales")  # fmt: skip
        print("| format | threads | isa | batch | kernel GB/s | torch dequant+F.linear GB/s | kernel/torch "
              "| stream read GB/s | kernel/stream | queued GB/s | queued/stream | bf16 kernel GB/s "
              "| experts/s vs bf16 |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    if len(threads) > 1 or not args.one:
        timelines: list[str] = []
        for n in threads:  # one process per thread count (torch's OpenMP team must not linger)
            cmd = [sys.executable, __file__, *strip_threads(argv), "--threads", str(n), "--one"]
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()
            print("\n".join(line for line in out if not line.startswith(TRACE)), flush=True)
            timelines += [line[len(TRACE) :] for line in out if line.startswith(TRACE)]
        print("\nThe queued batches' median timeline, µs (experts/cpu/batch_trace.py; start: ready flag to phase 1)")
        print("| format | threads | batch | experts | batches | start | operands | phase 1 | phase 2 | phase 3 | done "
              "| busy | GB/s busy |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
        print("\n".join(timelines), flush=True)
        return 0
    kernel_rows, trace_rows = run_threads(args, threads[0])
    print("\n".join(kernel_rows + [TRACE + line for line in trace_rows]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
