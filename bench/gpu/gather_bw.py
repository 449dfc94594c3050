"""Fill bandwidth: the slot cache's gather kernel (SM loads from the pinned, mapped pool) against copy-engine
copies, on expert-sized rows (Qwen3-30B-A3B: gate_up 1536x2048 + down 2048x768 bf16, 9.4 MB).

    PYTHONPATH=src python3 bench/gpu/gather_bw.py [--experts 1,2,3] [--reps 40]

Every configuration is timed in turn inside one loop (same noise), reading rows no launch before it read
(so nothing comes from the GPU's L2); medians over the loop. Configurations: the production kernel
(``triton_copy.gather_rows_triton``) at its block / loads-per-program / warps settings, and
``cudaMemcpyAsync`` of the same rows (one copy per bank and expert; host-decided addresses, so not usable
inside the engine's device-planned step: the ceiling the gather is compared with).
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch

from freetoken.experts.host_pool import mapped_device_view
from freetoken.experts.slots.copy_triton import gather_rows_triton

DEFAULT_CONFIGS = "4096x8x4,4096x8x8,2048x8x4,8192x4x8,4096x16x8,1024x16x4"


def memcpy_rows(gu: torch.Tensor, dn: torch.Tensor, sgu: torch.Tensor, sdn: torch.Tensor, rows: list[int]) -> None:
    for j, e in enumerate(rows):
        sgu[j].copy_(gu[e], non_blocking=True)
        sdn[j].copy_(dn[e], non_blocking=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", default="1,2,3", help="rows per launch")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--pool", type=int, default=64, help="pool rows (pinned)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="block x loads-per-program x warps")  # fmt: skip
    args = p.parse_args()
    dev = torch.device("cuda")
    D, inter, n = 2048, 768, args.pool
    gu = torch.empty(n, 2 * inter, D, dtype=torch.bfloat16).pin_memory()
    dn = torch.empty(n, D, inter, dtype=torch.bfloat16).pin_memory()
    gu.view(torch.int16).random_(), dn.view(torch.int16).random_()
    mgu, mdn = mapped_device_view(gu, dev), mapped_device_view(dn, dev)
    slots = 8
    sgu = torch.empty(slots + 1, 2 * inter, D, dtype=torch.bfloat16, device=dev)
    sdn = torch.empty(slots + 1, D, inter, dtype=torch.bfloat16, device=dev)
    row_bytes = (gu[0].numel() + dn[0].numel()) * 2
    configs = [_config(c) for c in args.configs.split(",")]
    cursor = [0]

    def rows(q: int) -> list[int]:
        out = [(cursor[0] + j) % n for j in range(q)]
        cursor[0] = (cursor[0] + q) % n
        return out

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3

    print(f"# pool {n} rows of {row_bytes / 1e6:.1f} MB pinned; {args.reps} reps; medians; GB/s")
    names = [f"gather {c[0]}x{c[1]}x{c[2]}" for c in configs]
    print("| rows | " + " | ".join(names) + " | cudaMemcpyAsync |")
    print("|---" * (len(configs) + 2) + "|")
    for q in [int(v) for v in args.experts.split(",")]:
        res: list[list[float]] = [[] for _ in range(len(configs) + 1)]
        dst = torch.arange(q, dtype=torch.int64, device=dev)
        count = torch.tensor(q, dtype=torch.int64, device=dev)
        for rep in range(args.reps + 3):
            for k, (block, iters, warps) in enumerate(configs):
                src = torch.tensor(rows(q), dtype=torch.int64, device=dev)
                t = timed(partial(gather_rows_triton, (mgu, mdn), (sgu, sdn), src, dst, count, block, iters, warps))
                if rep == 0:  # the rows arrived whole
                    for j, e in enumerate(src.tolist()):
                        i16 = torch.int16  # random bits: compare as integers (NaN != NaN)
                        ok = torch.equal(sgu[j].cpu().view(i16), gu[e].view(i16))
                        ok = ok and torch.equal(sdn[j].cpu().view(i16), dn[e].view(i16))
                        assert ok, f"config {names[k]}: slot {j} differs from pool row {e}"
                if rep >= 3:
                    res[k].append(q * row_bytes / t / 1e9)
            t = timed(partial(memcpy_rows, gu, dn, sgu, sdn, rows(q)))
            if rep >= 3:
                res[-1].append(q * row_bytes / t / 1e9)
        print(f"| {q} | " + " | ".join(f"{statistics.median(v):.1f}" for v in res) + " |", flush=True)
    return 0


def _config(text: str) -> tuple[int, int, int]:
    b, i, w = (int(v) for v in text.split("x"))
    return b, i, w


if __name__ == "__main__":
    raise SystemExit(main())
