"""Triton: one launch that groups a decode step's routes and plans the slot cache (``plan`` fused).

The torch version (``group_routes`` + ``plan_fills``) is ~100 small ops per layer; on a GPU their launch
overhead, not their work, dominates a decode step. This kernel does the same in one program for up to
``MAX_ROUTES`` routes (decode batches) and produces bit-identical tables and outputs:
- grouping by pairwise comparisons over the K routes (no sort needed at this size);
- q from the same float32 product and ceil as ``slots/plan.py: fill_quota``;
- victims by repeated minimum over the slot keys (``stamp * (S+1) + slot``) of the slots no hit uses:
  ``q`` passes over the S stamps.
Reads of the tables happen before a barrier, writes after it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken.experts.slots.plan import WARM, FillRule, RouteGroups, SlotTables, StepPlan

MAX_ROUTES = 64
_BS = 512  # slots per pass of the victim search
_MAXKEY = tl.constexpr(9223372036854775807)
_STAMP_CAP = tl.constexpr(1 << 40)  # as in plan.py: recent victim keys sit above _RECENT_BASE
_RECENT_BASE = tl.constexpr(1 << 61)


@triton.jit
def group_in_registers(e, r, rv, K, n64):
    """Group routes e (padding: n64) by eid, as ``plan.group_routes``: axis 0 = route i, axis 1 = route j."""
    vj = rv[None, :]
    eq = (e[:, None] == e[None, :]) & rv[:, None] & vj
    less = (e[None, :] < e[:, None]) & vj
    n_less = tl.sum(less.to(tl.int32), axis=1)
    n_eq_before = tl.sum((eq & (r[None, :] < r[:, None])).to(tl.int32), axis=1)
    leader = rv & (n_eq_before == 0)
    cnt = tl.sum(eq.to(tl.int32), axis=1)
    g_of = tl.sum((less & leader[None, :]).to(tl.int32), axis=1)  # group of route i (eid order)
    pos = n_less + n_eq_before  # sorted position of route i
    n_groups = tl.sum(leader.to(tl.int32), axis=0)
    gsel = (g_of[None, :] == r[:, None]) & leader[None, :]  # [g, i]: i leads group g
    gvalid = r < n_groups
    geid = tl.where(gvalid, tl.sum(tl.where(gsel, e[None, :], 0), axis=1), n64)
    gcount = tl.sum(tl.where(gsel, cnt[None, :], 0), axis=1).to(tl.int64)
    gstart = tl.where(gvalid, tl.sum(tl.where(gsel, n_less[None, :], 0), axis=1), K).to(tl.int64)
    order = tl.sum(tl.where((pos[None, :] == r[:, None]) & vj, r[None, :], 0), axis=1).to(tl.int64)
    return order, g_of, gstart, gcount, geid, gvalid, n_groups


@triton.jit(do_not_specialize=["K", "layer_off", "N"])
def _group_kernel(ids_ptr, K, layer_off, N, i64_out, b_out, KB: tl.constexpr):
    """``group_routes`` alone (the fused backend: every expert resident, nothing to plan)."""
    r = tl.arange(0, KB)
    rv = r < K
    n64 = N.to(tl.int64)
    e = tl.load(ids_ptr + r, mask=rv, other=0).to(tl.int64) + layer_off
    e = tl.where(rv, e, n64)
    order, g_of, gstart, gcount, geid, gvalid, n_groups = group_in_registers(e, r, rv, K, n64)
    store_groups(i64_out, b_out, K, r, rv, e, order, g_of, gstart, gcount, geid, gvalid, n_groups)


@triton.jit
def store_groups(i64_out, b_out, K, r, rv, e, order, g_of, gstart, gcount, geid, gvalid, n_groups):
    """``group_in_registers``' tables as ``group_tables`` lays them out."""
    kk = K.to(tl.int64)  # i64_out = [eids, order, route_group, start, count, eid | n_groups]
    tl.store(i64_out + r, e, mask=rv)
    tl.store(i64_out + kk + r, order, mask=rv)
    tl.store(i64_out + 2 * kk + r, g_of.to(tl.int64), mask=rv)
    tl.store(i64_out + 3 * kk + r, gstart, mask=rv)
    tl.store(i64_out + 4 * kk + r, gcount, mask=rv)
    tl.store(i64_out + 5 * kk + r, geid, mask=rv)
    tl.store(i64_out + 6 * kk, n_groups.to(tl.int64))
    tl.store(b_out + r, gvalid.to(tl.int8), mask=rv)


def group_tables(K: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, RouteGroups]:
    """The buffers a grouping of K routes is written into (``store_groups``), and the ``RouteGroups`` viewing them."""
    if not 0 < K <= MAX_ROUTES:
        raise ValueError(f"the fused grouping takes 1..{MAX_ROUTES} routes, got {K}")
    i64 = torch.empty(6 * K + 1, dtype=torch.long, device=device)
    b = torch.empty(K, dtype=torch.bool, device=device)
    eids, order, rgroup, start, count, geid = i64[: 6 * K].view(6, K)
    return i64, b.view(torch.uint8), RouteGroups(eids, order, rgroup, start, count, geid, b, i64[6 * K])


def group_routes_triton(topk_ids: torch.Tensor, layer_offset: int, num_rows: int) -> RouteGroups:
    """``group_routes(topk_ids.reshape(-1) + layer_offset, num_rows)`` in one launch, for T*k <= MAX_ROUTES."""
    ids = topk_ids.reshape(-1)
    K = ids.numel()
    i64, b, groups = group_tables(K, ids.device)
    _group_kernel[(1,)](ids, K, layer_offset, num_rows, i64, b, KB=max(16, triton.next_power_of_2(K)))
    return groups


@triton.jit(do_not_specialize=["K", "layer_off", "N", "S", "KV", "protect", "fill_rows"])
def _plan_kernel(
    ids_ptr, K, layer_off, N, S, KV, protect, fill_rows,
    slot_of, eid_of, stamp, locked, tick_ptr, share_ptr,
    i64_out, b_out, counters, layer_counters,
    MIN_FILL: tl.constexpr, RECENT_LAST: tl.constexpr, KB: tl.constexpr, BS: tl.constexpr, COUNT: tl.constexpr,
):  # fmt: skip
    r = tl.arange(0, KB)
    rv = r < K
    n64 = N.to(tl.int64)
    s64 = S.to(tl.int64)
    e = tl.load(ids_ptr + r, mask=rv, other=0).to(tl.int64) + layer_off
    e = tl.where(rv, e, n64)
    order, g_of, gstart, gcount, geid, gvalid, n_groups = group_in_registers(e, r, rv, K, n64)
    # -- lookup, quota ---------------------------------------------------------------------------------
    gslot = tl.load(slot_of + geid, mask=gvalid, other=-1)
    hit = gvalid & (gslot >= 0)
    miss = gvalid & (gslot < 0)
    h = tl.sum(hit.to(tl.int64), axis=0)
    m = tl.sum(miss.to(tl.int64), axis=0)
    # Blocked slots: locked, or used within the last `protect` plans (stamps > tick - protect).
    tick0 = tl.load(tick_ptr)
    recent_after = tick0 - protect
    hst = tl.load(stamp + gslot, mask=hit, other=-1)
    hblk = tl.load(locked + gslot, mask=hit, other=0) != 0
    if not RECENT_LAST:
        hblk = hblk | ((hst > recent_after) & (hst >= 0))
    hit_blocked = tl.sum((hit & hblk).to(tl.int64), axis=0)
    n_blocked = tl.sum(tl.zeros((BS,), tl.int64), axis=0)
    for s0 in range(0, S, BS):
        sl = s0 + tl.arange(0, BS)
        sm = sl < S
        st = tl.load(stamp + sl, mask=sm, other=-1)
        blk = tl.load(locked + sl, mask=sm, other=0) != 0
        if not RECENT_LAST:
            blk = blk | ((st > recent_after) & (st >= 0))
        n_blocked += tl.sum((blk & sm).to(tl.int64), axis=0)
    available = s64 - n_blocked - h + hit_blocked
    q = tl.ceil((m + 1).to(tl.float32) * tl.load(share_ptr)).to(tl.int64) - 1  # ``slots/plan.py: fill_quota``
    q = tl.maximum(tl.minimum(q, m), tl.minimum(m, MIN_FILL))
    q = tl.minimum(q, available)
    fillable = miss & (geid < fill_rows.to(tl.int64))  # misses of unpinned experts stay on the CPU
    q = tl.minimum(q, tl.sum(fillable.to(tl.int64), axis=0))
    # -- which misses: most routes first, then the lower eid (stable descending order) ---------------
    key = tl.where(fillable, gcount * (n64 + 1) + (n64 - geid), -1)
    above = (key[None, :] > key[:, None]) | ((key[None, :] == key[:, None]) & (r[None, :] < r[:, None]))
    rank = tl.sum(above.to(tl.int32), axis=1)
    fill = fillable & (rank < q)
    # -- victims: the q oldest unlocked slots no hit uses ----------------------------------------------
    sp1 = s64 + 1
    hslots = tl.where(hit, gslot, -1)
    vict = tl.full((KB,), 0, tl.int64) + s64
    prev = tl.sum(tl.zeros((KB,), tl.int64), axis=0) - sp1 - 1
    j = tl.sum(tl.zeros((KB,), tl.int64), axis=0)
    for _it in range(0, q):  # one pass per victim: hit slots are never candidates
        best = tl.sum(tl.zeros((BS,), tl.int64), axis=0) + _MAXKEY
        for s0 in range(0, S, BS):
            sl = s0 + tl.arange(0, BS)
            sm = sl < S
            st = tl.load(stamp + sl, mask=sm, other=0)
            lk = tl.load(locked + sl, mask=sm, other=1)
            recent = (st > recent_after) & (st >= 0)
            ks = st * sp1 + sl
            used = tl.sum((sl.to(tl.int64)[:, None] == hslots[None, :]).to(tl.int32), axis=1) > 0
            if RECENT_LAST:  # recent slots after every older one, newest first
                ks = tl.where(recent, _RECENT_BASE + (_STAMP_CAP - st) * sp1 + sl, ks)
                ok = sm & (lk == 0) & ~used & (ks > prev)
            else:
                ok = sm & (lk == 0) & ~recent & ~used & (ks > prev)
            best = tl.minimum(best, tl.min(tl.where(ok, ks, _MAXKEY), axis=0))
        prev = best
        # keys are >= -(S+1) (free slots: stamp -1): shift before the remainder; recent keys: unbias
        cand = tl.where(best >= _RECENT_BASE, (best - _RECENT_BASE) % sp1, (best + sp1) % sp1)
        take = best < _MAXKEY
        vict = tl.where((r == j) & take, cand, vict)
        j = j + take.to(tl.int64)
    gv = tl.sum(tl.where(rank[:, None] == r[None, :], vict[None, :], 0), axis=1)  # victim of group g
    new_slot = tl.where(hit, gslot, tl.where(fill, gv, -1))
    take_j = r < q
    src = tl.sum(tl.where((rank[None, :] == r[:, None]) & fill[None, :], geid[None, :], 0), axis=1)
    old = tl.load(eid_of + vict, mask=take_j, other=-1)
    tick = tick0 + 1
    rslot = tl.sum(tl.where(g_of[:, None] == r[None, :], new_slot[None, :], 0), axis=1)
    code = tl.where(rslot >= 0, rslot, -1 - e)
    tl.debug_barrier()  # every table read above happens before any write below
    tl.store(slot_of + old, tl.full((KB,), -1, tl.int64), mask=take_j & (old >= 0))
    tl.store(slot_of + geid, gv, mask=fill)
    tl.store(eid_of + vict, src, mask=take_j)
    tl.store(stamp + gslot, tl.zeros((KB,), tl.int64) + tick, mask=hit)
    tl.store(stamp + vict, tl.zeros((KB,), tl.int64) + tick, mask=take_j)
    tl.store(tick_ptr, tick)
    # -- outputs: i64_out = [order, route_group, start, count, eid, slot, code | src, dst | 4 scalars] ----
    kk = K.to(tl.int64)
    tl.store(i64_out + r, order, mask=rv)
    tl.store(i64_out + kk + r, g_of.to(tl.int64), mask=rv)
    tl.store(i64_out + 2 * kk + r, gstart, mask=rv)
    tl.store(i64_out + 3 * kk + r, gcount, mask=rv)
    tl.store(i64_out + 4 * kk + r, geid, mask=rv)
    tl.store(i64_out + 5 * kk + r, new_slot, mask=rv)
    tl.store(i64_out + 6 * kk + r, code, mask=rv)
    kvm = r < KV
    tl.store(i64_out + 7 * kk + r, tl.where(take_j, src, 0), mask=kvm)
    tl.store(i64_out + 7 * kk + KV + r, tl.where(take_j, vict, s64), mask=kvm)
    tail = i64_out + 7 * kk + 2 * KV
    tl.store(tail, n_groups.to(tl.int64))
    tl.store(tail + 1, q)
    tl.store(tail + 2, h)
    tl.store(tail + 3, m)
    if COUNT > 0:  # ``counters.DeviceCounters``: hits, misses, fills, CPU runs, miss layers, q_last
        cpu = (m - q) if COUNT == 2 else q * 0
        tl.store(counters + 0, tl.load(counters + 0) + h)
        tl.store(counters + 1, tl.load(counters + 1) + m)
        tl.store(counters + 2, tl.load(counters + 2) + q)
        tl.store(counters + 3, tl.load(counters + 3) + cpu)
        tl.store(counters + 4, tl.load(counters + 4) + (m > 0).to(tl.int64))
        tl.store(counters + 5, q)
        tl.store(layer_counters + 0, tl.load(layer_counters + 0) + m)  # the layer's row: misses, fills, CPU runs
        tl.store(layer_counters + 1, tl.load(layer_counters + 1) + q)
        tl.store(layer_counters + 2, tl.load(layer_counters + 2) + cpu)
    tl.store(b_out + r, hit.to(tl.int8), mask=rv)
    tl.store(b_out + K + r, fill.to(tl.int8), mask=rv)
    tl.store(b_out + 2 * K + r, miss.to(tl.int8), mask=rv)
    tl.store(b_out + 3 * K + r, gvalid.to(tl.int8), mask=rv)


def plan_step_triton(
    tables: SlotTables,
    topk_ids: torch.Tensor,  # [T, k] per-layer expert ids
    layer_offset: int,  # layer * E
    share: torch.Tensor,  # [] float32
    rule: FillRule = WARM,
    counters: torch.Tensor | None = None,  # [6] int64 ``DeviceCounters.vector``: the step counted here
    count_cpu: bool = False,  # with counters: the misses not filled count as CPU runs (hybrid)
    layer_counters: torch.Tensor | None = None,  # [3] int64 with counters: the layer's ``DeviceCounters.per_layer`` row
) -> StepPlan:
    """``group_routes`` + ``plan_fills(pending=valid, ...)`` in one launch, for T*k <= MAX_ROUTES."""
    if (counters is None) != (layer_counters is None):
        raise ValueError("the fused plan counts into both the counter vector and the layer's row, or neither")
    ids = topk_ids.reshape(-1)
    K = ids.numel()
    if not 0 < K <= MAX_ROUTES:
        raise ValueError(f"the fused plan takes 1..{MAX_ROUTES} routes, got {K}")
    S, N = tables.num_slots, tables.num_rows
    KV = min(K, S)
    dev = ids.device
    i64 = torch.empty(7 * K + 2 * KV + 4, dtype=torch.long, device=dev)
    b = torch.empty(4 * K, dtype=torch.bool, device=dev)
    KB = max(16, triton.next_power_of_2(K))
    _plan_kernel[(1,)](
        ids, K, layer_offset, N, S, KV, rule.protect, N if rule.fill_rows is None else rule.fill_rows,
        tables.slot_of, tables.eid_of, tables.stamp, tables.locked.view(torch.uint8), tables.tick,
        share.to(torch.float32), i64, b.view(torch.uint8), i64 if counters is None else counters,
        i64 if layer_counters is None else layer_counters,
        MIN_FILL=rule.min_fill, RECENT_LAST=rule.recent_last, KB=KB, BS=_BS,
        COUNT=0 if counters is None else 1 + count_cpu,
    )  # fmt: skip
    order, rgroup, start, count, geid, slot, code = i64[: 7 * K].view(7, K)
    tail = i64[7 * K + 2 * KV :]
    hit, fill, miss, valid = b.view(4, K)
    groups = RouteGroups(ids + layer_offset, order, rgroup, start, count, geid, valid, tail[0])
    csrc, cdst = i64[7 * K : 7 * K + 2 * KV].view(2, KV)
    plan = StepPlan(groups, slot, hit, fill, miss, code, csrc, cdst, tail[1], tail[2], tail[3])
    plan.counted = counters is not None
    return plan
