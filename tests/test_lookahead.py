"""``EngineConfig.lookahead``: each MoE layer's likely experts (the next layer's router on this layer's input,
``layers/moe.py``) filled ahead through the slot backends' prefetcher (``SlotBackend.hint_next``). On the embedded
default model (6 MoE layers, 16 experts, top-4) on the CPU: the tokens never change, experts are filled ahead, the
layers miss less when they plan, and no slot stays locked."""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.layers.moe import MoELayer, link_lookahead

PROMPTS = [[5, 6, 7, 8, 9, 10], [300, 2, 77, 41], [19, 23, 29, 31, 37, 41, 43]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _llm(backend: str, lookahead: bool, cache: float | None = 0.4) -> LLM:
    return LLM(device="cpu", moe_backend=backend, expert_cache=cache, lookahead=lookahead,
               fill_fraction=0.5 if backend == "hybrid" else None)  # fmt: skip


def _run(llm: LLM) -> tuple[list[list[int]], list[int]]:
    tokens = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
    return tokens, llm.engine.setup.loaded.backend.layer_counts()["misses"]


def test_link_lookahead_chains_the_layers_in_order() -> None:
    llm = _llm("offload", True)
    moe = [layer.ffn for layer in llm.engine.setup.loaded.model.layers if isinstance(layer.ffn, MoELayer)]
    assert [m.lookahead for m in moe] == [*moe[1:], None]
    assert link_lookahead(moe[:1]) == 0 and link_lookahead([]) == 0
    assert all(layer.ffn.lookahead is None for layer in _llm("offload", False).engine.setup.loaded.model.layers)


@pytest.mark.parametrize("backend", ["offload", "hybrid"])
def test_lookahead_keeps_the_tokens_and_fills_ahead(backend: str) -> None:
    want, misses = _run(_llm(backend, False))
    llm = _llm(backend, True)
    got, ahead_misses = _run(llm)
    assert got == want == [o.token_ids for o in _llm("cpu", False, None).generate(PROMPTS, PARAMS)]
    s = llm.stats()
    assert s["expert_prefetches"] > 0 and s["prefetch_layers"] > 0
    # the later layers find most of their experts resident when they plan (the first, predicted by none, loses some
    # to the held slots); the copies themselves grow: what the box must weigh (docs/benchmarks.md)
    assert sum(ahead_misses[1:]) < 0.7 * sum(misses[1:]), (ahead_misses, misses)
    assert sum(ahead_misses) < sum(misses), (ahead_misses, misses)
    assert not bool(llm.engine.setup.loaded.backend.cache.tables.locked.any())
    llm.check_integrity()


def test_e2e_policy_option() -> None:
    """``ft bench e2e --policies hybrid,hybrid+la``: the option sets the config beside the same backend."""
    from freetoken.bench.e2e import policy_config

    assert policy_config("hybrid") == {"moe_backend": "hybrid", "lookahead": False}
    assert policy_config("offload+la") == {"moe_backend": "offload", "lookahead": True}
    with pytest.raises(SystemExit, match=r"unknown policy option\(s\) \['xx'\]"):
        policy_config("hybrid+xx")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["offload", "hybrid"])
def test_lookahead_on_cuda(backend: str) -> None:
    """On a GPU (whole-step graphs replayed, the copies on the side stream): the CPU engine's tokens, experts filled
    ahead, fewer misses when the layers plan, no slot left locked."""
    def on_cuda(lookahead: bool) -> LLM:
        return LLM(device="cuda", dtype="float32", moe_backend=backend, expert_cache=0.4, lookahead=lookahead,
                   fill_fraction=0.5 if backend == "hybrid" else None)  # fmt: skip

    want = [o.token_ids for o in _llm("cpu", False, None).generate(PROMPTS, PARAMS)]
    off, on = on_cuda(False), on_cuda(True)
    (t_off, m_off), (t_on, m_on) = _run(off), _run(on)
    assert t_off == t_on == want
    s = on.stats()
    assert s["step_graph_replays"] > 0 and s["expert_prefetches"] > 0
    assert sum(m_on[1:]) < sum(m_off[1:]), (m_on, m_off)
    assert not bool(on.engine.setup.loaded.backend.cache.tables.locked.any())
    on.check_integrity()


def test_e2e_refuses_lookahead_on_a_replayed_trace(tmp_path) -> None:
    """A trace routes instead of the router the prediction reads: refused before any checkpoint is written."""
    from freetoken.bench.e2e import main

    with pytest.raises(SystemExit, match="hybrid\\+la: lookahead predicts from the model's router"):
        main(["--preset", "qwen3-30b-a3b", "--dir", str(tmp_path / "ck"), "--policies", "hybrid,hybrid+la",
              "--routing-trace", "bench/traces/locality-48x128x8.npy"])  # fmt: skip
    assert not (tmp_path / "ck").exists()
