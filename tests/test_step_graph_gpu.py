"""The whole decode step as one CUDA graph (runner/step_graph.py) gives the eager step's tokens, for every
backend, greedy and seeded, at bucket sizes and between them (padded rows); every batch bucket x sampler feature
set (greedy, temperature with top-p/top-k/min-p, penalties, logprobs, seeds, grammar masks, all mixed) captures once
and replays after with no eager fallback; batches past the buckets and a routing trace run too. GPU only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.bench import routing_trace
from graph_cases import BUCKETS, FEATURES, run_case
from tiny_models import save_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = [[5 + i, 40 + 3 * i, 77, 100 + i, 9, 30 + i] for i in range(5)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("step_graph")
    save_checkpoint("qwen3_moe", d, seed=1, tokenizer=True)  # (the tokenizer: grammar-constrained rows)
    return d


def _run(
    ckpt: Path, graphs: bool, backend: str, prompts: list[list[int]], params: SamplingParams, trace: Path | None = None
):  # fmt: skip
    llm = LLM(
        str(ckpt), device="cuda", dtype="float32", moe_backend=backend,
        expert_cache=None if backend == "fused" else 0.5, max_running_requests=4, cuda_graphs=graphs,
    )  # fmt: skip
    if trace is not None:
        routing_trace.install(llm, str(trace))
    out = [r.token_ids for r in llm.generate(prompts, params)]
    stats = {**llm.stats(), "per_layer": llm.engine.setup.loaded.backend.layer_counts()}
    llm.check_integrity()
    close = getattr(llm.engine.setup.loaded.backend, "close", None)
    if close is not None:
        close()
    return out, stats


@pytest.mark.parametrize("backend", ["fused", "offload", "hybrid", "cpu"])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_graphed_step_equals_eager(ckpt: Path, backend: str, n: int) -> None:
    for params in (
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, ignore_eos=True, seed=11),
        SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=5, presence_penalty=1.0, logprobs=3),
    ):
        eager, s_eager = _run(ckpt, False, backend, PROMPTS[:n], params)
        graphed, stats = _run(ckpt, True, backend, PROMPTS[:n], params)
        assert graphed == eager
        if backend != "fused":  # the per-layer counts advance in replayed steps as the totals do
            layers = stats["per_layer"]
            assert sum(layers["misses"]) == stats["expert_misses"] and sum(layers["fills"]) == stats["expert_fills"]
            assert [f + c for f, c in zip(layers["fills"], layers["cpu_runs"])] == layers["misses"]
            # the same counts as eager where the cache sees the same touches: offload (hybrid refines its split
            # from timed branches), no pad row (a pad repeats row 0's routes, renewing their LRU stamps)
            if backend == "offload" and n in BUCKETS:
                assert layers == s_eager["per_layer"]
        assert stats["step_graph_eager_fallbacks"] == 0, stats["step_graph_eager_fallback_reasons"]
        assert stats["step_graph_replays"] == stats["step_graph_decode_steps"] - stats["step_graph_captures"] > 0
        assert stats["step_graphs"] >= 1


@pytest.mark.parametrize("backend", ["fused", "offload", "hybrid", "cpu"])
def test_every_bucket_and_feature_set_replays_with_no_fallback(ckpt: Path, backend: str) -> None:
    """Buckets 1, 2, 4, 8 x every sampler feature set (``graph_cases``): no decode step falls back to eager, each
    (bucket, stages) is captured once and replayed at every later step, and the tokens are the eager engine's."""
    kw: dict[str, Any] = dict(device="cuda", dtype="float32", moe_backend=backend, max_running_requests=8,
                              expert_cache=None if backend == "fused" else 0.5)  # fmt: skip
    graphed, eager = LLM(str(ckpt), cuda_graphs=True, **kw), LLM(str(ckpt), cuda_graphs=False, **kw)
    try:
        cases = [run_case(graphed, eager, b, f) for b in BUCKETS for f in FEATURES]
    finally:
        for llm in (graphed, eager):
            close = getattr(llm.engine.setup.loaded.backend, "close", None)
            if close is not None:
                close()
    bad = [c.row() for c in cases if not c.ok]
    assert not bad, "\n".join(bad)
    assert all(c.replays > 0 for c in cases if c.decode_steps > 1)


def test_batches_past_the_buckets_run_eagerly(ckpt: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm = LLM(str(ckpt), device="cuda", dtype="float32", moe_backend="fused", max_running_requests=4)
    graphs = llm.engine.runner.graphs
    assert graphs is not None and graphs.buckets == [1, 2, 4]
    graphs.buckets = [1, 2]  # a batch of 4 is now past the buckets
    four = [r.token_ids for r in llm.generate(PROMPTS[:4], params)]
    alone = [llm.generate([p], params)[0].token_ids for p in PROMPTS[:4]]
    assert four == alone


def test_routing_trace_replays_inside_the_graph(ckpt: Path, tmp_path: Path) -> None:
    cfg = __import__("json").loads((ckpt / "config.json").read_text())
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    layers, k = cfg["num_hidden_layers"], cfg["num_experts_per_tok"]
    rng = np.random.default_rng(0)
    trace = np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(layers)]) for _ in range(64)])
    path = tmp_path / "trace.npy"
    np.save(path, np.sort(trace, axis=-1).astype(np.uint8))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    eager, _ = _run(ckpt, False, "offload", PROMPTS[:2], params, trace=path)
    graphed, _ = _run(ckpt, True, "offload", PROMPTS[:2], params, trace=path)
    assert graphed == eager


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grammar_constrained_rows_replay_from_the_graph(tmp_path: Path, temperature: float) -> None:
    """A grammar-constrained request's decode steps replay from the step graph (the allowed-token bitmask is a
    graph input) and give the eager steps' tokens; a free request beside it is unaffected."""
    d = tmp_path / "grammar"
    save_checkpoint("qwen3_moe", d, seed=0, tokenizer=True)
    grammar = 'start: "ID-" /[0-9]{3}/ ("-" ("ok" | "no"))?'
    constrained = SamplingParams(max_tokens=40, temperature=temperature, seed=1, grammar=grammar)
    free = SamplingParams(max_tokens=12, temperature=temperature, seed=2, ignore_eos=True)

    def run(graphs: bool) -> tuple[list[Any], dict[str, Any]]:
        llm = LLM(str(d), device="cuda", dtype="float32", moe_backend="fused", max_running_requests=4,
                  cuda_graphs=graphs)  # fmt: skip
        outs = llm.generate([[5, 6, 7], [5, 6, 8]], [constrained, free])
        assert outs[0].text.startswith("ID-"), outs[0].text
        return [r.token_ids for r in outs], llm.stats()

    eager, _ = run(False)
    graphed, stats = run(True)
    assert graphed == eager
    assert stats["step_graph_replays"] > 0


@pytest.mark.parametrize("backend", ["fused", "hybrid"])
def test_captures_survive_the_collection_of_an_earlier_engines_graphs(ckpt: Path, backend: str) -> None:
    """An engine dropped while a reference cycle still holds it (and its CUDA graphs) is collected whenever the cyclic
    collector runs: with the collector running at almost every allocation, not inside a capture of the next engine
    (``hardware/graph_capture.py``), whose steps and MoE layers all capture and replay."""
    import gc

    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=3)
    kw: dict[str, Any] = dict(device="cuda", dtype="float32", moe_backend=backend, max_running_requests=4,
                              expert_cache=None if backend == "fused" else 0.5)  # fmt: skip
    first = LLM(str(ckpt), **kw)
    want = [r.token_ids for r in first.generate(PROMPTS[:3], params)]
    assert first.stats()["step_graphs"] >= 1
    cycle: list[Any] = [first]
    cycle.append(cycle)  # only the cyclic collector frees it now
    del first, cycle
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        second = LLM(str(ckpt), **kw)
        got = [r.token_ids for r in second.generate(PROMPTS[:3], params)]
        stats = second.stats()
    finally:
        gc.set_threshold(*threshold)
    assert got == want
    assert stats["step_graph_eager_fallbacks"] == 0, stats["step_graph_eager_fallback_reasons"]
    assert stats["step_graph_replays"] > 0 and stats.get("moe_graph_failures", 0) == 0
