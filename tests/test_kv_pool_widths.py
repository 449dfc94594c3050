"""A KV pool whose layers keep rows of differing widths (``head_dims``: DeepSeek-V4, each layer its own kind's row):
its bytes, and resizes (grow, shrink with moves, a refused device: waiting, then resume) that keep every layer's shape
and every used page's rows."""

from __future__ import annotations

import pytest
import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.hardware import device_memory
from test_elastic_rollback import FailingAllocator

S = 4
DIMS = (3, 12, 7)  # a window-only row, a wide row, a middle one


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_memory, "RETRY_WAIT_S", 0.0)


def _pool() -> tuple[KVPool, list[int], dict[int, list[torch.Tensor]]]:
    kv = KVPool(3, 8, S, 1, 99, torch.float32, torch.device("cpu"), value_dim=0, head_dims=DIMS)
    pages = kv.allocate(8, "r")
    kv.free(pages[:5], "r")
    kept = pages[5:]
    for layer in kv.k:
        layer.copy_(torch.arange(layer.numel(), dtype=torch.float32).view_as(layer))
    return kv, kept, {p: [t[p * S : (p + 1) * S].clone() for t in kv.k] for p in kept}


def _same(kv: KVPool, kept: list[int], rows: dict[int, list[torch.Tensor]], moves: dict[int, int]) -> bool:
    return all(torch.equal(t[moves.get(p, p) * S : (moves.get(p, p) + 1) * S], r)
               for p in kept for t, r in zip(kv.k, rows[p]))  # fmt: skip


def test_each_layer_keeps_its_own_width_and_the_page_bytes_are_their_sum() -> None:
    kv, _, _ = _pool()
    assert [t.shape for t in kv.k] == [(8 * S, 1, d) for d in DIMS]
    assert all(t.shape == (8 * S, 1, 0) for t in kv.v)
    assert kv.page_bytes == S * sum(DIMS) * 4 == sum(t.nbytes for t in kv.k) // kv.num_pages
    with pytest.raises(ValueError, match="3 layers but 2 head dims"):
        KVPool(3, 8, S, 1, 4, torch.float32, torch.device("cpu"), head_dims=(4, 4))


@pytest.mark.parametrize("size", [3, 12])
def test_a_resize_keeps_every_layer_width_and_the_used_rows(size: int) -> None:
    kv, kept, rows = _pool()
    moves = kv.resize(size)
    assert kv.num_pages == size and [t.shape for t in kv.k] == [(size * S, 1, d) for d in DIMS]
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
    kv.check_integrity({"r": [moves.get(p, p) for p in kept]})
