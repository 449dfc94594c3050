"""CPU expert kernel vs torch F.linear, and vs the machine's streaming read bandwidth (same run).

Effective GB/s = expert weight bytes read / time. Qwen3-30B-A3B expert shape (D=2048, I=768, bf16),
top-8 routes per token, batch 1 and 4; routes walk a pool much larger than L3 in order (an expert
comes back only after all others), so every call streams its weights from DRAM. Kernel and torch
calls alternate in one loop (same noise), and so do streaming reads of 256 MiB slices of
--read-gib of distinct data (the faster of a parallel uint64 sum on the kernel's own threads and
torch's int64 sum on as many); medians over --iters of each.

    PYTHONPATH=src python bench/cpu_kernel.py [--threads 1,2] [--read-gib 4] [--pool-gib 1.25] [--seq 12]

--seq N times N calls back to back, as a decode step calls the kernel once per MoE layer: a single call
pays the workers' wake-up and its phases' ramp once for only top-k experts.

Each thread count runs in its own process. torch's OpenMP threads spin for a while after each call
and slow down whatever runs next on their cores (here: the kernel); OMP_WAIT_POLICY=PASSIVE shows
the kernel without that (and torch without its spinning).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from freetoken.experts.cpu.kernel import CpuExpertKernel, Scales
from freetoken.hardware.cpus import physical_cores
from freetoken.hardware.huge_pages import advise_huge_pages


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


class Routes:
    """Routes for `batch` tokens x top-k experts, walking the pool in order: an expert is read again
    only after every other one was, so the reuse distance is the whole pool (>> L3, no cache hits)."""

    def __init__(self, num_experts: int, top_k: int, seed: int = 0) -> None:
        self.n, self.k, self.cursor = num_experts, top_k, 0
        self.gen = torch.Generator().manual_seed(seed)

    def next(self, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = (self.cursor + torch.arange(batch * self.k)) % self.n  # distinct while batch*k <= n
        self.cursor = (self.cursor + batch * self.k) % self.n
        tok = torch.arange(batch, dtype=torch.int32).repeat_interleave(self.k)
        return tok, rows.contiguous(), torch.rand(batch * self.k, generator=self.gen)


# After a torch call its OpenMP threads spin a while on the same cores (libgomp: GOMP_SPINCOUNT pauses,
# ~10-20 ms; Intel's runtime: KMP_BLOCKTIME, 200 ms); let them go to sleep before the next measurement, so
# no configuration is timed against another's spinning threads (with 2 ms, the first kernel measured after
# a torch call at 16 threads on the 16-core GPU box read 25% less than the same kernel measured next).
OMP_SETTLE_S = 0.25


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class StreamRead:
    """Streaming read on the kernel's threads (our C++ sum) and torch's int64 sum (as many threads),
    over rotating `chunk`-byte slices of `buf`, so reads interleave with the other measurements."""

    def __init__(self, kern: CpuExpertKernel, buf: torch.Tensor, chunk: int = 256 * 2**20) -> None:
        self.kern, self.buf, self.chunk, self.i = kern, buf, min(chunk, buf.numel()), 0

    def gbps(self) -> float:
        """The faster of the two reads of the next two slices."""
        n = self.buf.numel() // self.chunk
        a = self.buf[(self.i % n) * self.chunk :][: self.chunk]
        b = self.buf[((self.i + 1) % n) * self.chunk :][: self.chunk]
        self.i += 2
        ours = timed(lambda: self.kern.stream_read(a))
        theirs = timed(lambda: b.view(torch.int64).sum())
        time.sleep(OMP_SETTLE_S)
        return self.chunk / min(ours, theirs) / 1e9


Banks = tuple[torch.Tensor, torch.Tensor]


def make_banks(num_experts: int, D: int, inter: int, huge: bool) -> Banks:
    """Random bf16 banks; ``huge``: advised onto huge pages before their first write (as the engine's pool)."""
    gen = torch.Generator().manual_seed(0)
    gate_up = torch.empty(num_experts, 2 * inter, D, dtype=torch.bfloat16)
    down = torch.empty(num_experts, D, inter, dtype=torch.bfloat16)
    for t, k in ((gate_up, D), (down, inter)):
        if huge:
            advise_huge_pages(t)
        for e in range(num_experts):
            t[e] = torch.randn(t.shape[1:], generator=gen).div_(k**0.5)
    return gate_up, down


def bench_threads(args: argparse.Namespace, n: int, banks: dict[str, Banks], buf: torch.Tensor) -> list[str]:
    gate_up, down = next(iter(banks.values()))  # torch's baseline and the shapes
    # exactly n threads, like torch; one kernel per row blocking, each called on every page setting's banks, in
    # turn in one loop
    kerns = [CpuExpertKernel(num_threads=n, isa=args.isa, caller_helps=False, rows=r) for r in args.rows]
    variants = [(kern, pages, b, "call") for kern in kerns for pages, b in banks.items()]
    if args.queued:  # the engine's arrangement for cpu_threads = n: n - 1 workers + the helping feeder
        queues = [CpuExpertKernel(num_threads=max(1, n - 1), isa=args.isa, rows=r) for r in args.rows]
        variants += [(kern, pages, b, "queue") for kern in queues for pages, b in banks.items()]
    helped = CpuExpertKernel(num_threads=n, isa=args.isa, caller_helps=True)  # n workers + the waiting caller
    torch.set_num_threads(n)
    expert_bytes = (gate_up[0].numel() + down[0].numel()) * gate_up.element_size()
    stream = StreamRead(kerns[0], buf)
    for _ in range(buf.numel() // stream.chunk // 2):  # warm-up: touch the whole buffer once
        stream.gbps()

    def gbps(walk: Routes, x: torch.Tensor, fn: Callable[..., object], b: Banks = (gate_up, down),
             queue: CpuExpertKernel | None = None) -> float:  # fmt: skip
        """--seq calls back to back (a decode step's layers: the pool stays hot between them); with
        ``queue``, all queued at once and run by its feeder, as the engine's decode layers are."""
        calls = [walk.next(x.shape[0]) for _ in range(args.seq)]
        nbytes = sum(torch.unique(row).numel() for _, row, _ in calls) * expert_bytes
        if queue is not None:
            return nbytes / timed(queued_run(queue, x, calls, b)) / 1e9

        def run() -> None:
            for tok, row, w in calls:
                fn(x, tok, row, w, *b)

        return nbytes / timed(run) / 1e9

    lines = []
    for batch in (1, 4):
        walk = Routes(gate_up.shape[0], args.top_k, seed=batch)  # kernels and torch share one walk
        x = torch.randn(batch, gate_up.shape[2])
        ours: list[list[float]] = [[] for _ in variants]
        plus, base, reads = [], [], []
        for _ in range(args.iters):
            for k, (kern, _, kb, mode) in enumerate(variants):
                ours[k].append(gbps(walk, x, kern.run, kb, kern if mode == "queue" else None))
            plus.append(gbps(walk, x, helped.run))
            base.append(gbps(walk, x, torch_experts))
            time.sleep(OMP_SETTLE_S)
            reads.append(stream.gbps())
        b, r = statistics.median(base), statistics.median(reads)
        for (kern, pages, _, mode), vals in zip(variants, ours):
            g = statistics.median(vals)
            ratios = [f"{g / b:.2f}x", f"{r:.1f}", f"{g / r:.0%}", f"{statistics.median(plus):.1f}"]
            cells = [str(n), kern.isa, str(kern.rows), pages, mode, str(batch), f"{g:.1f}"]
            cells.append(f"{b:.1f}")
            cells += ratios
            lines.append("| " + " | ".join(cells) + " |")
    for kern in {id(v[0]): v[0] for v in variants}.values():
        kern.close()
    helped.close()
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
    p.add_argument("--seq", type=int, default=1,
                   help="calls timed back to back per measurement (e.g. 12: a decode step's MoE layers)")  # fmt: skip
    p.add_argument(
        "--rows",
        type=lambda t: [int(v) for v in t.split(",")],
        default=[None],
        help="batch-1 row blockings to compare, e.g. 1,2,4 (default: the kernel's, 4 on Intel AVX-512, else 1)",
    )
    p.add_argument("--huge-pages", type=_pages_list, default=["4K"],
                   help="pool page settings to compare: off, on or off,on (on: madvise'd huge pages, as the engine "
                        "allocates its pool; the streaming read's buffer too)")  # fmt: skip
    p.add_argument("--queued", action="store_true",
                   help="also time each kernel as decode drives it: --seq batches queued at once, run by the "
                        "kernel's feeder (n - 1 workers + the feeder: the engine's cpu_threads = n)")  # fmt: skip
    p.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)  # child process mode
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, physical_cores()})
    D, inter = args.hidden, args.inter
    expert_bytes = 3 * D * inter * 2
    num_experts = max(args.top_k * 4, int(args.pool_gib * 2**30 / expert_bytes))
    if not args.rows_only:
        print(f"# {' '.join(sys.argv)}")
        pool_gib = num_experts * expert_bytes / 2**30
        mb = expert_bytes / 1e6
        print(f"# expert {D}x{inter} bf16 {mb:.1f} MB; pool {num_experts} experts, {pool_gib:.2f} GiB")
        print(f"# top-{args.top_k}, read buffer {args.read_gib} GiB, {args.iters} iters (median)")
        print("| threads | isa | rows | pages | calls | batch | kernel GB/s | torch F.linear GB/s "
              "| kernel/torch | stream read GB/s | kernel/stream | kernel + waiting caller GB/s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    if len(threads) > 1:
        # one process per thread count: torch's OpenMP team and our pools from one configuration
        # must not linger into the next
        for n in threads:
            cmd = [sys.executable, __file__, *strip_threads(argv), "--threads", str(n), "--rows-only"]
            subprocess.run(cmd, check=True)
        return 0
    banks = {pages: make_banks(num_experts, D, inter, pages == "2M") for pages in args.huge_pages}
    buf = torch.empty(int(args.read_gib * 2**30), dtype=torch.uint8)
    if "2M" in args.huge_pages:  # the streaming read on the faster pages too
        advise_huge_pages(buf)
    buf.fill_(1)
    for line in bench_threads(args, threads[0], banks, buf):
        print(line, flush=True)
    return 0


def queued_run(kern: CpuExpertKernel, x: torch.Tensor, calls: Sequence[tuple[torch.Tensor, ...]],
               b: Banks, scales: Scales | None = None) -> Callable[[], None]:  # fmt: skip
    """Every call queued with its ready flag already reached (decode's stream-ordered branch, minus the GPU):
    the feeder starts each batch as soon as the previous one is done; returns when all are."""
    ready = torch.ones(1, dtype=torch.int32)
    done = torch.zeros(len(calls), dtype=torch.int32)
    prepared = [((-1 - row).to(torch.int64), w.float(), torch.empty(x.shape)) for _, row, w in calls]

    def run() -> None:
        for i, (codes, w, out) in enumerate(prepared):
            kern.enqueue(x, codes, w, b[0], b[1], out, ready=(ready, 1), done=(done[i : i + 1], 1), scales=scales)
        kern.drain()

    return run


def _pages_list(text: str) -> list[str]:
    names = {"off": "4K", "on": "2M"}
    items = [v.strip() for v in text.split(",")]
    if not items or any(v not in names for v in items):
        raise argparse.ArgumentTypeError(f"--huge-pages takes off, on or off,on, got {text!r}")
    return [names[v] for v in items]


def strip_threads(argv: list[str] | None) -> list[str]:
    """The command line without its --threads option (either form: `--threads 1,2`, `--threads=1,2`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--threads":
            skip = True
        elif not a.startswith("--threads="):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
