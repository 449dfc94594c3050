"""DeepSeek sparse attention's decode step (DeepSeek-V3.2, GLM-5) inside the whole-step graph
(``runner/step_graph.py``): on a CPU through the capture checker (``capture_check.FakeCapture``: an op a CUDA capture
refuses raises). Its indexer scores every position the page table reaches and keeps the top ``index_topk`` on the
device, so its graphs come per page-table width: every batch bucket and width captures once and replays with the eager
engine's tokens, past the indexer's top-k (6 of up to 26 positions here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from capture_check import cpu_step_graph_host, fake_step_graphs
from freetoken import LLM
from freetoken.runner import graph_shapes
from graph_cases import BUCKETS, cuda_tokens_eager_and_graphed, run_case
from tiny_dsa import save_dsa_checkpoint

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")
STEPS = 20  # 6-token prompts reach 26 positions: 7 pages of 4


@pytest.fixture(scope="module", params=["deepseek_v32", "glm_moe_dsa_shared"])
def ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    d = tmp_path_factory.mktemp(f"dsa_graph_{request.param}")
    return d, save_dsa_checkpoint(request.param, d, seed=0)


def _engine(d: Path) -> LLM:
    return LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)


def test_dsa_decode_replays_the_eager_tokens_in_a_graph_per_width(ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_shapes, "FIRST_WIDTH_TOKENS", 8)  # widths of 2, 4, 8, ... pages
    d, _ = ckpt
    cpu_step_graph_host(monkeypatch)
    graphed = fake_step_graphs(_engine(d), monkeypatch)
    graphs = graphed.engine.runner.graphs
    assert graphs is not None and graphed.engine.setup.loaded.model.scans_table
    eager = _engine(d)
    cases = [run_case(graphed, eager, b, "greedy", STEPS) for b in BUCKETS]
    cases.append(run_case(graphed, eager, 3, "mixed", 12))
    assert all(c.same_as_eager and c.replays > 0 and c.fallbacks == 0 for c in cases), "\n".join(
        c.row() for c in cases
    )
    used = {b: sorted(per) for b, per in graphs._static.items()}
    assert used == {b: [2, 4, 8] for b in BUCKETS}, used


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["fused", "hybrid"])
def test_graphed_dsa_step_on_cuda(ckpt, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA (the Triton decode over the kept latents): graphed == eager, the graphs per page-table width (1 and 2
    pages of 16 tokens as the contexts grow past 16)."""
    monkeypatch.setattr(graph_shapes, "FIRST_WIDTH_TOKENS", 16)
    d, _ = ckpt
    eager, graphed = cuda_tokens_eager_and_graphed(d, backend, steps=16)
    assert eager == graphed
