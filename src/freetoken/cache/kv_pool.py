"""Paged KV pool: fixed-size pages of K/V slots for every attention layer, and their owners.

Shapes: L = attention layers, P = pages, S = page_size, H = KV heads, hd = head dim, vd = value head dim.
``k[l]`` is ``[P * S, H, hd]`` and ``v[l]`` ``[P * S, H, vd]``, one tensor per layer: token slot ``page * S + offset``.
Multi-head latent attention (``layers/mla.py``) keeps one latent row per token in ``k`` (H = 1, hd = kv_lora_rank
+ qk_rope_head_dim; DeepSeek sparse attention, ``layers/dsa.py``, adds its indexer's key of index_head_dim to the
row) and nothing in ``v`` (vd = 0). ``head_dims`` gives each layer its own hd where layers differ (DeepSeek-V4: each
layer's row as wide as its own kind's, ``layers/v4_compressor.py``); a resize keeps each layer's shape. Page tables
live with the requests (a list of page ids per request); this pool only hands pages out and back.

A page is in one of three states: free; owned by a request (its private tail, by request id); or
owned by the radix prefix tree (shared, possibly locked by several requests that read it). Owners
are compared by equality, so the tree passes itself. ``free + used == total`` always.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import torch

from freetoken.hardware.device_memory import device_zeros, first_granted, remake, uses_driver_memory
from freetoken.hardware.device_memory import free_bytes as free_device_bytes


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        value_dim: int | None = None,
        head_dims: Sequence[int] | None = None,
    ) -> None:
        if num_pages < 1:
            raise ValueError("the KV pool needs at least one page")
        dims = [head_dim] * num_layers if head_dims is None else list(head_dims)
        if len(dims) != num_layers:
            raise ValueError(f"the KV pool has {num_layers} layers but {len(dims)} head dims")
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = torch.device(device)
        self.num_layers = num_layers
        vd = head_dim if value_dim is None else value_dim
        self.page_bytes = page_size * num_kv_heads * (sum(dims) + num_layers * vd) * dtype.itemsize
        rows = num_pages * page_size
        self.k = [device_zeros((rows, num_kv_heads, hd), dtype, self.device) for hd in dims]
        self.v = [device_zeros((rows, num_kv_heads, vd), dtype, self.device) for _ in range(num_layers)]
        # LIFO free list: recently freed pages are reused first (warm in caches).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._owner: dict[int, object] = {}  # page -> request id or the radix tree
        # a resize refused at every size: (used pages, their K/V per bank and layer in host memory, layer shapes)
        self._waiting: tuple[list[int], list[list[torch.Tensor]], list[tuple[tuple[int, ...], torch.dtype]]] | None = (
            None
        )

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._owner)

    @property
    def bytes(self) -> int:
        return self.num_pages * self.page_bytes

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def owner_of(self, page: int) -> object | None:
        return self._owner.get(page)

    def num_owned_by(self, owner: object) -> int:
        return sum(1 for o in self._owner.values() if o == owner)

    def allocate(self, n: int, owner: object) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"KV pool: {n} pages requested, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._owner[p] = owner
        return pages

    def free(self, pages: Sequence[int], owner: object) -> None:
        for p in pages:
            self._check_owner(p, owner, "freed")
            del self._owner[p]
            self._free.append(p)

    def transfer(self, pages: Sequence[int], owner: object, new_owner: object) -> None:
        """Hands used pages to another owner (a finished request's pages entering the radix tree)."""
        for p in pages:
            self._check_owner(p, owner, "transferred")
        for p in pages:
            self._owner[p] = new_owner

    def _check_owner(self, page: int, owner: object, what: str) -> None:
        if page not in self._owner or self._owner[page] != owner:
            raise AssertionError(f"KV page {page} {what} by {owner!r} but owned by {self._owner.get(page)!r}")

    def resize(
        self, num_pages: int, fallback: Sequence[int] = (), make_room: Callable[[], bool] | None = None
    ) -> dict[int, int]:
        """Safe points only: the pool becomes ``num_pages`` pages. Growing adds free pages; shrinking needs
        every used page to fit (the caller evicts or preempts first) and moves the used pages at or above
        ``num_pages`` into free pages below it, K/V copied. Returns the moves {old page: new page}; the
        caller rewrites the page tables that name them (requests, the radix tree). When the device refuses
        the new layers (another program took the memory meanwhile), the ``fallback`` sizes are tried in turn,
        then the used pages alone (``remake``: a shrink makes its layers beside the old ones where they fit):
        every used page is kept whatever size the device grants;
        ``num_pages`` says what the pool became. If the device refuses even the used pages, again and again,
        ``make_room()`` (when given) frees other memory of the caller's and says whether it did; the used pages
        are asked for once more. Only then ``torch.OutOfMemoryError``, the pool ``waiting`` (its used pages
        kept in host memory) until a ``resume`` is granted. A grow makes its layers beside the old ones where the
        device has room for both. Any other failure (an allocation failing another way, a copy) leaves the pool as
        it was: its old layers, or layers of its old size made again with every used page where it was."""
        if num_pages < 1:
            raise ValueError("the KV pool needs at least one page")
        if self.num_used > num_pages:
            raise ValueError(f"{self.num_used} KV pages are in use; the pool cannot shrink to {num_pages}")
        S = self.page_size
        used = sorted(self._owner)
        src = torch.tensor([p * S + i for p in used for i in range(S)], dtype=torch.long, device=self.device)
        shapes = [(tuple(t.shape[1:]), t.dtype) for t in (*self.k, *self.v)]  # K layers, then V layers
        old = [self.k, self.v]
        staged: list[list[torch.Tensor]] = []

        def drop() -> None:
            # On a GPU the used pages wait in host memory while the old layers go (their memory returns to the
            # device: ``device_zeros``): the peak is the old pool, and a shrink really frees memory.
            host = self.device.type == "cuda"
            staged.extend([t[src].to("cpu") if host else t[src] for t in bank] for bank in old)
            old.clear()
            self.k, self.v = [], []
            if host and not uses_driver_memory(self.device):
                torch.cuda.empty_cache()

        floor = max(len(used), 1)
        sizes = [num_pages, *(n for n in fallback if n >= floor), floor]
        make = functools.partial(self._banks, shapes=shapes)
        beside = num_pages > self.num_pages and num_pages * self.page_bytes <= free_device_bytes(self.device)
        n0 = self.num_pages
        try:
            try:
                num_pages, (k, v) = remake(make, sizes, n0, drop, "the KV pages", beside)
            except torch.OutOfMemoryError:
                if make_room is None or not make_room():
                    raise
                num_pages, (k, v) = first_granted(make, [floor], "the KV pages")  # in what the caller freed
            # staged rows, or (made beside the old layers) the old layers themselves, read at ``src`` layer by layer
            moves = self._install(num_pages, k, v, used, staged or old, None if staged else src)
        except torch.OutOfMemoryError:
            if staged:  # (else the old layers are still in place: nothing changed)
                self._waiting = (used, staged, shapes)  # the used pages wait in host memory for ``resume``
            raise
        except Exception:
            if staged:  # any other failure once the old layers went: the pool as it was, each page where it was
                self._remake_as_was(n0, used, staged, shapes)
            raise
        old.clear()
        return moves

    def _remake_as_was(
        self,
        num_pages: int,
        used: list[int],
        staged: list[list[torch.Tensor]],
        shapes: list[tuple[tuple[int, ...], torch.dtype]],
    ) -> None:
        """After a failed resize: layers of ``num_pages`` pages again, the used pages' K/V where they were; if even
        that fails, the pool waits (``waiting``) with its used pages in host memory, as when the device refuses."""
        try:
            k, v = self._banks(num_pages, shapes)
            self._install(num_pages, k, v, used, staged)
        except Exception:  # noqa: BLE001 - the caller raises the first failure
            self._waiting = (used, staged, shapes)

    @property
    def waiting(self) -> bool:
        """A resize the device refused at every size: the pool has no layers and its used pages wait in host
        memory until ``resume`` (nothing may read or write the pool until then)."""
        return self._waiting is not None

    def resume(self) -> dict[int, int] | None:
        """One more ask for a waiting pool, at its used pages (the pages freed meanwhile are dropped): the moves,
        as ``resize`` returns them; None while the device still refuses."""
        if self._waiting is None:
            return {}
        used0, staged, shapes = self._waiting
        used = sorted(self._owner)  # requests that ended meanwhile gave pages back: never new ones
        try:
            k, v = self._banks(max(len(used), 1), shapes)
        except torch.OutOfMemoryError:
            return None
        self._waiting = None
        S, at = self.page_size, {p: i for i, p in enumerate(used0)}
        keep = torch.tensor([at[p] * S + i for p in used for i in range(S)], dtype=torch.long)
        rows = [[t[keep.to(t.device)] for t in bank] for bank in staged]
        return self._install(max(len(used), 1), k, v, used, rows)

    def _install(
        self,
        num_pages: int,
        k: list[torch.Tensor],
        v: list[torch.Tensor],
        used: list[int],
        rows: list[list[torch.Tensor]],
        src: torch.Tensor | None = None,
    ) -> dict[int, int]:
        """The new layers in place, with ``rows`` (per bank and layer, the used pages' K/V in ``used`` order; or,
        with ``src``, tensors to read them from at ``src``) copied in: the used pages at or above ``num_pages``
        move into free pages below it."""
        S = self.page_size
        high = [p for p in used if p >= num_pages]
        low_free = sorted(p for p in range(num_pages) if p not in self._owner)
        moves = dict(zip(high, low_free))  # empty when growing
        dst = torch.tensor([moves.get(p, p) * S + i for p in used for i in range(S)], dtype=torch.long)
        dst = dst.to(self.device)
        for new_bank, bank_rows in zip((k, v), rows):
            for layer, kept in zip(new_bank, bank_rows):
                layer[dst] = kept[src] if src is not None else kept.to(self.device)
        self.k, self.v = k, v
        self._owner = {moves.get(p, p): o for p, o in self._owner.items()}
        self._free = sorted((p for p in range(num_pages) if p not in self._owner), reverse=True)
        self.num_pages = num_pages
        return moves

    def _banks(
        self, num_pages: int, shapes: list[tuple[tuple[int, ...], torch.dtype]]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """K and V layers of ``num_pages`` pages (``shapes``: the K layers', then the V layers'), all or none (a
        refused one drops those made before it)."""
        try:
            made = [device_zeros((num_pages * self.page_size, *shape), dt, self.device) for shape, dt in shapes]
        except torch.OutOfMemoryError:
            if self.device.type == "cuda" and not uses_driver_memory(self.device):
                torch.cuda.empty_cache()  # what was made before the refusal goes back to the device
            raise
        half = len(shapes) // 2
        return made[:half], made[half:]

    def slots(self, pages: list[int], start: int, end: int) -> list[int]:
        """Flat slot ids of token positions [start, end) of a sequence with page table ``pages``."""
        S = self.page_size
        return [pages[i // S] * S + i % S for i in range(start, end)]

    def fault(self) -> str | None:
        """Why a step cannot read or write the pool now (cheap: its layers' count and rows), None when it can."""
        if self._waiting is not None:
            return "the KV pool waits for device memory"
        rows = self.num_pages * self.page_size
        if len(self.k) != self.num_layers or len(self.v) != self.num_layers:
            return f"the KV pool has {len(self.k)} K and {len(self.v)} V layers of {self.num_layers}"
        short = next((t.shape[0] for t in (*self.k, *self.v) if t.shape[0] != rows), None)
        if short is not None:
            return f"a KV layer has {short} token rows, not {rows} ({self.num_pages} pages)"
        return None

    def check_integrity(self, page_tables: Mapping[object, Sequence[int]] | None = None) -> None:
        """``page_tables``: every owner's pages (requests: their private pages; the tree: its pages). A pool
        waiting for device memory has no layers; any other has all of them, of its size."""
        fault = None if self.waiting else self.fault()
        assert fault is None, fault
        assert len(self._free) + len(self._owner) == self.num_pages, "free + used != total"
        assert len(set(self._free)) == len(self._free), "a page is free twice"
        assert not set(self._free) & set(self._owner), "a page is both free and owned"
        if page_tables is not None:
            owned: dict[int, object] = {}
            for rid, pages in page_tables.items():
                for p in pages:
                    assert p not in owned, f"page {p} in the tables of {owned[p]!r} and {rid!r}"
                    owned[p] = rid
            assert owned == self._owner, "page tables disagree with the pool's owners"
