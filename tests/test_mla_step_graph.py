"""The MLA decode step inside the whole-step graph (``runner/step_graph.py``): on a CPU through the capture checker
(``capture_check.FakeCapture``: an op a CUDA capture refuses raises), every batch bucket captures once and replays
with the eager engine's tokens; on CUDA the real capture with the Triton absorbed decode, graphed == eager and ==
transformers' greedy tokens (float32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from capture_check import cpu_step_graph_host, fake_step_graphs
from freetoken import LLM
from graph_cases import BUCKETS, GRAPH_PROMPTS, cuda_tokens_eager_and_graphed, run_case
from reference import reference_greedy
from tiny_mla import save_mla_checkpoint, sigmoid_margin

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    d = tmp_path_factory.mktemp("mla_graph")
    return d, save_mla_checkpoint("deepseek_v3", d, seed=0)


def _cpu_graphed(d: Path, monkeypatch: pytest.MonkeyPatch) -> LLM:
    """A CPU engine whose decode steps go through the step graphs under a fake capture (``capture_check``)."""
    cpu_step_graph_host(monkeypatch)
    llm = LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)
    return fake_step_graphs(llm, monkeypatch)


def test_mla_decode_is_capturable_and_replays_the_eager_tokens(ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    d, _ = ckpt
    graphed = _cpu_graphed(d, monkeypatch)
    eager = LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)
    cases = [run_case(graphed, eager, b, f) for b in BUCKETS for f in ("greedy", "sample")]
    assert all(c.ok and c.replays > 0 for c in cases), "\n".join(c.row() for c in cases)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["fused", "hybrid"])
def test_graphed_mla_step_on_cuda(ckpt, backend: str) -> None:
    d, model = ckpt
    eager, graphed = cuda_tokens_eager_and_graphed(d, backend)
    assert eager == graphed
    refs = [reference_greedy(model, p, 12) for p in GRAPH_PROMPTS]
    assert (
        min(r.min_logit_margin for r in refs) > 1e-2
        and min(sigmoid_margin(model, r.prompt + r.tokens[:-1]) for r in refs) > 1e-2
    )  # wide margins: no near tie
    assert graphed == [r.tokens for r in refs]
