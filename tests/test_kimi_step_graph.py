"""Kimi-Linear's decode step inside the whole-step graph (``runner/step_graph.py``) on CUDA (marked ``gpu``): the KDA
step from its state slots (``kernels/kda.kda_step``, torch ops with fixed shapes) beside the NoPE latent attention's
absorbed decode; graphed == eager == transformers' greedy tokens (float32). (The CPU capture checker's replays of
state-pool models differ from the eager tokens for Qwen3.5-MoE as for Kimi-Linear: a harness question left open.)"""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from reference import ROUTER_MARGIN, reference_greedy
from tiny_kimi import save_kimi_checkpoint
from tiny_mla import sigmoid_margin

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("kimi_graph")
    return d, save_kimi_checkpoint(d, seed=0)


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
