"""The step graphs' logic on a CPU device, with a capture that runs the captured body under the capture checker
(``capture_check.FakeCapture``: an op a CUDA capture refuses raises): every batch bucket x sampler feature set
captures once and replays after, with no eager fallback, and gives the eager engine's tokens; a capture that fails
or runs out of memory, a batch past the buckets and a step retried alone are counted by reason and logged once, and
``/metrics`` shows them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from capture_check import CaptureBreaker, FakeCapture, cpu_step_graph_host, fake_step_graphs
from freetoken import LLM, SamplingParams
from freetoken.runner import step_graph
from freetoken.runner.step_graph import StepGraphs
from freetoken.server.metrics import ServerMetrics
from graph_cases import BUCKETS, FEATURES, PROMPTS, run_case
from tiny_models import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("step_graph_cpu")
    save_checkpoint("qwen3_moe", d, seed=1, tokenizer=True)
    return d


@pytest.fixture(autouse=True)
def _cpu_step_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_step_graph_host(monkeypatch)


def _llm(ckpt: Path, **kw: Any) -> LLM:
    kw = {"device": "cpu", "dtype": "float32", "max_running_requests": 8, "page_size": 4, "overlap_steps": True,
          **kw}  # fmt: skip
    return LLM(model=str(ckpt), **kw)


def _graphed(ckpt: Path, monkeypatch: pytest.MonkeyPatch, capture: FakeCapture | None = None, **kw: Any) -> LLM:
    """An engine whose decode steps go through the step graphs, captured by ``capture`` (default: a FakeCapture
    that puts the penalty state back after the capture's run)."""
    return fake_step_graphs(_llm(ckpt, **kw), monkeypatch, capture)


def _graphs(llm: LLM) -> StepGraphs:
    g = llm.engine.runner.graphs
    assert g is not None
    return g


def test_every_bucket_and_feature_set_replays_with_no_fallback(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graphed, eager = _graphed(ckpt, monkeypatch), _llm(ckpt)
    cases = [run_case(graphed, eager, b, f) for b in BUCKETS for f in FEATURES]
    bad = [c.row() for c in cases if not c.ok]
    assert not bad, "\n".join(bad)
    for c in cases:  # each (bucket, stages) captured on its first step, replayed after
        assert c.decode_steps >= 6 and c.replays >= c.decode_steps - 1 - (c.feature == "mixed"), c.row()
    stats = graphed.stats()
    assert stats["step_graph_eager_fallbacks"] == 0 and stats["step_graph_eager_fallback_reasons"] == {}
    assert stats["step_graph_replays"] == stats["step_graph_decode_steps"] - stats["step_graph_captures"]
    assert sorted(_graphs(graphed)._static) == list(BUCKETS)


def test_a_padded_bucket_replays_too(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3 rows in the 4-row bucket (a padding row repeats row 0; its sample, and its count in the shared penalty
    row, are dropped)."""
    graphed, eager = _graphed(ckpt, monkeypatch), _llm(ckpt)
    for f in ("penalties", "mixed"):
        c = run_case(graphed, eager, 3, f)
        assert c.ok and c.replays > 0, c.row()


def test_a_failed_capture_runs_its_steps_eagerly_counted_and_logged_once(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A capture that fails (as a host sync inside it does on CUDA) leaves that (bucket, stages) eager: every one of
    its steps is a fallback, said once; the tokens are the eager engine's; the other graphs go on."""
    why = "operation not permitted when stream is capturing"
    graphed = _graphed(ckpt, monkeypatch, FakeCapture(fail=RuntimeError(why)))
    eager = _llm(ckpt)
    with caplog.at_level(logging.WARNING, logger="freetoken.runner.step_graph"):
        c = run_case(graphed, eager, 2, "penalties")
        c2 = run_case(graphed, eager, 2, "penalties")
    assert c.same_as_eager and c2.same_as_eager
    assert c.captures == c.replays == 0 and c.fallbacks == c.decode_steps == 7
    assert c.reasons == {"capture_failed": 7} and c2.reasons == {"capture_failed": 7}
    said = [r.getMessage() for r in caplog.records if "capture_failed" in r.getMessage()]
    assert len(said) == 1 and why in said[0] and "2 rows, stages draw+penalties" in said[0], said
    # a capture that works again (another bucket) is taken: only the failed (bucket, stages) stays eager
    _graphs(graphed).capture = FakeCapture(keep=lambda: [graphed.engine.sampler.state.counts,
                                                         graphed.engine.sampler.state.seen])  # fmt: skip
    ok = run_case(graphed, eager, 1, "penalties")
    assert ok.ok and ok.captures == 1, ok.row()
    again = run_case(graphed, eager, 2, "penalties")
    assert again.reasons == {"capture_failed": 7} and again.same_as_eager


def test_a_capture_out_of_memory_is_tried_again(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_graph, "RETRY_AFTER", 3)
    calls = {"n": 0}
    graphed = _graphed(ckpt, monkeypatch)
    real = _graphs(graphed).capture

    def flaky(body: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("another program took it")
        return real(body)

    _graphs(graphed).capture = flaky
    c = run_case(graphed, _llm(ckpt), 1, "greedy", max_tokens=12)
    # step 1: eager, its capture out of memory; steps 2-4 eager (waiting); step 5 captured; 6-11 replayed
    assert c.reasons == {"capture_oom": 4} and c.captures == 1 and c.replays == 6 and c.same_as_eager, c.row()
    assert c.decode_steps == c.replays + c.captures + c.fallbacks


def test_batches_past_the_buckets_and_rows_retried_alone_are_counted(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    graphed = _graphed(ckpt, monkeypatch)
    _graphs(graphed).buckets = [1, 2]
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with caplog.at_level(logging.WARNING, logger="freetoken.runner.step_graph"):
        graphed.generate(PROMPTS[:4], sp)
        graphed.generate(PROMPTS[:4], sp)
    reasons = graphed.stats()["step_graph_eager_fallback_reasons"]
    assert reasons == {"past_buckets": 10}
    assert sum("past the largest bucket (4 rows, largest bucket 2)" in r.getMessage() for r in caplog.records) == 1
    # a step the engine computes request by request (a batched step failed) counts each decode row
    runner = graphed.engine.runner
    real, calls = runner.graphs.launch, {"n": 0}  # type: ignore[union-attr]

    def failing(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("a batched step failed")
        return real(*a, **k)

    monkeypatch.setattr(runner.graphs, "launch", failing)
    graphed.engine.overlap.enabled = False
    graphed.generate(PROMPTS[:2], sp)
    assert graphed.stats()["step_graph_eager_fallback_reasons"]["retried_alone"] == 2


def test_metrics_show_the_fallbacks_by_reason(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graphed = _graphed(ckpt, monkeypatch)
    _graphs(graphed).buckets = [1]
    graphed.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    text = ServerMetrics().render(graphed.stats(), "ready")
    assert "# TYPE freetoken_step_graph_eager_fallbacks_total counter" in text
    assert 'freetoken_step_graph_eager_fallbacks_total{reason="past_buckets"} 3' in text
    assert "freetoken_engine_step_graph_eager_fallbacks 3" in text
    plain = ServerMetrics().render(_llm(ckpt).stats(), "ready")  # no step graphs (a CPU engine): zero, no samples
    assert "freetoken_engine_step_graph_eager_fallbacks 0" in plain
    assert "freetoken_step_graph_eager_fallbacks_total{" not in plain


def test_the_checker_catches_what_broke_the_penalty_graph(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The penalty counts' old update (``index_put_`` with ``accumulate=True``) inside the captured body: the fake
    capture refuses it, so the penalised bucket's steps run eagerly, counted (older torch range-checks its indices
    with .item() there: a sync that voids a CUDA capture)."""
    from freetoken.runner.sampler import PenaltyState

    def old_update(self: PenaltyState, rows: torch.Tensor, ids: torch.Tensor) -> None:
        self.counts.index_put_((rows, ids), torch.ones_like(ids, dtype=torch.int32), accumulate=True)
        self.seen.index_put_((rows, ids), torch.ones_like(ids, dtype=torch.bool))

    new_update = PenaltyState.update
    monkeypatch.setattr(PenaltyState, "update", old_update)
    graphed = _graphed(ckpt, monkeypatch)
    c = run_case(graphed, _llm(ckpt), 4, "penalties")
    assert c.reasons == {"capture_failed": c.decode_steps} and c.same_as_eager
    state = PenaltyState(2, 8, torch.device("cpu"))
    rows, ids = torch.tensor([0, 1]), torch.tensor([3, 4])
    with pytest.raises(CaptureBreaker, match="accumulate=True"):
        FakeCapture()(lambda: (old_update(state, rows, ids), state.counts)[1])
    FakeCapture()(lambda: (new_update(state, rows, ids), state.counts)[1])  # the new one: nothing refused


@pytest.mark.parametrize("overlap", [False, True])
def test_a_one_token_prompt_chunk_is_not_a_decode_step(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """A tiny token budget gives a prompt a one-token chunk beside a decode row: every row has one token, but the
    chunk's row does not sample (its prompt goes on), so the step is neither the graphs' nor a launched one (both
    sample every row: the request got a token mid-prompt)."""
    sp = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    prompts = [PROMPTS[0][:3], PROMPTS[1]]
    graphed = _graphed(ckpt, monkeypatch, max_batched_tokens=2, overlap_steps=overlap)
    want = [r.token_ids for r in _llm(ckpt, max_batched_tokens=2, overlap_steps=False).generate(prompts, sp)]
    assert [r.token_ids for r in _llm(ckpt, max_batched_tokens=2, overlap_steps=overlap).generate(prompts, sp)] == want
    assert [r.token_ids for r in graphed.generate(prompts, sp)] == want
    s = graphed.stats()
    assert s["step_graph_replays"] > 0 and s["step_graph_eager_fallbacks"] == 0


@pytest.mark.parametrize("family", ["glm4_moe_groups", "minimax_m2"])
def test_sigmoid_routing_captures_and_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str) -> None:
    """Group-limited sigmoid routing with its correction bias (``kernels/route.route_sigmoid``) inside the step
    graph: nothing a CUDA capture refuses, and the eager engine's tokens."""
    save_checkpoint(family, tmp_path, seed=1, tokenizer=True)
    graphed, eager = _graphed(tmp_path, monkeypatch), _llm(tmp_path)
    c = run_case(graphed, eager, 2, "greedy")
    assert c.ok and c.replays > 0 and c.fallbacks == 0, c.row()
