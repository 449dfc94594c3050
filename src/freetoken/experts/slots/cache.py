"""The expert-slot cache: S device slots shared by all MoE layers, addressed by eid.

Contract (like the KV page pool and the state-checkpoint pool):
- ``plan`` (device, per layer and round, no host sync) is the only hot-path mutator: it classifies
  routes, picks LRU victims among the slots this round does not read (invariant: a slot is never
  evicted while a kernel of the current step reads it; kernels of earlier layers and rounds were
  enqueued earlier on the same stream, so they are done before the new copies land), updates the
  tables and returns the copies; ``copy`` then runs them as one batched gather.
- ``lookup / lock / unlock / insert / evict / size / check_integrity`` are host-side (they may
  synchronise) and are used at safe points, by static placements and by tests.
- Locked slots are never victims. Slot S is a scratch slot: padded copies land there, no eid maps to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from freetoken.experts.host_pool import HostExpertPool
from freetoken.experts.reference import ExpertAct
from freetoken.experts.slots.copy import batched_fill, copy_rows, copy_runs
from freetoken.experts.slots.counters import DeviceCounters
from freetoken.experts.slots.plan import WARM, FillRule, RouteGroups, SlotTables, StepPlan, group_routes, plan_fills
from freetoken.experts.slots.weights import SlotWeights
from freetoken.hardware.device_memory import device_zeros, remake, uses_driver_memory
from freetoken.hardware.device_memory import free_bytes as free_device_bytes
from freetoken.kernels.triton_support import use_triton


class SlotCache:
    def __init__(self, pool: HostExpertPool, num_slots: int, device: torch.device) -> None:
        if num_slots < 1:
            raise ValueError(f"the expert cache needs at least one slot, got {num_slots}")
        if num_slots > pool.num_rows:
            raise ValueError(f"{num_slots} slots exceed the {pool.num_rows} experts of the pool")
        self.pool = pool
        self.device = device
        S, N = num_slots, pool.num_rows
        # One slot = one whole expert: a row of every bank (``pool.tensors``: gate_up [S+1, 2I, D'], down
        # [S+1, D, I'], then the format's scale banks). Zero-filled so that masked work reading the scratch slot
        # stays finite.
        self.slots = self._banks(S)
        self.tables = SlotTables.empty(N, S, device)
        self._src = pool.device_views(device)
        self._held: list[int] = []  # eids the cache held, newest first (``resize``): a grow brings them back
        self.act = ExpertAct.of(pool.activation, pool.gate_up_bias, device)  # gpt-oss: biases by eid, not in slots

    @property
    def slot_gate_up(self) -> torch.Tensor:  # [S+1, 2I, D']
        return self.slots[0]

    @property
    def slot_down(self) -> torch.Tensor:  # [S+1, D, I']
        return self.slots[1]

    @property
    def weights(self) -> SlotWeights:
        """The slot banks as the grouped GEMM reads them (with the format and its scale banks)."""
        gs, ds = (self.slots[2], self.slots[3]) if len(self.slots) == 4 else (None, None)
        return SlotWeights(self.slots[0], self.slots[1], self.pool.fmt, gs, ds, self.act)

    # -- sizes ---------------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return self.tables.num_slots

    @property
    def total(self) -> int:
        return self.num_slots

    def size(self) -> int:
        """Slots holding an expert (host sync)."""
        return int((self.tables.eid_of[: self.num_slots] >= 0).sum())

    def free(self) -> int:
        return self.total - self.size()

    # -- hot path (device only) ----------------------------------------------------------------------
    def group(self, layer: int, topk_ids: torch.Tensor) -> RouteGroups:
        """topk_ids [T, k] per-layer expert ids -> routes grouped by eid = layer*E + id."""
        return group_routes(topk_ids.reshape(-1) + layer * self.pool.num_experts, self.pool.num_rows)

    def plan(self, groups: RouteGroups, pending: torch.Tensor, share: torch.Tensor, rule: FillRule = WARM) -> StepPlan:
        """``plan.plan_fills`` of one layer's ``pending`` groups."""
        E = self.pool.num_experts  # one layer's routes name at most E distinct experts
        return plan_fills(self.tables, groups, pending, share, rule, E)

    def group_and_plan(
        self,
        layer: int,
        topk_ids: torch.Tensor,
        share: torch.Tensor,
        rule: FillRule = WARM,
        counters: DeviceCounters | None = None,
        count_cpu: bool = False,
    ) -> StepPlan:
        """``group`` + ``plan`` of every group (a step's first round). Decode-sized steps on CUDA take the
        fused Triton plan (one launch instead of ~100 small ops), with identical results; it also adds the
        step to ``counters`` (the vector and the layer's row; ``count_cpu``: the unfilled misses are CPU runs)
        and says so in ``plan.counted``."""
        if use_triton(self.device):
            from freetoken.experts.slots.plan_triton import MAX_ROUTES, plan_step_triton

            if topk_ids.numel() <= MAX_ROUTES:
                off = layer * self.pool.num_experts
                vec, row = (None, None) if counters is None else (counters.vector, counters.per_layer[layer])
                return plan_step_triton(self.tables, topk_ids, off, share, rule, vec, count_cpu, row)
        groups = self.group(layer, topk_ids)
        return self.plan(groups, groups.valid, share, rule)

    def copy(self, plan: StepPlan) -> None:
        """One batched copy of this round's fills (all banks) from the pool into their slots."""
        batched_fill(self._src, self.slots, plan.copy_src, plan.copy_dst, plan.copy_count)

    # -- host-side API (may synchronise) -------------------------------------------------------------
    def _as_ids(self, eids: torch.Tensor | list[int]) -> torch.Tensor:
        return torch.as_tensor(eids, dtype=torch.long, device=self.device).reshape(-1)

    def lookup(self, eids: torch.Tensor | list[int]) -> torch.Tensor:
        """Slot of each eid, -1 when absent. Does not touch LRU stamps."""
        return self.tables.slot_of[self._as_ids(eids)]

    def lock(self, eids: torch.Tensor | list[int]) -> None:
        """Make resident experts unevictable. Raises KeyError for an absent eid."""
        slots = self.lookup(eids)
        if bool((slots < 0).any()):
            raise KeyError("cannot lock experts that are not resident")
        self.tables.locked[slots] = True

    def unlock(self, eids: torch.Tensor | list[int]) -> None:
        slots = self.lookup(eids)
        self.tables.locked[slots[slots >= 0]] = False

    def insert(self, eids: torch.Tensor | list[int]) -> torch.Tensor:
        """Make the given distinct eids resident (LRU victims among unlocked slots); returns their slots.

        Raises ValueError when they cannot all be resident at once.
        """
        ids = self._as_ids(eids)
        if ids.numel() == 0:
            return ids
        if ids.unique().numel() != ids.numel():
            raise ValueError("insert takes distinct eids")
        slots = self.lookup(ids)
        blocked = self.tables.locked[: self.num_slots].clone()
        blocked[slots[slots >= 0]] = True
        if int((slots < 0).sum()) > self.num_slots - int(blocked.sum()):  # checked before any change
            raise ValueError(f"cannot make {ids.numel()} experts resident in {self.num_slots} slots")
        groups = group_routes(ids, self.pool.num_rows)
        share = torch.ones((), dtype=torch.float32, device=self.device)
        self.copy(plan_fills(self.tables, groups, groups.valid, share))  # eids of any layers: no E bound
        return self.lookup(ids)

    def evict(self, eids: torch.Tensor | list[int]) -> None:
        """Drop resident experts (absent ones are ignored); frees and unlocks their slots."""
        t = self.tables
        ids = self._as_ids(eids)
        slots = t.slot_of[ids]
        slots = slots[slots >= 0]
        t.slot_of[t.eid_of[slots]] = -1
        t.eid_of[slots] = -1
        t.stamp[slots] = -1
        t.locked[slots] = False

    def resize(self, num_slots: int, fallback: Sequence[int] = ()) -> None:
        """Safe points only (no step in flight): change the slot count, keeping the residents that fit
        (locked ones first, then the most recently used), with their LRU stamps. A grow after a shrink brings back
        the experts the cache held before (the most recently used first, as the oldest residents, in their LRU
        order: those a shrink let go and those fills evicted while it was small), so the cache is warm again at
        once: the refill is this safe point's copy, registered like any fill (no step is in flight to need a slot).
        The pool holds every expert, so the survivors are copied again from the pool into the new banks, placed in
        eid order so that the copy is a few long DMA runs of the pinned pool (``copy.copy_rows``). A
        shrink makes its banks beside the old ones where they fit (``remake``), a grow where the device has room for
        both (nothing is lost if that is refused); else the old banks are dropped before the new ones are made (the
        peak is the larger of old and new). When the device refuses the new banks (another program took the memory
        meanwhile), the ``fallback`` sizes are tried in turn (the last one again and again), else
        ``torch.OutOfMemoryError`` (the cache then has no banks until a resize is granted). Any other failure leaves
        the cache as it was (the old banks, or banks of the old size made again) and is raised."""
        t, S, N = self.tables, self.num_slots, self.pool.num_rows
        if not 1 <= num_slots <= N:
            raise ValueError(f"slot count must be in [1, {N}], got {num_slots}")
        locked = t.locked[:S]
        if int(locked.sum()) > num_slots:
            raise ValueError(f"{int(locked.sum())} locked experts do not fit in {num_slots} slots")
        used = torch.nonzero(t.eid_of[:S] >= 0).flatten()
        key = t.stamp[used] + locked[used].long() * (1 << 62)  # locked first, then newest
        ranked = used[torch.sort(key, descending=True, stable=True).indices]
        # what the cache held, newest first: the residents now, then what it held before the last shrinks and does
        # not hold now (let go by a shrink, or evicted by fills while it was small)
        held = t.eid_of[ranked].tolist()
        now = set(held)
        self._held = (held + [e for e in self._held if e not in now])[:N]
        least = max(int(locked.sum()), 1)
        sizes = [num_slots, *(n for n in fallback if n >= least)]
        beside = num_slots > S and self._bank_bytes(num_slots) <= free_device_bytes(self.device)
        try:
            num_slots, banks = remake(self._banks, sizes, S, self._drop_banks, "the expert slots", beside)
            tables = self._survivors(ranked, num_slots)
            k = int((tables.eid_of[:num_slots] >= 0).sum())
            copy_rows(self.pool.tensors, banks, copy_runs(list(zip(tables.eid_of[:k].tolist(), range(k)))))
        except torch.OutOfMemoryError:
            raise  # refused at every size: no banks (``slots`` empty) until elastic memory resumes the cache
        except Exception:
            self._undo()  # any other failure: the cache as it was
            raise
        self.slots, self.tables = banks, tables

    def _survivors(self, ranked: torch.Tensor, num_slots: int) -> SlotTables:
        """The tables of ``num_slots`` slots: the first of ``ranked`` (slots, best first) that fit, then the experts
        the cache held before (``_held``), placed in eid order (the pool's rows copy as a few long runs)."""
        t, N, dev = self.tables, self.pool.num_rows, self.device
        keep = ranked[:num_slots]
        n = keep.numel()
        back = self._held[n:num_slots]  # nothing when it shrinks
        # Survivors: the kept experts with their stamps, then the brought-back ones (most recent first) below
        # every kept stamp in the same order: stamps and the tick shift up by m, so the LRU order (and the
        # streaming rule's window of recent steps) is what it was, and a miss evicts the oldest brought-back first.
        m = len(back)
        eids = torch.cat((t.eid_of[keep], torch.tensor(back, dtype=torch.long, device=dev)))
        stamps = torch.cat((t.stamp[keep] + m, torch.arange(m - 1, -1, -1, dtype=torch.long, device=dev)))
        locks = torch.cat((t.locked[keep], torch.zeros(m, dtype=torch.bool, device=dev)))
        order = torch.sort(eids).indices
        new = SlotTables.empty(N, num_slots, dev)
        new.tick = t.tick + m
        k = n + m
        new.eid_of[:k] = eids[order]
        new.stamp[:k] = stamps[order]
        new.locked[:k] = locks[order]
        new.slot_of[new.eid_of[:k]] = torch.arange(k, device=dev)
        return new

    def _undo(self) -> None:
        """After a failed resize: the banks as the tables say (the old ones, when they were never dropped; else made
        again, every resident copied again from the pool). If even that fails the cache has no banks, as when the
        device refuses every size (elastic memory resumes it)."""
        if self.slots:
            return
        eid_of = self.tables.eid_of[: self.num_slots].tolist()
        try:
            banks = self._banks(self.num_slots)
            copy_rows(self.pool.tensors, banks, copy_runs(sorted((e, s) for s, e in enumerate(eid_of) if e >= 0)))
        except Exception:  # noqa: BLE001 - the caller raises the first failure
            return
        self.slots = banks

    def _bank_bytes(self, num_slots: int) -> int:
        return sum((num_slots + 1) * t[0].numel() * t.element_size() for t in self.pool.tensors)

    def _drop_banks(self) -> None:
        self.slots = ()  # their memory returns to the device (``device_zeros``)
        if self.device.type == "cuda" and not uses_driver_memory(self.device):
            torch.cuda.empty_cache()

    def _banks(self, num_slots: int) -> tuple[torch.Tensor, ...]:
        """Zeroed banks of ``num_slots`` + 1 slots, one per pool bank (all or none)."""
        try:
            return tuple(device_zeros((num_slots + 1, *t.shape[1:]), t.dtype, self.device) for t in self.pool.tensors)
        except torch.OutOfMemoryError:
            if self.device.type == "cuda" and not uses_driver_memory(self.device):
                torch.cuda.empty_cache()  # the banks made before the refusal go back to the device
            raise

    def resident(self) -> dict[int, int]:
        """eid -> slot for every resident expert."""
        eid_of = self.tables.eid_of[: self.num_slots].tolist()
        return {e: s for s, e in enumerate(eid_of) if e >= 0}

    def check_integrity(self) -> None:
        """free + used == total; slot_of and eid_of are inverse maps; free slots are unstamped, unlocked."""
        t = self.tables
        S, N = self.num_slots, t.num_rows
        slot_of = t.slot_of.tolist()
        eid_of = t.eid_of.tolist()
        stamp = t.stamp.tolist()
        locked = t.locked.tolist()
        assert all(b.shape[0] == S + 1 for b in self.slots), f"slot banks not of {S} slots + scratch"
        assert slot_of[N] == -1, "sentinel eid maps to a slot"
        assert eid_of[S] == -1, "scratch slot holds an expert"
        used = [s for s in range(S) if eid_of[s] >= 0]
        free = [s for s in range(S) if eid_of[s] < 0]
        assert len(used) + len(free) == S
        assert len({eid_of[s] for s in used}) == len(used), "one eid in two slots"
        for s in used:
            assert 0 <= eid_of[s] < N, f"slot {s} holds eid {eid_of[s]} outside the pool"
            assert slot_of[eid_of[s]] == s, f"slot {s} holds eid {eid_of[s]}, slot_of: {slot_of[eid_of[s]]}"
            assert stamp[s] >= 0, f"used slot {s} has no stamp"
        for s in free:
            assert stamp[s] == -1 and not locked[s], f"free slot {s} is stamped or locked"
        mapped = [e for e in range(N) if slot_of[e] >= 0]
        assert len(mapped) == len(used), "slot_of maps more eids than slots are used"
        assert all(0 <= slot_of[e] < S for e in mapped)
