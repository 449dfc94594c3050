"""One expert per layer step shared by both branches, so the GPU and the CPU finish together.

With whole experts per branch, a layer's m misses split as q fills and m - q CPU runs, and the branches
finish together only when m * share happens to be an integer: with m ~ 3 at batch 1 they rarely do
(``bench/cache_sim.py`` models the cost; docs/benchmarks.md). The plan still fills ``q`` (``slot_plan.fill_quota``)
whole experts (they are cached: a lower q would raise the miss rate, which costs more than the imbalance on
the locality traces); when that leaves the GPU short (``m * share > q``), the best-ranked miss left to the CPU
is shared by rows of its intermediate dimension: the GPU computes rows [0, c) from the scratch slot (copied
there, everything else zeroed), the CPU rows [c, I) from the pool, ``c ~ (m * share - q) * I`` in steps of a
granule. The
gated activation is elementwise per intermediate row and zero rows contribute zero, so the partial sums add
up to the exact expert output (float32 summation order aside). The shared expert is not cached: like a CPU
run it leaves the slot tables alone.

The CPU learns its rows from the route code: ``-1 - (eid + N * c)`` (``c = 0``: the whole expert), decoded
by the kernel's feeder (``experts/cpu``). ``c = I`` makes it a GPU-only route (code = the scratch slot).
Everything is device ops on fixed shapes: no host sync, capturable in a CUDA graph. On CUDA the fused
plan (``triton_plan``, ``SHARE_STEP``) does the same inside its one launch, and the batched fill copies
the GPU part into the scratch slot in the same launch as the whole experts (``triton_copy``).
"""

from __future__ import annotations

import torch

from freetoken.experts.cpu.codes import encode_code
from freetoken.experts.slot_plan import SharedExpert, StepPlan

__all__ = ["GRANULE", "SharedExpert", "share_granule", "share_one_expert"]

GRANULE = 64  # intermediate rows per step of c (cache-line and vector aligned for bf16 and fp32)


def share_granule(inter: int) -> int:
    """Rows per step of the cut: ``GRANULE`` when it divides I into at least 4 steps, else I // 4 (tiny
    test models still split), at least 1."""
    if inter % GRANULE == 0 and inter >= 4 * GRANULE:
        return GRANULE
    return max(1, inter // 4)


def share_one_expert(plan: StepPlan, share: torch.Tensor, inter: int, num_rows: int, scratch: int) -> SharedExpert:
    """Choose the shared expert and its cut, and rewrite ``plan.slot`` / ``plan.route_code`` in place.

    The candidate is the miss the fill order would have taken next: most routes first, then the lower eid
    (``slot_plan``'s order). No share (rows 0) when no miss is left or q >= m * share."""
    g = plan.groups
    N = num_rows
    cand = plan.miss & ~plan.fill  # misses left to the CPU
    key = torch.where(cand, g.count * (N + 1) + (N - g.eid), torch.full_like(g.count, -1))
    best1 = torch.argmax(key).reshape(1)  # [1] the first maximum (index_select, not t[0-dim]: that syncs)
    best = best1[0]
    has = key.index_select(0, best1)[0] >= 0
    x = plan.num_misses.to(torch.float32) * share.to(torch.float32)
    frac = (x - plan.copy_count.to(torch.float32)).clamp(0.0, 1.0)
    step = share_granule(inter)
    rows = (torch.round(frac * (inter / step)).to(torch.long) * step).clamp(max=inter)
    rows = torch.where(has, rows, torch.zeros_like(rows))
    eid = torch.where(has, g.eid.index_select(0, best1)[0], torch.full_like(rows, N))
    on = rows > 0
    # GPU side: the group reads the scratch slot
    cur = plan.slot.index_select(0, best1)
    plan.slot.scatter_(0, best1, torch.where(on, torch.full_like(cur, scratch), cur))
    # CPU side: its routes carry the cut (or become GPU-only routes when c = I)
    mine = (g.route_group == best) & on
    code = torch.where(rows >= inter, torch.full_like(g.eids, scratch), encode_code(g.eids, rows, N))
    plan.route_code = torch.where(mine, code, plan.route_code)
    plan.shared = SharedExpert(best, eid, rows)
    return plan.shared
