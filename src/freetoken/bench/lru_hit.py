"""LRU hit rates of a routing trace: per-layer LRU and one LRU shared by all layers, against the
uniform expectation (a cache of fraction f hits f of uniformly random routes).

    python -m freetoken.bench.lru_hit TRACE.npy [--fractions 0.11,0.25,0.37]
"""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict

import numpy as np


def lru_hit_rate(trace: np.ndarray, num_experts: int, fraction: float, shared: bool) -> float:
    """trace [tokens, layers, k] expert ids; counts distinct (layer, expert) lookups per token."""
    T, L, _ = trace.shape
    caches = [OrderedDict[int, None]()] if shared else [OrderedDict[int, None]() for _ in range(L)]
    cap = max(1, round(fraction * num_experts * (L if shared else 1)))
    hits = total = 0
    for t in range(T):
        for layer in range(L):
            cache = caches[0] if shared else caches[layer]
            for e in sorted(set(int(x) for x in trace[t, layer])):
                key = layer * num_experts + e
                total += 1
                if key in cache:
                    hits += 1
                    cache.move_to_end(key)
                else:
                    cache[key] = None
                    if len(cache) > cap:
                        cache.popitem(last=False)
    return hits / max(total, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m freetoken.bench.lru_hit")
    ap.add_argument("trace")
    ap.add_argument("--experts", type=int, default=None, help="experts per layer (default: max id + 1)")
    ap.add_argument("--fractions", default="0.11,0.25,0.37")
    args = ap.parse_args(argv)
    trace = np.load(args.trace)
    E = args.experts or int(trace.max()) + 1
    print(f"# {args.trace}: {trace.shape[0]} tokens x {trace.shape[1]} layers x top-{trace.shape[2]}, E={E}")
    print("| cache fraction | per-layer LRU hit | shared LRU hit | uniform expectation |")
    print("|---|---|---|---|")
    for f in (float(x) for x in args.fractions.split(",")):
        per, sh = lru_hit_rate(trace, E, f, False), lru_hit_rate(trace, E, f, True)
        print(f"| {f:.0%} | {per:.3f} | {sh:.3f} | {f:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
