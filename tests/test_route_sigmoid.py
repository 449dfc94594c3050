"""Sigmoid routing with a correction bias and group limits (``kernels/route.py``) against transformers' own routers
(GLM-4.5's ``Glm4MoeTopkRouter``, the same as DeepSeek-V3's; MiniMax-M2's ``MiniMaxM2TopKRouter``), and its checks
at load (``models/routing.py``)."""

from __future__ import annotations

import json

import pytest
import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.kernels.route import SigmoidRouting, route_sigmoid, route_sigmoid_reference
from freetoken.layers.moe import MoELayer
from freetoken.models.base import Family
from freetoken.models.routing import sigmoid_routing
from reference import ROUTER_MARGIN, sigmoid_router_margin

E, D, T = 16, 32, 64
# (n_group, topk_group, top_k, norm_topk, scale)
CASES = [(1, 1, 4, True, 1.0), (4, 2, 4, True, 2.5), (4, 1, 2, False, 1.0), (8, 3, 6, True, 1.8), (4, 4, 4, True, 1.0)]


def _glm_router(n_group: int, topk_group: int, top_k: int, norm: bool, scale: float, seed: int):
    import transformers as tf

    cfg = tf.Glm4MoeConfig(hidden_size=D, n_routed_experts=E, num_experts_per_tok=top_k, n_group=n_group,
                           topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=scale)  # fmt: skip
    router = tf.models.glm4_moe.modeling_glm4_moe.Glm4MoeTopkRouter(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, D, generator=g) * 0.3)
        router.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.2)
    return router, torch.randn(T, D, generator=g)


def _same_routing(ids: torch.Tensor, w: torch.Tensor, ref_ids: torch.Tensor, ref_w: torch.Tensor) -> None:
    order, ref_order = ids.argsort(dim=-1), ref_ids.argsort(dim=-1)
    assert torch.equal(ids.gather(1, order), ref_ids.gather(1, ref_order))
    torch.testing.assert_close(w.gather(1, order), ref_w.float().gather(1, ref_order), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", CASES)
def test_group_limited_routing_matches_transformers(case):
    n_group, topk_group, top_k, norm, scale = case
    router, x = _glm_router(n_group, topk_group, top_k, norm, scale, seed=sum(case[:3]))
    with torch.no_grad():
        logits, ref_w, ref_ids = router(x)
    bias = router.e_score_correction_bias
    assert sigmoid_router_margin(logits, bias, top_k, n_group, topk_group) > ROUTER_MARGIN  # near-tie rule
    spec = SigmoidRouting(top_k, norm, n_group, topk_group, scale)
    ids, w = route_sigmoid(x, router.weight.detach(), bias, spec)
    _same_routing(ids, w, ref_ids, ref_w)
    assert ids.dtype == torch.int64 and w.dtype == torch.float32
    if topk_group < n_group:  # the group limit changes choices here: the test would see it missing
        free = route_sigmoid_reference(logits, bias, SigmoidRouting(top_k, norm, 1, 1, scale))[0]
        assert not torch.equal(free.sort(dim=-1).values, ids.sort(dim=-1).values)


def test_bias_only_chooses():
    """The correction bias moves the choice but never the weights: they are the unbiased sigmoid scores."""
    router, x = _glm_router(1, 1, 4, False, 1.0, seed=3)
    logits = torch.nn.functional.linear(x, router.weight.detach())
    bias = torch.zeros(E)
    bias[5] = 10.0  # expert 5 always chosen
    ids, w = route_sigmoid_reference(logits, bias, SigmoidRouting(4, False))
    assert bool((ids == 5).any(dim=-1).all())
    torch.testing.assert_close(w, logits.sigmoid().gather(1, ids))


def test_minimax_m2_routing_matches_transformers():
    import transformers as tf

    cfg = tf.MiniMaxM2Config(hidden_size=D, num_local_experts=E, num_experts_per_tok=4, head_dim=8)
    block = tf.models.minimax_m2.modeling_minimax_m2.MiniMaxM2SparseMoeBlock(cfg)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        block.gate.weight.copy_(torch.randn(E, D, generator=g) * 0.3)
        block.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.2)
        x = torch.randn(T, D, generator=g)
        logits, ref_w, ref_ids = block.gate(x, block.e_score_correction_bias)
    assert sigmoid_router_margin(logits, block.e_score_correction_bias, 4) > ROUTER_MARGIN
    ids, w = route_sigmoid(x, block.gate.weight.detach(), block.e_score_correction_bias, SigmoidRouting(4, True))
    _same_routing(ids, w, ref_ids, ref_w)


class _Collect:
    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        self.calls.append((ids, w))
        return torch.zeros_like(x)


def test_moe_layer_routes_by_sigmoid():
    router, x = _glm_router(4, 2, 4, True, 2.5, seed=11)
    spec = SigmoidRouting(4, True, 4, 2, 2.5)
    backend = _Collect()
    layer = MoELayer(router.weight.detach(), 4, True, 0, backend, sigmoid=spec,  # type: ignore[arg-type]
                     bias=router.e_score_correction_bias)  # fmt: skip
    layer.forward(x)
    with torch.no_grad():
        _, ref_w, ref_ids = router(x)
    _same_routing(*backend.calls[0], ref_ids, ref_w)


BASE = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 2, "n_routed_experts": 16, "num_experts_per_tok": 4,
        "norm_topk_prob": True, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5}  # fmt: skip
SIGMOID = Family(architectures=("Glm4MoeForCausalLM",), routing="sigmoid")


def _routing(tmp_path, **change):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **change}))
    return sigmoid_routing(load_hf_config(tmp_path), SIGMOID)


def test_routing_read_from_config(tmp_path):
    assert _routing(tmp_path) == SigmoidRouting(4, True, 4, 2, 2.5)


@pytest.mark.parametrize(
    "change, field",
    [({"topk_group": 5}, "topk_group"), ({"topk_group": 0}, "topk_group"), ({"n_group": 3}, "n_group"),
     ({"n_group": 16, "topk_group": 2}, "n_group"), ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
     ({"routed_scaling_factor": -1.0}, "routed_scaling_factor"), ({"scoring_func": "softmax"}, "scoring_func"),
     ({"n_group": "4"}, "n_group")],
)  # fmt: skip
def test_bad_routing_refused_naming_the_field(tmp_path, change, field):
    with pytest.raises(CheckpointError, match=field):
        _routing(tmp_path, **change)
