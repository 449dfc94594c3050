"""Elastic memory when the device refuses a size: another program takes the memory between a cache's free and
its new allocation (the race the GPU box showed). A refused size falls back (``first_granted``), every used KV
page and its K/V are kept at any size the device grants, and a stream running through the resize gets every
token, the same as an undisturbed run (fp32, greedy). The fake device (``fake_device.py``) refuses what does
not fit and lets the other program take what the engine frees."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from fake_device import FakeDevice
from freetoken import LLM, SamplingParams
from freetoken.cache.kv_pool import KVPool
from freetoken.config import EngineConfig
from freetoken.engine import vram_watch
from freetoken.engine.async_llm import AsyncLLM
from freetoken.hardware import device_memory
from freetoken.hardware.device_memory import first_granted
from freetoken.memory.budget import GIB, MemorySplit
from tiny_models import save_checkpoint

S = 2  # page size of the unit test: one page of the pool below is 2 layers x (K, V) x S x 1 x 2 fp32


def _page_bytes(kv: KVPool) -> int:
    return kv.page_bytes


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_memory, "RETRY_WAIT_S", 0.0)


def test_first_granted_falls_to_the_next_size_and_asks_the_last_again() -> None:
    asked: list[int] = []

    def make(n: int) -> int:
        asked.append(n)
        if n > 3 or len(asked) < 5:
            raise torch.OutOfMemoryError("taken")
        return n * 10

    assert first_granted(make, [9, 12, 5, 5, 3], "things") == (3, 30)
    assert asked == [9, 5, 3, 3, 3]  # 12 and the second 5 are not below the size before them
    with pytest.raises(torch.OutOfMemoryError, match="refused things at every size down to 2"):
        first_granted(lambda n: (_ for _ in ()).throw(torch.OutOfMemoryError("no")), [4, 2], "things")


def test_remake_shrinks_beside_the_old_allocation_where_it_fits() -> None:
    free = [5]  # units the device has free; the old allocation holds 8
    dropped: list[int] = []

    def make(n: int) -> int:
        if n > free[0]:
            raise torch.OutOfMemoryError("taken")
        return n

    def drop() -> None:
        dropped.append(1)
        free[0] += 8

    assert device_memory.remake(make, [4, 2], 8, drop, "units") == (4, 4) and not dropped  # made before the break
    assert device_memory.remake(make, [6, 2], 8, drop, "units") == (6, 6) and dropped  # not beside: dropped first
    dropped.clear()
    free[0] = 0
    assert device_memory.remake(make, [9, 8, 2], 8, drop, "units") == (8, 8) and dropped  # a grow drops first


def test_a_kv_grow_refused_at_every_size_keeps_the_used_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU failure: a grow whose target and old size were both taken meanwhile (and the fewest pages too)
    ends with the used pages alone, each with its K/V."""
    dev = FakeDevice(1 << 30)
    dev.install(monkeypatch)
    kv = KVPool(2, 16, S, 1, 2, torch.float32, torch.device("cpu"))
    dev.capacity = dev.live  # nothing free: the pool's own bytes only
    a = kv.allocate(3, "a")
    b = kv.allocate(2, "b")
    kv.free(b, "b")  # used pages 0..2 (a), free pages in between
    for layer in range(2):
        for p in a:
            kv.k[layer][p * S : (p + 1) * S] = float(p + 1)
            kv.v[layer][p * S : (p + 1) * S] = -float(p + 1)
    want = {p: kv.k[0][p * S].clone() for p in a}
    dev.take(dev.capacity - 4 * kv.page_bytes)  # whatever the pool frees, up to all but 4 pages
    moves = kv.resize(20, fallback=(16, 8))
    assert dev.refusals == 3 and kv.num_pages == 3  # 20, 16 and 8 refused: the 3 used pages came
    kept = [moves.get(p, p) for p in a]
    assert all(torch.equal(kv.k[0][q * S], want[p]) for p, q in zip(a, kept))
    assert all(torch.equal(kv.v[1][q * S], -want[p]) for p, q in zip(a, kept))
    kv.check_integrity({"a": kept})


# ---- a stream through a refused resize ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("refusal")
    save_checkpoint("qwen3_moe", d, seed=1)
    return str(d)


def _kw(ckpt: str) -> dict:
    return dict(model=ckpt, device="cpu", dtype="float32", moe_backend="hybrid", page_size=8, max_model_len=128,
                vram_reserve=0.0)  # fmt: skip


@pytest.mark.parametrize("takes", ["all but the fewest", "everything"])
def test_a_stream_survives_a_resize_the_device_refuses(ckpt: str, takes: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other program takes whatever the engine frees: all but the fewest slots and pages (the slots' refusal
    makes the KV pages give way), or everything (the engine waits, and the watcher's grow resumes it)."""
    probe = LLM(expert_cache=2, kv_pages=16, **_kw(ckpt))
    f = probe.engine.memory.facts
    prompt = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(8)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
    want = probe.generate([prompt], params)[0].token_ids
    R = 4 * f.slot_bytes  # the reserve; the hysteresis band is as large
    monkeypatch.setattr(vram_watch, "MIN_HYSTERESIS", 0)
    dev = FakeDevice(1 << 40)
    dev.install(monkeypatch)
    cfg = EngineConfig(**_kw(ckpt), vram_budget=(16 * f.slot_bytes + 32 * f.page_bytes + R) / GIB, kv_pages=32)
    llm = AsyncLLM.start(cfg.replace(vram_reserve=R / GIB), free_memory=dev)
    dev.llm = llm  # type: ignore[assignment]
    assert llm.wait_loaded(120) and llm.state == "ready"
    assert dev.live is not None
    dev.capacity = dev.live + R + R // 2  # 1.5 R free: inside the band
    # the other program wants all but the fewest slots (2 + a scratch slot) and 18 pages (a 128-token context is
    # 16): it takes whatever the engine frees, so each size the watcher plans from its reading is refused
    hog = dev.capacity - dev.live + 14 * f.slot_bytes + 14 * f.page_bytes if takes != "everything" else dev.capacity

    def mover() -> None:
        time.sleep(0.3)
        dev.take(hog)
        time.sleep(1.0)
        dev.take(0)
        dev.other = 0

    async def run() -> list[int]:
        toks: list[int] = []
        async for out in llm.generate(prompt, params):
            toks += out.new_token_ids
            await asyncio.sleep(0.02)
        return toks

    t = threading.Thread(target=mover)
    t.start()
    try:
        assert asyncio.run(run()) == want  # every token, the same ones
        t.join()
        deadline = time.time() + 10
        while llm.stats()["memory"]["kv_pages"] != 32 and time.time() < deadline:
            time.sleep(0.05)
        assert dev.refusals > 0  # the race happened
        history = llm.engine.memory.history  # type: ignore[union-attr]
        assert min(r.kv_pages_after for r in history) < 32 and min(r.slots_after for r in history) < 16
        if takes == "everything":  # it waited: nothing of its caches on the device, for a while
            assert any(r.slots_after == r.kv_pages_after == 0 for r in history)
        assert (llm.stats()["memory"]["slots"], llm.stats()["memory"]["kv_pages"]) == (16, 32)  # grew back
        llm.check_integrity()
    finally:
        asyncio.run(llm.shutdown())


def test_kv_pages_refused_at_every_size_make_the_slots_give_way(ckpt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KV shrink whose every size (the used pages too) the other program took: the slots go to the fewest,
    the pool asks again in what that freed, and generation goes on with the same tokens."""
    prompt = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(8)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = LLM(expert_cache=16, kv_pages=32, **_kw(ckpt)).generate([prompt], params)[0].token_ids
    dev = FakeDevice(1 << 40)
    dev.install(monkeypatch)
    llm = LLM(expert_cache=16, kv_pages=32, **_kw(ckpt))
    eng = llm.engine
    f = eng.memory.facts
    assert dev.live is not None
    dev.capacity = dev.live
    eng.add_request("a", prompt, params)
    got: list[int] = []
    for _ in range(3):
        for o in eng.step():
            got += o.new_token_ids
    # the other program wants all but the fewest slots (2 + scratch) and 10 pages: the KV shrink frees the pool,
    # the other program takes it (no size of the pool fits after), the slots give way
    dev.take(dev.live - 3 * f.slot_bytes - 10 * f.page_bytes)
    rec = eng.memory.apply(MemorySplit(0, 16, 24, 0), "test", "test")
    assert (rec.slots_after, eng.memory.num_slots) == (2, 2) and 6 <= eng.kv.num_pages <= 10
    assert dev.refusals > 0
    eng.check_integrity()
    for o in eng.step():  # the pool holds the used pages and few more: the request waits for it to grow
        got += o.new_token_ids
    dev.take(0)
    dev.other = 0  # the other program went: the pool and the slots grow back
    eng.memory.apply(MemorySplit(0, 16, 32, 0), "test", "test")
    assert (eng.memory.num_slots, eng.kv.num_pages) == (16, 32)
    while eng.has_unfinished():
        for o in eng.step():
            got += o.new_token_ids
    assert got == want
    eng.check_integrity()


def test_a_device_that_refuses_even_the_fewest_makes_the_engine_wait(ckpt: str, monkeypatch) -> None:
    """The other program takes everything the engine frees and more: even the fewest slots and the used pages are
    refused. The engine keeps every request and its pages (the used pages in host memory), runs no step while it
    waits, and resumes when the memory comes back: the same tokens."""
    import freetoken.engine.engine as engine_mod

    monkeypatch.setattr(engine_mod, "RESUME_S", 0.0)
    prompt = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(8)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    want = LLM(expert_cache=16, kv_pages=32, **_kw(ckpt)).generate([prompt], params)[0].token_ids
    dev = FakeDevice(1 << 40)
    dev.install(monkeypatch)
    eng = LLM(expert_cache=16, kv_pages=32, **_kw(ckpt)).engine
    assert dev.live is not None
    dev.capacity = dev.live
    eng.add_request("a", prompt, params)
    got: list[int] = []
    for _ in range(3):
        for o in eng.step():
            got += o.new_token_ids
    dev.take(dev.capacity)  # everything
    eng.memory.apply(MemorySplit(0, 8, 24, 0), "test", "test")
    assert eng.memory.waiting and eng.stats()["memory"]["waiting_for_device_memory"]
    assert eng.memory.split.slots == 0 and eng.memory.split.kv_pages == 0  # what the engine holds on the device
    eng.check_integrity()
    n = len(got)
    for _ in range(3):
        assert eng.step() == [] and eng.memory.waiting  # no step runs; the request keeps its place
    assert eng.has_unfinished() and len(got) == n
    dev.take(0)
    dev.other = 0  # the memory came back
    for o in eng.step():  # asks again (the fewest slots and the used pages), then steps
        got += o.new_token_ids
    assert not eng.memory.waiting and eng.memory.num_slots == 2
    eng.memory.apply(MemorySplit(0, 16, 32, 0), "test", "test")  # the watcher's grow
    assert (eng.memory.num_slots, eng.kv.num_pages) == (16, 32)
    while eng.has_unfinished():
        for o in eng.step():
            got += o.new_token_ids
    assert got == want
    eng.check_integrity()
