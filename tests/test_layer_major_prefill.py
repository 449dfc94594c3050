"""Layer-major prefill (engine/layer_major.py): the same logits as chunk-major (fp32, 1e-5) and transformers'
greedy tokens, a cold prompt streams the expert pool once, and running streams keep decoding (the same
tokens as alone) while a long prompt prefills between their steps."""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from reference import LOGIT_MARGIN, reference_greedy
from tiny_models import COMMON, _random_model

L, E = 4, 8  # every layer MoE; a cache of 16 slots spares exactly two whole layers (the streamer's buffers)
CHUNK = 16


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import transformers as tf

    cfg = tf.Qwen3MoeConfig(
        **COMMON, num_hidden_layers=L, head_dim=16, num_experts=E, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True,
    )  # fmt: skip
    d = tmp_path_factory.mktemp("layer_major")
    model = _random_model(cfg, seed=1)
    model.save_pretrained(d)
    return d, model


def _llm(path, **kw) -> LLM:
    args = dict(device="cpu", dtype="float32", moe_backend="offload", expert_cache=2 * E, max_batched_tokens=CHUNK,
                prefix_cache=False) | kw  # fmt: skip
    return LLM(model=str(path), **args)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_layer_major_logits_equal_chunk_major_and_stream_the_pool_once(ckpt) -> None:
    llm = _llm(ckpt[0])
    ids = _ids(77, 5)  # 5 chunks, the last one short
    s0 = llm.stats()
    got = llm.engine.score(ids, chunk=CHUNK, layer_major=True)  # first: the cache is cold
    s1 = llm.stats()
    ref = llm.engine.score(ids, chunk=CHUNK)
    s2 = llm.stats()
    err = float((got - ref).abs().max()) / max(1.0, float(ref.abs().max()))
    assert err <= 1e-5, err
    assert s1["prefill_experts_streamed"] - s0["prefill_experts_streamed"] == L * E  # the pool, once
    pool = llm.engine.setup.loaded.backend.pool
    assert s1["expert_bytes_copied"] - s0["expert_bytes_copied"] == L * E * pool.expert_bytes  # the counter
    assert s2["prefill_experts_streamed"] - s1["prefill_experts_streamed"] > 3 * L * E  # chunk-major: once a chunk
    llm.check_integrity()


def test_generate_layer_major_equals_transformers(ckpt) -> None:
    path, model = ckpt
    prompt = _ids(61, 7)
    ref = reference_greedy(model, prompt, 8)
    assert ref.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({ref.min_logit_margin:.2g})"
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for order in ("layer", "chunk"):
        llm = _llm(path, prefill_order=order)
        out = llm.generate([prompt], params)[0]
        assert out.token_ids == ref.tokens, order
        jobs = llm.stats()["layer_major_prefills"]
        assert jobs == (1 if order == "layer" else 0), order
        llm.check_integrity()


def test_activation_limit_runs_a_prompt_in_several_layer_major_prefills(ckpt) -> None:
    prompt = _ids(70, 8)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    want = _llm(ckpt[0], prefill_order="chunk").generate([prompt], params)[0].token_ids
    llm = _llm(ckpt[0], prefill_order="layer", layer_major_tokens=2 * CHUNK)
    assert llm.generate([prompt], params)[0].token_ids == want
    assert llm.stats()["layer_major_prefills"] == 2  # 32 + 32 layer-major, then the last 6 tokens alone
    none = _llm(ckpt[0], prefill_order="layer", layer_major_tokens=0)  # nothing fits: chunk-major
    assert none.generate([prompt], params)[0].token_ids == want and none.stats()["layer_major_prefills"] == 0


def _solo(path, prompt: list[int], n: int) -> list[int]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return _llm(path, prefill_order="chunk").generate([prompt], params)[0].token_ids


def test_running_stream_keeps_decoding_while_a_long_prompt_prefills(ckpt) -> None:
    path = ckpt[0]
    short, long = _ids(9, 11), _ids(200, 12)
    want_a, want_b = _solo(path, short, 40), _solo(path, long, 3)
    llm = _llm(path, prefill_order="layer", prefill_interleave_ms=0.0)  # a decode step after every unit
    eng = llm.engine
    eng.add_request("a", short, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    got: dict[str, list[int]] = {"a": [], "b": []}
    during = 0  # tokens of "a" produced while "b" prefilled layer-major
    while eng.has_unfinished():
        if len(got["a"]) == 2 and "b" not in eng.requests and not got["b"]:
            eng.add_request("b", long, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        busy = eng.layer_major_busy
        for out in eng.step():
            got[out.request_id] += out.new_token_ids
            during += len(out.new_token_ids) if busy and out.request_id == "a" else 0
        eng.check_integrity()
    assert got["a"] == want_a and got["b"] == want_b
    assert eng.stats()["layer_major_prefills"] == eng.stats()["layer_major_balanced"] == 1  # beside a stream
    assert during >= 20  # 13 chunks x 4 layers of prefill units, a decode step between them


def test_aborting_a_request_mid_prefill_cancels_the_job(ckpt) -> None:
    path = ckpt[0]
    short, long = _ids(9, 11), _ids(200, 12)
    llm = _llm(path, prefill_order="layer", prefill_interleave_ms=0.0)
    eng = llm.engine
    eng.add_request("a", short, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    tokens = [t for o in eng.step() for t in o.new_token_ids]
    eng.add_request("b", long, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    for _ in range(4):
        tokens += [t for o in eng.step() if o.request_id == "a" for t in o.new_token_ids]
    assert eng.layer_major_busy
    eng.abort("b")
    assert not eng.layer_major_busy
    while eng.has_unfinished():
        tokens += [t for o in eng.step() if o.request_id == "a" for t in o.new_token_ids]
        eng.check_integrity()
    assert tokens == _solo(path, short, 30)
    assert eng.stats()["layer_major_prefills"] == 1


def test_balanced_chunks_cost_at_most_a_first_chunk() -> None:
    from freetoken.engine.layer_major import balanced_chunks, chunk_cost, cut_chunks

    a, b = object(), object()
    extents = [(a, 0, 3000), (b, 500, 700)]  # b: a warm prompt's suffix, from its token 500
    chunk, cross = 512, 300.0
    got = balanced_chunks(extents, chunk, cross)  # type: ignore[arg-type]
    target = chunk_cost(chunk, 0, cross)
    pieces = [(r, s, n) for c in got for (r, n), s in zip(c.items, c.starts)]
    assert [p[2] for p in pieces if p[0] is a] and sum(p[2] for p in pieces if p[0] is a) == 3000
    assert sum(p[2] for p in pieces if p[0] is b) == 700
    for r in (a, b):  # each request's pieces follow on from each other
        mine = [(s, n) for q, s, n in pieces if q is r]
        assert all(s0 + n0 == s1 for (s0, n0), (s1, _) in zip(mine, mine[1:]))
    for c in got:
        assert sum(n for _, n in c.items) <= chunk
        assert sum(chunk_cost(n, s, cross) for (_, n), s in zip(c.items, c.starts)) <= target
    sizes = [sum(n for _, n in c.items) for c in got]
    assert sizes[0] == chunk and sizes[1] < chunk and sizes[len(cut_chunks(extents[:1], chunk)) - 1] < chunk / 2
    assert len(got) > len(cut_chunks(extents, chunk))  # the price: more, smaller units


def test_balanced_layer_major_logits_equal_chunk_major(ckpt) -> None:
    from freetoken.engine.layer_major import balanced_chunks

    llm = _llm(ckpt[0])
    ids = _ids(90, 9)
    cross = llm.engine.layer_major.crossover
    assert 0 < cross < 1e6
    req = object()
    sizes = [n for c in balanced_chunks([(req, 0, len(ids))], CHUNK, cross / 4) for _, n in c.items]  # type: ignore[list-item]
    assert len(set(sizes)) > 1 and sizes[0] == CHUNK
    got = llm.engine.score(ids, chunk=sizes, layer_major=True)
    ref = llm.engine.score(ids, chunk=CHUNK)
    err = float((got - ref).abs().max()) / max(1.0, float(ref.abs().max()))
    assert err <= 1e-5, err
