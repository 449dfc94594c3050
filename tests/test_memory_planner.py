"""The memory planner and the VRAM watcher's policy (pure functions), then the engine driven by them on the
CPU: a budget below the minimum is refused with the numbers, a budget change moves the slots first, the split
follows the session's KV, and a fake free-memory source makes the watcher shrink and grow the engine while a
request runs, its tokens unchanged."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from fake_device import FakeDevice
from freetoken import LLM, SamplingParams
from freetoken.config import EngineConfig
from freetoken.engine import vram_watch
from freetoken.engine.async_llm import AsyncLLM
from freetoken.engine.vram_watch import VramWatcher, hysteresis_for, watch_decision
from freetoken.memory.budget import GIB, MIB, BudgetError, MemoryFacts, follow_kv, parse_budget_gib, split_budget
from tiny_models import save_checkpoint

FACTS = MemoryFacts(slot_bytes=10 * MIB, page_bytes=MIB, min_slots=8, max_slots=1000, min_pages=64,
                    reserve_bytes=GIB, page_size=16, context=1024)  # fmt: skip


def test_split_gives_the_slots_what_the_kv_pages_leave() -> None:
    s = split_budget(GIB + 80 * MIB + 500 * MIB, FACTS, kv_wanted=100)
    assert (s.slots, s.kv_pages, s.reserve_bytes) == (48, 100, GIB)
    big = split_budget(20 * GIB, FACTS, kv_wanted=100)  # every expert fits: the rest goes to KV pages
    assert big.slots == 1000 and big.kv_pages == (19 * GIB - 1000 * 10 * MIB) // MIB
    few = split_budget(GIB + 8 * 10 * MIB + 64 * MIB, FACTS, kv_wanted=100)  # the minimum: KV gives way
    assert (few.slots, few.kv_pages) == (8, 64)
    assert split_budget(GIB + 200 * MIB, FACTS, kv_wanted=10).kv_pages == 64 + (200 - 80 - 64) % 10  # >= min


def test_a_budget_below_the_minimum_is_refused_with_the_numbers() -> None:
    with pytest.raises(BudgetError) as e:
        split_budget(GIB, FACTS, kv_wanted=64)
    msg = str(e.value)
    assert "1.000 GiB is below the minimum" in msg
    assert "8 expert slots x 10.00 MiB (one layer's top-k)" in msg
    assert "64 KV pages x 1.000 MiB (one 1024-token context)" in msg and "1.00 GiB reserve = 1.141 GiB" in msg
    for bad in (0, -1, float("nan"), float("inf"), "8", True, None):
        with pytest.raises(BudgetError):
            parse_budget_gib(bad)
    assert parse_budget_gib(1.5) == 3 * GIB // 2


def test_follow_kv_moves_budget_with_occupancy_and_hysteresis() -> None:
    assert follow_kv(100, 80, base_pages=100) == 160  # running requests hold 80%: double to 50%
    assert follow_kv(100, 76, base_pages=50) == 152
    assert follow_kv(100, 50, base_pages=50) is None  # inside the band: nothing moves
    assert follow_kv(160, 30, base_pages=100) == 100  # they gave pages back: down to the base, not below
    assert follow_kv(400, 60, base_pages=100) == 120
    assert follow_kv(100, 10, base_pages=100) is None  # at the base already
    assert follow_kv(0, 0, base_pages=1) is None


def test_watch_decision_shrinks_by_the_shortfall_and_grows_back_with_hysteresis() -> None:
    band = hysteresis_for(GIB)
    assert band == GIB
    budget, target, floor = 20 * GIB, 20 * GIB, 2 * GIB
    shrink = watch_decision(GIB // 4, GIB, budget, target, floor)  # the shortfall and half the band
    assert shrink is not None and shrink[0] == budget - 3 * GIB // 4 - band // 2
    assert "free VRAM 0.25 GiB < reserve 1.00 GiB" in shrink[1]
    assert watch_decision(GIB // 2, GIB, 2 * GIB, target, floor) is None  # at the minimum: nothing left to give
    why = shrink[1].replace("0.25", "1.00")
    assert watch_decision(GIB - 1, GIB, 3 * GIB, target, floor) == (3 * GIB - 1 - band // 2, why)
    assert watch_decision(GIB - 1, GIB, 2 * GIB + 1, target, floor)[0] == floor  # type: ignore[index]
    assert watch_decision(GIB + band, GIB, 10 * GIB, target, floor) is None  # inside the band
    grow = watch_decision(5 * GIB, GIB, 10 * GIB, target, floor)
    assert grow is not None and grow[0] == 10 * GIB + 4 * GIB - band // 2
    assert watch_decision(30 * GIB, GIB, 10 * GIB, target, floor)[0] == target  # type: ignore[index]
    assert watch_decision(30 * GIB, GIB, target, target, floor) is None  # never above the budget set by hand
    streak = watch_decision(GIB // 4, GIB, budget, target, floor, streak=2)  # a program still allocating
    assert streak is not None and streak[0] == budget - 4 * (3 * GIB // 4 + band // 2)
    # after a grow the free memory sits half a band above the reserve: no shrink, no grow (no oscillation)
    assert watch_decision(GIB + band // 2, GIB, 14 * GIB, target, floor) is None


class FakeFree:
    """A free-memory source the test moves (the watcher's thread reads it)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def free_bytes(self) -> int:
        return self.value


def test_watcher_posts_only_what_the_policy_acts_on_one_at_a_time() -> None:
    src, posted = FakeFree(10 * GIB), []
    w = VramWatcher(src, wants=lambda free: free < GIB, post=posted.append, period_s=0.01).start()
    try:
        time.sleep(0.1)
        assert posted == [] and w.readings > 0
        src.value = GIB // 2
        deadline = time.time() + 5
        while not posted and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert posted == [GIB // 2]  # one reading waits for the engine: no flood
        w.done()
        deadline = time.time() + 5
        while len(posted) < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert posted[1] == GIB // 2
    finally:
        w.stop()


# ---- the engine ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("planner")
    save_checkpoint("qwen3_moe", d, seed=1)
    return str(d)


def _kw(ckpt: str) -> dict:
    return dict(model=ckpt, device="cpu", dtype="float32", moe_backend="hybrid", page_size=8, max_model_len=128,
                vram_reserve=0.0)  # fmt: skip


def _facts(llm: LLM) -> MemoryFacts:
    return llm.engine.memory.facts


def test_engine_starts_at_its_budget_and_refuses_one_below_the_minimum(ckpt: str) -> None:
    probe = LLM(expert_cache=2, kv_pages=16, **_kw(ckpt))
    f = _facts(probe)
    assert (f.min_slots, f.max_slots, f.min_pages) == (2, 16, 16)
    budget = (10 * f.slot_bytes + 40 * f.page_bytes) / GIB
    llm = LLM(vram_budget=budget, kv_pages=40, **_kw(ckpt))
    assert (llm.engine.memory.num_slots, llm.engine.kv.num_pages) == (10, 40)
    with pytest.raises(BudgetError, match=r"below the minimum this model needs: 2 expert slots x .* \+ 16 KV pages"):
        LLM(vram_budget=(f.minimum_budget - 1) / GIB, **_kw(ckpt))
    before = llm.stats()["memory"]
    with pytest.raises(BudgetError, match="one 128-token context"):
        llm.engine.set_vram_budget((f.minimum_budget - f.page_bytes) / GIB)
    assert llm.stats()["memory"] == before  # a refused budget changes nothing
    # a smaller budget takes from the slots first, then from the KV pages
    m = llm.engine.set_vram_budget((4 * f.slot_bytes + 40 * f.page_bytes) / GIB)
    assert (m["slots"], m["kv_pages"]) == (4, 40) and m["last_resize"]["source"] == "api"
    m = llm.engine.set_vram_budget((2 * f.slot_bytes + 30 * f.page_bytes) / GIB)
    assert (m["slots"], m["kv_pages"]) == (2, 30)
    m = llm.engine.set_vram_budget((16 * f.slot_bytes + 30 * f.page_bytes) / GIB)
    assert (m["slots"], m["kv_pages"]) == (16, 30)
    llm.check_integrity()


def test_the_split_follows_the_session_and_keeps_the_tokens(ckpt: str) -> None:
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (40, 70, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    fixed = LLM(expert_cache=12, kv_pages=64, **_kw(ckpt))
    want = [r.token_ids for r in fixed.generate(prompts, params)]
    f = _facts(fixed)
    llm = LLM(vram_budget=(12 * f.slot_bytes + 20 * f.page_bytes) / GIB, kv_pages=20, **_kw(ckpt))
    assert (llm.engine.memory.num_slots, llm.engine.kv.num_pages) == (12, 20)
    seen = []
    step = llm.engine.step

    def watched() -> list:
        out = step()
        seen.append((llm.engine.memory.num_slots, llm.engine.kv.num_pages))
        return out

    llm.engine.step = watched  # type: ignore[method-assign]
    assert [r.token_ids for r in llm.generate(prompts, params)] == want
    grown = max(kv for _, kv in seen)
    assert grown > 20 and min(s for s, _ in seen) < 12  # the KV pages grew out of the slots' budget ...
    assert seen[-1] == (12, 20)  # ... and went back once the requests gave their pages back
    assert llm.stats()["memory"]["last_resize"]["source"] == "session"
    llm.check_integrity()


def test_a_fake_free_memory_source_drives_the_engine_while_a_request_runs(
    ckpt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = LLM(expert_cache=2, kv_pages=16, **_kw(ckpt))
    f = _facts(probe)
    prompt = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(8)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    want = probe.generate([prompt], params)[0].token_ids
    R = 4 * f.slot_bytes  # the reserve, in the tiny model's units; the hysteresis band is as large
    monkeypatch.setattr(vram_watch, "MIN_HYSTERESIS", 0)
    used = 16 * f.slot_bytes + 32 * f.page_bytes
    cfg = EngineConfig(**_kw(ckpt), vram_budget=(used + R) / GIB, kv_pages=32).replace(vram_reserve=R / GIB)
    dev = FakeDevice(used + R + R // 2)  # 1.5 R free at start: inside the band
    llm = AsyncLLM.start(cfg, free_memory=dev)
    dev.llm = llm  # type: ignore[assignment]
    assert llm.wait_loaded(120) and llm.state == "ready"
    seen: list[tuple[int, int]] = []

    def mover() -> None:  # the other program leaves 10 slots' worth less than the reserve, then goes
        time.sleep(0.3)
        dev.other = R // 2 + 10 * f.slot_bytes
        time.sleep(0.5)
        dev.other = 0

    async def run() -> list[int]:
        toks: list[int] = []
        async for out in llm.generate(prompt, params):
            toks += out.new_token_ids
            m = llm.engine.memory  # type: ignore[union-attr]
            seen.append((m.num_slots, llm.engine.kv.num_pages))  # type: ignore[union-attr]
            await asyncio.sleep(0.02)
        return toks

    t = threading.Thread(target=mover)
    t.start()
    try:
        assert asyncio.run(run()) == want
        t.join()
        deadline = time.time() + 10
        while llm.stats()["memory"]["slots"] != 16 and time.time() < deadline:
            time.sleep(0.05)
        assert min(seen) == (4, 32)  # the shortfall + half the band (12 slots), slots first, once
        assert llm.stats()["memory"]["slots"] == 16  # grew back to the budget set at start
        assert llm.stats()["memory"]["last_resize"]["source"] == "watcher"
        assert llm.stats()["vram_watcher"] == "on"
        llm.check_integrity()
    finally:
        asyncio.run(llm.shutdown())


def test_without_nvml_the_watcher_is_off_said_once(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # an import that fails, as where nvidia-ml-py is missing
    monkeypatch.setattr(vram_watch.NvmlSource, "_said", False)
    with caplog.at_level("WARNING"):
        assert vram_watch.NvmlSource.open(torch.device("cuda")) is None
        assert vram_watch.NvmlSource.open(torch.device("cuda")) is None
    said = [r for r in caplog.records if "VRAM watcher off" in r.getMessage()]
    assert len(said) == 1 and "nvidia-ml-py" in said[0].getMessage()
