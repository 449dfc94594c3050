"""The state pool's rings of per-token rows (``row_rings``: DeepSeek-V4's window keys and raw compressor rows): each
ring a view of one flat tensor, so a checkpoint copy (device slot to slot, and through the host tier) carries every
ring, and the slot's bytes are the rings' sum."""

from __future__ import annotations

import torch

from freetoken.cache.host_states import HostStates
from freetoken.cache.state_pool import StatePool, StateShape

RINGS = ((4, 3), (0, 0), (2, 5))  # (positions, width): a window ring, a sliding layer's empty one, a raw ring
SHAPE = StateShape(0, 0, 0, 0, 0, 0, row_rings=RINGS)


def test_rings_are_views_of_one_flat_tensor_and_their_bytes_add_up() -> None:
    states = StatePool(SHAPE, 3, torch.float32, torch.device("cpu"), num_checkpoints=2)
    assert [tuple(r.shape) for r in states.rows] == [(5, n, w) for n, w in RINGS]
    assert states.flat.shape == (1, 5, 4 * 3 + 2 * 5)
    assert SHAPE.slot_bytes(torch.float32) == 22 * 4 and states.bytes == 5 * 22 * 4
    states.rows[2][1, 1] = 7.0
    assert states.flat[0, 1, 12 + 5 :].eq(7.0).all() and states.flat[0, 1, :17].eq(0.0).all()


def test_a_checkpoint_copies_every_ring_on_the_device_and_through_the_host_tier() -> None:
    states = StatePool(SHAPE, 2, torch.float32, torch.device("cpu"), num_checkpoints=1)
    for j, ring in enumerate(states.rows):
        ring[0] = torch.arange(ring[0].numel(), dtype=torch.float32).view_as(ring[0]) + 10 * j
    want = [r[0].clone() for r in states.rows]
    states.copy(0, 2)  # into the checkpoint slot
    assert all(torch.equal(r[2], w) for r, w in zip(states.rows, want))
    host = HostStates(states, 1)
    host.save(2, 0)
    host.load(0, 1)  # back into another request's slot
    assert all(torch.equal(r[1], w) for r, w in zip(states.rows, want))
