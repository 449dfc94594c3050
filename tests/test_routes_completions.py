"""``/v1/completions``, ``/v1/tokenize`` and ``/v1/detokenize`` through the real openai SDK (and httpx for the
routes it has no method for) against the real engine on a tiny random checkpoint, on loopback: ``echo`` +
``logprobs`` prompt logprobs equal transformers' own within 1e-4, generation streamed and not agrees, stop and
seed behave, the tokenize round trip, and bad input gets a 400 in OpenAI's shape while the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from freetoken.server.settings import ServerConfig
from server_harness import MODEL, Running, real_engine, serve

PROMPT = "The quick brown fox jumps over the lazy dog. Hello world"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    from tiny_models import save_checkpoint

    path = tmp_path_factory.mktemp("completions")
    model = save_checkpoint("qwen3_moe", Path(path), seed=0, tokenizer=True)
    return str(path), model.float().eval()


@pytest.fixture(scope="module")
def srv(ckpt: tuple[str, Any]) -> Iterator[Running]:
    config = ServerConfig(served_model_names=(MODEL,), max_body_bytes=64 * 1024)
    with serve(real_engine(ckpt[0], max_model_len=128), config) as s:
        yield s
        s.engine.check_integrity()


def _oa(srv: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)


def test_echo_logprobs_equal_transformers(srv: Running, ckpt: tuple[str, Any]) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(ckpt[0])(PROMPT)["input_ids"]
    with torch.no_grad():
        ref = torch.log_softmax(ckpt[1](torch.tensor([ids])).logits[0].float(), -1)
    want = [ref[i, t].item() for i, t in enumerate(ids[1:])]
    for prompt in (PROMPT, ids):
        r = _oa(srv).completions.create(model="gpt-3.5-turbo-instruct", prompt=prompt, echo=True, logprobs=3,
                                        max_tokens=0)  # fmt: skip
        assert r.model == MODEL and r.choices[0].text == PROMPT and r.choices[0].finish_reason == "length"
        lp: Any = r.choices[0].logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and len(lp.tokens) == len(ids)
        assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], want)) < 1e-4
        best = ref[:-1].topk(3, -1)
        for i, top in enumerate(lp.top_logprobs[1:]):  # keyed by text: two tokens of one text keep one entry
            assert all(min(abs(v - b) for b in best.values[i].tolist()) < 1e-4 for v in top.values())
        assert "".join(lp.tokens) == PROMPT and lp.text_offset[:2] == [0, len(lp.tokens[0])]
        assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 0)


def test_generation_streamed_and_not(srv: Running) -> None:
    oa = _oa(srv)
    full = oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=2, echo=True)
    c = full.choices[0]
    assert c.text.startswith(PROMPT) and c.finish_reason in ("length", "stop")
    gen_text = c.text[len(PROMPT):]
    lp: Any = c.logprobs
    assert full.usage is not None and len(lp.tokens) == full.usage.prompt_tokens + full.usage.completion_tokens
    assert all(x is not None for x in lp.token_logprobs[1:])
    chunks = list(oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                        stream_options={"include_usage": True}))  # fmt: skip
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == gen_text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == full.usage.completion_tokens  # type: ignore[union-attr]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == c.finish_reason
    a = oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, seed=7)
    b = oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, seed=7)
    assert a.choices[0].text == b.choices[0].text
    if len(gen_text) > 3:  # a stop string inside the greedy answer ends it there, itself left out
        stop = gen_text[2:4]
        s = oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop])
        assert s.choices[0].text == gen_text[: gen_text.index(stop)] and s.choices[0].finish_reason == "stop"


def test_tokenize_round_trip(srv: Running) -> None:
    r = httpx.post(srv.url + "/v1/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
    assert r["count"] == len(r["tokens"]) > 5 and r["max_model_len"] == 128
    back = httpx.post(srv.url + "/v1/detokenize", json={"model": MODEL, "tokens": r["tokens"]}).json()
    assert back == {"prompt": PROMPT}
    msgs = [{"role": "user", "content": "Hello world"}]
    chat = httpx.post(srv.url + "/v1/tokenize", json={"messages": msgs}).json()
    text = httpx.post(srv.url + "/v1/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert text == "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    done = _oa(srv).chat.completions.create(model=MODEL, messages=msgs, max_tokens=1)  # type: ignore[arg-type]
    assert done.usage is not None and done.usage.prompt_tokens == chat["count"]


BAD: list[tuple[str, str, dict[str, Any], str | None]] = [
    ("completions", "empty prompt", {"prompt": ""}, "prompt"),
    ("completions", "two prompts", {"prompt": ["a", "b"]}, "prompt"),
    ("completions", "id outside vocab", {"prompt": [1, 10**6]}, "prompt.1"),
    ("completions", "too long", {"prompt": list(range(1, 200))}, "messages"),
    ("completions", "max_tokens 0 without echo", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("completions", "n 2", {"prompt": "hi", "n": 2}, "n"),
    ("completions", "suffix", {"prompt": "hi", "suffix": "x"}, "suffix"),
    ("completions", "logprobs 99", {"prompt": "hi", "logprobs": 99}, None),
    ("completions", "wrong type", {"prompt": 3}, "prompt"),
    ("tokenize", "neither", {}, "prompt"),
    ("tokenize", "both", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
    ("tokenize", "too long", {"prompt": "hello " * 400}, "messages"),
    ("detokenize", "id outside vocab", {"tokens": [5, -1]}, "tokens.1"),
    ("detokenize", "too many", {"tokens": [5] * 300}, "messages"),
    ("detokenize", "wrong type", {"tokens": "abc"}, "tokens"),
]


@pytest.mark.parametrize("route,name,body,param", BAD, ids=[f"{b[0]}-{b[1]}" for b in BAD])
def test_bad_input_is_a_400_in_openai_shape(srv: Running, route: str, name: str, body: Any, param: str | None) -> None:
    for stream in (False, True) if route == "completions" else (False,):
        r = httpx.post(f"{srv.url}/v1/{route}", json={"model": MODEL, **body, **({"stream": True} if stream else {})})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"], err
        assert err["param"] == param or (param and err["param"].startswith(param + ".")), err  # a union's member
    assert _oa(srv).completions.create(model=MODEL, prompt="hi", max_tokens=2).choices[0].finish_reason


def test_body_limit_applies(srv: Running) -> None:
    r = httpx.post(srv.url + "/v1/tokenize", json={"prompt": "x" * 70_000})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


def test_scoring_without_free_pages_is_a_503_and_beyond_the_pool_a_400(ckpt: tuple[str, Any]) -> None:
    """``echo`` scoring takes temporary pages: while running requests hold them it is a 503 (retry later, nothing
    lost), a prompt more than the whole KV cache holds is the caller's 400; once the pages come free it scores."""
    from freetoken.config import EngineConfig
    from freetoken.engine.engine import LLMEngine
    from freetoken.engine.errors import InputError, KVBusyError
    from freetoken.runner.sampling_params import SamplingParams
    from freetoken.server.errors import from_engine_error

    engine = LLMEngine(EngineConfig(model=ckpt[0], device="cpu", dtype="float32", max_model_len=128, page_size=8,
                                    kv_pages=6, prefix_cache=False))  # fmt: skip
    engine.add_request("holder", list(range(3, 35)), SamplingParams(max_tokens=8, temperature=0.0))
    engine.step()  # the holder's 32 prompt tokens take 4 of the 6 pages
    with pytest.raises(KVBusyError) as busy:
        engine.prompt_logprobs(list(range(3, 27)))  # 3 pages, 2 free
    assert from_engine_error(busy.value).status("openai") == 503
    with pytest.raises(InputError, match="more than the whole KV cache holds"):
        engine.prompt_logprobs(list(range(3, 60)))  # 8 pages of 6
    while engine.has_unfinished():
        engine.step()
    assert len(engine.prompt_logprobs(list(range(3, 27)))) == 23
    engine.check_integrity()
