"""Our engine against transformers' forward on tiny random checkpoints of every supported family (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from devices import DEVICES
from freetoken import LLM, SamplingParams
from freetoken.kernels.linear import BF16_COPIES
from reference import LOGIT_MARGIN, ROUTER_MARGIN, assert_close_logits, reference_greedy
from tiny_models import FAMILIES, MOE_FAMILIES, make_model, save_checkpoint

PROMPT_LENGTHS = (5, 13, 29)
STEPS = 32
# Seeds picked so the reference has no near ties (asserted below, DESIGN §8).
SEEDS = {"qwen3_moe": 1, "qwen2_moe": 1, "mixtral": 1, "olmoe": 2, "qwen3": 0, "llama": 0}


def _prompts(seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1000 + seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def _refs(model, family: str, prompts: list[list[int]]):
    top_k = model.config.num_experts_per_tok if family in MOE_FAMILIES else None
    refs = [reference_greedy(model, p, STEPS, top_k) for p in prompts]
    for r in refs:  # the near-tie rule: this seed must be free of ties, else pick another seed
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        if top_k:
            assert r.min_router_margin > ROUTER_MARGIN, f"seed has a router near-tie ({r.min_router_margin:.2g})"
    return refs


@pytest.fixture(scope="module", params=FAMILIES)
def family_ckpt(request, tmp_path_factory):
    family = request.param
    d = tmp_path_factory.mktemp(family)
    model = save_checkpoint(family, d, seed=SEEDS[family])
    prompts = _prompts(SEEDS[family], model.config.vocab_size)
    return family, d, model, prompts, _refs(model, family, prompts)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_logits_match(family_ckpt, device):
    family, d, model, prompts, refs = family_ckpt
    llm = LLM(model=str(d), device=device, dtype="float32")
    for r in refs:
        assert_close_logits(llm.engine.score(r.prompt), r.prompt_logits)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_tokens_batched_match(family_ckpt, device):
    family, d, model, prompts, refs = family_ckpt
    llm = LLM(model=str(d), device=device, dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate(prompts, params)  # all three together: batching must not change a token
    for out, r in zip(outs, refs):
        assert out.token_ids == r.tokens
        assert out.finish_reason == "length"
    alone = llm.generate([prompts[1]], params)[0]
    assert alone.token_ids == refs[1].tokens
    llm.check_integrity()
    assert llm.stats()["kv_pages_used"] == 0


@pytest.mark.gpu
def test_bf16_agreement_on_gpu(family_ckpt, record_property):
    """bf16 cannot match fp32 token for token: a bf16 rounding can flip a router top-k choice on these wide random
    weights (transformers' own bf16 forward shows the same jumps). Measure the agreement (reported in the issue note)
    and bound it loosely: some prompt agrees on its first tokens with close logits."""
    family, d, model, prompts, refs = family_ckpt
    llm = LLM(model=str(d), device="cuda", dtype="bfloat16")
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    agree, errs = [], []
    for out, r in zip(outs, refs):
        n = next((i for i, (a, b) in enumerate(zip(out.token_ids, r.tokens)) if a != b), STEPS)
        agree.append(n)
        err = float((llm.engine.score(r.prompt) - r.prompt_logits).abs().max()) / float(r.prompt_logits.abs().max())
        print(f"bf16 {family}: first divergence at token {n}/{STEPS}, prefill logit rel err {err:.3g}")
        errs.append(err)
    record_property("bf16_agreement", agree)
    assert max(agree) >= 1 and min(errs) < 0.1  # not a different function: some prompt agrees closely


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_sharded_checkpoint(tmp_path, family):
    model = save_checkpoint(family, tmp_path, seed=SEEDS[family], max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) >= 2
    prompts = _prompts(SEEDS[family], model.config.vocab_size)
    refs = _refs(model, family, prompts)
    llm = LLM(model=str(tmp_path), device="cpu", dtype="float32")
    assert_close_logits(llm.engine.score(prompts[0]), refs[0].prompt_logits)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "llama"])
def test_bf16_checkpoint_under_float32_steps(tmp_path, family):
    """A bf16 checkpoint run in float32 on a CPU (the embedded model's case): the engine keeps bf16 copies of the
    experts and the decode step's linears (``kernels/linear.py``, the fused backend's widening kernel path); logits
    and greedy tokens still match transformers' float32 forward of the same checkpoint."""
    model = make_model(family, seed=SEEDS[family])
    with torch.no_grad():
        for p in model.parameters():  # bf16 values in float32 (buffers such as the rotary frequencies stay float32)
            p.copy_(p.bfloat16())
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    model = make_model(family, seed=SEEDS[family])
    with torch.no_grad():
        for p in model.parameters():  # transformers' float32 forward of the checkpoint's values
            p.copy_(p.bfloat16())
    prompts = _prompts(SEEDS[family], model.config.vocab_size)
    refs = _refs(model, family, prompts)
    llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", moe_backend="fused")
    decoder = llm.engine.setup.loaded.model
    backend = llm.engine.setup.loaded.backend
    assert family not in MOE_FAMILIES or backend.gate_up.dtype == torch.bfloat16
    for r in refs:
        assert_close_logits(llm.engine.score(r.prompt), r.prompt_logits)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    head16 = BF16_COPIES.held(decoder.lm_head)  # the decode steps read the head's bf16 copy (the op holds it)
    assert head16 is not None and head16.dtype == torch.bfloat16
