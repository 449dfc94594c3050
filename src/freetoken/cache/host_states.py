"""The host-RAM tier of the recurrent-state checkpoints: checkpoints the device tier (the ``StatePool``'s checkpoint
slots) evicts move here, and a request resumes from one by copying it back into its state slot.

Layout: slot-major, ``conv`` ``[n, L, C, K-1]`` (the model dtype) and ``ssm`` ``[n, L, H, dk, dv]`` (float32), and the
window layers' KV rings ``[n, Lr, W, Hkv, hd]`` (``ring_k``, ``ring_v``), so a checkpoint is one contiguous block per
tensor; allocated empty (a slot is read only after a save wrote it: on the CPU
the pages are committed as they are written); pinned on a CUDA device (copies are DMA, asynchronous to the host
thread). Ordering on CUDA: ``save`` copies device -> host on a copy stream of its own, after everything the compute
stream has queued (the state was written there; earlier ``load`` reads of the host slot were queued there too), and
records an event; ``load`` makes the compute stream wait for the host slot's event, then copies host -> device on the
compute stream (stream-ordered: the request's step runs after it); ``fence`` makes the compute stream wait until a
saved device slot has been read before anything queued later overwrites it. No host thread waits on a copy. On the
CPU the tier is the same memory as the device tier: a second pool, plain copies, no streams.
"""

from __future__ import annotations

import logging

import torch

from freetoken.cache.state_pool import StatePool

log = logging.getLogger(__name__)


class HostStates:
    def __init__(self, pool: StatePool, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("a host state checkpoint tier needs at least one slot")
        self.pool, self.num_slots = pool, num_slots
        device = pool.conv.device
        self.pinned = device.type == "cuda"
        try:
            self.tensors = self._alloc(pool, num_slots, self.pinned)
        except RuntimeError as e:  # a system that caps page-locked memory: pageable (the copies wait for the host)
            log.warning("state checkpoints: the host tier could not be pinned (%s); pageable instead", e)
            self.pinned = False
            self.tensors = self._alloc(pool, num_slots, False)
        self.conv, self.ssm, self.ring_k, self.ring_v = self.tensors[:4]
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._saved: dict[int, torch.cuda.Event] = {}  # host slot -> its device -> host copy is done
        self._read: dict[int, torch.cuda.Event] = {}  # device slot -> the copy reading it is done
        self.num_saved = self.num_loaded = 0

    @staticmethod
    def _alloc(pool: StatePool, num_slots: int, pin: bool) -> tuple[torch.Tensor, ...]:
        """Slot-major host copies of every pool tensor ([n, layers, ...])."""
        return tuple(torch.empty((num_slots, t.shape[0], *t.shape[2:]), dtype=t.dtype, pin_memory=pin)
                     for t in pool.tensors)  # fmt: skip

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def save(self, src: int, dst: int) -> None:
        """Device slot ``src``'s state (every layer) into host slot ``dst``."""
        self.num_saved += 1
        pairs = list(zip(self.tensors, self.pool.tensors, strict=True))
        if self._stream is None:
            for host, dev in pairs:
                host[dst].copy_(dev[:, src])
            return
        compute = torch.cuda.current_stream(self.pool.conv.device)
        self._stream.wait_stream(compute)
        with torch.cuda.stream(self._stream):
            for host, dev in pairs:
                host[dst].copy_(dev[:, src], non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        self._saved[dst], self._read[src] = done, done

    def load(self, src: int, dst: int) -> None:
        """Host slot ``src`` into device slot ``dst`` (a request's state slot), ordered before the compute stream's
        later work."""
        self.num_loaded += 1
        pairs = list(zip(self.tensors, self.pool.tensors, strict=True))
        if self._stream is None:
            for host, dev in pairs:
                dev[:, dst].copy_(host[src])
            return
        saved = self._saved.pop(src, None)
        compute = torch.cuda.current_stream(self.pool.conv.device)
        if saved is not None:
            compute.wait_event(saved)
        for host, dev in pairs:
            dev[:, dst].copy_(host[src], non_blocking=True)

    def fence(self, device_slot: int) -> None:
        """Device slot ``device_slot`` is about to be written again: the compute stream waits (on the device, not
        the host thread) until a pending save has read it."""
        done = self._read.pop(device_slot, None)
        if done is not None:
            torch.cuda.current_stream(self.pool.conv.device).wait_event(done)
