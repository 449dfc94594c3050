"""Which KV pages each request holds: a locked shared prefix from the radix tree, then a private tail.

A request's page table is ``pages[:num_shared_pages]`` (owned by the tree, read-only, locked through
``prefix_node``) followed by pages it owns and writes. The shared part is a multiple of the page
size, so a request never writes into a tree page. Without a tree (``prefix_cache=False``) every page
is private and this reduces to allocate / free. With linear-attention layers a request also holds one
recurrent-state slot (``states``) from admission until it gives its pages back, and it resumes only from a
prefix whose state was checkpointed (``checkpoints``): the deepest checkpointed node of its match; while it
prefills it takes checkpoints at its anchors, hung on the tree's nodes when it gives its pages to the tree; while
it decodes one more checkpoint rolls along its reply (rewritten at each page boundary it crosses: ``roll``), so
the state after its own reply, up to the last whole page, is there for the next turn. With the checkpoints' host
tier the anchors wait for device slots (``chunk`` gives them as the prefill reaches them and ends a step before one
it cannot give; ``spill`` moves the written ones to the host after each step), so a device tier smaller than a
prompt's anchors still takes them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from freetoken.cache.anchors import Anchors
from freetoken.cache.kv_pool import KVPool
from freetoken.cache.radix import RadixCache
from freetoken.cache.state_checkpoints import StateCheckpoints
from freetoken.cache.state_pool import StatePool
from freetoken.engine.request import Request


class KVManager:
    def __init__(
        self,
        kv: KVPool,
        tree: RadixCache | None,
        states: StatePool | None = None,
        checkpoints: StateCheckpoints | None = None,
        anchors: Anchors | None = None,
    ) -> None:
        self.kv, self.tree, self.states = kv, tree, states
        self.checkpoints, self.anchors = checkpoints, anchors
        self.num_prefix_tokens_reused = 0  # tokens admitted as already computed thanks to the tree

    def admit(self, req: Request, budget: int) -> int:
        """Gives a request that holds no KV its longest cached prefix (whole pages, at least one token
        left to compute so the step yields logits) and pages for its next chunk of at most ``budget``
        tokens. Returns the tokens to compute this step; 0 when the pool is short (then it holds nothing)."""
        assert not req.pages and req.num_computed_tokens == 0, "admit: the request already holds KV"
        if self.states is not None:  # one slot per running request: the pool has more than can run
            req.state_slot = self.states.allocate(req.request_id)
        if self.tree is not None:
            m = self.tree.lookup(req.token_ids[: req.num_tokens - 1])
            node, pages = m.node, m.pages
            if self.checkpoints is not None:  # a recurrent state resumes only where one was saved
                node = self.checkpoints.deepest(node)
                pages = self.tree.path_pages(node)
            if pages:
                self.tree.lock(node)
                req.prefix_node, req.pages, req.num_shared_pages = node, list(pages), len(pages)
                req.num_computed_tokens = len(pages) * self.kv.page_size
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        if not self.grow(req, n):
            self.release(req, cache=False)
            return 0
        if self.checkpoints is not None and req.prefix_node is not None:
            assert req.state_slot is not None
            self.checkpoints.restore(req.prefix_node, req.state_slot)
        self._plan_checkpoints(req)
        self._plan_rolling(req)
        n = self.chunk(req, n)
        self.num_prefix_tokens_reused += req.num_computed_tokens
        if req.num_preemptions == 0:
            req.num_cached_tokens = req.num_computed_tokens
        return n

    def grow(self, req: Request, n: int) -> bool:
        """Make req's pages cover num_computed + n tokens; False when the pool is short even after
        evicting every unlocked tree page it needs."""
        need = self.kv.pages_for(req.num_computed_tokens + n) - len(req.pages)
        if need <= 0:
            return True
        if not self.reserve(need):
            return False
        req.pages += self.kv.allocate(need, req.request_id)
        return True

    def reserve(self, num_pages: int) -> bool:
        """Evicts unlocked tree pages until ``num_pages`` are free; False (evicting nothing: cached
        prefixes are not thrown away for nothing) if even that would not be enough."""
        short = num_pages - self.kv.num_free
        if short <= 0:
            return True
        if self.tree is None or short > self.tree.num_evictable_pages:
            return False
        freed = self.tree.evict(short)
        assert len(freed) == short, "unlocked tree pages could not all be evicted"
        return True

    def release(self, req: Request, cache: bool = True) -> None:
        """Gives back every page of req (finished or preempted): with ``cache`` its fully computed pages
        enter the tree (so a recompute or a next turn is cheap), the rest return to the pool. Afterwards
        the request holds no KV (``num_computed_tokens == 0``)."""
        rid, shared = req.request_id, req.num_shared_pages
        to_free = req.pages[shared:]
        if self.tree is not None and cache:
            full = min(req.num_computed_tokens // self.kv.page_size, len(req.pages))
            if full > 0:
                S = self.kv.page_size
                cached = self.tree.insert(req.token_ids[: full * S], req.pages[:full], rid)
                # the locked shared path is in the tree with the same tokens, so it is found again
                assert cached >= shared, "the tree lost a locked prefix"
                to_free = req.pages[shared:cached] + req.pages[full:]  # duplicates of cached pages + the tail
                self._hang_checkpoints(req, full * S)
        self._give_checkpoints(req)
        self.kv.free(to_free, rid)
        if req.prefix_node is not None:
            assert self.tree is not None
            self.tree.unlock(req.prefix_node)
        if req.state_slot is not None:
            assert self.states is not None
            self.states.free(req.state_slot, rid)
        req.pages, req.num_shared_pages, req.prefix_node, req.state_slot = [], 0, None, None
        req.num_computed_tokens, req.rolling = 0, None

    def evict_for_shrink(self, num_pages: int) -> int:
        """Evicts unlocked tree pages (LRU first) until the used pages would fit a pool of ``num_pages``, or
        nothing unlocked is left; returns the pages still over (0: the pool can shrink now)."""
        over = self.kv.num_used - num_pages
        if over > 0 and self.tree is not None and self.tree.num_evictable_pages:
            self.tree.evict(min(over, self.tree.num_evictable_pages))
        return max(0, self.kv.num_used - num_pages)

    def resize(
        self,
        num_pages: int,
        requests: Iterable[Request],
        fallback: Sequence[int] = (),
        make_room: Callable[[], bool] | None = None,
    ) -> None:
        """``KVPool.resize`` (the used pages must fit; ``fallback``, ``make_room``: what it falls to), then the
        moved pages renamed in every request's page table and in the tree."""
        self._rename(self.kv.resize(num_pages, fallback, make_room), requests)

    def resume(self, requests: Iterable[Request]) -> bool:
        """``KVPool.resume`` (a pool that waits for device memory asks again); whether it has layers now."""
        moves = self.kv.resume()
        if moves is None:
            return False
        self._rename(moves, requests)
        return True

    def _rename(self, moves: dict[int, int], requests: Iterable[Request]) -> None:
        if not moves:
            return
        for r in requests:
            r.pages = [moves.get(p, p) for p in r.pages]
        if self.tree is not None:
            self.tree.remap(moves)

    # ---- state checkpoints ----------------------------------------------------------------------
    def _plan_checkpoints(self, req: Request) -> None:
        """Checkpoint slots for the anchors past the resume point (the layers write them while prefilling). Without
        a host tier: the deepest first, while the pool has slots. With one: all wait, in order, for the slots that
        ``chunk`` gives them as the prefill reaches them (``spill`` frees the ones written)."""
        if self.checkpoints is None or self.anchors is None:
            return
        S = self.kv.page_size
        positions = self.anchors.positions(req.token_ids, req.num_computed_tokens, req.num_tokens, S)
        if self.checkpoints.host is not None:
            req.capture_wait = positions  # the decode checkpoint's slot first (``_plan_rolling``), then ``chunk``
            return
        for p in reversed(positions):
            slot = self.checkpoints.take()  # the deepest first, while the pool has slots
            if slot is None:
                break
            req.captures.append((p, slot))

    def chunk(self, req: Request, n: int) -> int:
        """The tokens of req's next step, at most ``n``: the anchors waiting for a slot that the step reaches get one;
        when the device tier has none left, the step stops just before the first such anchor (the captures it writes
        are spilled to the host tier after it and their slots come free), or, with nothing of its own to free,
        that anchor is not checkpointed."""
        wait, start = req.capture_wait, req.num_computed_tokens
        while wait and wait[0] <= start:  # passed without a slot (a layer-major prefill's chunks)
            wait.pop(0)
        while wait and wait[0] <= start + n:
            assert self.checkpoints is not None
            slot = self.checkpoints.take()
            if slot is not None:
                req.captures.append((wait.pop(0), slot))
                continue
            devices, rolling = self.checkpoints.states.checkpoint_slots, self._rolling(req)
            if wait[0] - 1 > start and any(start < p and s in devices and s != rolling for p, s in req.captures):
                return wait[0] - 1 - start
            wait.pop(0)
        return n

    def spill(self, req: Request) -> None:
        """After a step: req's written anchor checkpoints move to the host tier's pending slots (a host tier only),
        giving their device slots to the anchors still ahead."""
        ck = self.checkpoints
        if ck is None or ck.host is None or not req.capture_wait:
            return
        devices, rolling = ck.states.checkpoint_slots, self._rolling(req)
        for i, (p, slot) in enumerate(req.captures):
            if slot in devices and slot != rolling and p <= req.num_computed_tokens:
                key = ck.spill(slot)
                if key is None:
                    return
                req.captures[i] = (p, key)

    @staticmethod
    def _rolling(req: Request) -> int | None:
        return req.rolling[0] if req.rolling is not None else None

    def _plan_rolling(self, req: Request) -> None:
        """The decode checkpoint: planned at the first page boundary past the prompt (``roll`` moves it on)."""
        if self.checkpoints is None or self.anchors is None:
            return
        slot = self.checkpoints.take()
        if slot is not None:
            S = self.kv.page_size
            req.captures.append(((req.num_tokens // S + 1) * S, slot))
            req.rolling = (slot, 0)

    def roll(self, req: Request) -> None:
        """After a step: the decode checkpoint, once its page boundary is computed (written), is planned at the
        next boundary (the slot is rewritten there; until then it holds the state at the last one); the anchor
        checkpoints written are spilled to the host tier while anchors wait for slots (``spill``)."""
        self.spill(req)
        if req.rolling is None:
            return
        slot = req.rolling[0]
        i = next(i for i, (_, s) in enumerate(req.captures) if s == slot)
        p = req.captures[i][0]
        if p <= req.num_computed_tokens:
            req.captures[i], req.rolling = (p + self.kv.page_size, slot), (slot, p)

    def _hang_checkpoints(self, req: Request, cached_tokens: int) -> None:
        """The checkpoints req has written, onto the tree nodes ending at their positions (the decode checkpoint at
        the last boundary it was written at)."""
        assert self.tree is not None
        if req.rolling is not None and req.rolling[1] > 0:
            slot, written = req.rolling
            req.captures = [(written if s == slot else p, s) for p, s in req.captures]
        left = []
        for p, slot in req.captures:
            if self.checkpoints is None or p > min(cached_tokens, req.num_computed_tokens):
                left.append((p, slot))
                continue
            m = self.tree.lookup(req.token_ids[:p])
            if m.num_pages * self.kv.page_size == p:
                self.checkpoints.hang(slot, m.node)
            else:
                left.append((p, slot))
        req.captures = left

    def _give_checkpoints(self, req: Request) -> None:
        if self.checkpoints is not None:
            for _, slot in req.captures:
                self.checkpoints.give(slot)
        req.captures, req.capture_wait = [], []

    # ---- introspection --------------------------------------------------------------------------
    @property
    def num_pinned(self) -> int:
        """Pages that cannot be reclaimed now: request-private ones and locked tree pages."""
        return self.kv.num_used - (self.tree.num_evictable_pages if self.tree is not None else 0)

    def page_tables(self, requests: Iterable[Request]) -> dict[object, list[int]]:
        """Every owner's pages, as the pool should record them: private pages by request id, and the tree's."""
        tables: dict[object, list[int]] = {r.request_id: r.pages[r.num_shared_pages :] for r in requests if r.pages}
        if self.tree is not None:
            tables[self.tree] = self.tree.all_pages()
        return tables

    def check_integrity(self, requests: Iterable[Request]) -> None:
        reqs = list(requests)
        self.kv.check_integrity(self.page_tables(reqs))
        if self.states is not None:
            self.states.check_integrity({r.request_id: r.state_slot for r in reqs if r.state_slot is not None})
        if self.checkpoints is not None:
            self.checkpoints.check_integrity()
            pending = sorted(slot for r in reqs for _, slot in r.captures)
            assert pending == sorted(self.checkpoints.pending), "pending state checkpoints without a request"
        if self.tree is None:
            assert all(r.num_shared_pages == 0 and r.prefix_node is None for r in reqs), "shared pages without a tree"
            return
        self.tree.check_integrity()
        holders = 0
        for r in reqs:
            if r.prefix_node is None:
                assert r.num_shared_pages == 0, f"{r.request_id!r}: shared pages without a locked node"
                continue
            holders += 1
            assert r.prefix_node.lock_ref > 0, f"{r.request_id!r}: its prefix node is not locked"
            assert r.pages[: r.num_shared_pages] == self.tree.path_pages(r.prefix_node), (
                f"{r.request_id!r}: shared pages differ from its locked path"
            )
        # each lock adds one to exactly one child of the root: no lock without a holder
        assert sum(c.lock_ref for c in self.tree.root.children.values()) == holders, "a radix lock has no holder"
