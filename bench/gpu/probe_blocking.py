"""The concurrent bandwidth probe's copy thread: spinning against sleeping event waits, side by side.

    PYTHONPATH=src python3 bench/gpu/probe_blocking.py [--threads 6,16] [--seconds 1.5] [--repeats 2]

``ft bench bw``'s concurrent figures (B_P', B_H') run the CPU kernel on ``threads`` workers while a second
thread keeps expert-sized copies in flight and waits on CUDA events. A spinning event wait takes a core;
with a worker on every core it slows the kernel. Prints B_P' / B_H' (GB/s, medians) with spinning and
with blocking (sleeping) events, alternating in one process.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from freetoken.experts.cpu.kernel import CpuExpertKernel
from freetoken.hardware.bandwidth import BandwidthConfig, CopyLoad, KernelLoad, concurrent_gbps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="6,16")
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    dev = torch.device("cuda")
    print("| threads | events | B_P' GB/s | B_H' GB/s |")
    print("|---|---|---|---|")
    for n in (int(v) for v in a.threads.split(",")):
        cfg = BandwidthConfig(seconds=a.seconds)
        kern = CpuExpertKernel(num_threads=n, caller_helps=False)
        try:
            load = KernelLoad(kern, cfg)
            src = torch.empty(cfg.pool_bytes, dtype=torch.uint8, pin_memory=True).fill_(1)
            loads = {b: CopyLoad(src, dev, cfg.expert_bytes, cfg.top_k, blocking=b) for b in (False, True)}
            res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for _ in range(a.repeats):
                for b, c in loads.items():
                    res[b].append(concurrent_gbps(load, c, a.seconds))
            for b, v in res.items():
                bp = statistics.median(x[0] for x in v)
                bh = statistics.median(x[1] for x in v)
                print(f"| {n} | {'blocking' if b else 'spinning'} | {bp:.1f} | {bh:.1f} |", flush=True)
        finally:
            kern.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
