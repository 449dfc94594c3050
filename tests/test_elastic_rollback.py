"""A resize is all or nothing: an allocation that fails after a cache's teardown has begun (the old layers or banks
already dropped) leaves the cache, and the engine, as it was: the same sizes, every used KV page's K/V where it
was, the same greedy tokens (fp32). The failure is injected in the real allocation path: ``device_zeros``, as
the caches call it, fails the way the CPU allocator does ("can't allocate memory") on the calls a script names;
``free_device_bytes`` says there is no room beside the old allocation, so a grow drops the old one first."""

from __future__ import annotations

import math

import psutil
import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.cache.kv_pool import KVPool
from freetoken.hardware import device_memory
from freetoken.memory.budget import GIB, BudgetError, Capacity, ResizeError, parse_budget_gib
from tiny_models import save_checkpoint

S = 2
ALLOC = "alloc"  # fail as the CPU allocator does
OOM = "oom"  # refused as the device refuses


class FailingAllocator:
    """The caches' ``device_zeros``: call n (from 1) does what ``script[n]`` says, or, past ``every_from``, fails."""

    def __init__(self, script: dict[int, str], every_from: int | None = None) -> None:
        self.script, self.every_from = script, every_from
        self.calls = 0
        self.failed_with_layers: list[int] = []  # the KV pool's layers at each failure (0: torn down)
        self.pool: KVPool | None = None

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        self.calls += 1
        what = self.script.get(self.calls)
        if what is None and self.every_from is not None and self.calls >= self.every_from:
            what = ALLOC
        if what is not None and self.pool is not None:
            self.failed_with_layers.append(len(self.pool.k))
        if what == OOM:
            raise torch.OutOfMemoryError("refused")
        if what == ALLOC:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 89389006848 bytes")
        return torch.zeros(shape, dtype=dtype, device=device)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FailingAllocator:
        import freetoken.cache.kv_pool as kv_pool
        import freetoken.experts.slots.cache as slot_cache

        for module in (kv_pool, slot_cache):
            monkeypatch.setattr(module, "device_zeros", self)
            monkeypatch.setattr(module, "free_device_bytes", lambda device: 0, raising=False)  # no room beside
        return self


class Guard:
    """The caches' allocator, refusing (as a test failure, never by trying) anything over a quarter of what the host
    has free: before the fix, a budget over the machine went on to allocate it (the kernel killed the server)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        self.asked.append(nbytes)
        if nbytes > psutil.virtual_memory().available // 4:
            raise AssertionError(f"test guard: the resize went on to allocate {nbytes} bytes")
        return torch.zeros(shape, dtype=dtype, device=device)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Guard:
        import freetoken.cache.kv_pool as kv_pool
        import freetoken.experts.slots.cache as slot_cache

        for module in (kv_pool, slot_cache):
            monkeypatch.setattr(module, "device_zeros", self)
        return self


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_memory, "RETRY_WAIT_S", 0.0)


def _filled_pool() -> tuple[KVPool, list[int], dict[int, torch.Tensor]]:
    kv = KVPool(2, 16, S, 1, 2, torch.float32, torch.device("cpu"))
    a = kv.allocate(5, "a")
    kv.free(kv.allocate(2, "b"), "b")
    for layer in range(2):
        for p in a:
            kv.k[layer][p * S : (p + 1) * S] = float(p + 1)
            kv.v[layer][p * S : (p + 1) * S] = -float(p + 1) - layer
    return kv, a, {p: torch.stack([kv.k[1][p * S], kv.v[1][p * S]]) for p in a}


@pytest.mark.parametrize(
    "size, script",
    [(24, {1: ALLOC}), (24, {2: ALLOC}), (24, {4: ALLOC}), (6, {1: OOM, 2: ALLOC}), (6, {1: OOM, 5: ALLOC})],
    ids=["grow-first", "grow-second", "grow-last", "shrink-first", "shrink-last"],
)
def test_a_kv_resize_failing_after_teardown_puts_the_pool_back(
    size: int, script: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kv, a, want = _filled_pool()
    free_before = sorted(kv._free)
    alloc = FailingAllocator(script).install(monkeypatch)
    alloc.pool = kv
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        kv.resize(size)
    assert alloc.failed_with_layers[-1] == 0  # the failure came after the old layers went
    assert kv.num_pages == 16 and len(kv.k) == len(kv.v) == 2 and kv.k[0].shape[0] == 16 * S
    assert all(torch.equal(torch.stack([kv.k[1][p * S], kv.v[1][p * S]]), want[p]) for p in a)
    assert sorted(kv._free) == free_before and not kv.waiting
    kv.check_integrity({"a": a})


def test_a_kv_pool_that_cannot_be_made_again_waits_and_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every allocation fails from the first: the old size cannot be made again either; the used pages wait in host
    memory (the pool is ``waiting``, sound) and come back, each K/V intact, once the allocator heals."""
    kv, a, want = _filled_pool()
    alloc = FailingAllocator({}, every_from=1).install(monkeypatch)
    with pytest.raises(RuntimeError):
        kv.resize(24)
    assert kv.waiting and kv.fault() == "the KV pool waits for device memory"
    kv.check_integrity({"a": a})
    alloc.every_from = None
    moves = kv.resume()
    assert moves is not None and not kv.waiting and kv.fault() is None
    kept = [moves.get(p, p) for p in a]
    assert all(torch.equal(torch.stack([kv.k[1][q * S], kv.v[1][q * S]]), want[p]) for p, q in zip(a, kept))
    kv.check_integrity({"a": kept})


def test_check_integrity_sees_a_pool_without_its_layers() -> None:
    """The state the 2026-12-05 failure left (the KV list half torn down): no longer 'sound'."""
    kv, a, _ = _filled_pool()
    kv.k = kv.k[:1]
    assert kv.fault() == "the KV pool has 1 K and 2 V layers of 2"
    with pytest.raises(AssertionError, match="1 K and 2 V layers"):
        kv.check_integrity({"a": a})


# ---- the engine --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("rollback")
    save_checkpoint("qwen3_moe", d, seed=1)
    return str(d)


def _kw(ckpt: str) -> dict:
    return dict(model=ckpt, device="cpu", dtype="float32", moe_backend="hybrid", page_size=8, max_model_len=128,
                vram_reserve=0.0)  # fmt: skip


PROMPT = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(8)).tolist()
GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)


@pytest.mark.parametrize("fail_at", [1, 3, 5, 6], ids=["kv-first", "kv-third", "slots-first", "slots-last"])
def test_a_budget_whose_allocation_fails_mid_resize_leaves_the_engine_as_it_was(
    ckpt: str, fail_at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grow of both caches: the KV pool's four layers are calls 1-4, the slot banks 5-6. A failure in the slots,
    after the KV pool grew, puts the KV pool back too."""
    llm = LLM(expert_cache=8, kv_pages=24, **_kw(ckpt))
    eng = llm.engine
    f = eng.memory.facts
    llm.engine.set_vram_budget((8 * f.slot_bytes + 24 * f.page_bytes) / GIB)  # the budget the caches are at
    want = llm.generate([PROMPT], GREEDY)[0].token_ids
    before = eng.memory.stats()
    FailingAllocator({fail_at: ALLOC}).install(monkeypatch)
    budget = (16 * f.slot_bytes + 40 * f.page_bytes) / GIB  # every expert of the pool, 16 more pages
    with pytest.raises(ResizeError) as err:
        eng.set_vram_budget(budget)
    msg = str(err.value)
    assert f"the resize to {budget:.3f} GiB (16 expert slots + 40 KV pages) failed" in msg
    assert "can't allocate memory" in msg and "What exists: host RAM" in msg and "GiB free" in msg
    assert "The engine is at 8 expert slots + 24 KV pages" in msg
    after = eng.memory.stats()
    for key in ("slots", "kv_pages", "budget_gib", "target_gib", "waiting_for_device_memory"):
        assert after[key] == before[key], key
    assert eng.memory.fault() is None and eng.memory.restore_to is None
    eng.check_integrity()
    assert llm.generate([PROMPT], GREEDY)[0].token_ids == want
    eng.check_integrity()


def test_budgets_over_what_the_machine_has_are_refused_before_anything_changes(
    ckpt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = LLM(expert_cache=8, kv_pages=24, **_kw(ckpt))
    guard = Guard().install(monkeypatch)
    m = llm.engine.memory
    m.capacity = lambda held: Capacity(3 * GIB, held, 24 * GIB, "host RAM (test)")
    before = m.stats()
    for gib in (50, 1000, 1e308):
        with pytest.raises(BudgetError, match=r"exceeds what this machine has for the caches: host RAM \(test\)"):
            llm.engine.set_vram_budget(gib)
    with pytest.raises(BudgetError, match=r"a VRAM budget of 50\.000 GiB exceeds .* = 3\.0\d\d GiB"):
        llm.engine.set_vram_budget(50)
    assert m.stats() == before and guard.asked == []  # refused before any cache was touched
    assert parse_budget_gib(1e308) > 1 << 1000  # a number, exactly: whether it fits is the capacity's question
    with pytest.raises(BudgetError, match="positive"):
        parse_budget_gib(-1.0)
    with pytest.raises(BudgetError, match="finite"):
        parse_budget_gib(float("inf"))
