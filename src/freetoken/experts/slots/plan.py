"""Per-layer slot planning on the device: fixed shapes, no host synchronisation.

K = T*k routes of one MoE layer step. Everything here is torch ops whose output shapes depend only on
K, S and N (sort, cumsum, scatter, topk, where): no ``.item()``, ``nonzero``, ``unique`` or boolean
indexing, so the same code runs on the CPU, on a GPU stream without syncs, and inside a CUDA graph.

Groups: the routes sorted by eid; group g is the g-th distinct eid (g < n_groups), padded to K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT64_MAX = torch.iinfo(torch.int64).max
# Victim keys: older slots are stamp * (S+1) + slot < 2**60 (stamps < 2**40 plans, S < 2**20); recent
# slots taken last sort above _RECENT_BASE.
_STAMP_CAP = 1 << 40
_RECENT_BASE = 1 << 61


@dataclass
class RouteGroups:
    """Routes grouped by eid. All tensors [K] int64 unless noted."""

    eids: torch.Tensor  # [K] eid of each route, original (token-major) order
    order: torch.Tensor  # [K] route ids by eid; group g: order[start[g] : start[g] + count[g]]
    route_group: torch.Tensor  # [K] group of each route (original order)
    start: torch.Tensor  # [K] first sorted position of group g (K for padding groups)
    count: torch.Tensor  # [K] routes of group g (0 for padding groups)
    eid: torch.Tensor  # [K] eid of group g (N for padding groups)
    valid: torch.Tensor  # [K] bool: g < n_groups
    n_groups: torch.Tensor  # [] distinct eids


def group_routes(eids: torch.Tensor, num_rows: int) -> RouteGroups:
    """Deduplicate the routed eids with one fixed-size sort. eids [K] int64 in [0, N)."""
    eids = eids.reshape(-1)
    K = eids.numel()
    dev = eids.device
    sorted_e, order = torch.sort(eids, stable=True)
    first = torch.ones(K, dtype=torch.bool, device=dev)
    first[1:] = sorted_e[1:] != sorted_e[:-1]
    gid = torch.cumsum(first.long(), 0) - 1  # [K] group of each sorted position
    pos = torch.arange(K, device=dev)
    start = torch.full((K,), K, dtype=torch.long, device=dev).scatter_reduce_(0, gid, pos, "amin")
    count = torch.zeros(K, dtype=torch.long, device=dev).scatter_add_(0, gid, torch.ones_like(gid))
    geid = torch.full((K,), num_rows, dtype=torch.long, device=dev).scatter_reduce_(0, gid, sorted_e, "amin")
    route_group = torch.empty_like(gid).scatter_(0, order, gid)
    n_groups = first.sum()
    return RouteGroups(eids, order, route_group, start, count, geid, pos < n_groups, n_groups)


@dataclass
class SlotTables:
    """The cache's device tables (mutated in place by ``plan_fills``). S slots + 1 scratch slot."""

    slot_of: torch.Tensor  # [N+1] slot of each eid, -1 absent (index N: sentinel, always -1)
    eid_of: torch.Tensor  # [S+1] eid in each slot, -1 free (index S: the scratch slot)
    stamp: torch.Tensor  # [S+1] last-use tick, -1 free
    locked: torch.Tensor  # [S+1] bool: never chosen as a victim
    tick: torch.Tensor  # [] use counter, +1 per plan

    @classmethod
    def empty(cls, num_rows: int, num_slots: int, device: torch.device | str = "cpu") -> SlotTables:
        """Tables of an empty cache: no eid resident, every slot free."""
        def unset(n: int) -> torch.Tensor:
            return torch.full((n + 1,), -1, dtype=torch.long, device=device)

        S = num_slots
        locked = torch.zeros(S + 1, dtype=torch.bool, device=device)
        return cls(unset(num_rows), unset(S), unset(S), locked, torch.zeros((), dtype=torch.long, device=device))

    @property
    def num_slots(self) -> int:
        return int(self.eid_of.shape[0]) - 1

    @property
    def num_rows(self) -> int:
        return int(self.slot_of.shape[0]) - 1


@dataclass(frozen=True)
class FillRule:
    """How a backend's rounds fill and evict. When a step's working set exceeds the cache, plain LRU evicts
    exactly what the next step needs again (every fill a future miss, hit rate 0): ``protect`` names the recent
    slots (used within the last ``protect`` plans), and ``recent_last`` (offload, hybrid) evicts them only after
    every older slot, newest first, so excess misses stream through a few slots instead of flushing the cache;
    without it they are never victims (q shrinks: the misses stay unfilled, e.g. for the CPU). Neither changes
    anything while the cache holds more than a step's working set."""

    min_fill: int = 1  # 1: at least one fill when a step misses (the cache keeps warming); 0: frozen residency
    protect: int = 0  # > 0: slots used in the last `protect` plans are "recent"
    recent_last: bool = False  # recent slots: False = never victims, True = victims last, newest first
    fill_rows: int | None = None  # only eids below this are ever filled (the pinned part of the pool); None: all


WARM = FillRule()  # fill as the share says, plain LRU victims


@dataclass
class StepPlan:
    """What one round of one layer does. Group tensors are [K], copy tensors [Kv], Kv = min(K, S[, E])."""

    groups: RouteGroups
    slot: torch.Tensor  # [K] slot serving group g on the GPU this round, -1 otherwise
    hit: torch.Tensor  # [K] bool: group g was resident
    fill: torch.Tensor  # [K] bool: group g is filled this round
    miss: torch.Tensor  # [K] bool: group g was pending and absent
    route_code: torch.Tensor  # [K] per route: slot id (>= 0), or -1 - eid when not on the GPU this round
    copy_src: torch.Tensor  # [Kv] pool rows to copy (padded entries: row 0)
    copy_dst: torch.Tensor  # [Kv] destination slots (padded entries: the scratch slot S)
    copy_count: torch.Tensor  # [] q: valid copy entries (a prefix)
    num_hits: torch.Tensor  # [] distinct hits
    num_misses: torch.Tensor  # [] m
    counted: bool = False  # the plan added its step to the device counters itself (the fused plan)


def fill_quota(m: torch.Tensor, share: torch.Tensor, available: torch.Tensor, min_fill: int) -> torch.Tensor:
    """q = clamp(ceil((m+1)*share) - 1, min_fill if m > 0 else 0, m), then at most ``available``. All [] int64.

    ``ceil((m+1)s) - 1`` is the whole number of fills that makes the later branch finish first: with the GPU
    at ``B_P'`` per expert and the CPU at ``B_H'``, ``s = B_P'/(B_P'+B_H')``, ``x = m*s`` balances them exactly;
    of ``floor(x)`` and ``ceil(x)`` it takes the one with the smaller ``max(q/B_P', (m-q)/B_H')``, i.e. ceil when
    ``x``'s fraction exceeds ``1 - s`` (ties: floor). ``round(x)`` rounds at 0.5 whatever the rates: with
    ``s = 0.38`` and ``m = 4`` it fills 2 (the GPU's branch 2 experts long, the CPU's 2/0.62*0.38 = 1.2) where
    1 fill (CPU 3*0.38/0.62 = 1.8) ends sooner. Equal to ``round`` at ``s = 0.5`` except at exact ties."""
    q = ((m + 1).to(torch.float32) * share.to(torch.float32)).ceil().to(torch.long) - 1
    lo = torch.clamp(m, max=min_fill)  # min_fill when m >= min_fill, m when smaller, 0 when m == 0
    q = torch.maximum(torch.minimum(q, m), lo)
    return torch.minimum(q, available)


def plan_fills(
    tables: SlotTables,
    groups: RouteGroups,
    pending: torch.Tensor,  # [K] bool: groups still to serve (round 1: groups.valid)
    share: torch.Tensor,  # [] float: share of misses to fill
    rule: FillRule = WARM,
    max_distinct: int | None = None,  # bound on distinct eids (a layer's E): shortens the copy lists
) -> StepPlan:
    """Classify pending groups, choose q fills (``fill_quota``) and their victims (``rule``), update the
    tables, build the copies."""
    t = tables
    S, N = t.num_slots, t.num_rows
    K = groups.eid.numel()
    Kv = min(K, S) if max_distinct is None else min(K, S, max_distinct)  # q <= m <= distinct eids
    dev = groups.eid.device
    slot = t.slot_of[groups.eid.clamp(max=N)]  # padding groups read the sentinel (-1)
    hit = pending & (slot >= 0)
    miss = pending & (slot < 0)
    m = miss.sum()
    # Slots this round reads (hits) or that are locked can never be victims.
    used = torch.zeros(S + 1, dtype=torch.bool, device=dev)
    used.scatter_(0, torch.where(hit, slot, S), True)
    blocked = (used | t.locked)[:S]
    stamp = t.stamp[:S]
    recent = (stamp > t.tick - rule.protect) & (stamp >= 0)  # all False when protect == 0
    if not rule.recent_last:
        blocked = blocked | recent
    available = S - blocked.sum()
    q = fill_quota(m, share, available, rule.min_fill)
    fillable = miss
    if rule.fill_rows is not None:  # misses of unpinned experts stay on the CPU
        fillable = miss & (groups.eid < rule.fill_rows)
        q = torch.minimum(q, fillable.sum())
    # Fill the misses the most routes want first (ties: the lower eid), one descending sort.
    key = torch.where(fillable, groups.count * (N + 1) + (N - groups.eid), torch.full_like(groups.count, -1))
    ranked = torch.sort(key, descending=True, stable=True).indices  # [K] groups by fill priority
    pos = torch.arange(K, device=dev)
    rank = torch.empty_like(ranked).scatter_(0, ranked, pos)
    fill = fillable & (rank < q)
    # Victims: the Kv oldest unblocked slots (free slots have stamp -1: oldest, lowest slot first).
    sidx = torch.arange(S, device=dev)
    skey = stamp * (S + 1) + sidx
    if rule.recent_last:  # after every older slot, newest first
        skey = torch.where(recent, _RECENT_BASE + (_STAMP_CAP - stamp) * (S + 1) + sidx, skey)
    skey = torch.where(blocked, torch.full_like(sidx, _INT64_MAX), skey)
    victims = torch.topk(skey, Kv, largest=False, sorted=True).indices  # [Kv]
    j = pos[:Kv]
    take = j < q
    copy_src = torch.where(take, groups.eid[ranked[:Kv]].clamp(max=N - 1), torch.zeros_like(j))
    copy_dst = torch.where(take, victims, torch.full_like(j, S))
    grp_fill_slot = victims[rank.clamp(max=max(Kv - 1, 0))] if Kv > 0 else torch.full_like(slot, -1)
    new_slot = torch.where(hit, slot, torch.where(fill, grp_fill_slot, torch.full_like(slot, -1)))
    _update_tables(t, hit, slot, take, victims, copy_src, copy_dst)
    rslot = new_slot[groups.route_group]
    route_code = torch.where(rslot >= 0, rslot, -1 - groups.eids)
    return StepPlan(groups, new_slot, hit, fill, miss, route_code, copy_src, copy_dst, q, hit.sum(), m)


def _update_tables(
    t: SlotTables,
    hit: torch.Tensor,
    slot: torch.Tensor,
    take: torch.Tensor,
    victims: torch.Tensor,
    copy_src: torch.Tensor,
    copy_dst: torch.Tensor,
) -> None:
    """Evict the victims' old eids, map the filled eids, stamp every slot this round uses."""
    S, N = t.num_slots, t.num_rows
    old = t.eid_of[victims]
    gone = torch.where(take & (old >= 0), old, torch.full_like(old, N))
    t.slot_of.scatter_(0, gone, torch.full_like(gone, -1))
    new = torch.where(take, copy_src, torch.full_like(copy_src, N))
    t.slot_of.scatter_(0, new, torch.where(take, victims, torch.full_like(victims, -1)))
    t.slot_of[N:] = -1
    t.eid_of.scatter_(0, copy_dst, torch.where(take, copy_src, torch.full_like(copy_src, -1)))
    t.eid_of[S:] = -1
    t.tick.add_(1)
    t.stamp.scatter_(0, torch.where(hit, slot, S), t.tick.expand(slot.shape[0]))
    t.stamp.scatter_(0, copy_dst, t.tick.expand(copy_dst.shape[0]))
    t.stamp[S:] = -1
