"""Hit rate of the slot cache after a shrink and a grow (CPU, no timing): how fast offload's cache is warm again.

A qwen3-30b-a3b-shaped routing (6 MoE layers x 128 experts, top-8, batch 1, Zipf-skewed per layer, ``--skew``) drives a
``SlotCache`` of the whole pool with offload's streaming rule: warm-up, then a shrink to one token's experts,
decode at that size, a grow to ``--mid`` slots and then the pool (the resize sequence of the GPU timeline), and
the hit rate of each window of steps after the grow is printed.
Run: PYTHONPATH=src python3 bench/regrow_hits.py [--mid 690] [--steps 200] [--window 20] [--skew 1]
"""

from __future__ import annotations

import argparse
import json

import torch

from freetoken.experts.base import ExpertBanks
from freetoken.experts.host_pool import HostExpertPool
from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.plan import FillRule

L, E, K = 6, 128, 8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mid", type=int, default=690)
    ap.add_argument("--small-steps", type=int, default=50)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mid-steps", type=int, default=100)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of each layer's routing (0: uniform)")
    a = ap.parse_args()
    n = L * E
    banks = ExpertBanks(torch.zeros(n, 2, 1), torch.zeros(n, 1, 1), L, E)
    cache = SlotCache(HostExpertPool(banks, pin=False), n, torch.device("cpu"))
    rule = FillRule(min_fill=1, protect=L, recent_last=True)  # offload's streaming_rule
    g = torch.Generator().manual_seed(0)
    weights = [(torch.arange(1, E + 1) ** -a.skew)[torch.randperm(E, generator=g)] for _ in range(L)]

    def step() -> tuple[int, int]:
        hits = misses = 0
        for layer in range(L):
            ids = torch.multinomial(weights[layer], K, generator=g).reshape(1, K)
            groups = cache.group(layer, ids)
            plan = cache.plan(groups, groups.valid, torch.tensor(1.0), rule)
            cache.copy(plan)
            hits, misses = hits + int(plan.num_hits), misses + int(plan.num_misses)
        return hits, misses

    def windows(steps: int) -> list[float]:
        out, h, m = [], 0, 0
        for i in range(steps):
            dh, dm = step()
            h, m = h + dh, m + dm
            if (i + 1) % a.window == 0:
                out.append(round(h / (h + m), 3))
                h = m = 0
        return out

    windows(300)
    before = windows(a.window * 3)
    cache.resize(K)
    windows(a.small_steps)
    cache.resize(a.mid)
    mid = windows(a.mid_steps)
    cache.resize(n)
    full = windows(a.steps)
    cache.check_integrity()
    print(json.dumps({"before": before, f"after_grow_to_{a.mid}": mid, f"after_grow_to_{n}": full}))


if __name__ == "__main__":
    main()
