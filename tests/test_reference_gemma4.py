"""Gemma-4 (``Gemma4ForCausalLM``, ``Gemma4ForConditionalGeneration``'s text part) against transformers' forward on
tiny random checkpoints (CPU, fp32; ``tiny_gemma4.py``): the MoE variant through the fused, offload, cpu and hybrid
expert backends (prefill logits; in chunks that cut the 8-token window; one token a step through the rings; layer-major;
greedy tokens of a batch decoding past the window), the dense variant, prefix reuse after an edit (the rings resumed
from a checkpoint), where the KV lives (pages only for full layers computing K/V, rings only for sliding ones, none
for KV-shared layers), and load refusals naming the tensor."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from checkpoint_edits import edited_checkpoint as _copy
from devices import DEVICES
from freetoken import LLM, SamplingParams
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.gemma4_config import gemma4_config
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.memory.sizes import KVGeometry, kv_geometry, model_bytes
from reference import LOGIT_MARGIN, ROUTER_MARGIN, assert_close_logits, reference_greedy
from tiny_gemma4 import WINDOW, save_gemma4

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

SEED = 6
PROMPT_LENGTHS = (5, 13, 29)
STEPS = 16  # every sequence decodes past the 8-token window
BACKENDS = [("fused", None, None), ("offload", 0.5, None), ("cpu", None, None), ("hybrid", 0.5, 0.5)]


@torch.no_grad()
def router_margin(model, ids: list[int], top_k: int) -> float:
    """The near-tie rule for Gemma-4's router: its recorded outputs are already probabilities (the k-th minus the
    (k+1)-th, over tokens and layers)."""
    out = model(torch.tensor([ids]), use_cache=False, output_router_logits=True)
    margin = float("inf")
    for probs in out.router_logits:
        top = torch.topk(probs.float().reshape(-1, probs.shape[-1]), top_k + 1, dim=-1).values
        margin = min(margin, float((top[:, top_k - 1] - top[:, top_k]).min()))
    return margin


def _refs(model, moe: bool):
    g = torch.Generator().manual_seed(1000 + SEED)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    refs = [reference_greedy(model, p, STEPS) for p in prompts]
    for r in refs:  # the near-tie rule: this seed must be free of ties, else pick another seed
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        if moe:
            m = router_margin(model, r.prompt + r.tokens[:-1], 2)
            assert m > ROUTER_MARGIN, f"seed has a router near-tie ({m:.2g})"
    with torch.no_grad():  # logits at every position of prompt + continuation
        full = [model(torch.tensor([r.prompt + r.tokens]), use_cache=False).logits[0].float() for r in refs]
    return refs, full


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4_moe")
    model = save_gemma4(d, "moe", SEED)
    return (d, model, *_refs(model, True))


def _llm(d, backend: str = "cpu", cache: float | None = None, fill: float | None = None, device: str = "cpu",
         **kw) -> LLM:  # fmt: skip
    return LLM(model=str(d), device=device, dtype="float32", moe_backend=backend, expert_cache=cache,
               fill_fraction=fill, **kw)  # fmt: skip


def _check_scores(llm: LLM, refs, full) -> None:
    for r, ref in zip(refs, full):
        assert_close_logits(llm.engine.score(r.prompt), r.prompt_logits)
        seq = r.prompt + r.tokens
        assert_close_logits(llm.engine.score(seq, chunk=5), ref)  # chunks cut the window
        assert_close_logits(llm.engine.score(seq, chunk=1), ref)  # every step a decode step through the rings
        assert_close_logits(llm.engine.score(seq, chunk=[3, 11, len(seq) - 14], layer_major=True), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_logits_and_greedy_tokens_match(ckpt, device, backend, cache, fill):
    d, _, refs, full = ckpt
    llm = _llm(d, backend, cache, fill, device, max_batched_tokens=16)
    _check_scores(llm, refs, full)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate([r.prompt for r in refs], params)  # prompts cut in chunks beside others' decode rows
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()
    s = llm.stats()
    assert s["kv_pages_used"] == 0
    if device == "cuda" and backend != "cpu":  # decode steps from captured graphs, the rings and the per-layer
        assert s["step_graph_replays"] > 0  # inputs in them (the cpu backend's steps run eagerly by design)


def test_kv_only_where_layers_compute_it(ckpt):
    """8 layers: sliding 0-4 and 6, full 5 and 7; 6 and 7 KV-shared. Pages for layer 5 alone (its own head dim and
    one KV head), rings for layers 0-4; the router's scale folded, the per-expert scale kept."""
    d, model, _, _ = ckpt
    llm = _llm(d)
    assert len(llm.engine.kv.k) == 1 and llm.engine.kv.k[0].shape[-2:] == (1, 32)
    states = llm.engine.states
    assert states is not None and states.ring_k.shape[0] == 5 and states.ring_k.shape[2:] == (WINDOW, 2, 16)
    layers = llm.engine.setup.loaded.model.layers
    shared = [lay.attn.reads_only if lay.attn.window is None else lay.attn.source != lay.attn.layer for lay in layers]
    assert shared == [False] * 6 + [True] * 2
    assert layers[7].attn.layer == 0 and layers[6].attn.source == 4


def test_memory_sizes_match_what_the_engine_allocates(ckpt):
    """``memory/sizes.py`` from config.json alone: one KV page layer of 1 head x (32 + 32), five rings of 8 x 2 x 16
    (K and V) a request; the engine's tensors hold exactly that."""
    d = ckpt[0]
    b = model_bytes(load_hf_config(d), 4, None, window_ring=True)
    assert (b.kv_layers, b.ring_layers, b.kv_per_token) == (1, 5, 64 * 4)
    assert b.state_per_request == 5 * 2 * WINDOW * 2 * 16 * 4
    llm = _llm(d, page_size=8, max_model_len=64, max_running_requests=2)
    kv, states = llm.engine.kv, llm.engine.states
    assert kv.k[0].nbytes + kv.v[0].nbytes == b.kv_per_token * kv.k[0].shape[0]
    assert states is not None and states.ring_k.nbytes + states.ring_v.nbytes == (
        b.state_per_request * states.ring_k.shape[1])


@pytest.fixture(scope="module")
def dense_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4_dense")
    model = save_gemma4(d, "dense", SEED)
    return (d, model, *_refs(model, False))


def test_dense_variant_matches(dense_ckpt):
    d, _, refs, full = dense_ckpt
    llm = _llm(d, max_batched_tokens=16)
    assert llm.engine.setup.loaded.banks is None
    _check_scores(llm, refs, full)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    assert [o.token_ids for o in llm.generate([r.prompt for r in refs], params)] == [r.tokens for r in refs]


def test_prefix_reuse_after_an_edit(ckpt):
    """A request, then the same prompt edited after token 20: the second resumes from a ring checkpoint (every 8
    tokens) and prefills only the rest; its tokens are transformers' for the edited prompt."""
    d, model, refs, _ = ckpt
    llm = _llm(d, "offload", 0.5, state_checkpoint_every=8)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    base = refs[2].prompt
    assert llm.generate([base], params)[0].token_ids == refs[2].tokens
    edited = base[:20] + [7, 8, 9, 10, 11]
    want = reference_greedy(model, edited, STEPS)
    assert want.min_logit_margin > LOGIT_MARGIN
    before = llm.stats()["prefix_tokens_reused"]
    assert llm.generate([edited], params)[0].token_ids == want.tokens
    s = llm.stats()
    assert s["prefix_tokens_reused"] - before >= 16 and s["state_restores"] >= 1
    llm.check_integrity()


def test_conditional_generation_text_part(tmp_path, caplog):
    """``Gemma4ForConditionalGeneration``: the text model under ``model.language_model.``; the vision and audio
    towers and their embedders skipped, said once."""
    model = save_gemma4(tmp_path, "dense", SEED, multimodal=True)
    ids = torch.randint(3, 512, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    with caplog.at_level(logging.INFO, logger="freetoken.checkpoint.weights"):
        llm = _llm(tmp_path)
    said = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(said) == 1 and "model.vision_tower.*" in said[0] and "model.audio_tower.*" in said[0]
    with torch.no_grad():
        want = model(torch.tensor([ids]), use_cache=False).logits[0].float()
    assert_close_logits(llm.engine.score(ids), want)


def test_release_config_form(tmp_path):
    """A config.json in the release's form (``global_head_dim`` / ``num_global_key_value_heads`` at the top of
    ``text_config``, no ``per_layer_config``; Gemma-4 26B-A4B's sizes): full layers of 512 x 2 KV heads with k = v,
    sliding layers of 256 x 8 in 1024-token rings, 5 page layers and 25 rings."""
    text = dict(model_type="gemma4_text", hidden_size=2816, intermediate_size=2112, num_hidden_layers=30,
                num_attention_heads=16, num_key_value_heads=8, head_dim=256, global_head_dim=512,
                num_global_key_value_heads=2, attention_k_eq_v=True, vocab_size=262144, enable_moe_block=True,
                num_experts=128, top_k_experts=8, moe_intermediate_size=704, sliding_window=1024,
                hidden_size_per_layer_input=0, final_logit_softcapping=30.0)  # fmt: skip
    cfg = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = load_hf_config(tmp_path)
    g = gemma4_config(hf)
    full = [i for i, lay in enumerate(g.layers) if lay.kind == "full_attention"]
    assert full == [5, 11, 17, 23, 29] and hf.top_k == 8 and g.window == 1024 and g.ple_dim == 0
    assert {(lay.head_dim, lay.kv_heads, lay.k_eq_v) for lay in g.layers} == {(512, 2, True), (256, 8, False)}
    assert g.rope["full_attention"].kind == "proportional" and g.softcap == 30.0
    assert kv_geometry(hf) == KVGeometry(2, 512, 512)
    b = model_bytes(hf, 2, None, window_ring=True)
    assert (b.kv_layers, b.ring_layers, b.kv_per_token) == (5, 25, 5 * 2 * 1024 * 2)
    assert b.state_per_request == 25 * 2 * 1024 * 8 * 256 * 2


# ---- bad input ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["model.embed_tokens_per_layer.weight", "model.layers.5.self_attn.k_proj.weight",
                                  "model.layers.2.router.per_expert_scale", "model.layers.3.layer_scalar",
                                  "model.layers.0.experts.gate_up_proj"])  # fmt: skip
def test_missing_tensor_is_named(ckpt, tmp_path, name):
    d = _copy(ckpt[0], tmp_path / "m", drop=name)
    with pytest.raises(CheckpointError, match=f"tensor {name} is missing"):
        _llm(d)


def test_misshapen_and_unread_tensors_are_named(ckpt, tmp_path):
    name = "model.layers.1.self_attn.q_norm.weight"
    d = _copy(ckpt[0], tmp_path / "m", add={name: torch.ones(17)})
    with pytest.raises(CheckpointError, match=rf"tensor {name} has shape \[17\], expected \[16\]"):
        _llm(d)
    extra = "model.layers.6.self_attn.k_proj.weight"  # a KV-shared layer has no K projection
    d = _copy(ckpt[0], tmp_path / "x", add={extra: torch.zeros(32, 64)})
    with pytest.raises(CheckpointError, match=extra):
        _llm(d)


def test_bidirectional_config_is_refused(ckpt, tmp_path):
    def edit(cfg):
        cfg["use_bidirectional_attention"] = "all"
        return cfg

    d = _copy(ckpt[0], tmp_path / "m", config=edit)
    with pytest.raises(CheckpointError, match="use_bidirectional_attention"):
        _llm(d)


def test_ftw_conversion_loads_and_matches(ckpt, tmp_path):
    """``ft convert``: the routed experts banked as the loader banks them; read back with the GELU(tanh) activation."""
    from freetoken.loader.ftw_convert import convert

    d, _, refs, full = ckpt
    convert(d, tmp_path / "ftw")
    llm = LLM(model=str(tmp_path / "ftw"), device="cpu", dtype="float32", moe_backend="cpu")
    banks = llm.engine.setup.loaded.banks
    assert banks is not None and banks.activation == "gelu_tanh" and banks.num_layers == 8
    r = refs[2]
    assert_close_logits(llm.engine.score(r.prompt + r.tokens), full[2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_per_layer_table_in_host_ram_on_cuda(ckpt, monkeypatch):
    """A PLE table too large for the device's share stays in host RAM; a step's rows are gathered there (such decode
    steps run eagerly) and the results are the same."""
    import freetoken.models.gemma4 as gemma4

    monkeypatch.setattr(gemma4, "PLE_DEVICE_SHARE", 0.0)
    d, _, refs, full = ckpt
    llm = _llm(d, "fused", device="cuda")
    ple = llm.engine.setup.loaded.model.ple
    assert ple is not None and ple.table.device.type == "cpu"
    r = refs[1]
    assert_close_logits(llm.engine.score(r.prompt + r.tokens, chunk=4), full[1])
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    assert llm.generate([r.prompt], params)[0].token_ids == r.tokens
