"""Overlapped decode steps on CUDA through the step graphs (engine/overlap.py): the serial engine's outputs, fp32
exactly (the CPU file's checks on the GPU), bf16 under the near-tie rule. GPU only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from freetoken import SamplingParams
from test_overlap import PROMPTS, _llm, _one, check_aborts, check_mixed, check_prefix_reuse
from tiny_models import save_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = {"device": "cuda", "moe_backend": "fused"}
BF16_MARGIN = 0.05  # top-1/top-2 logprob gap under which bf16 steps of other batch shapes may pick either


@pytest.fixture(autouse=True)
def _check_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FREETOKEN_DEBUG", "1")


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_5_moe"])
def ckpt(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    d = tmp_path_factory.mktemp(f"overlap_gpu_{request.param}")
    save_checkpoint(request.param, d, seed=3, tokenizer=True)
    return d


def test_overlap_gives_the_serial_steps_through_graphs(ckpt: Path) -> None:
    stats = check_mixed(ckpt, **CUDA)
    assert stats["step_graph_replays"] > 0


@pytest.mark.parametrize("abort_step", [3, 6])
def test_aborts_mid_stream_on_cuda(ckpt: Path, abort_step: int) -> None:
    check_aborts(ckpt, abort_step, **CUDA)


@pytest.mark.parametrize("stop_at", [5, 8])
def test_prefix_reuse_after_overlap_on_cuda(ckpt: Path, stop_at: int) -> None:
    check_prefix_reuse(ckpt, stop_at, **CUDA)


def test_bf16_batch4_under_the_near_tie_rule(ckpt: Path) -> None:
    """bf16, 4 greedy rows: each row's tokens equal the serial ones up to its first near tie of the serial run."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)

    def run(overlap: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        llm = _llm(ckpt, overlap, **CUDA, dtype="bfloat16")
        outs = [_one(llm, f"r{i}", p, params) for i, p in enumerate(PROMPTS[:1])]  # batch 1 first (graph warm)
        eng = llm.engine
        for i, p in enumerate(PROMPTS[:4]):
            eng.add_request(f"b{i}", p, params)
        got: dict[str, dict[str, Any]] = {f"b{i}": {"tokens": [], "logprobs": []} for i in range(4)}
        while eng.has_unfinished():
            for o in eng.step():
                got[o.request_id]["tokens"] += o.new_token_ids
                got[o.request_id]["logprobs"] += o.logprobs or []
        return outs + list(got.values()), eng.stats()

    serial, _ = run(False)
    overlapped, stats = run(True)
    assert stats["steps_launched_ahead"] > 20 and stats["step_graph_replays"] > 0
    for s, o in zip(serial, overlapped, strict=True):
        for k, (t, lp) in enumerate(zip(s["tokens"], s["logprobs"], strict=True)):
            top = lp[2]
            if len(top) > 1 and top[0][1] - top[1][1] < BF16_MARGIN:
                break  # a near tie: the rest may differ
            assert o["tokens"][k] == t, f"token {k} differs away from a near tie"
