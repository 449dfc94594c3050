"""A budgeted pool of recurrent-state checkpoints hung on radix-tree nodes, LRU-recycled apart from KV pages, in two
tiers: the device tier (slots of the ``StatePool`` past its request slots) and, optionally, a host-RAM tier
(``HostStates``) that takes what the device tier evicts.

A checkpoint is identified by a key: a device checkpoint slot (``StatePool.checkpoint_slots``), or a host slot
numbered after them (``host_keys``); ``RadixNode.checkpoint`` holds the key, so the tree keeps one entry whichever
tier holds the state. Its life: ``take`` (a request will write the state at a planned position into a device slot
while it prefills: pending), then ``hang`` on the radix node whose path ends at that position (when the request gives
its pages to the tree), or ``give`` back. A hung checkpoint is what a later request with that prefix resumes from
(``restore``: a device copy, or host -> device). When the device tier has no free slot, ``take`` evicts its least
recently used hung checkpoint: into the host tier when there is one (``demote``: an asynchronous device -> host copy;
the host tier, when full, drops its own least recently used checkpoint first), else dropped. A request prefilling
past more anchors than the device tier has slots moves each written pending checkpoint to a host slot, still pending
(``spill``), and its device slot takes the next anchor. When the tree evicts a node's pages, the tree drops its
checkpoint (``dropped``), whichever tier holds it. LRU order is one clock over both tiers (a hang or a restore
touches a checkpoint; a demotion keeps its time).

Contract (like the other caches): lookup (``deepest``) / insert (``take`` + ``hang``) / evict (LRU in ``take``,
``dropped``) / size / ``check_integrity`` (``free + pending + hung == total`` in each tier; a hung key and its node
point at each other). Only the engine thread mutates it.
"""

from __future__ import annotations

import itertools

from freetoken.cache.host_states import HostStates
from freetoken.cache.radix import RadixCache, RadixNode
from freetoken.cache.state_pool import StatePool


class StateCheckpoints:
    def __init__(self, states: StatePool, tree: RadixCache, host: HostStates | None = None) -> None:
        if states.num_checkpoints < 1:
            raise ValueError("a state checkpoint pool needs at least one checkpoint slot")
        self.states, self.tree, self.host = states, tree, host
        self._free: list[int] = list(reversed(states.checkpoint_slots))
        base = states.num_slots + states.num_checkpoints
        self.host_keys = range(base, base + (host.num_slots if host is not None else 0))
        self._host_free: list[int] = list(reversed(self.host_keys))
        self._pending: set[int] = set()
        self._hung: dict[int, RadixNode] = {}  # key (either tier) -> its node
        self._used: dict[int, int] = {}  # key -> logical clock of its last hang or restore
        self._clock = itertools.count(1)
        self.num_restored = self.num_restored_host = self.num_recycled = self.num_demoted = self.num_spilled = 0
        tree.on_drop = self.dropped

    @property
    def size(self) -> int:
        return len(self._hung)

    @property
    def size_host(self) -> int:
        return sum(1 for k in self._hung if k in self.host_keys)

    @property
    def pending(self) -> set[int]:
        return set(self._pending)

    @property
    def num_slots(self) -> int:
        return self.states.num_checkpoints

    def stats(self) -> dict[str, int]:
        """Both tiers: checkpoints held and slots, restores (all, from the host), demotions, drops (recycled)."""
        host = self.size_host
        return {"state_checkpoints": self.size, "state_checkpoints_device": self.size - host,
                "state_checkpoints_host": host, "state_checkpoint_slots_device": self.num_slots,
                "state_checkpoint_slots_host": len(self.host_keys), "state_restores": self.num_restored,
                "state_restores_host": self.num_restored_host, "state_demoted": self.num_demoted,
                "state_spilled": self.num_spilled,
                "state_recycled": self.num_recycled}  # fmt: skip

    def take(self) -> int | None:
        """A device slot for a checkpoint to be written; None when every slot is pending (nothing to evict)."""
        if not self._free:
            on_device = [k for k in self._hung if k not in self.host_keys]
            if on_device:
                lru = min(on_device, key=self._used.__getitem__)
                if self.host is not None:
                    self.demote(lru)
                else:
                    self._unhang(lru)
                    self.num_recycled += 1
        if not self._free:
            return None
        slot = self._free.pop()
        if self.host is not None:
            self.host.fence(slot)  # a demotion still reading it finishes before the layers write it
        self._pending.add(slot)
        return slot

    def demote(self, slot: int) -> None:
        """Device checkpoint ``slot`` into the host tier (its node now names the host key); the device slot is
        free. The host tier, when full, drops its least recently used checkpoint first."""
        assert self.host is not None and slot in self._hung and slot not in self.host_keys
        if not self._host_free:
            held = [k for k in self._hung if k in self.host_keys]
            if not held:  # every host slot is pending: the checkpoint is dropped
                self._unhang(slot)
                self.num_recycled += 1
                return
            self._unhang(min(held, key=self._used.__getitem__))
            self.num_recycled += 1
        key = self._host_free.pop()
        self.host.save(slot, key - self.host_keys.start)
        node = self._hung.pop(slot)
        node.checkpoint, self._hung[key] = key, node
        self._used[key] = self._used.pop(slot)
        self._free.append(slot)
        self.num_demoted += 1

    def spill(self, slot: int) -> int | None:
        """A pending device checkpoint, written, into the host tier while it waits to be hung (its request prefills
        on and needs the device slot for its next anchors): the host key it now has (pending), or None when every
        host slot is pending."""
        assert self.host is not None and slot in self._pending and slot not in self.host_keys
        if not self._host_free:
            held = [k for k in self._hung if k in self.host_keys]
            if not held:
                return None
            lru = min(held, key=self._used.__getitem__)
            self._unhang(lru)
            self.num_recycled += 1
        key = self._host_free.pop()
        self.host.save(slot, key - self.host_keys.start)
        self._pending.remove(slot)
        self._pending.add(key)
        self._free.append(slot)
        self.num_spilled += 1
        return key

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
        (self._host_free if slot in self.host_keys else self._free).append(slot)

    def deepest(self, node: RadixNode) -> RadixNode:
        """The deepest node at or above ``node`` with a checkpoint (the root when none)."""
        cur: RadixNode | None = node
        while cur is not None and cur is not self.tree.root and cur.checkpoint is None:
            cur = cur.parent
        return cur if cur is not None else self.tree.root

    def restore(self, node: RadixNode, slot: int) -> None:
        """Node's checkpoint into request slot ``slot`` (from the host tier: host -> device, stream-ordered)."""
        ck = node.checkpoint
        assert ck is not None and self._hung.get(ck) is node, "restoring a node without a checkpoint"
        if ck in self.host_keys:
            assert self.host is not None
            self.host.load(ck - self.host_keys.start, slot)
            self.num_restored_host += 1
        else:
            self.states.copy(ck, slot)
        self._used[ck] = next(self._clock)
        self.num_restored += 1

    def dropped(self, node: RadixNode) -> None:
        """The tree is shortening or removing ``node``: its checkpoint no longer matches a cached path."""
        if node.checkpoint is not None:
            self._unhang(node.checkpoint)

    def _unhang(self, key: int) -> None:
        node = self._hung.pop(key)
        node.checkpoint = None
        del self._used[key]
        (self._host_free if key in self.host_keys else self._free).append(key)

    def check_integrity(self) -> None:
        slots, keys = set(self.states.checkpoint_slots), set(self.host_keys)
        free, host_free = set(self._free), set(self._host_free)
        pending, host_pending = self._pending & slots, self._pending & keys
        hung, host_hung = set(self._hung) & slots, set(self._hung) & keys
        assert len(free) == len(self._free), "a checkpoint slot is free twice"
        assert len(free) + len(pending) + len(hung) == len(slots), "free + pending + hung != total"
        assert free | pending | hung == slots, "a checkpoint slot is lost or foreign"
        assert len(host_free) == len(self._host_free), "a host checkpoint slot is free twice"
        assert len(host_free) + len(host_pending) + len(host_hung) == len(keys), "host: free + pending + hung != total"
        assert host_free | host_pending | host_hung == keys, "a host checkpoint slot is lost or foreign"
        assert len(hung) + len(host_hung) == len(self._hung) == len(self._used), "a checkpoint outside both tiers"
        for key, node in self._hung.items():
            assert node.checkpoint == key, f"checkpoint {key}: its node carries {node.checkpoint}"
        on_nodes = [n.checkpoint for n in self.tree.nodes() if n.checkpoint is not None]
        assert sorted(on_nodes) == sorted(self._hung), "tree nodes carry checkpoints the pool does not know"
