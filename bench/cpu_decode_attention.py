"""The CPU decode attention (``kernels/attention/decode_reference.py``) per call, one thread, at a decode shape.

    PYTHONPATH=src python3 bench/cpu_decode_attention.py [--heads 4] [--kv-heads 2] [--head-dim 64] [--context 200]
"""

from __future__ import annotations

import argparse
import time

import torch

from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.decode_reference import paged_decode_reference


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    pages = -(-a.context // a.page) + 1
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(a.batch * pages * a.page, a.kv_heads, a.head_dim, generator=g)
    vc = torch.randn_like(kc)
    table = torch.randperm(a.batch * pages, generator=g).view(a.batch, pages).to(torch.int32)
    lens = torch.full((a.batch,), a.context, dtype=torch.int32)
    q = torch.randn(a.batch, a.heads, a.head_dim, generator=g)
    for _ in range(50):
        paged_decode_reference(q, kc, vc, DecodeMeta(table, lens, a.page), a.head_dim**-0.5)
    t = time.perf_counter()
    for _ in range(a.calls):  # a fresh DecodeMeta per call: the slots are looked up once per step, as in the engine
        paged_decode_reference(q, kc, vc, DecodeMeta(table, lens, a.page), a.head_dim**-0.5)
    print(f"{(time.perf_counter() - t) / a.calls * 1e6:.1f} us per call")


if __name__ == "__main__":
    main()
