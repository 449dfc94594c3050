"""Synthetic MoE routing traces with temporal locality.

Per layer, each token routes to k distinct experts. Each of the previous token's experts is kept
with probability p_keep; the rest are drawn from a per-layer Zipf(s) popularity over a random
permutation of the experts. Output: uint8/uint16 array [tokens, layers, k] saved as .npy.
"""

import argparse
from collections import OrderedDict

import numpy as np


def gen(tokens, layers, E, k, p_keep, s, seed):
    rng = np.random.default_rng(seed)
    out = np.zeros((tokens, layers, k), dtype=np.uint16)
    w = 1.0 / np.arange(1, E + 1) ** s
    for l in range(layers):
        perm = rng.permutation(E)
        pop = np.zeros(E)
        pop[perm] = w
        pop /= pop.sum()
        cur = list(rng.choice(E, size=k, replace=False, p=pop))
        for t in range(tokens):
            keep = [e for e in cur if rng.random() < p_keep]
            while len(keep) < k:
                e = int(rng.choice(E, p=pop))
                if e not in keep:
                    keep.append(e)
            cur = keep
            out[t, l] = sorted(cur)
    return out


def lru_hit_rate(trace, E, frac, shared=False):
    T, L, k = trace.shape
    if shared:
        cap = int(frac * L * E)
        cache = OrderedDict()
        hit = tot = 0
        for t in range(T):
            for l in range(L):
                for e in trace[t, l]:
                    key = (l, int(e))
                    tot += 1
                    if key in cache:
                        hit += 1
                        cache.move_to_end(key)
                    else:
                        cache[key] = 1
                        if len(cache) > cap:
                            cache.popitem(last=False)
        return hit / tot
    cap = max(k, int(frac * E))
    hit = tot = 0
    for l in range(L):
        cache = OrderedDict()
        for t in range(T):
            for e in trace[t, l]:
                e = int(e)
                tot += 1
                if e in cache:
                    hit += 1
                    cache.move_to_end(e)
                else:
                    cache[e] = 1
                    if len(cache) > cap:
                        cache.popitem(last=False)
    return hit / tot


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--p-keep", type=float, default=0.6)
    ap.add_argument("--zipf", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    tr = gen(a.tokens, a.layers, a.experts, a.topk, a.p_keep, a.zipf, a.seed)
    for f in (0.11, 0.25, 0.37, 0.5):
        print(f"cache {f:.2f}: per-layer LRU hit {lru_hit_rate(tr, a.experts, f):.3f}  uniform expectation {f:.2f}")
    if a.out:
        tr = tr.astype(np.uint8) if a.experts <= 256 else tr
        np.save(a.out, tr)
        print("saved", a.out, tr.shape, tr.dtype)
