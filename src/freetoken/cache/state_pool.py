"""Recurrent-state slots of the running requests (gated DeltaNet layers, and the KV rings of sliding-window attention
layers: gpt-oss): one slot per request, like a KV page table of one page, allocated at admission and freed at finish or
preemption.

Shapes: L = linear-attention layers, S = slots, C = conv channels, K = conv kernel, H = value heads, dk / dv = key /
value head dims. ``conv[l]`` is ``[S, C, K-1]`` (the last K-1 conv inputs, the model dtype), ``ssm[l]`` is
``[S, H, dk, dv]`` (float32); ``ring_k[r]`` and ``ring_v[r]`` are ``[S, W, Hkv, hd]`` (the model dtype: window layer r's
K/V of a request's last W tokens, position p at ring row p % W); ``rows[j]`` is ``[S, n_j, w_j]`` (the model dtype: ring
j of ``row_rings``, a request's last n_j per-token rows of w_j channels, position p at row p % n_j: DeepSeek-V4's window
keys and raw compressor rows), views of one ``flat`` ``[1, S, sum n_j w_j]``. The layers read and write a slot in place,
so a decode step captured in a CUDA graph reads the slot ids from a static buffer; a slot's contents are valid only for
its owner's computed tokens (a request starting at position 0 starts from zeros, whatever the slot held; a ring's rows
of positions below 0 are masked). ``free + used == total`` always. Slots past ``num_slots`` hold checkpoints
(``state_checkpoints.py``), copied from and to request slots (``copy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateShape:
    """What one request's recurrent state looks like, per linear-attention layer."""

    num_layers: int
    conv_channels: int
    conv_len: int  # K - 1
    heads: int
    k_dim: int
    v_dim: int
    # sliding-window attention layers whose KV is a ring of a request's last ``ring_len`` (the window) tokens
    ring_layers: int = 0
    ring_len: int = 0
    ring_heads: int = 0  # KV heads
    ring_dim: int = 0  # head dim
    row_rings: tuple[tuple[int, int], ...] = ()  # rings of per-token rows: (positions n, width w) each

    def slot_bytes(self, dtype: torch.dtype) -> int:
        conv = self.conv_channels * self.conv_len * dtype.itemsize
        ring = 2 * self.ring_layers * self.ring_len * self.ring_heads * self.ring_dim * dtype.itemsize
        rows = sum(n * w for n, w in self.row_rings) * dtype.itemsize
        return self.num_layers * (conv + self.heads * self.k_dim * self.v_dim * 4) + ring + rows


class StatePool:
    def __init__(
        self, shape: StateShape, num_slots: int, dtype: torch.dtype, device: torch.device, num_checkpoints: int = 0
    ) -> None:
        if num_slots < 1:
            raise ValueError("the state pool needs at least one slot")
        self.shape, self.num_slots, self.num_checkpoints = shape, num_slots, num_checkpoints
        L, n = shape.num_layers, num_slots + num_checkpoints
        self.conv = torch.zeros((L, n, shape.conv_channels, shape.conv_len), dtype=dtype, device=device)
        self.ssm = torch.zeros((L, n, shape.heads, shape.k_dim, shape.v_dim), dtype=torch.float32, device=device)
        ring = (shape.ring_layers, n, shape.ring_len, shape.ring_heads, shape.ring_dim)
        self.ring_k = torch.zeros(ring, dtype=dtype, device=device)
        self.ring_v = torch.zeros(ring, dtype=dtype, device=device)
        sizes = [rn * w for rn, w in shape.row_rings]
        self.flat = torch.zeros((1, n, sum(sizes)), dtype=dtype, device=device)
        at = [sum(sizes[:j]) for j in range(len(sizes))]
        self.rows = [self.flat[0, :, a : a + size].view(n, rn, w)
                     for a, size, (rn, w) in zip(at, sizes, shape.row_rings)]  # fmt: skip
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._owner: dict[int, object] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every per-slot tensor, ``[layers, slots, ...]`` each: what a checkpoint copies."""
        return (self.conv, self.ssm, self.ring_k, self.ring_v, self.flat)

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @property
    def checkpoint_slots(self) -> range:
        return range(self.num_slots, self.num_slots + self.num_checkpoints)

    def copy(self, src: int, dst: int) -> None:
        """Slot ``src``'s state into slot ``dst``, every layer (a checkpoint taken or restored)."""
        for t in self.tensors:
            t[:, dst].copy_(t[:, src])

    def allocate(self, owner: object) -> int:
        if not self._free:
            raise MemoryError(f"state pool: all {self.num_slots} slots are taken")
        slot = self._free.pop()
        self._owner[slot] = owner
        return slot

    def free(self, slot: int, owner: object) -> None:
        if self._owner.get(slot) != owner:
            raise AssertionError(f"state slot {slot} freed by {owner!r} but owned by {self._owner.get(slot)!r}")
        del self._owner[slot]
        self._free.append(slot)

    def check_integrity(self, slots: Mapping[object, int] | None = None) -> None:
        """``slots``: every owner's slot (the running requests')."""
        assert len(self._free) + len(self._owner) == self.num_slots, "free + used != total"
        assert len(set(self._free)) == len(self._free), "a state slot is free twice"
        assert not set(self._free) & set(self._owner), "a state slot is both free and owned"
        if slots is not None:
            assert {s: o for o, s in slots.items()} == self._owner, "request state slots disagree with the pool"
