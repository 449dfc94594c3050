"""Radix prefix cache over KV pages, shared by all requests.

Page-granular: every edge is a run of whole pages of token ids (S = page_size tokens per page) and
a node holds the KV page id of each of its S-token pages. A path from the root spells a token
prefix whose K/V sit in the path's pages, in order.

Contract (the shape every cache shares: lookup / lock / insert / evict / size / check_integrity):
- ``lookup(tokens)``: the longest cached prefix of whole pages, as its last node and its
  pages. It may split a node at a page boundary so that the node ends exactly at the match, and it
  marks the path as used now (LRU).
- ``lock(node)`` / ``unlock(node)``: a request reading the pages of a path holds one lock on the
  path's last node; the count is kept on every node of the path. Locked nodes are never evicted.
- ``insert(tokens, pages, owner)``: adds the pages of a request that finishes or is preempted. For
  the part already cached the tree keeps its own pages and the caller frees its copies (the count
  of that part is returned); the other pages change owner from ``owner`` to the tree in the pool.
- ``evict(n)``: frees up to n pages back to the pool, tail pages of the least recently used
  unlocked leaf first (a leaf may shrink page by page; an emptied leaf goes, its parent may follow).
- ``remap(moves)``: the pool resized and moved pages; the tree renames them (no page is lost).
- Only the engine thread mutates the tree (no lock around the Python object).
- A node may carry a recurrent-state checkpoint taken where its path ends (``checkpoint``, a slot of
  ``state_checkpoints.py``): a split keeps it on the tail (its end does not move); when eviction shortens or
  removes the node, ``on_drop(node)`` is told first.

Invariants (``check_integrity``):
1. Every non-root node has ``len(key) == len(pages) * S > 0`` and is its parent's child under the
   first page of its key; children of a node start with different pages.
2. Every tree page appears once in the tree and is owned by the tree in the KV pool, and the pool
   gives the tree no other page; ``num_pages`` counts them.
3. ``node.lock_ref >= sum(child.lock_ref)``; ``num_locked_pages`` counts pages of locked nodes.
4. ``parent.last_access >= child.last_access`` (a path is touched as a whole), so the least recently
   used unlocked leaf is the oldest page run of its branch.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freetoken.cache.kv_pool import KVPool


@dataclass(eq=False)
class RadixNode:
    id: int
    key: list[int]  # token ids of this edge: len(pages) whole pages
    pages: list[int]  # KV page ids, one per S tokens of key
    parent: RadixNode | None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)  # by the first page's tokens
    lock_ref: int = 0  # requests whose locked path runs through this node
    last_access: int = 0  # logical clock of the last lookup/insert touching this node
    checkpoint: int | None = None  # a state checkpoint taken at the end of this node's path


@dataclass
class PrefixMatch:
    node: RadixNode  # last node of the matched path (the root when nothing matched)
    pages: list[int]  # page ids of the matched prefix, in order

    @property
    def num_pages(self) -> int:
        return len(self.pages)


class RadixCache:
    def __init__(self, kv: KVPool) -> None:
        self.kv = kv
        self.page_size = kv.page_size
        self._ids = itertools.count()
        self.root = RadixNode(next(self._ids), [], [], None)
        self._clock = 0
        self._num_pages = 0
        self._num_locked_pages = 0
        self.num_evictions = 0  # pages evicted since start
        self.on_drop: Callable[[RadixNode], None] | None = None  # a node with a checkpoint shrinks or goes

    def __repr__(self) -> str:
        return "<radix tree>"

    # ---- size -----------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Pages held by the tree (locked or not)."""
        return self._num_pages

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def num_locked_pages(self) -> int:
        return self._num_locked_pages

    @property
    def num_evictable_pages(self) -> int:
        return self._num_pages - self._num_locked_pages

    # ---- lookup ---------------------------------------------------------------------------------
    def lookup(self, tokens: Sequence[int]) -> PrefixMatch:
        """Longest cached prefix of ``tokens`` in whole pages (a trailing partial page never matches)."""
        self._clock += 1
        node, pages, i = self.root, [], 0
        n = len(tokens) // self.page_size
        while i < n:
            child = node.children.get(self._page(tokens, i))
            if child is None:
                break
            k = self._common_pages(child, tokens, i, n)
            if k < len(child.pages):
                child = self._split(child, k)
            pages += child.pages
            node, i = child, i + k
        self._touch(node)
        return PrefixMatch(node, pages)

    def path_pages(self, node: RadixNode) -> list[int]:
        """Page ids from the root down to ``node`` (a request's shared prefix)."""
        runs: list[list[int]] = []
        cur: RadixNode | None = node
        while cur is not None:
            runs.append(cur.pages)
            cur = cur.parent
        return [p for run in reversed(runs) for p in run]

    def all_pages(self) -> list[int]:
        return [p for node in self.nodes() for p in node.pages]

    # ---- lock -----------------------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        for n in self._path(node):
            if n.lock_ref == 0:
                self._num_locked_pages += len(n.pages)
            n.lock_ref += 1

    def unlock(self, node: RadixNode) -> None:
        for n in self._path(node):
            if n.lock_ref <= 0:
                raise AssertionError(f"radix node {n.id} unlocked more often than locked")
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self._num_locked_pages -= len(n.pages)

    # ---- insert ---------------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], pages: Sequence[int], owner: object) -> int:
        """Caches ``pages`` (``len(tokens) == len(pages) * S``); returns how many leading pages were
        cached already (those stay ``owner``'s: it frees them or already shares them). The rest move
        from ``owner`` to the tree."""
        S = self.page_size
        if len(tokens) != len(pages) * S:
            raise ValueError(f"{len(tokens)} tokens for {len(pages)} pages of {S}")
        self._clock += 1
        node, i, n = self.root, 0, len(pages)
        while i < n:
            child = node.children.get(self._page(tokens, i))
            if child is None:
                new = RadixNode(next(self._ids), list(tokens[i * S :]), list(pages[i:]), node)
                self.kv.transfer(new.pages, owner, self)
                node.children[self._page(tokens, i)] = new
                self._num_pages += len(new.pages)
                self._touch(new)
                return i
            k = self._common_pages(child, tokens, i, n)
            if k < len(child.pages):
                child = self._split(child, k)
            node, i = child, i + k
        self._touch(node)
        return n

    # ---- evict ----------------------------------------------------------------------------------
    def evict(self, num_pages: int) -> list[int]:
        """Frees up to ``num_pages`` unlocked pages to the pool; returns their ids in eviction order."""
        heap = [(n.last_access, n.id, n) for n in self.nodes() if not n.children and n.lock_ref == 0 and n.pages]
        heapq.heapify(heap)
        freed: list[int] = []
        while len(freed) < num_pages and heap:
            _, _, leaf = heapq.heappop(heap)
            take = min(num_pages - len(freed), len(leaf.pages))
            keep = len(leaf.pages) - take
            if leaf.checkpoint is not None and self.on_drop is not None:
                self.on_drop(leaf)
            freed += reversed(leaf.pages[keep:])  # deepest page first
            if keep:
                del leaf.pages[keep:], leaf.key[keep * self.page_size :]
                continue
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._page(leaf.key, 0)]
            leaf.parent = None
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        self.kv.free(freed, self)
        self._num_pages -= len(freed)
        self.num_evictions += len(freed)
        return freed

    def remap(self, moves: dict[int, int]) -> None:
        """The KV pool moved pages (``KVPool.resize``): rename them in every node, keeping every page."""
        if not moves:
            return
        for node in self.nodes():
            node.pages = [moves.get(p, p) for p in node.pages]

    # ---- integrity ------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        S = self.page_size
        seen: set[int] = set()
        locked = 0
        for node in self.nodes():
            child_locks = 0
            for first, child in node.children.items():
                assert child.parent is node, f"node {child.id} has a wrong parent"
                assert child.pages and len(child.key) == len(child.pages) * S, f"node {child.id}: key/pages mismatch"
                assert first == self._page(child.key, 0), f"node {child.id} filed under the wrong page"
                assert child.last_access <= node.last_access or node is self.root, f"node {child.id} newer than parent"
                child_locks += child.lock_ref
            if node is not self.root:
                assert node.lock_ref >= child_locks, f"node {node.id}: lock count below its children's"
                locked += len(node.pages) if node.lock_ref else 0
            for p in node.pages:
                assert p not in seen, f"page {p} twice in the radix tree"
                assert self.kv.owner_of(p) is self, f"tree page {p} is owned by {self.kv.owner_of(p)!r} in the pool"
                seen.add(p)
        assert len(seen) == self._num_pages, "radix page count is off"
        assert self.kv.num_owned_by(self) == self._num_pages, "the pool gives the tree pages it does not hold"
        assert locked == self._num_locked_pages, "locked page count is off"

    # ---- helpers --------------------------------------------------------------------------------
    def _page(self, tokens: Sequence[int], i: int) -> tuple[int, ...]:
        S = self.page_size
        return tuple(tokens[i * S : (i + 1) * S])

    def _common_pages(self, child: RadixNode, tokens: Sequence[int], i: int, n: int) -> int:
        """Whole pages shared by ``child``'s edge and ``tokens`` from page i (at least 1: the dict key matched)."""
        k = 1
        while k < len(child.pages) and i + k < n and self._page(child.key, k) == self._page(tokens, i + k):
            k += 1
        return k

    def _split(self, node: RadixNode, k: int) -> RadixNode:
        """Cuts ``node``'s edge after k pages: a new head node takes the first k pages and becomes the
        parent; ``node`` keeps its id, children and the tail (so locks held on it stay valid)."""
        S = self.page_size
        parent = node.parent
        assert parent is not None and 0 < k < len(node.pages)
        head = RadixNode(
            next(self._ids), node.key[: k * S], node.pages[:k], parent,
            lock_ref=node.lock_ref, last_access=node.last_access,
        )  # fmt: skip
        parent.children[self._page(head.key, 0)] = head
        node.key, node.pages, node.parent = node.key[k * S :], node.pages[k:], head
        head.children[self._page(node.key, 0)] = node
        return head

    def _path(self, node: RadixNode) -> Iterator[RadixNode]:
        """``node`` and its ancestors, root excluded."""
        cur: RadixNode | None = node
        while cur is not None and cur is not self.root:
            yield cur
            cur = cur.parent

    def _touch(self, node: RadixNode) -> None:
        cur: RadixNode | None = node
        while cur is not None:
            cur.last_access = self._clock
            cur = cur.parent

    def nodes(self) -> Iterator[RadixNode]:
        """Every node, the root included (depth first); the state-checkpoint pool checks its own against them."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
