"""The MLA families (DeepSeek-V3, GLM-4.7-Flash; ``layers/mla.py``) against transformers' forward on tiny random
checkpoints (CPU, fp32; ``tiny_mla.py``): prefill logits one shot, in chunks and one token at a time (every step an
absorbed decode step over the paged latents); greedy tokens of a batch whose steps mix prefill chunks and decode rows
through the fused, offload, cpu and hybrid expert backends at a small cache; a YaRN-mscale variant with the
rotate-half layout beside the interleaved one; prefix reuse after an edit; preemption. Then the memory plan's bytes
per token and what a bad MLA checkpoint gets at load."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch

from checkpoint_edits import edited_checkpoint as _edited
from freetoken import LLM, SamplingParams
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.memory.sizes import model_bytes
from reference import (
    LOGIT_MARGIN,
    ROUTER_MARGIN,
    check_batched_greedy,
    check_preemption_keeps_tokens,
    check_reuse_after_an_edit,
    check_scoring,
    reference_greedy,
    torch_ops,
)
from reference import float32_llm as _llm
from tiny_mla import VARIANTS, save_mla_checkpoint, sigmoid_margin

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

PROMPT_LENGTHS = (5, 13, 29)
STEPS = 12
# Seeds picked so the reference has no near ties (asserted below, DESIGN §8).
SEEDS = {"deepseek_v3": 0, "glm4_moe_lite": 2, "deepseek_yarn": 3}
# (backend, expert cache, fill fraction): 2 slots of 16 routed experts is a small cache
BACKENDS = [("fused", None, None), ("offload", 0.125, None), ("cpu", None, None), ("hybrid", 0.125, 0.5)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)


def _prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1000 + seed)
    return [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def _reference(model, prompt: list[int], steps: int = STEPS):
    r = reference_greedy(model, prompt, steps)
    assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
    margin = sigmoid_margin(model, r.prompt + r.tokens[:-1])
    assert margin > ROUTER_MARGIN, f"seed has a router near-tie ({margin:.2g})"
    return r


@pytest.fixture(scope="module", params=VARIANTS)
def mla_ckpt(request, tmp_path_factory):
    variant = request.param
    d = tmp_path_factory.mktemp(variant)
    model = save_mla_checkpoint(variant, d, SEEDS[variant])
    refs = [_reference(model, p) for p in _prompts(SEEDS[variant])]
    with torch.no_grad(), torch_ops(model):  # the reference's logits at every position of prompt + continuation
        exact = copy.deepcopy(model).double()
        exact.set_experts_implementation("eager")  # grouped_mm has no float64
        full = [exact(torch.tensor([r.prompt + r.tokens]), use_cache=False).logits[0] for r in refs]
    return variant, d, model, refs, full


def test_logits_match_one_shot_chunked_and_token_by_token(mla_ckpt):
    """Prefill expands the latents; chunks read the latents earlier chunks wrote (chunk-major and layer-major);
    chunk 1 is the absorbed decode."""
    variant, d, model, refs, full = mla_ckpt
    check_scoring(_llm(d), refs, full)


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_greedy_tokens_batched_match(mla_ckpt, backend, cache, fill):
    """Three requests at once with a 16-token step budget (chunked prompts sharing steps with decode rows), then one
    alone in pages the batch used."""
    variant, d, model, refs, _ = mla_ckpt
    check_batched_greedy(_llm(d, backend, cache, fill, max_batched_tokens=16), refs, PARAMS)


def test_prefix_reuse_after_an_edit(mla_ckpt, freetoken_env):
    """An edit in the middle of a context: reuse stops at its page; the rest is prefilled over the cached latents."""
    variant, d, model, _, _ = mla_ckpt
    if variant != "deepseek_v3":
        pytest.skip("one variant suffices: the latents are cached alike")
    freetoken_env("FREETOKEN_DEBUG", "1")  # every cache checked after every step
    history = torch.randint(3, 512, (60,), generator=torch.Generator().manual_seed(77)).tolist()
    check_reuse_after_an_edit(_llm(d, page_size=8), lambda ids: _reference(model, ids), history, 43, PARAMS)


def test_preempted_requests_keep_their_tokens(mla_ckpt, freetoken_env):
    """A KV pool too small for the batch: requests are preempted and resumed; their latents are recomputed or
    reused from the tree, and the tokens do not change."""
    variant, d, model, refs, _ = mla_ckpt
    if variant != "glm4_moe_lite":
        pytest.skip("one variant suffices")
    freetoken_env("FREETOKEN_DEBUG", "1")
    check_preemption_keeps_tokens(_llm(d, page_size=4, kv_pages=14, max_batched_tokens=16), refs, PARAMS)


def test_kv_bytes_per_token_is_the_latent_formula(mla_ckpt):
    """(kv_lora_rank + qk_rope_head_dim) x dtype bytes x attention layers, in the plan and in the pool's tensors."""
    variant, d, model, _, _ = mla_ckpt
    cfg = model.config
    hf = load_hf_config(d)
    per_token = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4 * cfg.num_hidden_layers
    assert model_bytes(hf, 4).kv_per_token == per_token
    assert model_bytes(hf, 2).kv_per_token == per_token // 2
    llm = _llm(d, page_size=8, max_model_len=64, max_running_requests=2)
    kv = llm.engine.kv
    assert kv.k[0].shape[1:] == (1, cfg.kv_lora_rank + cfg.qk_rope_head_dim) and kv.v[0].numel() == 0
    held = sum(t.numel() * t.element_size() for t in kv.k + kv.v)
    assert held == per_token * kv.num_pages * 8 == llm.engine.memory.plan.kv_bytes


def test_real_config_bytes_per_token(tmp_path):
    """DeepSeek-V3's and GLM-4.7-Flash's shapes: 576 latent values per token and layer, bf16."""
    for name, layers in (("DeepseekV3ForCausalLM", 61), ("Glm4MoeLiteForCausalLM", 47)):
        cfg = {"architectures": [name], "hidden_size": 7168, "num_attention_heads": 128, "num_hidden_layers": layers,
               "vocab_size": 1000, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128}  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        assert model_bytes(load_hf_config(tmp_path), 2).kv_per_token == 576 * 2 * layers


def _set(key: str, value: object):
    def edit(cfg: dict) -> dict:
        cfg[key] = value
        return cfg

    return edit


def test_bad_mla_shapes_are_refused_naming_the_field(mla_ckpt, tmp_path):
    variant, d, model, _, _ = mla_ckpt
    if variant != "deepseek_v3":
        pytest.skip("one variant suffices")
    bad = _edited(d, tmp_path / "rank", config=_set("kv_lora_rank", 24))
    with pytest.raises(CheckpointError, match=r"kv_a_proj_with_mqa.weight has 48 rows .*kv_lora_rank \+ qk_rope"):
        LLM(model=str(bad), device="cpu", dtype="float32")
    bad = _edited(d, tmp_path / "nope", config=_set("qk_nope_head_dim", 8))
    with pytest.raises(CheckpointError, match=r"q_b_proj.weight has 128 rows .*qk_nope_head_dim \+ qk_rope_head_dim"):
        LLM(model=str(bad), device="cpu", dtype="float32")
    cut = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    bad = _edited(d, tmp_path / "tensor", tensors=lambda s: {**s, cut: s[cut][:40]})
    with pytest.raises(CheckpointError, match=r"kv_a_proj_with_mqa.weight has 40 rows"):
        LLM(model=str(bad), device="cpu", dtype="float32")
    bad = _edited(d, tmp_path / "null", config=_set("kv_lora_rank", None))
    with pytest.raises(CheckpointError, match="kv_lora_rank"):
        LLM(model=str(bad), device="cpu", dtype="float32")


def test_mtp_layer_skipped_said_once(mla_ckpt, tmp_path, caplog):
    """DeepSeek-V3 ships its multi-token-prediction layer as ``model.layers.<num_hidden_layers>``: not read, said
    once; a stray tensor elsewhere is still refused."""
    variant, d, model, refs, _ = mla_ckpt
    if variant != "deepseek_v3":
        pytest.skip("one variant suffices")
    n = model.config.num_hidden_layers
    mtp = {f"model.layers.{n}.eh_proj.weight": torch.zeros(64, 128), f"model.layers.{n}.enorm.weight": torch.ones(64),
           f"model.layers.{n}.shared_head.norm.weight": torch.ones(64)}  # fmt: skip
    ok = _edited(d, tmp_path / "mtp", tensors=lambda s: {**s, **mtp})
    with caplog.at_level(logging.INFO, logger="freetoken.checkpoint.weights"):
        llm = LLM(model=str(ok), device="cpu", dtype="float32")
    said = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(said) == 1 and "3 tensor(s)" in said[0]
    assert llm.generate([refs[0].prompt], PARAMS)[0].token_ids == refs[0].tokens
    stray = {f"model.layers.{n + 1}.eh_proj.weight": torch.zeros(2)}  # beyond the one MTP layer config.json counts
    bad = _edited(d, tmp_path / "stray", tensors=lambda s: {**s, **stray})
    with pytest.raises(CheckpointError, match=f"model.layers.{n + 1}.eh_proj.weight"):
        LLM(model=str(bad), device="cpu", dtype="float32")


def test_chat_family_of_the_mla_model_types():
    from freetoken.chat.registry import detect_family

    assert detect_family("deepseek_v3") == "deepseek_v3"
    assert detect_family("glm4_moe_lite") == "glm45"
