"""A fake FP8-block Qwen3-MoE checkpoint (random weights rounded to e4m3 with valid 128x128 scales): our dequantised
weights equal transformers' own (``FineGrainedFP8Config(dequantize=True)``), the routed experts stay packed in the
pool, and greedy tokens of every backend equal transformers' dequantised model (CPU, float32, the near-tie rule of
DESIGN §8). The same on CUDA (gpu-marked)."""

from __future__ import annotations

import pytest
import torch

from devices import DEVICES
from freetoken import LLM, SamplingParams
from freetoken.config import EngineConfig
from freetoken.loader.model_setup import setup_model
from freetoken.quant import FP8_BLOCK_128
from reference import LOGIT_MARGIN, ROUTER_MARGIN, assert_close_logits, reference_greedy
from tiny_models import load_fp8_reference, save_fp8_checkpoint

pytest.importorskip("accelerate")  # transformers' FP8 loading needs it (a test extra)

SEED = 5  # picked: no near ties (asserted in the fixture)
STEPS = 24
PROMPT_LENGTHS = (5, 13)
BACKENDS = ("fused", "offload", "cpu", "hybrid")


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("fp8")
    save_fp8_checkpoint(d, seed=SEED)
    ref = load_fp8_reference(d)
    g = torch.Generator().manual_seed(1000 + SEED)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    runs = [reference_greedy(ref, p, STEPS, top_k=2) for p in prompts]
    for r in runs:  # the near-tie rule: this seed must be free of ties, else pick another
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        assert r.min_router_margin > ROUTER_MARGIN, f"seed has a router near-tie ({r.min_router_margin:.2g})"
    return d, ref, prompts, runs


def test_dequantised_weights_equal_transformers(fp8_ckpt) -> None:
    d, ref, _, _ = fp8_ckpt
    setup = setup_model(EngineConfig(model=str(d), device="cpu", dtype="float32", moe_backend="cpu"))
    loaded = setup.loaded
    banks = loaded.banks
    assert banks is not None and banks.fmt == FP8_BLOCK_128
    assert banks.gate_up.dtype == torch.float8_e4m3fn and banks.down.dtype == torch.float8_e4m3fn  # stay packed
    assert banks.expert_bytes == 3 * 128 * 128 + (2 + 1) * 4  # packed bytes and the 3 block scales
    E = banks.num_experts
    for li, layer in enumerate((0, 2)):  # the MoE layers
        experts = ref.model.layers[layer].mlp.experts
        gu, dn = banks.dequantized(slice(li * E, (li + 1) * E), torch.float32)
        assert torch.equal(gu, experts.gate_up_proj.detach())
        assert torch.equal(dn, experts.down_proj.detach())
    for i, ours in enumerate(loaded.model.layers):
        theirs = ref.model.layers[i].self_attn
        for name in ("q", "k", "v", "o"):  # q and o were fp8 (dequantised at load), k and v float
            assert torch.equal(getattr(ours.attn.w, name), getattr(theirs, f"{name}_proj").weight.detach())
    dense = ref.model.layers[1].mlp
    assert torch.equal(loaded.model.layers[1].ffn.gate, dense.gate_proj.weight.detach())
    assert torch.equal(loaded.model.layers[1].ffn.down, dense.down_proj.weight.detach())
    setup.loaded.backend.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_greedy_tokens_equal_transformers(fp8_ckpt, backend: str, device: str) -> None:
    d, _, prompts, runs = fp8_ckpt
    fill = 0.5 if backend == "hybrid" else None
    llm = LLM(model=str(d), device=device, dtype="float32", moe_backend=backend, expert_cache=0.5, fill_fraction=fill)
    for r in runs:
        assert_close_logits(llm.engine.score(r.prompt).cpu(), r.prompt_logits)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    for out, r in zip(outs, runs):
        assert out.token_ids == r.tokens
    llm.check_integrity()
    stats = llm.stats()
    if backend in ("offload", "hybrid"):
        assert stats["expert_fills"] > 0
    if backend in ("cpu", "hybrid"):
        assert stats["expert_cpu_runs"] > 0
