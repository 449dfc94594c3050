"""The host tier's copies at Qwen3.6-35B-A3B's checkpoint size (30 gated DeltaNet layers: conv 8192 x 3 bf16, state
32 x 128 x 128 fp32; 61.4 MiB): device -> pinned host (``HostStates.save``, its copy stream) and back (``load``, the
compute stream), ms and GB/s (medians of 20); then a stand-in for decode (bf16 matmuls on the compute stream) alone
and with a save queued every 10 of them, to see whether saves delay it. CUDA only."""

from __future__ import annotations

import statistics
import time

import torch

from freetoken.cache.host_states import HostStates
from freetoken.cache.state_pool import StatePool, StateShape


def _timed(fn, n: int = 20) -> float:
    out = []
    for i in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(i)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    dev = torch.device("cuda")
    shape = StateShape(30, 2 * 16 * 128 + 32 * 128, 3, 32, 128, 128)
    pool = StatePool(shape, 2, torch.bfloat16, dev, 4)
    host = HostStates(pool, 8)
    size = shape.slot_bytes(torch.bfloat16)
    print(f"checkpoint: {size / 2**20:.1f} MiB, host tier pinned: {host.pinned}")
    pool.ssm.normal_()
    save = _timed(lambda i: host.save(2, i % 8))
    load = _timed(lambda i: host.load(i % 8, 0))
    assert torch.equal(pool.ssm[:, 0], pool.ssm[:, 2]) and torch.equal(pool.conv[:, 0], pool.conv[:, 2])
    print(f"save (D2H): {save * 1e3:.2f} ms, {size / save / 1e9:.1f} GB/s; load (H2D): {load * 1e3:.2f} ms, "
          f"{size / load / 1e9:.1f} GB/s")  # fmt: skip
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

    def decode(i: int, saves: bool) -> None:
        for k in range(100):
            a @ a
            if saves and k % 10 == 0:
                host.save(2, k // 10 % 8)

    alone = _timed(lambda i: decode(i, False), 5)
    beside = _timed(lambda i: decode(i, True), 5)
    print(f"100 matmuls: alone {alone * 1e3:.1f} ms, with 10 saves queued beside them {beside * 1e3:.1f} ms "
          f"({(beside / alone - 1) * 100:+.1f}%; the saves alone would take {10 * save * 1e3:.1f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
