"""Kimi-Linear (KDA + NoPE latent attention, ``models/kimi_linear.py``) against transformers' forward on one tiny
random checkpoint (CPU, fp32; ``tiny_kimi.py``): prefill logits one shot, in chunks and one token at a time (the KDA
decode step from its state slot, the absorbed MLA decode); greedy tokens of a batch whose steps mix prefill chunks and
decode rows through the fused, offload, cpu and hybrid expert backends; prefix reuse after an edit (the recurrent
state restored from an anchor's checkpoint); the KDA rule's chunks against its recurrence; the config as the real
checkpoints spell it; and what a bad checkpoint gets at load."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from checkpoint_edits import edited_checkpoint as _edited
from freetoken import LLM, SamplingParams
from freetoken.bench.agent_edits import common_prefix
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.kernels.gated_delta import l2norm
from freetoken.kernels.kda import chunk_kda, recurrent_kda
from freetoken.memory.sizes import model_bytes
from reference import (
    LOGIT_MARGIN,
    ROUTER_MARGIN,
    assert_close_logits,
    check_batched_greedy,
    check_scoring,
    reference_greedy,
    torch_ops,
)
from reference import float32_llm as _llm
from tiny_kimi import save_kimi_checkpoint
from tiny_mla import sigmoid_margin
from tiny_models import save_tokenizer

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

PROMPT_LENGTHS = (1, 13, 37)  # 1: a decode-shaped first step at position 0 (the states start from zeros)
STEPS = 12
SEED = 0  # picked so the reference has no near ties (asserted below, DESIGN §8)
# (backend, expert cache, fill fraction): 2 slots of 24 routed experts is a small cache
BACKENDS = [("fused", None, None), ("offload", 0.1, None), ("cpu", None, None), ("hybrid", 0.1, 0.5)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
PAGE = 4


def _reference(model, prompt: list[int]):
    r = reference_greedy(model, prompt, STEPS)
    assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
    margin = sigmoid_margin(model, r.prompt + r.tokens[:-1])
    assert margin > ROUTER_MARGIN, f"seed has a router near-tie ({margin:.2g})"
    return r


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    d = tmp_path_factory.mktemp("kimi_linear")
    model = save_kimi_checkpoint(d, SEED)
    tok = save_tokenizer(d)  # Qwen-style specials: <|im_end|>, <think>, </think> are anchors of the Kimi family too
    g = torch.Generator().manual_seed(1000 + SEED)
    refs = [_reference(model, torch.randint(3, 400, (n,), generator=g).tolist()) for n in PROMPT_LENGTHS]
    with torch.no_grad(), torch_ops(model):  # the reference's logits at every position of prompt + continuation
        exact = copy.deepcopy(model).double()
        exact.set_experts_implementation("eager")  # grouped_mm has no float64
        full = [exact(torch.tensor([r.prompt + r.tokens]), use_cache=False).logits[0] for r in refs]
    return d, model, refs, full, tok.convert_tokens_to_ids("<|im_end|>")


def test_layers_as_the_config_lists_them(kimi):
    """linear_attn_config's 1-indexed lists: KDA at 1, 3, 4, latent attention at 2; the first layer dense."""
    d, model, _, _, _ = kimi
    assert model.config.layer_types == ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
    llm = _llm(d, state_checkpoints=0)
    kinds = [type(layer.attn).__name__ for layer in llm.engine.runner.model.layers]
    assert kinds == ["KimiDeltaAttention", "MLAttention", "KimiDeltaAttention", "KimiDeltaAttention"]
    assert [type(layer.ffn).__name__ for layer in llm.engine.runner.model.layers] == ["DenseMLP"] + ["MoELayer"] * 3
    assert len(llm.engine.kv.k) == 1 and llm.engine.kv.k[0].shape[1:] == (1, 32 + 16)  # one latent row per token
    states = llm.engine.states
    assert states is not None and states.conv.shape[0] == 3 and states.conv.shape[2:] == (3 * 4 * 16, 3)
    assert states.ssm.shape[2:] == (4, 16, 16)


def test_planned_bytes_are_what_the_engine_allocates(kimi):
    """The memory plan's latent rows and KDA states (``memory/sizes.py``) against the pool's tensors."""
    d = kimi[0]
    hf = load_hf_config(d)
    b = model_bytes(hf, 4, full_attention_interval=4)
    assert (b.kv_layers, b.linear_layers) == (1, 3)
    llm = _llm(d, page_size=8, max_model_len=64, max_running_requests=2, state_checkpoints=3)
    kv, st, plan = llm.engine.kv, llm.engine.states, llm.engine.memory.plan
    held = sum(t.numel() * t.element_size() for t in kv.k + kv.v)
    assert held == b.kv_per_token * kv.num_pages * 8 == plan.kv_bytes and b.kv_per_token == (32 + 16) * 4
    assert st is not None and (st.num_slots, st.num_checkpoints) == (3, 3)
    state = sum(t.numel() * t.element_size() for t in (st.conv, st.ssm))
    assert state == b.state_per_request * 6 == plan.states_bytes
    assert b.state_per_request == 3 * (3 * 64 * 3 * 4 + 4 * 16 * 16 * 4)


def test_logits_match_one_shot_chunked_and_token_by_token(kimi):
    """Chunks cut the conv window (3 < K-1 + 1) and the rule's 16-token chunks; chunk 1 is every step a decode step
    (KDA's recurrent step from its slot, MLA's absorbed decode); layer-major runs the chunks layer by layer."""
    d, _, refs, full, _ = kimi
    check_scoring(_llm(d), refs, full, chunks=(1, 3, 17))


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_greedy_tokens_batched_match(kimi, backend, cache, fill):
    """Three requests at once with a 16-token step budget (chunked prompts sharing steps with decode rows), then one
    alone in a state slot and pages the batch used."""
    d, _, refs, _, _ = kimi
    llm = _llm(d, backend, cache, fill, max_batched_tokens=16)
    check_batched_greedy(llm, refs, PARAMS)
    states = llm.engine.states
    assert states is not None and states.num_free == states.num_slots


def test_prefix_reuse_after_an_edit(kimi, freetoken_env):
    """An agent turn, then the next prompt with its tool output dropped: the request resumes from the checkpoint at
    the deepest surviving anchor (``<|im_end|>``), prefills at most the new suffix and a page, and matches a fresh
    prefill and transformers' greedy tokens."""
    freetoken_env("FREETOKEN_DEBUG", "1")  # every cache checked after every step
    d, model, _, _, E = kimi
    g = torch.Generator().manual_seed(3)
    text = lambda n: torch.randint(20, 400, (n,), generator=g).tolist()  # noqa: E731
    system, user, output, new = [*text(21), E], [*text(9), E], [*text(17), E], [*text(7), E, *text(2)]
    first, edited = system + user + output, system + user + new
    llm = _llm(d, page_size=PAGE)
    fresh = llm.engine.score(edited)[-1]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([first], one)
    seen: list[torch.Tensor] = []
    runner_model = llm.engine.runner.model
    real_logits = runner_model.logits
    runner_model.logits = lambda h: seen.append(real_logits(h)) or seen[-1]  # type: ignore[method-assign]
    before = llm.stats()
    out = llm.generate([edited], PARAMS)[0].token_ids
    after = llm.stats()
    assert after["state_restores"] == before["state_restores"] + 1
    reused = after["prefix_tokens_reused"] - before["prefix_tokens_reused"]
    refilled = after["prefill_tokens"] - before["prefill_tokens"]
    suffix = len(edited) - common_prefix(first, edited)
    assert reused > 0 and refilled == len(edited) - reused and refilled <= suffix + PAGE, (reused, refilled, suffix)
    assert out == _reference(model, edited).tokens
    assert_close_logits(seen[0][0], fresh)  # the resumed prefill's last logits
    llm.check_integrity()


@pytest.mark.parametrize("decay", [0.05, 3.0])
def test_chunked_rule_equals_the_recurrence(decay):
    """``chunk_kda`` over 45 tokens (2 whole chunks and a part) from a non-zero state against ``recurrent_kda`` token
    by token; strong decays (e^-3 per channel and token and stronger) do not overflow a chunk."""
    g = torch.Generator().manual_seed(0)
    n, H, dk, dv = 45, 3, 8, 6
    q = l2norm(torch.randn(n, H, dk, generator=g)) * dk**-0.5
    k = l2norm(torch.randn(n, H, dk, generator=g))
    v = torch.randn(n, H, dv, generator=g)
    gate = -decay * torch.rand(n, H, dk, generator=g) * 10
    beta = torch.rand(n, H, generator=g)
    s0 = torch.randn(H, dk, dv, generator=g)
    out, s = chunk_kda(q, k, v, gate, beta, s0)
    state, outs = s0[None], []
    for t in range(n):
        o, state = recurrent_kda(q[t : t + 1], k[t : t + 1], v[t : t + 1], gate[t : t + 1], beta[t : t + 1], state)
        outs.append(o[0])
    assert torch.isfinite(out).all() and torch.isfinite(s).all()
    torch.testing.assert_close(out, torch.stack(outs), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, state[0], rtol=1e-5, atol=1e-5)


# ---- the config as the real checkpoints spell it ---------------------------------------------------------------------
# moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json fields our loader reads (published values)
REAL = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": 163840,
        "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024, "num_hidden_layers": 27,
        "num_attention_heads": 32, "num_key_value_heads": 32, "kv_lora_rank": 512, "q_lora_rank": None,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
        "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid", "num_expert_group": 1, "topk_group": 1,
        "routed_scaling_factor": 2.446, "first_k_dense_replace": 1, "model_max_length": 1048576,
        "rms_norm_eps": 1e-5, "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)], "head_dim": 128,
        "num_heads": 32, "short_conv_kernel_size": 4}}  # fmt: skip


def test_real_config_fields_and_bytes(tmp_path):
    """Its own field names read as the usual ones; 7 latent-attention layers of 576 values a token, 20 KDA layers of
    a [3*32*128, 3] conv window (bf16) and a [32, 128, 128] float32 state a request."""
    (tmp_path / "config.json").write_text(json.dumps(REAL))
    hf = load_hf_config(tmp_path)
    assert (hf.top_k, hf.norm_topk_prob, hf.shared_expert_intermediate_size) == (8, True, 1024)
    assert hf.max_position_embeddings == 1048576 and hf.raw["n_group"] == 1 and hf.raw["scoring_func"] == "sigmoid"
    assert hf.layer_types is not None and [i + 1 for i, t in enumerate(hf.layer_types) if t == "full_attention"] == [
        4, 8, 12, 16, 20, 24, 27]  # fmt: skip
    assert hf.moe_layer_ids == list(range(1, 27))
    b = model_bytes(hf, 2, full_attention_interval=4)
    assert (b.kv_layers, b.linear_layers) == (7, 20)
    assert b.kv_per_token == 7 * 576 * 2
    assert b.state_per_request == 20 * (3 * 32 * 128 * 3 * 2 + 32 * 128 * 128 * 4)


def test_chat_family_of_the_model_type():
    from freetoken.chat.registry import detect_family

    assert detect_family("kimi_linear") == "kimi_k2"


def test_bench_preset_is_the_real_expert_shape():
    """``ft bench --preset kimi-linear``: the routed experts of KimiLinearConfig's defaults (those of the 48B-A3B)."""
    import transformers as tf

    from freetoken.bench.presets import PRESETS

    cfg, p = tf.KimiLinearConfig(), PRESETS["kimi-linear"]
    assert (p.hidden, p.inter, p.experts, p.top_k) == (cfg.hidden_size, cfg.moe_intermediate_size,
                                                       cfg.num_local_experts, cfg.num_experts_per_tok)  # fmt: skip
    assert p.layers == cfg.mlp_layer_types.count("sparse") == REAL["num_hidden_layers"] - 1


def test_defaults_when_the_config_lists_no_layers(tmp_path):
    """No layer lists: transformers' defaults, full attention where i > 0 and i % 4 == 0 (0-indexed), the first
    layer dense (``first_k_dense_replace`` unsaid means 1); an explicit ``mlp_layer_types`` wins over it."""
    cfg = {k: v for k, v in REAL.items() if k not in ("linear_attn_config", "first_k_dense_replace")}
    cfg["num_hidden_layers"] = 9
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = load_hf_config(tmp_path)
    assert hf.layer_types is not None and [i for i, t in enumerate(hf.layer_types) if t == "full_attention"] == [4, 8]
    assert hf.moe_layer_ids == list(range(1, 9)) and hf.raw["linear_num_value_heads"] == 32
    cfg = {**cfg, "first_k_dense_replace": 2, "mlp_layer_types": ["sparse"] * 8 + ["dense"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_hf_config(tmp_path).moe_layer_ids == list(range(8))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "mlp_layer_types": ["moe"] * 9}))
    with pytest.raises(CheckpointError, match="mlp_layer_types must list 'dense' or 'sparse'"):
        load_hf_config(tmp_path)


@pytest.mark.parametrize("lin,match", [
    ({"full_attn_layers": [2], "kda_layers": [1, 3]}, r"layer 4 \(1-indexed\) in neither"),
    ({"full_attn_layers": [2, 5], "kda_layers": [1, 3, 4]}, r"full_attn_layers names layer 5; layers are numbered 1"),
    ({"full_attn_layers": [2, 3], "kda_layers": [1, 3, 4]}, "names layer 3 twice"),
])  # fmt: skip
def test_bad_layer_lists_are_refused(tmp_path, lin, match):
    cfg = {**REAL, "num_hidden_layers": 4, "linear_attn_config": {**REAL["linear_attn_config"], **lin}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        load_hf_config(tmp_path)


# ---- bad checkpoints -----------------------------------------------------------------------------------------------

def test_the_shipped_layout_of_dense_layers_loads(kimi, tmp_path):
    """transformers saves the dense layer under ``block_sparse_moe.``; the real checkpoints ship it as ``mlp.``."""
    d, _, refs, full, _ = kimi
    moved = lambda s: {k.replace("layers.0.block_sparse_moe.", "layers.0.mlp."): v for k, v in s.items()}  # noqa: E731
    llm = LLM(model=str(_edited(d, tmp_path / "m", tensors=moved)), device="cpu", dtype="float32")
    r = refs[1]
    assert_close_logits(llm.engine.score(r.prompt + r.tokens).double(), full[1])


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.A_log", "model.layers.2.self_attn.k_conv1d.weight",
                                  "model.layers.3.self_attn.f_b_proj.weight",
                                  "model.layers.1.self_attn.kv_b_proj.weight"])  # fmt: skip
def test_missing_tensor_is_named(kimi, tmp_path, name):
    d = _edited(kimi[0], tmp_path / "m", tensors=lambda s: {k: v for k, v in s.items() if k != name})
    with pytest.raises(CheckpointError, match=f"tensor {name} is missing"):
        LLM(model=str(d), device="cpu", dtype="float32")


@pytest.mark.parametrize("name,cut", [("model.layers.0.self_attn.dt_bias", 48),
                                      ("model.layers.2.self_attn.g_b_proj.weight", 32)])  # fmt: skip
def test_misshapen_tensor_is_named(kimi, tmp_path, name, cut):
    d = _edited(kimi[0], tmp_path / "m", tensors=lambda s: {**s, name: s[name][:cut]})
    with pytest.raises(CheckpointError, match=f"tensor {name} has shape"):
        LLM(model=str(d), device="cpu", dtype="float32")


def test_unread_tensor_and_bad_fields_are_refused(kimi, tmp_path):
    d = kimi[0]
    bias = "model.layers.0.self_attn.q_conv1d.bias"
    bad = _edited(d, tmp_path / "bias", tensors=lambda s: {**s, bias: torch.zeros(64)})
    with pytest.raises(CheckpointError, match=bias):
        LLM(model=str(bad), device="cpu", dtype="float32")
    bad = _edited(d, tmp_path / "rope", config=lambda c: {**c, "mla_use_nope": False})
    with pytest.raises(CheckpointError, match="mla_use_nope False"):
        LLM(model=str(bad), device="cpu", dtype="float32")
    bad = _edited(d, tmp_path / "softmax", config=lambda c: {**c, "moe_router_activation_func": "softmax"})
    with pytest.raises(CheckpointError, match="scoring_func 'softmax'"):
        LLM(model=str(bad), device="cpu", dtype="float32")
    bad = _edited(d, tmp_path / "heads", config=lambda c: {**c, "linear_attn_config": {**c["linear_attn_config"],
                                                                                       "num_heads": 8}})  # fmt: skip
    with pytest.raises(CheckpointError, match=r"self_attn.q_proj.weight has shape \[64, 64\], expected \[128, 64\]"):
        LLM(model=str(bad), device="cpu", dtype="float32")
