"""Prefill at the PCIe limit: whole MoE layers double-buffered through the slot pool.

A long prompt routes nearly every expert of every layer, so on-demand fills would copy a layer's
experts in rounds while the GPU waits. Instead, at the first MoE layer of a prefill step the streamer
takes ``B >= min(2, L)`` whole-layer buffers (``B * E`` least-recently-used *unlocked* slots: a running
decode's locked experts are never taken; free slots beyond two layers add buffers) out of the existing
slot pool, so GPU memory is never oversubscribed. Layer l lives in buffer ``l % B``: it is registered in
``slot_of`` (so the step's routes all hit and the normal plan + grouped GEMM run unchanged), while a
dedicated copy stream loads layer l+1 into the next buffer. CUDA events order copy -> compute -> release:

    copy stream:    [waits release(l+1-B) | load l+1] ...
    compute stream: waits copy(l) -> layer l experts -> records release(l)

Experts of a layer already resident outside the buffers are used where they are (not copied twice).
A layer may be computed in several passes (a layer-major prefill runs every chunk of layer l, then layer
l+1: ``engine/layer_major.py``): a layer's later passes find it loaded and copy nothing, so a cold prompt
streams the pool once. The stream stays open until the next safe point (``begin_step`` / ``finish``: call it
before any host-side change to the slot cache); then
the held layers stay registered with fresh LRU stamps: they seed decode. A stream restarted at a later layer
(a layer-major prefill resumed after decode steps ran in between) takes as buffers the slots it needs least:
experts of layers still to come last (they would be copied again), then the least recently used (decode's
hot experts last). On the CPU the same logic runs with plain synchronous copies (no streams, no events),
which is what CI tests.

Falls back to on-demand fills (the caller's normal path, as decode: fills of the routed misses, and the CPU branch
for hybrid) when the pool cannot spare two layers (``2 * E`` > unlocked slots), the step has fewer tokens than
``stream_min_tokens`` (a short prompt, or a warm prompt's short new suffix), or fewer than ``E`` experts are absent
from the cache (it holds nearly the whole pool: streaming would displace more than it brings).
Modes: ``stream`` (overlap), ``serial`` (copy a layer, then compute it: no prefetch), ``off``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.copy import copy_rows, copy_runs

MODES = ("stream", "serial", "off")


def stream_min_tokens(num_experts: int, top_k: int) -> int:
    """Fewest tokens of a prefill step for which whole layers stream.

    Bandwidth model, per layer: a stream copies every absent expert of the layer (A at B_P, overlapped with the
    layer before); on-demand fills copy only the routed misses (offload: all at B_P; hybrid: a share, the CPU
    branch reads the rest at B_H alongside). T tokens routed uniformly leave A * (1 - k/E)^T of the absent experts
    unrouted: while that is one expert or more per layer, a stream copies weights no token reads, and what it buys
    in return (hiding the copies behind the compute of a few tokens, and hybrid's CPU branch, still bandwidth-bound
    at T*k/E tokens per expert, left idle) is small. So: stream when E * (1 - k/E)^T < 1, i.e.
    T >= ln E / -ln(1 - k/E) (about E ln E / k: 76 tokens for 128 experts, top-8)."""
    if top_k <= 0 or num_experts <= 1:
        return 1
    if top_k >= num_experts:
        return 1
    return max(1, math.ceil(math.log(num_experts) / -math.log1p(-top_k / num_experts)))


@dataclass
class _Buffer:
    slots: list[int]  # [E] slot of expert e of the layer held here
    layer: int = -1  # layer registered here, -1 none
    placed: list[tuple[int, int]] = field(default_factory=list)  # (eid, slot) registered by us
    copied: torch.cuda.Event | None = None  # the layer's copies are done
    released: torch.cuda.Event | None = None  # the last kernel reading this buffer is done


class LayerStreamer:
    """Per prefill step: ``begin_step`` arms it, ``before_layer``/``after_layer`` bracket each MoE layer."""

    def __init__(self, cache: SlotCache, num_layers: int, mode: str = "stream") -> None:
        if mode not in MODES:
            raise ValueError(f"prefill mode must be one of {MODES}, got {mode!r}")
        self.cache = cache
        self.num_layers = num_layers
        self.mode = mode
        self._armed = False
        self._active = False
        self._bufs: list[_Buffer] = []
        self._resident: dict[int, int] = {}  # eid -> slot of residents outside the buffers (step start)
        self._kept: set[tuple[int, int]] = set()  # (eid, slot) in a buffer that held the expert already
        self._stream: torch.cuda.Stream | None = None
        self.steps_streamed = 0
        self.steps_ondemand = 0  # prefill steps that fell back to on-demand fills
        self.layers_streamed = 0
        self.experts_copied = 0

    @property
    def num_experts(self) -> int:
        return self.cache.pool.num_experts

    @property
    def min_buffers(self) -> int:
        """Double buffering needs two whole layers (one when the model has a single MoE layer)."""
        return min(2, self.num_layers)

    @property
    def num_buffers(self) -> int:
        """Whole-layer buffers of the current stream (0 when none is active)."""
        return len(self._bufs)

    @property
    def active(self) -> bool:
        return self._active

    @property
    def _cuda(self) -> bool:
        return self.cache.device.type == "cuda"

    # -- step boundaries -------------------------------------------------------------------------------
    def begin_step(self, num_tokens: int, is_decode: bool) -> None:
        """Safe point: close an unfinished stream, arm for a prefill step (decided at its first layer)."""
        self.finish()
        self._armed = not is_decode and self.mode != "off"

    def wants_stream(self, num_tokens: int, top_k: int, unlocked: int, absent: int) -> bool:
        """Whole layers pay off: the step has enough tokens (``stream_min_tokens``), the pool spares the buffers,
        and at least a layer's worth of experts is absent (a warm cache that holds the pool fills on demand)."""
        E = self.num_experts
        enough = num_tokens >= stream_min_tokens(E, top_k)
        return enough and self.min_buffers * E <= unlocked and absent >= E

    def _start(self, num_tokens: int, top_k: int, layer: int) -> bool:
        """Take the buffers (unlocked slots, one host sync), or decline (on-demand fills); ``layer``: the
        first layer this stream computes."""
        t, S, E = self.cache.tables, self.cache.num_slots, self.num_experts
        locked, stamp, eid_of = torch.stack((t.locked[:S].long(), t.stamp[:S], t.eid_of[:S])).tolist()  # [3, S]
        unlocked = [s for s in range(S) if not locked[s]]
        absent = self.cache.pool.num_rows - sum(1 for e in eid_of if e >= 0)
        if not self.wants_stream(num_tokens, top_k, len(unlocked), absent):
            self.steps_ondemand += 1
            return False
        # Free slots beyond two layers become further buffers (a ring: layer l in buffer l % B), so a cache
        # with room keeps more of the prompt's layers resident afterwards, at no eviction.
        free = sum(1 for s in unlocked if eid_of[s] < 0)
        nbuf = max(self.min_buffers, min(self.num_layers, free // E))
        # Buffer b first holds the b-th of the next nbuf layers (l % nbuf == b): those of their experts already
        # resident stay where they are, as part of their buffer (kept: registered, never copied); the other
        # positions take the slots needed least (not an expert of a layer to come, then oldest).
        bufs: list[list[int]] = [[-1] * E for _ in range(nbuf)]
        kept: set[tuple[int, int]] = set()
        for s in unlocked:
            e = eid_of[s]
            if layer * E <= e < min(layer + nbuf, self.num_layers) * E:
                bufs[(e // E) % nbuf][e % E] = s
                kept.add((e, s))
        kept_slots = {s for _, s in kept}

        def cost(s: int) -> tuple[bool, int, int]:  # an expert of a layer still to come would be copied again
            return eid_of[s] >= layer * E, stamp[s], s

        rest = sorted(sorted((s for s in unlocked if s not in kept_slots), key=cost)[: nbuf * E - len(kept)])
        take = iter(rest)  # ascending: runs
        for buf_slots in bufs:
            for e in range(E):
                if buf_slots[e] < 0:
                    buf_slots[e] = next(take)
        gone = [eid_of[s] for s in rest if eid_of[s] >= 0]
        if gone:
            self._set(t.slot_of, gone, -1)
        if rest:
            self._set(t.eid_of, rest, -1)
            self._set(t.stamp, rest, -1)
        taken = set(rest) | kept_slots
        self._resident = {e: s for s, e in enumerate(eid_of) if e >= 0 and s not in taken}
        self._kept = kept
        start = self._record()  # kernels of earlier steps that read the taken slots
        self._bufs = [_Buffer(b, released=start) for b in bufs]
        self._active = True
        self.steps_streamed += 1
        return True

    def finish(self) -> None:
        """End of the step: compute waits for any copy still in flight; the held layers stay resident
        with fresh stamps (they seed decode)."""
        if not self._active:
            return
        for buf in self._bufs:
            if buf.copied is not None and self._cuda:
                torch.cuda.current_stream(self.cache.device).wait_event(buf.copied)
            slots = [s for _, s in buf.placed]
            if slots:
                self._stamp(slots)
        self._bufs, self._resident, self._kept, self._active = [], {}, set(), False

    # -- per layer -------------------------------------------------------------------------------------
    def before_layer(self, layer: int, topk_ids: torch.Tensor) -> bool:
        """True when every expert of ``layer`` is resident for this step (the plan will only hit)."""
        if self._armed:
            self._armed = False
            self._start(int(topk_ids.shape[0]), int(topk_ids.shape[1]), layer)
        if not self._active:
            return False
        buf = self._bufs[layer % self.num_buffers]
        if buf.layer != layer:
            if self.mode == "serial":  # no overlap: the copy starts after every kernel enqueued so far
                buf.released = self._record()
            self._load(layer, buf)
        nxt = layer + 1
        if self.mode == "stream" and nxt < self.num_layers and self.num_buffers > 1:
            other = self._bufs[nxt % self.num_buffers]
            if other.layer != nxt:
                self._load(nxt, other)  # overlaps this layer's compute
        if self._cuda and buf.copied is not None:
            torch.cuda.current_stream(self.cache.device).wait_event(buf.copied)
            buf.copied = None
        return True

    def after_layer(self, layer: int) -> None:
        """The layer's kernels (of this pass) are enqueued: its buffer may be overwritten once they are done.
        The stream stays open past the last layer: a layer-major prefill runs it once per chunk."""
        if not self._active:
            return
        self._bufs[layer % self.num_buffers].released = self._record()

    # -- mechanics -------------------------------------------------------------------------------------
    def _load(self, layer: int, buf: _Buffer) -> None:
        """Unregister the buffer's old layer, register ``layer`` and copy its non-resident experts in."""
        t, E, c = self.cache.tables, self.num_experts, self.cache
        if buf.placed:  # compute-stream order: after the old layer's kernels were enqueued
            old_e, old_s = [p[0] for p in buf.placed], [p[1] for p in buf.placed]
            self._set(t.slot_of, old_e, -1)
            self._set(t.eid_of, old_s, -1)
            self._set(t.stamp, old_s, -1)
            self._kept.difference_update(buf.placed)
        pairs = [(layer * E + e, buf.slots[e]) for e in range(E) if layer * E + e not in self._resident]
        buf.layer, buf.placed = layer, pairs
        self.layers_streamed += 1
        if not pairs:
            return
        eids, slots = [p[0] for p in pairs], [p[1] for p in pairs]
        idx_e, idx_s = self._ids(eids), self._ids(slots)
        t.slot_of.index_copy_(0, idx_e, idx_s)
        t.eid_of.index_copy_(0, idx_s, idx_e)
        self._stamp(slots)
        copies = [p for p in pairs if p not in self._kept]  # kept ones hold their expert already
        self.experts_copied += len(copies)
        runs = copy_runs(copies)
        if not self._cuda:  # synchronous: plain copies
            copy_rows(c.pool.tensors, c.slots, runs)
            return
        stream = self._copy_stream()
        if buf.released is not None:
            stream.wait_event(buf.released)
        with torch.cuda.stream(stream):  # pinned pool -> slots, DMA on the copy stream
            copy_rows(c.pool.tensors, c.slots, runs)
            ev = torch.cuda.Event()
            ev.record(stream)
        buf.copied = ev

    def _copy_stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.cache.device)
        return self._stream

    def _record(self) -> torch.cuda.Event | None:
        if not self._cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.cache.device))
        return ev

    def _ids(self, values: list[int]) -> torch.Tensor:
        """Host ints -> a device index tensor. CUDA: through pinned memory, because a copy from pageable
        memory waits for the stream to drain (it would stall the host until the previous layer is done)."""
        ids = torch.tensor(values, dtype=torch.long)
        if not self._cuda:
            return ids
        return ids.pin_memory().to(self.cache.device, non_blocking=True)

    def _set(self, table: torch.Tensor, index: list[int], value: int) -> None:
        table.index_fill_(0, self._ids(index), value)

    def _stamp(self, slots: list[int]) -> None:
        """Stamp slots with the current tick (newer than every earlier plan's), on the device."""
        t = self.cache.tables
        idx = self._ids(slots)
        t.stamp.scatter_(0, idx, t.tick.expand(idx.numel()))  # like slots/plan.py: _update_tables

    def stats(self) -> dict[str, int]:
        return {
            "prefill_steps_streamed": self.steps_streamed,
            "prefill_steps_ondemand": self.steps_ondemand,
            "prefill_layers_streamed": self.layers_streamed,
            "prefill_experts_streamed": self.experts_copied,
            "prefill_stream_bytes": self.experts_copied * self.cache.pool.expert_bytes,
        }
