"""The engine survives anything that goes wrong while serving one request: that request finishes with an
error, the others keep their exact tokens, the caches stay sound, and later requests are served."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.config import EngineConfig
from freetoken.engine.async_llm import AsyncLLM
from freetoken.engine.errors import RequestFailedError
from freetoken.engine.outputs import RequestOutput
from tiny_models import save_checkpoint

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [[5 + i, 40 + 3 * i, 77, 100 + i, 9] for i in range(3)]
POISON = 444  # a token id the injected failures key on


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_next"])  # qwen3_next: recurrent states too
def ckpt(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    d = tmp_path_factory.mktemp("failures")
    save_checkpoint(request.param, d, seed=1)
    return d


@pytest.fixture(autouse=True)
def _check_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FREETOKEN_DEBUG", "1")


def _llm(d: Any) -> LLM:
    return LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=4)


def _run_all(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, RequestOutput]:
    """Adds every prompt, steps to the end; the last output and the tokens of each request."""
    eng = llm.engine
    tokens: dict[str, list[int]] = {}
    last: dict[str, RequestOutput] = {}
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(f"r{i}", p, sp)
        tokens[f"r{i}"] = []
    while eng.has_unfinished():
        for out in eng.step():
            tokens[out.request_id] += out.new_token_ids
            last[out.request_id] = out
    for rid, out in last.items():
        out.new_token_ids = tokens[rid]
    return last


def test_tiny_and_denormal_temperatures_sample_greedily(ckpt: Any) -> None:
    llm = _llm(ckpt)
    greedy = [r.token_ids for r in llm.generate(PROMPTS, PARAMS)]
    for t in (1e-40, 5e-324, 9e-6):
        sp = SamplingParams(temperature=t, max_tokens=6, ignore_eos=True, seed=3)
        assert [r.token_ids for r in llm.generate(PROMPTS, sp)] == greedy
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="temperature"):
            SamplingParams(temperature=bad)
    for seed in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="seed"):
            SamplingParams(seed=seed)
    SamplingParams(seed=2**64 - 1)
    SamplingParams(seed=-(2**63))


def test_a_failing_sampler_fails_only_its_request(ckpt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = _llm(ckpt)
    alone = [llm.generate([p], PARAMS)[0].token_ids for p in PROMPTS]
    import freetoken.runner.step_sampler as sampler_mod

    real_sample = sampler_mod.sample_batch

    def sample_batch(logits: torch.Tensor, b: Any, *args: Any, **kwargs: Any) -> Any:
        if bool(((b.seed_lo == 13) & (b.step >= 2)).any()):  # after the batch's forward advanced every state
            raise RuntimeError("injected sampler fault")
        return real_sample(logits, b, *args, **kwargs)

    monkeypatch.setattr(sampler_mod, "sample_batch", sample_batch)
    poisoned = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, seed=13)
    outs = _run_all(llm, PROMPTS, [PARAMS, poisoned, PARAMS])
    assert outs["r1"].finish_reason == "error" and "injected sampler fault" in (outs["r1"].error or "")
    assert outs["r0"].new_token_ids == alone[0] and outs["r2"].new_token_ids == alone[2]
    llm.check_integrity()
    assert llm.stats()["kv_pages_used"] == 0
    assert llm.generate([PROMPTS[1]], PARAMS)[0].token_ids == alone[1]  # and it serves on


def test_a_failing_model_step_fails_only_the_request_that_fails_alone(
    ckpt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = _llm(ckpt)
    alone = [llm.generate([p], PARAMS)[0].token_ids for p in PROMPTS]
    model = llm.engine.runner.model
    real_forward = model.forward
    calls = {"failed": 0}

    def forward(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if bool((input_ids == POISON).any()):
            calls["failed"] += 1
            raise RuntimeError("injected model fault")
        return real_forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    prompts = [PROMPTS[0], [POISON, 7, 8, 9], PROMPTS[2]]
    outs = _run_all(llm, prompts, [PARAMS] * 3)
    assert calls["failed"] >= 2  # the batch, then the poisoned request alone
    assert outs["r1"].finish_reason == "error" and "injected model fault" in (outs["r1"].error or "")
    assert outs["r0"].new_token_ids == alone[0] and outs["r2"].new_token_ids == alone[2]
    llm.check_integrity()
    assert llm.stats()["kv_pages_used"] == 0


def test_engine_thread_lives_through_a_failed_step(ckpt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that fails outside any one request fails every stream with the error; the engine stays
    ready and serves the next requests exactly."""

    async def collect(llm: AsyncLLM, ids: list[int]) -> list[int]:
        out: list[int] = []
        async for o in llm.generate(ids, PARAMS):
            out += o.new_token_ids
        return out

    async def main() -> None:
        llm = AsyncLLM.start(EngineConfig(model=str(ckpt), device="cpu", dtype="float32"))
        await llm.wait_ready()
        alone = await collect(llm, PROMPTS[0])
        assert llm.engine is not None
        sched = llm.engine.scheduler
        real = sched.schedule
        state = {"armed": True}

        def schedule(*args: Any, **kwargs: Any) -> Any:
            batch = real(*args, **kwargs)
            if state["armed"] and any(req.num_output_tokens == 2 for req, _ in batch.items):
                state["armed"] = False
                raise RuntimeError("injected scheduler fault")
            return batch

        monkeypatch.setattr(sched, "schedule", schedule)
        results = await asyncio.gather(*(collect(llm, p) for p in PROMPTS), return_exceptions=True)
        assert all(isinstance(r, RequestFailedError) and "injected scheduler fault" in str(r) for r in results)
        assert llm.state == "ready"
        await llm.check_integrity_async()
        assert await collect(llm, PROMPTS[0]) == alone
        assert llm.stats()["kv_pages_used"] == 0 and llm.stats()["running"] == 0
        await llm.shutdown()

    asyncio.run(main())


def test_a_request_given_up_before_the_engine_saw_it_is_dropped(ckpt: Any) -> None:
    """Found by the soak: a client that gives up at once cancels its Add command's future; answering
    a cancelled future raised InvalidStateError and ended the engine thread."""
    import concurrent.futures as cf

    from freetoken.engine.commands import Add

    async def main() -> None:
        llm = AsyncLLM.start(EngineConfig(model=str(ckpt), device="cpu", dtype="float32"))
        await llm.wait_ready()
        gone: cf.Future[None] = cf.Future()
        gone.cancel()
        llm._cmds.put(Add("gone", PROMPTS[0], PARAMS, gone))
        out: list[int] = []
        async for o in llm.generate(PROMPTS[1], PARAMS):
            out += o.new_token_ids
        assert len(out) == PARAMS.max_tokens and llm.state == "ready"
        assert llm.stats()["running"] == 0 and llm.stats()["waiting"] == 0
        await llm.shutdown()

    asyncio.run(main())
