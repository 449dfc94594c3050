"""DeepSeek-V4's decode step inside the whole-step graph (``runner/step_graph.py``): its attention in fixed-shape torch
ops (``layers/v4_decode.py``: ring rows at p % W, the closing window's entry written on the device, every entry the
page table reaches masked by position, CSA's top-k over them) beside the residual streams and the hash-routed MoE. On a
CPU through the capture checker (``capture_check.FakeCapture``: an op a CUDA capture refuses raises), graphed == eager
tokens past the window, past several compressed windows and past the indexer's top-k; on CUDA (marked ``gpu``) the
real capture, graphed == eager == transformers' greedy tokens (float32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capture_check import cpu_step_graph_host, fake_step_graphs
from freetoken import LLM
from freetoken.runner import graph_shapes
from graph_cases import BUCKETS, GRAPH_PROMPTS, cuda_tokens_eager_and_graphed, run_case
from reference import INDEX_MARGIN, LOGIT_MARGIN, ROUTER_MARGIN, margins, reference_greedy
from tiny_dsv4 import save_dsv4_checkpoint

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")
STEPS = 20  # 6-token prompts reach 26 positions: 3 windows of 8, 6 CSA entries (3 kept), 3 HCA entries


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("dsv4_graph")
    return d, save_dsv4_checkpoint(d, seed=0)


def _engine(d: Path) -> LLM:
    return LLM(model=str(d), device="cpu", dtype="float32", max_running_requests=8, page_size=4)


def _cpu_graphed(d: Path, monkeypatch: pytest.MonkeyPatch) -> LLM:
    """A CPU engine whose decode steps go through the step graphs under a fake capture; its run of the body starts
    from the rings the step's eager run advanced, so the state slots and KV rows are put back after it."""
    cpu_step_graph_host(monkeypatch)
    llm = _engine(d)
    assert llm.engine.states is not None and llm.engine.setup.loaded.model.step_capturable
    return fake_step_graphs(llm, monkeypatch, recurrent=True)


def test_dsv4_decode_is_capturable_and_replays_the_eager_tokens(ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch size captures once and replays with the eager engine's tokens, the steps that take a state
    checkpoint too (a copy behind the replay). The graphed engine's entry rows and rings start as NaN: rows of
    positions a sequence has not written (pages past its own, ring rows below position 0) never reach the output."""
    d, _ = ckpt
    graphed = _cpu_graphed(d, monkeypatch)
    kv, states = graphed.engine.kv, graphed.engine.states
    assert states is not None
    for t in (*kv.e, states.flat):
        t.fill_(float("nan"))
    eager = _engine(d)
    cases = [run_case(graphed, eager, b, "greedy", STEPS) for b in BUCKETS]
    assert all(c.same_as_eager and c.replays > 0 for c in cases), "\n".join(c.row() for c in cases)
    assert all(not c.reasons for c in cases), "\n".join(c.row() for c in cases)
    graphs = graphed.engine.runner.graphs
    assert graphs is not None and graphs.buckets == list(range(1, 9))  # state slots: a graph per size, no pad row


def test_dsv4_sampled_rows_replay_the_eager_tokens(ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded sampling with penalties and a mix of sampler stages over 3 rows: the graph's tokens are the eager
    engine's."""
    d, _ = ckpt
    graphed, eager = _cpu_graphed(d, monkeypatch), _engine(d)
    for feature in ("penalties", "mixed"):
        c = run_case(graphed, eager, 3, feature, 12)
        assert c.same_as_eager and c.replays > 0, c.row()
        assert not c.reasons, c.row()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["fused", "hybrid"])
def test_graphed_dsv4_step_on_cuda(ckpt, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Graphed == eager == transformers on CUDA, the graphs per page-table width (1 and 2 pages of 16 here)."""
    monkeypatch.setattr(graph_shapes, "FIRST_WIDTH_TOKENS", 16)
    d, model = ckpt
    eager, graphed = cuda_tokens_eager_and_graphed(d, backend)
    assert eager == graphed
    refs = [reference_greedy(model, p, 12) for p in GRAPH_PROMPTS]
    assert min(r.min_logit_margin for r in refs) > LOGIT_MARGIN  # no near tie (the GPU's float32 GEMMs)
    for r in refs:
        router, index = margins(model, r.prompt + r.tokens)
        assert router > ROUTER_MARGIN and index > INDEX_MARGIN
    assert graphed == [r.tokens for r in refs]


def test_dsv4_graphs_come_per_page_table_width(ckpt, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step that reads every entry its page table reaches runs in the narrowest width holding its longest
    page table (here 2, 4 and 8 pages as the contexts grow to 26 tokens), not at ``max_model_len``'s: the same tokens
    as eager, each width captured once per batch size."""
    monkeypatch.setattr(graph_shapes, "FIRST_WIDTH_TOKENS", 8)  # 2 pages of 4 tokens
    d, _ = ckpt
    graphed = _cpu_graphed(d, monkeypatch)
    graphs = graphed.engine.runner.graphs
    assert graphs is not None and graphed.engine.setup.loaded.model.scans_table
    assert graphs.widths == [2, 4, 8, 16, 32, 64, graphs.max_pages]
    eager = _engine(d)
    cases = [run_case(graphed, eager, b, "greedy", STEPS) for b in (1, 3)]
    assert all(c.same_as_eager and c.replays > 0 for c in cases), "\n".join(c.row() for c in cases)
    assert all(not c.reasons for c in cases), "\n".join(c.row() for c in cases)
    used = {b: sorted(per) for b, per in graphs._static.items()}
    assert used == {1: [2, 4, 8], 3: [2, 4, 8]}, used  # 6 prompt tokens + 20: pages 2, then 3-4, then 5-7
