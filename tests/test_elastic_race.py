"""The race behind the flaky ``test_elastic_refusal.py::...[everything]``, forced with events: the engine waits for
device memory (another program took everything), the memory comes back, and the step's own resume (``RESUME_S``)
comes before the VRAM watcher's grow. That step then ran the session follower against the fewest the device had
granted, a split below the planner's minimum: ``BudgetError`` inside the step failed every request. Now the
follower leaves such a split to the watcher: the stream gets every token, the same ones, and the watcher grows
the caches back."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import torch

import freetoken.engine.engine as engine_mod
from fake_device import FakeDevice
from freetoken import LLM, SamplingParams
from freetoken.config import EngineConfig
from freetoken.engine import vram_watch
from freetoken.engine.async_llm import AsyncLLM
from freetoken.hardware import device_memory
from freetoken.memory.budget import GIB
from tiny_models import save_checkpoint

T = 30  # seconds any one wait may take before the test gives up (a hang is a failure, not a timing)


class GatedReadings:
    """The watcher's source: the fake device's free memory, or (``hold``) a steady reading the policy ignores."""

    def __init__(self, dev: FakeDevice, steady: int) -> None:
        self.dev, self.steady, self.hold = dev, steady, True

    def free_bytes(self) -> int:
        return self.steady if self.hold else self.dev.free_bytes()


def _wrap(obj: Any, name: str, monkeypatch: pytest.MonkeyPatch, after: Any) -> None:
    orig = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            after(None)
            raise
        after(out)
        return out

    monkeypatch.setattr(obj, name, wrapped)


def test_a_step_that_resumes_the_caches_runs_the_follower_without_failing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint("qwen3_moe", tmp_path, seed=1)
    kw = dict(model=str(tmp_path), device="cpu", dtype="float32", moe_backend="hybrid", page_size=8,
              max_model_len=128, vram_reserve=0.0)  # fmt: skip
    probe = LLM(expert_cache=2, kv_pages=16, **kw)
    f = probe.engine.memory.facts
    # 36 tokens: 4.5 pages of 8, so the request's next tokens fit its last page when the pool is its used pages
    prompt = torch.randint(3, 500, (36,), generator=torch.Generator().manual_seed(8)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    want = probe.generate([prompt], params)[0].token_ids
    monkeypatch.setattr(device_memory, "RETRY_WAIT_S", 0.0)
    monkeypatch.setattr(engine_mod, "RESUME_S", 0.0)  # the step asks again at once
    monkeypatch.setattr(vram_watch, "MIN_HYSTERESIS", 0)
    monkeypatch.setattr(vram_watch, "POLL_S", 0.005)
    R = 4 * f.slot_bytes
    dev = FakeDevice(1 << 40)
    dev.install(monkeypatch)
    readings = GatedReadings(dev, R)  # exactly the reserve: the watcher does nothing
    cfg = EngineConfig(**kw, vram_budget=(16 * f.slot_bytes + 32 * f.page_bytes + R) / GIB, kv_pages=32)
    llm = AsyncLLM.start(cfg.replace(vram_reserve=R / GIB), free_memory=readings)
    assert llm.wait_loaded(120) and llm.state == "ready" and llm.watcher is not None
    mem = llm.engine.memory  # type: ignore[union-attr]
    assert dev.live is not None
    dev.capacity = dev.live + R + R // 2
    stepped, posted, waiting, resumed, followed, grown = (threading.Event() for _ in range(6))

    def after_follow(_: object) -> None:  # the engine thread, at the end of every step
        if resumed.is_set():
            followed.set()  # the step that resumed the caches ran the follower
        elif not stepped.is_set():
            stepped.set()
            posted.wait(T)  # hold the engine until the watcher posted its reading: the shrink lands mid-stream

    _wrap(mem, "follow", monkeypatch, after_follow)
    _wrap(llm.watcher, "post", monkeypatch, lambda _: posted.set())
    _wrap(
        mem,
        "apply",
        monkeypatch,
        lambda _: (
            waiting.set() if mem.waiting else None,
            grown.set() if (mem.num_slots, mem.kv_pages) == (16, 32) else None,
        ),
    )
    _wrap(mem, "resume", monkeypatch, lambda ok: resumed.set() if ok and waiting.is_set() else None)

    def other_program() -> None:
        assert stepped.wait(T)
        dev.take(dev.capacity)  # everything, and whatever the engine frees
        readings.hold = False  # the watcher reads 0 free: a shrink, refused at every size: the engine waits
        assert waiting.wait(T)
        readings.hold = True  # the watcher sees nothing more happen ...
        dev.take(0)
        dev.other = 0  # ... while the memory comes back: the step's own resume comes first
        assert followed.wait(T)
        readings.hold = False  # now the watcher's grow

    async def stream() -> list[int]:
        toks: list[int] = []
        async for out in llm.generate(prompt, params):
            toks += out.new_token_ids
        return toks

    t = threading.Thread(target=other_program)
    t.start()
    try:
        assert asyncio.run(stream()) == want  # every token, the same ones
        t.join(T)
        assert followed.is_set() and grown.wait(T)
        assert (mem.num_slots, mem.kv_pages) == (16, 32)
        assert any(r.slots_after == r.kv_pages_after == 0 for r in mem.history)  # it did wait
        llm.check_integrity()
    finally:
        readings.hold = False
        for e in (stepped, posted, waiting, followed):
            e.set()
        asyncio.run(llm.shutdown())
