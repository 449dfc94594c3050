"""``ft bench e2e``'s gpt-oss presets (``gpt-oss-20b``: MXFP4 experts as shipped; ``gpt-oss-20b-bf16``): their
synthetic checkpoints (``bench/synthetic_gpt_oss.py``) count packed bytes at the real shape, and a scaled-down one of
each loads as gpt-oss (experts banked in the preset's format, biases and the clamped activation, window layers) and
generates on the CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from freetoken import LLM, SamplingParams
from freetoken.bench.presets import PRESETS, GptOssShape, MoEShape
from freetoken.bench.synthetic_gpt_oss import write_gpt_oss
from freetoken.quant import BF16, MXFP4

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def test_the_mxfp4_preset_counts_packed_bytes() -> None:
    s, b = PRESETS["gpt-oss-20b"], PRESETS["gpt-oss-20b-bf16"]
    D = I = 2880
    assert s.fmt == MXFP4 and b.fmt == BF16 and s.gpt_oss is not None and b.gpt_oss == s.gpt_oss
    assert s.expert_bytes() == 3 * D * I // 2 + 3 * D * I // 32  # e2m1 pairs and an e8m0 byte per 32
    assert b.expert_bytes() / s.expert_bytes() > 3.7
    assert s.e2e_layers == 24 and 10e9 < s.pool_bytes(24) < 10.5e9  # the whole model's experts


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-20b-bf16"])
def test_scaled_down_checkpoint_loads_as_gpt_oss_and_generates(tmp_path, name: str) -> None:
    shape = replace(PRESETS[name], hidden=64, inter=64, experts=8, top_k=2, gpt_oss=GptOssShape(2, 1, 16, 8, 512))
    assert isinstance(shape, MoEShape)
    written = write_gpt_oss(tmp_path, shape, 3, max_positions=256, embed_std=1.0, fmt=shape.fmt)
    assert written <= sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", moe_backend="hybrid", expert_cache=0.5,
              fill_fraction=0.5)  # fmt: skip
    loaded = llm.engine.setup.loaded
    banks = loaded.banks
    assert banks is not None and banks.fmt == shape.fmt and banks.activation == "gptoss"
    assert banks.gate_up_bias is not None
    assert banks.expert_bytes == shape.expert_bytes(4 if name.endswith("bf16") else 2)  # bf16 banked float32 here
    assert [layer.attn.window for layer in loaded.model.layers] == [8, None, 8]
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    assert len(out.token_ids) == 12
    llm.check_integrity()
