"""The radix prefix cache over KV pages: exact node/page ids, LRU eviction order, locks, and a property
test against a brute-force model (one dict entry per cached page, keyed by the whole prefix it ends)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.cache.kv_pool import KVPool
from freetoken.cache.radix import RadixCache

S = 2  # page size: tokens per page


def _setup(num_pages: int = 16) -> tuple[KVPool, RadixCache]:
    kv = KVPool(1, num_pages, S, 1, 1, torch.float32, torch.device("cpu"))
    return kv, RadixCache(kv)


def _cache(tree: RadixCache, kv: KVPool, tokens: list[int], owner: str) -> tuple[list[int], int]:
    """A request that computed ``tokens`` into fresh pages and finishes: returns (its pages, pages already cached)."""
    pages = kv.allocate(len(tokens) // S, owner)
    cached = tree.insert(tokens, pages, owner)
    kv.free(pages[:cached], owner)  # its copies of the already cached part
    return pages, cached


def test_insert_split_match_exact_ids():
    kv, tree = _setup()
    pages_a, cached = _cache(tree, kv, [1, 2, 3, 4, 5, 6], "a")
    assert (pages_a, cached) == ([0, 1, 2], 0)
    assert [kv.owner_of(p) for p in pages_a] == [tree] * 3
    (a,) = tree.root.children.values()
    assert (a.id, a.key, a.pages) == (1, [1, 2, 3, 4, 5, 6], [0, 1, 2])

    # b shares two pages: the edge splits, the head is a new node, a keeps its id and the tail
    pages_b, cached = _cache(tree, kv, [1, 2, 3, 4, 7, 8, 9, 10], "b")
    assert (pages_b, cached) == ([3, 4, 5, 6], 2)
    assert kv.owner_of(3) is None and kv.owner_of(4) is None  # b's duplicates went back to the pool
    (head,) = tree.root.children.values()
    assert (head.id, head.pages, a.parent) == (2, [0, 1], head)
    assert a.pages == [2] and a.key == [5, 6]
    b = head.children[(7, 8)]
    assert (b.id, b.pages) == (3, [5, 6])
    assert tree.num_pages == 5 and kv.num_used == 5

    # a match ending inside b's edge splits it too; a trailing partial page never matches
    m = tree.lookup([1, 2, 3, 4, 7, 8, 9])
    assert (m.node.id, m.pages) == (4, [0, 1, 5])
    assert m.node.children[(9, 10)] is b and b.pages == [6]
    assert tree.lookup([1, 2, 3]).pages == [0]
    assert tree.lookup([1]).pages == [] and tree.lookup([2, 1]).node is tree.root
    assert tree.path_pages(a) == [0, 1, 2]
    tree.check_integrity()
    kv.check_integrity({tree: tree.all_pages()})


def test_lru_eviction_order_and_partial_leaves():
    kv, tree = _setup()
    _cache(tree, kv, [1, 2, 3, 4, 5, 6], "a")  # pages 0 1 2, clock 1
    _cache(tree, kv, [1, 2, 3, 4, 7, 8, 9, 10], "b")  # duplicates 3 4 freed, new 5 6, clock 2
    _cache(tree, kv, [9, 9, 9, 9], "c")  # pages 4 3 (the LIFO free list hands back b's), clock 3
    assert tree.lookup([9, 9, 9, 9]).pages == [4, 3]
    # leaves by last use: a's tail [2] (clock 1) < b's tail [5, 6] (clock 2) < c [4, 3] (clock 4)
    assert tree.evict(1) == [2]
    assert tree.evict(1) == [6]  # b's leaf shrinks from its deepest page
    assert tree.lookup([1, 2, 3, 4]).pages == [0, 1]  # touches the shared head only: b's leaf stays old
    assert tree.evict(2) == [5, 3]  # b's last page, then c's deepest page
    assert tree.evict(5) == [4, 1, 0]  # c is older than the shared head now; then the head goes too
    assert tree.num_pages == 0 and not tree.root.children and tree.num_evictions == 7
    assert kv.num_free == kv.num_pages
    tree.check_integrity()


def test_locked_paths_are_never_evicted():
    kv, tree = _setup()
    _cache(tree, kv, [1, 2, 3, 4, 5, 6], "a")  # 0 1 2
    _cache(tree, kv, [1, 2, 7, 8], "b")  # new page 4 (its copy of [1, 2], page 3, went back)
    m = tree.lookup([1, 2, 3, 4])  # splits a after page 1: lock covers [0, 1] exactly
    assert m.pages == [0, 1]
    tree.lock(m.node)
    tree.lock(m.node)  # a second reader of the same prefix
    assert tree.num_locked_pages == 2 and tree.num_evictable_pages == 2
    assert tree.evict(10) == [2, 4]  # a's tail (older) then b; the locked path stays
    assert tree.all_pages() == [0, 1] and tree.evict(10) == []
    tree.unlock(m.node)
    assert tree.evict(10) == []  # still locked once
    tree.check_integrity()
    tree.unlock(m.node)
    assert tree.num_locked_pages == 0
    assert tree.evict(10) == [1, 0]
    tree.check_integrity()


def test_insert_under_a_locked_node_keeps_the_lock_on_split():
    kv, tree = _setup()
    _cache(tree, kv, [1, 2, 3, 4, 5, 6], "a")
    m = tree.lookup([1, 2, 3, 4, 5, 6])
    tree.lock(m.node)  # a reader holds the whole edge [0, 1, 2]
    _cache(tree, kv, [1, 2, 8, 8], "b")  # splits the locked edge: both halves stay locked
    head = tree.root.children[(1, 2)]
    assert head.lock_ref == 1 and m.node.lock_ref == 1 and head.pages == [0]
    assert tree.num_locked_pages == 3
    assert tree.evict(10) == [4]  # only b's page is unlocked
    tree.unlock(m.node)
    tree.check_integrity()


def test_pool_integrity_sees_each_page_with_one_owner():
    kv, tree = _setup(num_pages=6)
    _cache(tree, kv, [1, 2, 3, 4], "a")  # pages 0 1 to the tree
    private = kv.allocate(2, "r")  # 2 3 a running request's tail
    kv.check_integrity({tree: tree.all_pages(), "r": private})
    with pytest.raises(AssertionError, match="disagree"):
        kv.check_integrity({tree: tree.all_pages()})  # r's pages missing from the tables
    with pytest.raises(AssertionError, match="in the tables of"):
        kv.check_integrity({tree: tree.all_pages(), "r": private + [0]})  # a tree page in a request's table
    with pytest.raises(AssertionError, match="owned by <radix tree>"):
        kv.free([0], "r")  # a request cannot free a tree page
    with pytest.raises(AssertionError, match="owned by 'r'"):
        kv.transfer([2], "a", tree)
    assert kv.num_free + kv.num_used == kv.num_pages == 6 and kv.num_owned_by(tree) == 2


# ---- property test: the tree against a brute-force model ----------------------------------------
Path = tuple[tuple[int, ...], ...]


class Model:
    """Every cached page as ``prefix -> page``, with its own last-use time and lock count."""

    def __init__(self) -> None:
        self.page: dict[Path, int] = {}
        self.time: dict[Path, int] = {}
        self.locks: dict[Path, int] = {}
        self.clock = 0

    @staticmethod
    def prefixes(tokens: list[int]) -> list[Path]:
        pages = [tuple(tokens[i : i + S]) for i in range(0, len(tokens) // S * S, S)]
        return [tuple(pages[: i + 1]) for i in range(len(pages))]

    def longest(self, tokens: list[int]) -> list[Path]:
        out = []
        for p in self.prefixes(tokens):
            if p not in self.page:
                break
            out.append(p)
        return out

    def lookup(self, tokens: list[int]) -> list[Path]:
        self.clock += 1
        hit = self.longest(tokens)
        for p in hit:
            self.time[p] = self.clock
        return hit

    def insert(self, tokens: list[int], pages: list[int]) -> int:
        self.clock += 1
        cached = len(self.longest(tokens))
        for p, page in zip(self.prefixes(tokens), pages):
            self.page.setdefault(p, page)
            self.time[p] = self.clock
        return cached

    def evict(self, n: int) -> list[int]:
        freed: list[int] = []
        while len(freed) < n:
            parents = {p[:-1] for p in self.page}
            leaves = [p for p in self.page if p not in parents and not self.locks.get(p)]
            if not leaves:
                break
            oldest = min(leaves, key=lambda p: self.time[p])
            assert sum(self.time[p] == self.time[oldest] for p in leaves) == 1  # LRU is never a tie
            freed.append(self.page.pop(oldest))
            del self.time[oldest]
        return freed

    @property
    def num_locked(self) -> int:
        return sum(1 for p in self.page if self.locks.get(p))


# prompts share prefixes often: a prefix of one of three base texts, then a few random tokens
BASES = [[1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], [1, 2, 3, 1, 3, 3, 2, 2, 1, 1, 3, 2], [2, 2, 2, 1, 1, 1, 3, 3, 3]]
tokens_st = st.builds(
    lambda b, n, tail: BASES[b][:n] + tail,
    st.integers(0, 2), st.integers(0, 12), st.lists(st.integers(1, 3), max_size=4),
)  # fmt: skip
op_st = st.one_of(
    st.tuples(st.just("admit"), tokens_st),
    st.tuples(st.just("lookup"), tokens_st),
    st.tuples(st.just("finish"), st.integers(0, 7)),
    st.tuples(st.just("evict"), st.integers(1, 6)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, max_size=40))
def test_random_operations_match_a_brute_force_model(ops):
    kv, tree = _setup(num_pages=12)
    model = Model()
    held: list[tuple[str, list[int], object, list[int], int, list[Path]]] = []
    for i, (kind, arg) in enumerate(ops):
        if kind == "lookup":
            assert tree.lookup(arg).pages == [model.page[p] for p in model.lookup(arg)]
        elif kind == "evict":
            expected = model.evict(arg)
            assert tree.evict(arg) == expected
        elif kind == "admit":  # what the KV manager does: match + lock, then private pages for the rest
            m, hit = tree.lookup(arg), model.lookup(arg)
            assert m.pages == [model.page[p] for p in hit]
            tree.lock(m.node)
            for p in hit:
                model.locks[p] = model.locks.get(p, 0) + 1
            need = len(arg) // S - len(m.pages)
            short = need - kv.num_free
            if short > 0:
                assert tree.evict(short) == model.evict(short)
            if need > kv.num_free:  # does not fit: give the prefix back
                tree.unlock(m.node)
                for p in hit:
                    model.locks[p] -= 1
            else:
                owner = f"r{i}"
                held.append((owner, arg, m.node, m.pages + kv.allocate(need, owner), len(m.pages), hit))
        elif held:  # finish: the request's pages enter the tree, duplicates go back, the lock goes
            owner, tokens, node, pages, shared, hit = held.pop(arg % len(held))
            full = tokens[: len(pages) * S]
            cached = tree.insert(full, pages, owner)
            assert cached == model.insert(full, pages) and cached >= shared
            kv.free(pages[shared:cached], owner)
            tree.unlock(node)
            for p in hit:
                model.locks[p] -= 1
        tree.check_integrity()
        assert tree.num_pages == len(model.page)
        assert tree.num_locked_pages == model.num_locked
        assert sorted(tree.all_pages()) == sorted(model.page.values())
        tables: dict[object, list[int]] = {tree: tree.all_pages()}
        tables.update({h[0]: h[3][h[4] :] for h in held})
        kv.check_integrity(tables)
