"""``ft bench e2e``'s frontier presets (``glm-4.7``, ``minimax-m2``, ``deepseek-v3``, ``deepseek-v3.2``, ``glm-5``):
their synthetic checkpoints (``bench/synthetic_frontier.py``) at the real per-layer shapes fit the GPU box's 40 GB at
the preset's layer count, and a scaled-down one of each family, FP8 as shipped, loads (experts banked packed) and
generates on the CPU (DeepSeek-V3's latent attention, GLM-5's sparse attention with a top-3 indexer)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.bench.presets import PRESETS, FrontierShape, MLAShape, MoEShape
from freetoken.bench.synthetic_frontier import frontier_bytes, write_frontier
from freetoken.quant import FP8_BLOCK_128

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


FRONTIER = ["glm-4.7", "minimax-m2", "deepseek-v3", "deepseek-v3.2", "glm-5"]


@pytest.mark.parametrize("name", FRONTIER)
def test_real_shapes_fit_the_gpu_box(name):
    s = PRESETS[name]
    assert s.frontier is not None and s.fmt == FP8_BLOCK_128
    size = frontier_bytes(s, s.e2e_layers)
    assert 30e9 < size <= 40e9  # as many layers as fit, the first dense layers counted
    assert frontier_bytes(s, s.e2e_layers + 1) > 40e9


TINY = {
    "glm-4.7": FrontierShape("glm4_moe", 2, 1, 128, 0.5, dense_layers=1, dense_inter=256, shared_experts=1, scale=2.5),
    "minimax-m2": FrontierShape("minimax_m2", 2, 1, 128, 0.5),
    "deepseek-v3": FrontierShape("deepseek_v3", 2, 2, 64, 1.0, dense_layers=1, dense_inter=256, shared_experts=1,
                                 n_group=2, topk_group=1, scale=2.5, rope_theta=1e4,
                                 mla=MLAShape(q_lora=128, nope_dim=64, v_dim=128, kv_lora=128)),  # fmt: skip
    "glm-5": FrontierShape("glm_moe_dsa", 2, 2, 64, 1.0, dense_layers=1, dense_inter=256, shared_experts=1,
                           mla=MLAShape(q_lora=128, nope_dim=64, v_dim=128, kv_lora=128, index_heads=2,
                                        index_topk=3)),  # fmt: skip
}


@pytest.mark.parametrize("name", list(TINY))
def test_scaled_down_checkpoint_loads_packed_and_generates(tmp_path, name):
    shape = replace(PRESETS[name], hidden=256, inter=128, experts=8, top_k=2, frontier=TINY[name])
    assert isinstance(shape, MoEShape)
    written = write_frontier(tmp_path, shape, 3, vocab=512, max_positions=256, embed_std=1.0, fmt=shape.fmt)
    files = sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    assert written == frontier_bytes(shape, 3, vocab=512) and written <= files
    llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", moe_backend="hybrid", expert_cache=0.5,
              fill_fraction=0.5)  # fmt: skip
    banks = llm.engine.setup.loaded.banks
    assert banks is not None and banks.gate_up.dtype == torch.float8_e4m3fn
    assert len(llm.engine.setup.loaded.model.layers) == 3
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    llm.check_integrity()
