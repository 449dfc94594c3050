"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5; ``layers/dsa.py``) against transformers' forward on tiny random
checkpoints (CPU, fp32; ``tiny_dsa.py``, ``index_topk`` 6 under prompts of 5 to 29 tokens, so the indexer drops
positions): prefill logits one shot, in chunks, layer-major and one token at a time (absorbed decode over the kept
latents); the same weights with a dense ``index_topk`` give other logits (the sparsity is real); greedy tokens of a
batch mixing prefill chunks and decode rows through the fused, offload, cpu and hybrid expert backends at a small
cache; prefix reuse after an edit and preemption (the indexer's keys live in the latent's pages); a GLM-5 whose
middle layer attends by the first layer's top-k (``indexer_types``: full, shared, full). Then the memory plan's bytes
per token."""

from __future__ import annotations

import json

import pytest
import torch

from freetoken import SamplingParams
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.memory.sizes import model_bytes
from reference import (
    LOGIT_MARGIN,
    ROUTER_MARGIN,
    assert_close_logits,
    check_batched_greedy,
    check_preemption_keeps_tokens,
    check_reuse_after_an_edit,
    check_scoring,
    reference_greedy,
    torch_ops,
)
from reference import float32_llm as _llm
from tiny_dsa import VARIANTS, index_margin, make_model, save_dsa_checkpoint
from tiny_mla import sigmoid_margin

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

PROMPT_LENGTHS = (5, 13, 29)
STEPS = 10
INDEX_MARGIN = 1e-4
# Seeds picked so the reference has no near ties (logits, routers, the indexer's top-k; asserted below, DESIGN §8).
SEEDS = {"deepseek_v32": 2, "glm_moe_dsa": 0, "glm_moe_dsa_shared": 2}
# (backend, expert cache, fill fraction): 2 slots of 16 routed experts is a small cache
BACKENDS = [("fused", None, None), ("offload", 0.125, None), ("cpu", None, None), ("hybrid", 0.125, 0.5)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)


def _prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1000 + seed)
    return [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def _reference(model, prompt: list[int], steps: int = STEPS):
    r = reference_greedy(model, prompt, steps)
    assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
    seq = r.prompt + r.tokens[:-1]
    margin = sigmoid_margin(model, seq)
    assert margin > ROUTER_MARGIN, f"seed has a router near-tie ({margin:.2g})"
    margin = index_margin(model, seq)
    assert margin > INDEX_MARGIN, f"seed has an indexer near-tie ({margin:.2g})"
    return r


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad(), torch_ops(model):
        return model(torch.tensor([ids]), use_cache=False).logits[0].double()


@pytest.fixture(scope="module", params=VARIANTS)
def dsa_ckpt(request, tmp_path_factory):
    variant = request.param
    d = tmp_path_factory.mktemp(variant)
    model = save_dsa_checkpoint(variant, d, SEEDS[variant])
    refs = [_reference(model, p) for p in _prompts(SEEDS[variant])]
    full = [_logits(model, r.prompt + r.tokens) for r in refs]
    return variant, d, model, refs, full


def test_logits_match_one_shot_chunked_and_token_by_token(dsa_ckpt):
    """Prefill selects per query among the positions it sees; chunks read the latents and indexer keys earlier
    chunks wrote (chunk-major and layer-major); chunk 1 is the absorbed sparse decode."""
    variant, d, model, refs, full = dsa_ckpt
    check_scoring(_llm(d), refs, full)


def test_the_sparsity_drops_positions(dsa_ckpt):
    """The same weights with an ``index_topk`` past every context (dense MLA) give other logits beyond the first
    ``index_topk`` positions and the same ones before: the engine's match above is a sparse one."""
    variant, d, model, refs, full = dsa_ckpt
    dense = make_model(variant, SEEDS[variant], index_topk=4096)
    dense.load_state_dict(model.state_dict())
    seq = refs[2].prompt + refs[2].tokens
    ref = _logits(dense, seq)
    k = model.config.index_topk
    assert_close_logits(full[2][:k], ref[:k])
    assert float((full[2][k + 2 :] - ref[k + 2 :]).abs().max()) > 1e-2


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_greedy_tokens_batched_match(dsa_ckpt, backend, cache, fill):
    """Three requests at once with a 16-token step budget (chunked prompts sharing steps with decode rows), then one
    alone in pages the batch used."""
    variant, d, model, refs, _ = dsa_ckpt
    check_batched_greedy(_llm(d, backend, cache, fill, max_batched_tokens=16), refs, PARAMS)


def test_prefix_reuse_after_an_edit(dsa_ckpt, freetoken_env):
    """An edit in the middle of a context: reuse stops at its page; the rest is prefilled over the cached latents
    and indexer keys."""
    variant, d, model, _, _ = dsa_ckpt
    if variant != "deepseek_v32":
        pytest.skip("one variant suffices: the indexer keys are cached alike")
    freetoken_env("FREETOKEN_DEBUG", "1")
    history = torch.randint(3, 512, (40,), generator=torch.Generator().manual_seed(78)).tolist()
    check_reuse_after_an_edit(_llm(d, page_size=8), lambda ids: _reference(model, ids), history, 27, PARAMS)


def test_preempted_requests_keep_their_tokens(dsa_ckpt, freetoken_env):
    variant, d, model, refs, _ = dsa_ckpt
    if variant != "glm_moe_dsa":
        pytest.skip("one variant suffices")
    freetoken_env("FREETOKEN_DEBUG", "1")
    check_preemption_keeps_tokens(_llm(d, page_size=4, kv_pages=12, max_batched_tokens=16), refs, PARAMS)


def test_kv_bytes_per_token_is_the_latent_and_indexer_formula(dsa_ckpt):
    """(kv_lora_rank + qk_rope_head_dim + index_head_dim) x dtype bytes x layers, in the plan and the pool."""
    variant, d, model, _, _ = dsa_ckpt
    cfg = model.config
    per_token = (cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim) * 4 * cfg.num_hidden_layers
    hf = load_hf_config(d)
    assert model_bytes(hf, 4).kv_per_token == per_token
    assert model_bytes(hf, 2).kv_per_token == per_token // 2
    llm = _llm(d, page_size=8, max_model_len=64, max_running_requests=2)
    kv = llm.engine.kv
    assert kv.k[0].shape[1:] == (1, cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim)
    held = sum(t.numel() * t.element_size() for t in kv.k + kv.v)
    assert held == per_token * kv.num_pages * 8 == llm.engine.memory.plan.kv_bytes


@pytest.mark.parametrize("name,layers", [("DeepseekV32ForCausalLM", 61), ("GlmMoeDsaForCausalLM", 78)])
def test_real_config_bytes_per_token(tmp_path, name, layers):
    """DeepSeek-V3.2's and GLM-5's shapes: a 576-value latent and a 128-value indexer key per token and layer."""
    cfg = {"architectures": [name], "hidden_size": 6144, "num_attention_heads": 64, "num_hidden_layers": layers,
           "vocab_size": 1000, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192,
           "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert model_bytes(load_hf_config(tmp_path), 2).kv_per_token == (576 + 128) * 2 * layers


def test_chat_family_of_the_dsa_model_types():
    from freetoken.chat.registry import detect_family

    assert detect_family("deepseek_v32") == "deepseek_v3"
    assert detect_family("glm_moe_dsa") == "glm45"
