"""Kimi-Linear's decode step inside the whole-step graph (``runner/step_graph.py``): the KDA step from its state slots
(``kernels/kda.kda_step``, torch ops of fixed shapes) beside the NoPE latent attention's absorbed decode. On a CPU
through the capture checker, graphed == eager tokens; on CUDA (marked ``gpu``) the real capture, graphed == eager ==
transformers' greedy tokens (float32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from capture_check import FakeCapture
from freetoken import LLM, SamplingParams
from freetoken.layers.rope import Rotary
from freetoken.runner.step_graph import StepGraphs
from graph_cases import BUCKETS, run_case
from reference import ROUTER_MARGIN, reference_greedy
from tiny_kimi import save_kimi_checkpoint
from tiny_mla import sigmoid_margin

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("kimi_graph")
    return d, save_kimi_checkpoint(d, seed=0)


def _cpu_graphed(d: Path, monkeypatch: pytest.MonkeyPatch) -> LLM:
    """A CPU engine whose decode steps go through the step graphs under a fake capture (the per-step lookups keyed
    on the step's tensors made again at every body run, as on CUDA). The fake capture runs the body where a CUDA one
    records it only: that run starts from the state slots the step's eager run advanced, so the KV rows it writes
    differ too; both are put back after it (``keep``)."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    body, tables = StepGraphs._body, Rotary._tables

    def fresh_body(self: StepGraphs, st: Any, f: Any) -> torch.Tensor:
        st.batch.decode.gathered.clear()
        return body(self, st, f)

    def fresh_tables(self: Rotary, positions: torch.Tensor, dtype: torch.dtype) -> Any:
        self._last = None
        return tables(self, positions, dtype)

    monkeypatch.setattr(StepGraphs, "_body", fresh_body)
    monkeypatch.setattr(Rotary, "_tables", fresh_tables)
    llm = LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)
    eng = llm.engine
    backend = eng.setup.loaded.backend
    monkeypatch.setattr(backend, "step_capturable", lambda tokens, top_k: True)
    for hook in ("begin_step_capture", "end_step_capture", "before_step_replay"):
        monkeypatch.setattr(backend, hook, lambda *a: None)
    state, pools, kv = eng.sampler.state, eng.states, eng.kv
    assert pools is not None

    def kept() -> list[torch.Tensor]:
        return [state.counts, state.seen, *pools.tensors, *kv.k, *kv.v]

    rows, pages = eng.config.max_running_requests, eng.kv.pages_for(eng.max_model_len)
    eng.runner.graphs = StepGraphs(eng.setup.loaded.model, eng.kv, backend, eng.sampler, rows, pages, eng.hf.top_k,
                                   capture=FakeCapture(keep=kept))  # fmt: skip
    return llm


def test_kimi_decode_is_capturable_and_replays_the_eager_tokens(ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU through the capture checker (``capture_check.FakeCapture``: an op a CUDA capture refuses raises):
    every batch bucket captures once and replays with the eager engine's tokens; only the steps that take a state
    checkpoint run eagerly (per sequence, by design)."""
    d, _ = ckpt
    graphed = _cpu_graphed(d, monkeypatch)
    eager = LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)
    cases = [run_case(graphed, eager, b, "greedy") for b in BUCKETS]
    assert all(c.same_as_eager and c.replays > 0 for c in cases), "\n".join(c.row() for c in cases)
    assert all(set(c.reasons) <= {"state_checkpoint"} for c in cases), "\n".join(c.row() for c in cases)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["fused", "hybrid"])
def test_graphed_kimi_step_on_cuda(ckpt, backend: str) -> None:
    d, model = ckpt
    prompts = [[5, 40, 77, 100, 9, 30], [7, 44, 70, 102, 9, 31, 8, 300]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = []
    for graphs in (False, True):
        cache = None if backend == "fused" else 0.5
        llm = LLM(str(d), device="cuda", dtype="float32", moe_backend=backend, expert_cache=cache,
                  max_running_requests=4, cuda_graphs=graphs)  # fmt: skip
        outs.append([r.token_ids for r in llm.generate(prompts, params)])
        if graphs:
            assert llm.stats()["step_graph_replays"] > 0
    assert outs[0] == outs[1]
    refs = [reference_greedy(model, p, 12) for p in prompts]
    assert min(r.min_logit_margin for r in refs) > 1e-2  # wide margins: no near tie (the GPU's float32 GEMMs)
    assert min(sigmoid_margin(model, r.prompt + r.tokens[:-1]) for r in refs) > ROUTER_MARGIN
    assert outs[1] == [r.tokens for r in refs]
