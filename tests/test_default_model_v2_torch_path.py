"""v2 training's torch path (fla_gradcheck.unbind_fla): transformers' chunked gated delta rule with a chunk size
chosen per sequence length gives the default chunk's outputs and gradients, and the model's layers call it."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as qwen35  # noqa: E402


@pytest.fixture(scope="module")
def gradcheck():  # type: ignore[no-untyped-def]
    from training.default_model_v2 import fla_gradcheck

    return fla_gradcheck


def test_scan_chunk_bounds_the_scan(gradcheck) -> None:  # type: ignore[no-untyped-def]
    assert gradcheck.scan_chunk(300) == 64
    assert gradcheck.scan_chunk(2048) == 64
    assert gradcheck.scan_chunk(2049) == 128
    assert gradcheck.scan_chunk(8192) == 256
    assert gradcheck.scan_chunk(60_991) == 512
    assert gradcheck.scan_chunk(10**6) == gradcheck.MAX_CHUNK


@pytest.mark.parametrize("tokens", [300, 1100])
def test_larger_chunks_same_rule(gradcheck, tokens: int) -> None:  # type: ignore[no-untyped-def]
    fn = inspect.unwrap(qwen35.torch_chunk_gated_delta_rule)
    g = torch.Generator().manual_seed(tokens)
    h, dk, dv = 2, 32, 16
    base = [torch.randn(1, tokens, h, d, generator=g) for d in (dk, dk, dv)]
    base += [F.logsigmoid(torch.randn(1, tokens, h, generator=g) + 3), torch.rand(1, tokens, h, generator=g)]
    weight = torch.randn(1, tokens, h, dv, generator=g)
    results = []
    for chunk in (64, 256):
        xs = [x.clone().requires_grad_() for x in base]
        out, _ = fn(*xs[:3], g=xs[3], beta=xs[4], chunk_size=chunk, use_qk_l2norm_in_kernel=True)
        (out * weight).sum().backward()
        results.append((out.detach(), [x.grad for x in xs]))
    (o64, g64), (o256, g256) = results
    assert torch.allclose(o256, o64, rtol=1e-4, atol=1e-5)
    for a, b in zip(g256, g64):
        assert float((a - b).norm() / b.norm()) < 1e-4


def test_unbind_binds_the_scan_chunk(gradcheck, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    real = inspect.unwrap(qwen35.torch_chunk_gated_delta_rule)

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["chunk_size"])
        return real(*args, **kwargs)

    # what transformers does when fla imports: the module's name is a wrapper around its torch function
    monkeypatch.setattr(qwen35, "torch_chunk_gated_delta_rule", gradcheck.with_scan_chunk(spy))
    cfg = qwen35.Qwen3_5MoeTextConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, max_position_embeddings=20000)
    model = qwen35.Qwen3_5MoeForCausalLM(cfg)
    assert gradcheck.unbind_fla(model) >= 1
    assert inspect.unwrap(qwen35.torch_chunk_gated_delta_rule) is spy
    ids = torch.randint(0, 64, (1, 2100))
    model(input_ids=ids).logits.sum().backward()
    assert seen == [128]
