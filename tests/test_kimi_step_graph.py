"""Kimi-Linear's decode step inside the whole-step graph (``runner/step_graph.py``): the KDA step from its state slots
(``kernels/kda.kda_step``, torch ops of fixed shapes) beside the NoPE latent attention's absorbed decode. On a CPU
through the capture checker, graphed == eager tokens; on CUDA (marked ``gpu``) the real capture, graphed == eager ==
transformers' greedy tokens (float32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capture_check import cpu_step_graph_host, fake_step_graphs
from freetoken import LLM
from graph_cases import BUCKETS, GRAPH_PROMPTS, cuda_tokens_eager_and_graphed, run_case
from reference import ROUTER_MARGIN, reference_greedy
from tiny_kimi import save_kimi_checkpoint
from tiny_mla import sigmoid_margin

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("kimi_graph")
    return d, save_kimi_checkpoint(d, seed=0)


def _cpu_graphed(d: Path, monkeypatch: pytest.MonkeyPatch) -> LLM:
    """A CPU engine whose decode steps go through the step graphs under a fake capture (``capture_check``); its run
    of the body starts from the state slots the step's eager run advanced, so state slots and KV rows are put back."""
    cpu_step_graph_host(monkeypatch)
    llm = LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)
    assert llm.engine.states is not None
    return fake_step_graphs(llm, monkeypatch, recurrent=True)


def test_kimi_decode_is_capturable_and_replays_the_eager_tokens(ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU through the capture checker (``capture_check.FakeCapture``: an op a CUDA capture refuses raises):
    every batch bucket captures once and replays with the eager engine's tokens, the steps that take a state
    checkpoint too (a copy behind the replay)."""
    d, _ = ckpt
    graphed = _cpu_graphed(d, monkeypatch)
    eager = LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)
    cases = [run_case(graphed, eager, b, "greedy") for b in BUCKETS]
    assert all(c.same_as_eager and c.replays > 0 for c in cases), "\n".join(c.row() for c in cases)
    assert all(not c.reasons for c in cases), "\n".join(c.row() for c in cases)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["fused", "hybrid"])
def test_graphed_kimi_step_on_cuda(ckpt, backend: str) -> None:
    d, model = ckpt
    eager, graphed = cuda_tokens_eager_and_graphed(d, backend)
    assert eager == graphed
    refs = [reference_greedy(model, p, 12) for p in GRAPH_PROMPTS]
    assert min(r.min_logit_margin for r in refs) > 1e-2  # wide margins: no near tie (the GPU's float32 GEMMs)
    assert min(sigmoid_margin(model, r.prompt + r.tokens[:-1]) for r in refs) > ROUTER_MARGIN
    assert graphed == [r.tokens for r in refs]


def test_a_recurrent_model_has_a_graph_per_batch_size_and_no_pad_row(ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pad row would share row 0's state slot, which the in-place state kernels update while the pad reads it: on
    CUDA the pad then wrote other K/V than row 0 into row 0's KV slot (``runner/step_graph.py``). A model with state
    slots has a graph for every batch size: 3 rows replay their own 3-row graph, the eager tokens."""
    d, _ = ckpt
    graphed = _cpu_graphed(d, monkeypatch)
    eager = LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)
    graphs = graphed.engine.runner.graphs
    assert graphs is not None and graphs.buckets == list(range(1, 9))
    c = run_case(graphed, eager, 3, "greedy")
    assert c.same_as_eager and c.replays > 0, c.row()
    assert sorted(graphs._static) == [3]
