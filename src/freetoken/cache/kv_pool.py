"""Paged KV pool: fixed-size pages of K/V slots for every attention layer, and their owners.

Shapes: L = attention layers, P = pages, S = page_size, H = KV heads, hd = head dim, vd = value head dim.
``k[l]`` is ``[P * S, H, hd]`` and ``v[l]`` ``[P * S, H, vd]``, one tensor per layer: token slot ``page * S + offset``.
Multi-head latent attention (``layers/mla.py``) keeps one latent row per token in ``k`` (H = 1, hd = kv_lora_rank
+ qk_rope_head_dim; DeepSeek sparse attention, ``layers/dsa.py``, adds its indexer's key of index_head_dim to the
row) and nothing in ``v`` (vd = 0). ``head_dims`` gives each layer its own hd where layers differ (DeepSeek-V4: each
layer's row as wide as its own kind's, ``layers/v4_compressor.py``). ``entries`` (per layer: rate m, width e) adds
``e[l]`` ``[P * R, e]``, one row per m tokens, R = ceil(S / m) rows a page: position pos's row is
``page * R + (pos % S) // m`` (two positions of one page m apart never share it); DeepSeek-V4 keeps its compressed
entries there (a layer without entries: m = 0, R = 0). A resize keeps every tensor's shape and rows per page. Page
tables live with the requests (a list of page ids per request); this pool only hands pages out and back.

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

Shape = tuple[int, tuple[int, ...], torch.dtype]  # one layer tensor: rows per page, a row's shape, dtype
Banks = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]  # K, V and entry layers


def _rows(pages: Sequence[int], r: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The rows of ``pages`` (in order) in a tensor of ``r`` rows a page."""
    return torch.tensor([p * r + i for p in pages for i in range(r)], dtype=torch.long, device=device)


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
        entries: Sequence[tuple[int, int]] | None = None,
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
        ents = list(entries or [])
        if ents and len(ents) != num_layers:
            raise ValueError(f"the KV pool has {num_layers} layers but {len(ents)} entry layouts")
        self.entry_rates = [m for m, _ in ents]
        self.entry_rows = [-(-page_size // m) if m else 0 for m in self.entry_rates]  # R per layer
        entry_elems = sum(r * w for r, (_, w) in zip(self.entry_rows, ents))
        self.page_bytes = (page_size * num_kv_heads * (sum(dims) + num_layers * vd) + entry_elems) * dtype.itemsize
        rows = num_pages * page_size
        self.k = [device_zeros((rows, num_kv_heads, hd), dtype, self.device) for hd in dims]
        self.v = [device_zeros((rows, num_kv_heads, vd), dtype, self.device) for _ in range(num_layers)]
        self.e = [device_zeros((num_pages * r, w), dtype, self.device) for r, (_, w) in zip(self.entry_rows, ents)]
        # LIFO free list: recently freed pages are reused first (warm in caches).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._owner: dict[int, object] = {}  # page -> request id or the radix tree
        # a resize refused at every size: (used pages, their rows per bank and layer in host memory, layer shapes)
        self._waiting: tuple[list[int], list[list[torch.Tensor]], list[Shape]] | None = None

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
        used = sorted(self._owner)
        shapes = self._shapes()
        src = {r: _rows(used, r, self.device) for r, _, _ in shapes}
        old = [self.k, self.v, self.e]
        staged: list[list[torch.Tensor]] = []

        def drop() -> None:
            # On a GPU the used pages wait in host memory while the old layers go (their memory returns to the
            # device: ``device_zeros``): the peak is the old pool, and a shrink really frees memory.
            host = self.device.type == "cuda"
            n = self.num_pages
            staged.extend([t[src[t.shape[0] // n]].to("cpu") if host else t[src[t.shape[0] // n]] for t in bank]
                          for bank in old)  # fmt: skip
            old.clear()
            self.k, self.v, self.e = [], [], []
            if host and not uses_driver_memory(self.device):
                torch.cuda.empty_cache()

        floor = max(len(used), 1)
        sizes = [num_pages, *(n for n in fallback if n >= floor), floor]
        make = functools.partial(self._banks, shapes=shapes)
        beside = num_pages > self.num_pages and num_pages * self.page_bytes <= free_device_bytes(self.device)
        n0 = self.num_pages
        try:
            try:
                num_pages, banks = remake(make, sizes, n0, drop, "the KV pages", beside)
            except torch.OutOfMemoryError:
                if make_room is None or not make_room():
                    raise
                num_pages, banks = first_granted(make, [floor], "the KV pages")  # in what the caller freed
            # staged rows, or (made beside the old layers) the old layers themselves, read at ``src`` layer by layer
            moves = self._install(num_pages, banks, used, staged or old, None if staged else src)
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
        shapes: list[Shape],
    ) -> None:
        """After a failed resize: layers of ``num_pages`` pages again, the used pages' K/V where they were; if even
        that fails, the pool waits (``waiting``) with its used pages in host memory, as when the device refuses."""
        try:
            self._install(num_pages, self._banks(num_pages, shapes), used, staged)
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
            banks = self._banks(max(len(used), 1), shapes)
        except torch.OutOfMemoryError:
            return None
        self._waiting = None
        at = {p: i for i, p in enumerate(used0)}
        keep = {r: _rows([at[p] for p in used], r) for r, _, _ in shapes}
        per = iter(r for r, _, _ in shapes)
        rows = [[t[keep[next(per)].to(t.device)] for t in bank] for bank in staged]
        return self._install(max(len(used), 1), banks, used, rows)

    def _install(
        self,
        num_pages: int,
        banks: Banks,
        used: list[int],
        rows: list[list[torch.Tensor]],
        src: dict[int, torch.Tensor] | None = None,
    ) -> dict[int, int]:
        """The new layers (K, V, entries) in place, with ``rows`` (per bank and layer, the used pages' rows in
        ``used`` order; or, with ``src``, tensors to read them from at ``src`` by rows per page) copied in: the used
        pages at or above ``num_pages`` move into free pages below it."""
        high = [p for p in used if p >= num_pages]
        low_free = sorted(p for p in range(num_pages) if p not in self._owner)
        moves = dict(zip(high, low_free))  # empty when growing
        to = [moves.get(p, p) for p in used]
        dst: dict[int, torch.Tensor] = {}
        for new_bank, bank_rows in zip(banks, rows):
            for layer, kept in zip(new_bank, bank_rows):
                r = layer.shape[0] // num_pages
                if r not in dst:
                    dst[r] = _rows(to, r, self.device)
                layer[dst[r]] = kept[src[r]] if src is not None else kept.to(self.device)
        self.k, self.v, self.e = banks
        self._owner = {moves.get(p, p): o for p, o in self._owner.items()}
        self._free = sorted((p for p in range(num_pages) if p not in self._owner), reverse=True)
        self.num_pages = num_pages
        return moves

    def _shapes(self) -> list[Shape]:
        """Every layer tensor's shape: the K layers', then the V layers', then the entry layers'."""
        S, L = self.page_size, self.num_layers
        per = [S] * (2 * L) + self.entry_rows
        return [(r, tuple(t.shape[1:]), t.dtype) for r, t in zip(per, (*self.k, *self.v, *self.e))]

    def _banks(
        self, num_pages: int, shapes: list[Shape]
    ) -> Banks:
        """K, V and entry layers of ``num_pages`` pages (``shapes``: the K layers', the V layers', the entry
        layers'), all or none (a refused one drops those made before it)."""
        try:
            made = [device_zeros((num_pages * r, *shape), dt, self.device) for r, shape, dt in shapes]
        except torch.OutOfMemoryError:
            if self.device.type == "cuda" and not uses_driver_memory(self.device):
                torch.cuda.empty_cache()  # what was made before the refusal goes back to the device
            raise
        L = self.num_layers
        return made[:L], made[L : 2 * L], made[2 * L :]

    def slots(self, pages: list[int], start: int, end: int) -> list[int]:
        """Flat slot ids of token positions [start, end) of a sequence with page table ``pages``."""
        S = self.page_size
        return [pages[i // S] * S + i % S for i in range(start, end)]

    def fault(self) -> str | None:
        """Why a step cannot read or write the pool now (cheap: its layers' count and rows), None when it can."""
        if self._waiting is not None:
            return "the KV pool waits for device memory"
        L, n = self.num_layers, self.num_pages
        if len(self.k) != L or len(self.v) != L:
            return f"the KV pool has {len(self.k)} K and {len(self.v)} V layers of {L}"
        if len(self.e) != len(self.entry_rows):
            return f"the KV pool has {len(self.e)} entry layers of {len(self.entry_rows)}"
        per = [self.page_size] * (2 * L) + self.entry_rows
        short = next(((t.shape[0], r) for r, t in zip(per, (*self.k, *self.v, *self.e)) if t.shape[0] != n * r), None)
        if short is not None:
            return f"a KV layer has {short[0]} rows, not {n * short[1]} ({n} pages of {short[1]})"
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
