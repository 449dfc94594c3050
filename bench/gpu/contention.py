"""What a concurrent fill does to the CPU expert kernel: copy-engine copies against the slot cache's SM gather.

    PYTHONPATH=src python3 bench/gpu/contention.py [--threads 6] [--experts 1,2,8] [--seconds 2] [--repeats 2]

The hybrid branch of a decode layer runs the CPU kernel on 1-2 experts per call while the GPU fills 2-3
experts through the gather kernel (SM loads from the pinned, mapped pool); ``ft bench bw`` measures the CPU
kernel (8 experts per call) against copy-engine copies. Per CPU batch size this prints the kernel's GB/s
alone, beside ``cudaMemcpyAsync`` copies of expert-sized chunks and beside the gather kernel (2 experts per
launch), and the fill's own GB/s in each pairing: whether the gather's many small PCIe reads cost the CPU
more host bandwidth than the copy engine's. Loads alternate in one process (same noise); medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import threading
import time

import torch

from freetoken.experts.cpu.kernel import CpuExpertKernel
from freetoken.experts.host_pool import mapped_device_view
from freetoken.experts.slots.copy_triton import gather_rows_triton
from freetoken.hardware.bandwidth import BandwidthConfig, CopyLoad, KernelLoad

_GB = 1e9


class GatherLoad:
    """The slot cache's gather kernel, ``experts`` pool rows per launch, two launches in flight."""

    def __init__(self, gu: torch.Tensor, dn: torch.Tensor, device: torch.device, experts: int) -> None:
        self.mgu, self.mdn = mapped_device_view(gu, device), mapped_device_view(dn, device)
        self.n, self.q = gu.shape[0], experts
        self.row_bytes = (gu[0].numel() + dn[0].numel()) * gu.element_size()
        self.sgu = torch.empty((experts + 1, *gu.shape[1:]), dtype=gu.dtype, device=device)
        self.sdn = torch.empty((experts + 1, *dn.shape[1:]), dtype=dn.dtype, device=device)
        self.dst = torch.arange(experts, dtype=torch.int64, device=device)
        self.count = torch.tensor(experts, dtype=torch.int64, device=device)
        self.srcs = [torch.arange(i * experts, (i + 1) * experts, dtype=torch.int64, device=device) % self.n
                     for i in range(max(1, self.n // experts))]  # fmt: skip
        self.stream = torch.cuda.Stream(device)

    def _launch(self, i: int) -> torch.cuda.Event:
        with torch.cuda.stream(self.stream):
            src = self.srcs[i % len(self.srcs)]
            gather_rows_triton((self.mgu, self.mdn), (self.sgu, self.sdn), src, self.dst, self.count)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        return ev

    def run_for(self, seconds: float, start: threading.Barrier | None = None) -> float:
        self._launch(0).synchronize()
        if start is not None:
            start.wait()
        prev, n, t0 = None, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            ev = self._launch(n)
            n += 1
            if prev is not None:
                prev.synchronize()
            prev = ev
        self.stream.synchronize()
        return n * self.q * self.row_bytes / (time.perf_counter() - t0) / _GB


def pair(kernel: KernelLoad, other: CopyLoad | GatherLoad | None, seconds: float) -> tuple[float, float]:
    """(CPU kernel GB/s, fill GB/s) with both running at once (fill 0 when alone)."""
    if other is None:
        return kernel.run_for(seconds), 0.0
    start = threading.Barrier(2, timeout=120)
    res: dict[str, float] = {}
    t = threading.Thread(target=lambda: res.__setitem__("p", other.run_for(seconds, start)))
    t.start()
    h = kernel.run_for(seconds, start)
    t.join()
    return h, res["p"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=6, help="CPU kernel workers")
    p.add_argument("--experts", default="1,2,8", help="experts per CPU kernel call")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--pool-gib", type=float, default=2.0, help="each pool (CPU kernel's, fill's)")
    a = p.parse_args()
    dev = torch.device("cuda")
    base = BandwidthConfig(pool_bytes=int(a.pool_gib * 2**30), seconds=a.seconds)
    kern = CpuExpertKernel(num_threads=a.threads, caller_helps=False)
    n = int(a.pool_gib * 2**30) // base.expert_bytes
    gu = torch.empty(n, 2 * base.inter, base.hidden, dtype=torch.bfloat16).pin_memory()
    dn = torch.empty(n, base.hidden, base.inter, dtype=torch.bfloat16).pin_memory()
    gu.view(torch.int16).random_(), dn.view(torch.int16).random_()
    src = torch.empty(int(a.pool_gib * 2**30), dtype=torch.uint8, pin_memory=True).fill_(1)
    fills = {"alone": None, "memcpy": CopyLoad(src, dev, base.expert_bytes, 8), "gather": GatherLoad(gu, dn, dev, 2)}
    print(f"# CPU kernel {kern.num_threads} workers ({kern.isa}), expert {base.expert_bytes / 1e6:.1f} MB, "
          f"{a.seconds} s per pairing, medians of {a.repeats}; GB/s as CPU kernel / fill")  # fmt: skip
    print("| experts per call | " + " | ".join(fills) + " |")
    print("|---" * (len(fills) + 1) + "|")
    try:
        for k in (int(v) for v in a.experts.split(",")):
            cfg = dataclasses.replace(base, top_k=k)
            load = KernelLoad(kern, cfg)
            res: dict[str, list[tuple[float, float]]] = {f: [] for f in fills}
            for _ in range(a.repeats):
                for name, f in fills.items():
                    res[name].append(pair(load, f, a.seconds))
            cells = []
            for name in fills:
                h = statistics.median(v[0] for v in res[name])
                f = statistics.median(v[1] for v in res[name])
                cells.append(f"{h:.1f}" + (f" / {f:.1f}" if f else ""))
            print(f"| {k} | " + " | ".join(cells) + " |", flush=True)
            del load
    finally:
        kern.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
