"""The engine thread driven from asyncio: concurrency, aborts, errors before output, integrity."""

from __future__ import annotations

import asyncio

import pytest

from freetoken.config import EngineConfig
from freetoken.engine.async_llm import AsyncLLM
from freetoken.engine.errors import EngineDeadError, PromptTooLongError
from freetoken.runner.sampling_params import SamplingParams
from tiny_models import save_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("async")
    save_checkpoint("qwen3_moe", d, seed=1, tokenizer=True)
    return d


async def _collect(llm: AsyncLLM, ids: list[int], params: SamplingParams) -> list[int]:
    out: list[int] = []
    async for o in llm.generate(ids, params):
        out += o.new_token_ids
    return out


def test_concurrent_streams_equal_alone_and_abort_frees_pages(ckpt):
    async def main() -> None:
        llm = AsyncLLM.start(EngineConfig(model=str(ckpt), device="cpu", max_running_requests=2))
        await llm.wait_ready()
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        prompts = [[5 + i, 40 + 3 * i, 77, 100 + i, 9] for i in range(6)]
        alone = [await _collect(llm, p, params) for p in prompts[:2]]
        together = await asyncio.gather(*[_collect(llm, p, params) for p in prompts])
        assert together[:2] == alone
        assert all(len(t) == 12 for t in together)
        # a consumer that stops early aborts its request and frees its pages
        stream = llm.generate(prompts[0], SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
        async for _ in stream:
            break
        await stream.aclose()
        await asyncio.sleep(0.2)
        await llm.check_integrity_async()
        with pytest.raises(PromptTooLongError):
            await _collect(llm, [1] * llm.max_model_len, params)
        assert (await _collect(llm, prompts[1], params)) == alone[1]  # still serving
        assert llm.stats()["kv_pages_used"] == 0
        await llm.shutdown()
        with pytest.raises(EngineDeadError):
            await _collect(llm, prompts[0], params)

    asyncio.run(main())


def test_load_failure_reports_dead(tmp_path):
    async def main() -> None:
        llm = AsyncLLM.start(EngineConfig(model=str(tmp_path / "missing"), device="cpu"))
        with pytest.raises(EngineDeadError, match="does not exist"):
            await llm.wait_ready()
        assert llm.state == "dead"

    asyncio.run(main())
