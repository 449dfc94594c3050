"""A KV pool whose layers keep rows of differing widths (``head_dims``: DeepSeek-V4, each layer its own kind's row)
and entry rows, one per m tokens (``entries``: ceil(S / m) a page): its bytes, the entry row of a position, and
resizes (grow, shrink with moves, a refused device: waiting, then resume) that keep every tensor's shape and every used
page's rows."""

from __future__ import annotations

import pytest
import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.hardware import device_memory
from test_elastic_rollback import FailingAllocator

S = 4
DIMS = (3, 12, 7)  # a window-only row, a wide row, a middle one
ENTRIES = ((0, 0), (3, 5), (8, 6))  # (rate, width): none; 2 rows a page (S = 4); 1 row a page (every other page)
ROWS = (0, 2, 1)


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_memory, "RETRY_WAIT_S", 0.0)


def _pool() -> tuple[KVPool, list[int], dict[int, list[torch.Tensor]]]:
    kv = KVPool(3, 8, S, 1, 99, torch.float32, torch.device("cpu"), value_dim=0, head_dims=DIMS, entries=ENTRIES)
    pages = kv.allocate(8, "r")
    kv.free(pages[:5], "r")
    kept = pages[5:]
    for layer in (*kv.k, *kv.e):
        layer.copy_(torch.arange(layer.numel(), dtype=torch.float32).view_as(layer) + 1)
    return kv, kept, {p: _page(kv, p) for p in kept}


def _page(kv: KVPool, p: int) -> list[torch.Tensor]:
    """Page p's rows in every K layer, then in every entry layer."""
    per = [S] * len(kv.k) + kv.entry_rows
    return [t[p * r : (p + 1) * r].clone() for r, t in zip(per, (*kv.k, *kv.e))]


def _same(kv: KVPool, kept: list[int], rows: dict[int, list[torch.Tensor]], moves: dict[int, int]) -> bool:
    return all(torch.equal(a, b) for p in kept for a, b in zip(_page(kv, moves.get(p, p)), rows[p]))


def test_each_layer_keeps_its_own_width_and_the_page_bytes_are_their_sum() -> None:
    kv, _, _ = _pool()
    assert [t.shape for t in kv.k] == [(8 * S, 1, d) for d in DIMS]
    assert all(t.shape == (8 * S, 1, 0) for t in kv.v)
    assert kv.entry_rows == list(ROWS) and [t.shape for t in kv.e] == [(8 * r, w) for r, (_, w) in zip(ROWS, ENTRIES)]
    assert kv.page_bytes == (S * sum(DIMS) + 2 * 5 + 6) * 4 == sum(t.nbytes for t in kv.k + kv.e) // kv.num_pages
    with pytest.raises(ValueError, match="3 layers but 2 head dims"):
        KVPool(3, 8, S, 1, 4, torch.float32, torch.device("cpu"), head_dims=(4, 4))
    with pytest.raises(ValueError, match="3 layers but 1 entry layouts"):
        KVPool(3, 8, S, 1, 4, torch.float32, torch.device("cpu"), entries=((2, 2),))


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
def test_window_ends_of_one_page_never_share_an_entry_row(m: int) -> None:
    """Position pos's entry row is page * R + (pos % S) // m: the window ends ((w + 1) m - 1) of a page land in
    distinct rows below R = ceil(S / m)."""
    R = -(-S // m)
    ends = [(w + 1) * m - 1 for w in range(40)]
    for page in range(10):
        offs = [(e % S) // m for e in ends if e // S == page]
        assert len(set(offs)) == len(offs) and all(o < R for o in offs)


@pytest.mark.parametrize("size", [3, 12])
def test_a_resize_keeps_every_layer_width_and_the_used_rows(size: int) -> None:
    kv, kept, rows = _pool()
    moves = kv.resize(size)
    assert kv.num_pages == size and [t.shape for t in kv.k] == [(size * S, 1, d) for d in DIMS]
    assert [t.shape for t in kv.e] == [(size * r, w) for r, (_, w) in zip(ROWS, ENTRIES)]
    assert _same(kv, kept, rows, moves) and (moves == {} if size > 8 else len(moves) > 0)
    kv.check_integrity({"r": [moves.get(p, p) for p in kept]})


def test_a_refused_resize_waits_and_resumes_with_every_width(monkeypatch: pytest.MonkeyPatch) -> None:
    kv, kept, rows = _pool()
    alloc = FailingAllocator({}, every_from=1).install(monkeypatch)
    with pytest.raises(RuntimeError):
        kv.resize(12)
    assert kv.waiting
    alloc.every_from = None
    moves = kv.resume()
    assert moves is not None and not kv.waiting and kv.fault() is None
    assert [t.shape[1:] for t in kv.k] == [(1, d) for d in DIMS] and _same(kv, kept, rows, moves)
    assert [t.shape for t in kv.e] == [(kv.num_pages * r, w) for r, (_, w) in zip(ROWS, ENTRIES)]
    kv.check_integrity({"r": [moves.get(p, p) for p in kept]})
