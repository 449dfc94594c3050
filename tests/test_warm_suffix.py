"""A warm prompt (its prefix reused) with a short new suffix does not stream whole layers: it fills only its routed
misses (hybrid: and runs the rest on its CPU branch), as decode does (experts/prefill/streamer.py:
stream_min_tokens); a long cold prompt still streams. Greedy tokens equal a run without prefix reuse."""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.experts.backends.split_policy import SplitPolicy
from freetoken.experts.prefill.streamer import stream_min_tokens
from tiny_models import COMMON, _random_model

L, E, K = 4, 32, 2  # stream_min_tokens(32, 2) = 54; a cache of 2E slots spares the streamer's two buffers
PAGE = 16
COLD = 96  # whole pages: the warm request reuses all of them
SUFFIX = 6


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import transformers as tf

    cfg = tf.Qwen3MoeConfig(
        **COMMON, num_hidden_layers=L, head_dim=16, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=32,
        norm_topk_prob=True,
    )  # fmt: skip
    d = tmp_path_factory.mktemp("warm_suffix")
    _random_model(cfg, seed=2).save_pretrained(d)
    return d


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_threshold() -> None:
    assert stream_min_tokens(E, K) == 54
    assert stream_min_tokens(128, 8) == 76  # Qwen3-30B-A3B: a 64-token suffix fills on demand
    assert stream_min_tokens(8, 8) == stream_min_tokens(1, 1) == stream_min_tokens(8, 0) == 1
    for e, k in ((8, 2), (64, 4), (256, 8)):  # below the threshold an expert of the layer is expected unrouted
        t = stream_min_tokens(e, k)
        assert e * (1 - k / e) ** t < 1 <= e * (1 - k / e) ** (t - 1)


@pytest.mark.parametrize("backend", ["offload", "hybrid"])
def test_warm_short_suffix_copies_only_its_routed_experts(ckpt, backend: str) -> None:
    assert SUFFIX < stream_min_tokens(E, K) <= COLD
    kw = dict(device="cpu", dtype="float32", moe_backend=backend, expert_cache=2 * E, page_size=PAGE)
    llm = LLM(model=str(ckpt), **kw)
    be = llm.engine.setup.loaded.backend
    routed: list[set[int]] = []  # per step: (layer, expert) ids routed
    inner = be.forward

    def recording(layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        routed[-1].update((layer * E + ids.flatten()).tolist())
        return inner(layer, x, ids, w)

    be.forward = recording  # type: ignore[method-assign]
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompt = _ids(COLD, 1)
    warm = prompt + _ids(SUFFIX, 2)

    routed.append(set())
    s0 = llm.stats()
    llm.generate(prompt, greedy)
    s1 = llm.stats()
    assert s1["prefill_layers_streamed"] - s0["prefill_layers_streamed"] >= L  # cold and long: streamed

    eng = llm.engine
    if backend == "hybrid":  # decode's split, whatever this machine's profile says (unmeasured: it stays)
        be.policy = SplitPolicy(share=0.5, fixed=False)
    be.begin_step(1, True)  # a safe point: the next counts are the warm request's alone
    b0 = llm.stats()
    routed.append(set())
    eng.add_request("warm", warm, greedy)
    got = [t for o in eng.step() for t in o.new_token_ids]  # the suffix's prefill step, its first token
    be.begin_step(1, True)
    b1 = llm.stats()
    while eng.has_unfinished():
        got += [t for o in eng.step() for t in o.new_token_ids]
    assert b1["prefix_tokens_reused"] - b0["prefix_tokens_reused"] == COLD
    assert b1["prefill_layers_streamed"] == b0["prefill_layers_streamed"]  # the suffix did not stream
    copied = b1["expert_bytes_copied"] - b0["expert_bytes_copied"]
    expert_bytes = be.pool.expert_bytes
    assert copied <= len(routed[-1]) * expert_bytes < L * E * expert_bytes // 2
    if backend == "hybrid":  # split like decode: about half of the misses ran on the CPU branch
        cpu, misses = (b1[k] - b0[k] for k in ("expert_cpu_runs", "expert_misses"))
        assert 0.3 * misses <= cpu <= 0.7 * misses, (cpu, misses)
    llm.check_integrity()

    fresh = LLM(model=str(ckpt), prefix_cache=False, **kw)  # no prefix reuse: the whole prompt computed again
    assert fresh.generate(warm, greedy)[0].token_ids == got
