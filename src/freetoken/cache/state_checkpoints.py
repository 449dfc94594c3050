"""A budgeted pool of recurrent-state checkpoints hung on radix-tree nodes, LRU-recycled apart from KV pages.

A checkpoint is a slot of the ``StatePool`` past its request slots (every layer kind's state tensors, copied whole:
``StatePool.copy``). Its life: ``take`` (a request will write the state at a planned position into it while it
prefills: pending), then ``hang`` on the radix node whose path ends at that position (when the request gives its
pages to the tree), or ``give`` back. A hung checkpoint is what a later request with that prefix resumes from
(``restore``): the state at the end of the node's path. When the pool is full, ``take`` recycles the least recently
used hung checkpoint; when the tree evicts a node's pages, the tree drops its checkpoint (``dropped``).

Contract (like the other caches): lookup (``deepest``) / insert (``take`` + ``hang``) / evict (LRU in ``take``,
``dropped``) / size / ``check_integrity`` (``free + pending + hung == total``; a hung slot and its node point at
each other). Only the engine thread mutates it.
"""

from __future__ import annotations

import itertools

from freetoken.cache.radix import RadixCache, RadixNode
from freetoken.cache.state_pool import StatePool


class StateCheckpoints:
    def __init__(self, states: StatePool, tree: RadixCache) -> None:
        if states.num_checkpoints < 1:
            raise ValueError("a state checkpoint pool needs at least one checkpoint slot")
        self.states, self.tree = states, tree
        self._free: list[int] = list(reversed(states.checkpoint_slots))
        self._pending: set[int] = set()
        self._hung: dict[int, RadixNode] = {}
        self._used: dict[int, int] = {}  # slot -> logical clock of its last hang or restore
        self._clock = itertools.count(1)
        self.num_restored = self.num_recycled = 0
        tree.on_drop = self.dropped

    @property
    def size(self) -> int:
        return len(self._hung)

    @property
    def pending(self) -> set[int]:
        return set(self._pending)

    @property
    def num_slots(self) -> int:
        return self.states.num_checkpoints

    def take(self) -> int | None:
        """A slot for a checkpoint to be written; None when every slot is pending (nothing to recycle)."""
        if not self._free and self._hung:
            lru = min(self._hung, key=self._used.__getitem__)
            self._unhang(lru)
            self.num_recycled += 1
        if not self._free:
            return None
        slot = self._free.pop()
        self._pending.add(slot)
        return slot

    def hang(self, slot: int, node: RadixNode) -> None:
        """A pending checkpoint, written, onto the node whose path ends where it was taken (a node that has one
        keeps its own: the same prefix gives the same state)."""
        assert slot in self._pending, f"state checkpoint {slot} is not pending"
        if node.checkpoint is not None or node is self.tree.root:
            self.give(slot)
            return
        self._pending.discard(slot)
        node.checkpoint, self._hung[slot] = slot, node
        self._used[slot] = next(self._clock)

    def give(self, slot: int) -> None:
        """A pending checkpoint not hung (its request stopped before the position, or gave no pages)."""
        self._pending.remove(slot)
        self._free.append(slot)

    def deepest(self, node: RadixNode) -> RadixNode:
        """The deepest node at or above ``node`` with a checkpoint (the root when none)."""
        cur: RadixNode | None = node
        while cur is not None and cur is not self.tree.root and cur.checkpoint is None:
            cur = cur.parent
        return cur if cur is not None else self.tree.root

    def restore(self, node: RadixNode, slot: int) -> None:
        """Node's checkpoint into request slot ``slot``."""
        ck = node.checkpoint
        assert ck is not None and self._hung.get(ck) is node, "restoring a node without a checkpoint"
        self.states.copy(ck, slot)
        self._used[ck] = next(self._clock)
        self.num_restored += 1

    def dropped(self, node: RadixNode) -> None:
        """The tree is shortening or removing ``node``: its checkpoint no longer matches a cached path."""
        if node.checkpoint is not None:
            self._unhang(node.checkpoint)

    def _unhang(self, slot: int) -> None:
        node = self._hung.pop(slot)
        node.checkpoint = None
        del self._used[slot]
        self._free.append(slot)

    def check_integrity(self) -> None:
        slots = set(self.states.checkpoint_slots)
        free, pending, hung = set(self._free), self._pending, set(self._hung)
        assert len(free) == len(self._free), "a checkpoint slot is free twice"
        assert len(free) + len(pending) + len(hung) == len(slots), "free + pending + hung != total"
        assert free | pending | hung == slots, "a checkpoint slot is lost or foreign"
        for slot, node in self._hung.items():
            assert node.checkpoint == slot, f"checkpoint {slot}: its node carries {node.checkpoint}"
        on_nodes = [n.checkpoint for n in self.tree._nodes() if n.checkpoint is not None]
        assert sorted(on_nodes) == sorted(hung), "tree nodes carry checkpoints the pool does not know"
