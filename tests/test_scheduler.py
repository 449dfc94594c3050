"""Continuous batching under KV pressure: preemption of the newest request, never a deadlock."""

from __future__ import annotations

import pytest

from freetoken import LLM, SamplingParams
from tiny_models import save_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("sched")
    save_checkpoint("qwen3_moe", d, seed=1)
    return d


def _prompts() -> list[list[int]]:
    return [[(7 * i + 13 * j) % 500 + 3 for j in range(20 + 3 * i)] for i in range(4)]


def test_kv_exhaustion_preempts_and_everything_completes(ckpt):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    roomy = LLM(model=str(ckpt), device="cpu", kv_pages=64, page_size=8)
    alone = [roomy.generate([p], params)[0].token_ids for p in _prompts()]
    # 4 requests of ~60 tokens need ~32 pages of 8; give them 12: the newest must yield.
    tight = LLM(model=str(ckpt), device="cpu", kv_pages=12, page_size=8)
    outs = tight.generate(_prompts(), params)
    assert [o.token_ids for o in outs] == alone
    stats = tight.stats()
    assert stats["preemptions"] > 0
    assert stats["kv_pages_used"] == 0
    tight.check_integrity()


def test_waiting_queue_beyond_max_running(ckpt):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    llm = LLM(model=str(ckpt), device="cpu", max_running_requests=2)
    prompts = _prompts() * 3
    outs = llm.generate(prompts, params)
    assert all(len(o.token_ids) == 5 for o in outs)
    assert outs[0].token_ids == outs[4].token_ids  # same prompt, same greedy tokens, whatever the batch


def test_request_that_can_never_fit_fails_clearly(ckpt):
    llm = LLM(model=str(ckpt), device="cpu", kv_pages=2, page_size=8)
    from freetoken.engine.errors import InputError

    with pytest.raises(InputError, match="never fit"):
        llm.generate([list(range(3, 40))], SamplingParams(max_tokens=4))
    # growing past the pool while decoding alone ends with an error, other state intact
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))[0]
    assert out.finish_reason == "error"
    assert len(out.token_ids) == 16 - 3 + 1
    llm.check_integrity()


def test_chunked_prefill_matches_one_shot(ckpt):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    big = LLM(model=str(ckpt), device="cpu").generate(_prompts(), params)
    small = LLM(model=str(ckpt), device="cpu", max_batched_tokens=7).generate(_prompts(), params)
    assert [o.token_ids for o in big] == [o.token_ids for o in small]
