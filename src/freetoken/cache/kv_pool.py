"""Paged KV pool: fixed-size pages of K/V slots for every attention layer, and their owners.

Shapes: L = attention layers, P = pages, S = page_size, H = KV heads, hd = head dim.
``k[l]`` / ``v[l]`` are ``[P * S, H, hd]``: token slot ``page * S + offset``. Page tables live
with the requests (a list of page ids per request); this pool only hands pages out and back.

A page is in one of three states: free; owned by a request (its private tail, by request id); or
owned by the radix prefix tree (shared, possibly locked by several requests that read it). Owners
are compared by equality, so the tree passes itself. ``free + used == total`` always.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


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
    ) -> None:
        if num_pages < 1:
            raise ValueError("the KV pool needs at least one page")
        self.num_pages = num_pages
        self.page_size = page_size
        shape = (num_layers, num_pages * page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # LIFO free list: recently freed pages are reused first (warm in caches).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._owner: dict[int, object] = {}  # page -> request id or the radix tree

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._owner)

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

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

    def slots(self, pages: list[int], start: int, end: int) -> list[int]:
        """Flat slot ids of token positions [start, end) of a sequence with page table ``pages``."""
        S = self.page_size
        return [pages[i // S] * S + i % S for i in range(start, end)]

    def check_integrity(self, page_tables: Mapping[object, Sequence[int]] | None = None) -> None:
        """``page_tables``: every owner's pages (requests: their private pages; the tree: its pages)."""
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
