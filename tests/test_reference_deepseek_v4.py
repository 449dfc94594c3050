"""DeepSeek-V4 (``DeepseekV4ForCausalLM``) against transformers' forward on a tiny random checkpoint (CPU, fp32;
``tiny_dsv4.py``: every attention kind, token-id routed layers, 4 residual streams, the MTP block present) through the
fused, offload, cpu and hybrid expert backends: prompt logits, the whole sequence scored in chunks that cut windows
and compression windows, one token a step (decode), layer-major; greedy tokens of a batch decoding past the window;
prefix reuse after an edit (the compressed rows come from the shared pages); and the load refusals by name."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.checkpoint.errors import CheckpointError
from reference import (
    LOGIT_MARGIN,
    ROUTER_MARGIN,
    assert_close_logits,
    check_scoring,
    reference_greedy,
    torch_ops,
)
from tiny_dsv4 import save_dsv4_checkpoint

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

SEED = 0
PROMPT_LENGTHS = (5, 13, 29)
STEPS = 16  # the longest context reaches 45 tokens: 11 CSA entries (3 kept), 5 HCA entries, windows of 8
BACKENDS = [("fused", None, None), ("offload", 0.5, None), ("cpu", None, None), ("hybrid", 0.5, 0.5)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
INDEX_MARGIN = 1e-4


@torch.no_grad()
def margins(model: Any, ids: list[int]) -> tuple[float, float]:
    """(router, indexer) near-tie margins of transformers' forward over ``ids`` (DESIGN §8): the k-th minus the
    (k+1)-th biased score of every score-routed token; the last kept minus the first dropped indexer score of every
    query that sees more entries than it keeps."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Indexer, DeepseekV4TopKRouter

    router, index = float("inf"), float("inf")
    hooks = []

    def on_router(mod: Any, args: Any, out: Any) -> None:
        nonlocal router
        scores = mod.score_fn(out[0].float()) + mod.e_score_correction_bias
        top = scores.topk(mod.top_k + 1, dim=-1).values
        router = min(router, float((top[:, -2] - top[:, -1]).min()))

    seen: list[torch.Tensor] = []
    topk = torch.Tensor.topk

    def record(self: torch.Tensor, *a: Any, **kw: Any) -> Any:
        if self.dim() == 3 and self.shape[1] == len(ids) and recording:
            seen.append(self.clone())
        return topk(self, *a, **kw)

    for m in model.modules():
        if isinstance(m, DeepseekV4TopKRouter):
            hooks.append(m.register_forward_hook(on_router))
    recording = False

    def pre(mod: Any, args: Any) -> None:
        nonlocal recording
        recording = True

    def post(mod: Any, args: Any, out: Any) -> None:
        nonlocal recording
        recording = False

    for m in model.modules():
        if isinstance(m, DeepseekV4Indexer):
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    torch.Tensor.topk = record  # type: ignore[method-assign]
    try:
        with torch_ops(model):
            model(torch.tensor([ids]), use_cache=False)
    finally:
        torch.Tensor.topk = topk  # type: ignore[method-assign]
        for h in hooks:
            h.remove()
    k = model.config.index_topk
    for scores in seen:
        for row in scores[0]:
            ok = row[torch.isfinite(row)].sort(descending=True).values
            if ok.numel() > k:
                index = min(index, float(ok[k - 1] - ok[k]) / max(1.0, float(ok.abs().max())))
    return router, index


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("dsv4")
    model = save_dsv4_checkpoint(d, SEED)
    g = torch.Generator().manual_seed(1000 + SEED)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    refs = [reference_greedy(model, p, STEPS) for p in prompts]
    for r in refs:  # the near-tie rule: this seed must be free of ties, else pick another seed
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        router, index = margins(model, r.prompt + r.tokens)
        assert router > ROUTER_MARGIN, f"seed has a router near-tie ({router:.2g})"
        assert index > INDEX_MARGIN, f"seed has an indexer near-tie ({index:.2g})"
    with torch.no_grad(), torch_ops(model):  # logits at every position of prompt + continuation
        full = [model(torch.tensor([r.prompt + r.tokens]), use_cache=False).logits[0].float() for r in refs]
    return d, model, refs, full


def _llm(d: Path, backend: str = "fused", cache: float | None = None, fill: float | None = None, **kw: Any) -> LLM:
    return LLM(model=str(d), device="cpu", dtype="float32", moe_backend=backend, expert_cache=cache, fill_fraction=fill,
               **kw)  # fmt: skip


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_logits_and_greedy_tokens_match(ckpt, backend, cache, fill):
    d, _, refs, full = ckpt
    llm = _llm(d, backend, cache, fill)
    # chunks of 5 cut windows and compression windows; chunks of 1: every step a decode step
    check_scoring(llm, refs, full, chunks=(5, 1), layer_major=lambda n: [3, 11, n - 14])
    outs = llm.generate([r.prompt for r in refs], PARAMS)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()


@pytest.mark.parametrize("S,every,at,resume", [(8, 8, 29, 24), (4, 4, 30, 28)])  # an HCA window's edge (24), or inside
def test_prefix_reuse_after_an_edit(ckpt, freetoken_env, S, every, at, resume):
    """An edit in the middle of a context: the request resumes from the deepest state checkpoint before the edit's page
    (a grid every ``every`` tokens: the tiny model has no anchors): the window keys and the raw rows of a compression
    window the checkpoint cuts come from its rings, the compressed entries from the shared pages; the suffix is
    prefilled, and both requests continue as transformers does."""
    d, model, _, _ = ckpt
    freetoken_env("FREETOKEN_DEBUG", "1")  # every cache checked after every step
    history = torch.randint(3, 512, (40,), generator=torch.Generator().manual_seed(77)).tolist()
    edited = list(history)
    edited[at] = (edited[at] + 1) % 500 + 3
    llm = _llm(d, page_size=S, state_checkpoint_every=every)
    first = llm.generate([history], PARAMS)[0].token_ids
    before = llm.stats()
    out = llm.generate([edited], PARAMS)[0].token_ids
    after = llm.stats()
    assert after["state_restores"] == before["state_restores"] + 1
    assert after["prefix_tokens_reused"] - before["prefix_tokens_reused"] == resume
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(edited) - resume
    for ids, got in ((history, first), (edited, out)):
        ref = reference_greedy(model, ids, STEPS)
        assert ref.min_logit_margin > LOGIT_MARGIN and got == ref.tokens
    llm.check_integrity()


def test_the_next_turn_resumes_after_the_reply(ckpt):
    """The reply (past the window and several compression windows) is checkpointed when the request finishes; the next
    turn re-prefills its new suffix and less than a page, and continues as transformers does."""
    d, model, _, _ = ckpt
    first = torch.randint(3, 512, (13,), generator=torch.Generator().manual_seed(5)).tolist()
    llm = _llm(d, page_size=4)
    reply = llm.generate([first], PARAMS)[0].token_ids
    prompt = first + reply + torch.randint(3, 512, (6,), generator=torch.Generator().manual_seed(6)).tolist()
    before = llm.stats()
    out = llm.generate([prompt], PARAMS)[0].token_ids
    refilled = llm.stats()["prefill_tokens"] - before["prefill_tokens"]
    assert refilled <= 6 + 4, refilled
    ref = reference_greedy(model, prompt, STEPS)
    assert ref.min_logit_margin > LOGIT_MARGIN and out == ref.tokens
    llm.check_integrity()


def test_mtp_block_is_skipped_and_said_once(ckpt, caplog):
    d, _, refs, full = ckpt
    with caplog.at_level(logging.INFO, logger="freetoken.loader.deepseek_v4_build"):
        llm = _llm(d, "cpu")
    said = [r for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert len(said) == 1 and "4 tensors" in said[0].getMessage()
    assert_close_logits(llm.engine.score(refs[0].prompt), refs[0].prompt_logits)


def test_hash_layers_route_by_token_id(ckpt):
    """The first two layers' experts are ``tid2eid[input_ids]`` whatever the hidden state; the others route by score."""
    d, model, _, _ = ckpt
    llm = _llm(d)
    layers = llm.engine.setup.loaded.model.layers
    ids = torch.tensor([7, 300, 7])
    x = torch.randn((3, 64), generator=torch.Generator().manual_seed(3))
    for i, layer in enumerate(layers):
        experts, w = layer.ffn.choose(x, ids)
        table = model.model.layers[i].mlp.gate
        if i < 2:
            assert torch.equal(experts, table.tid2eid[ids])
        else:
            assert layer.ffn.tid2eid is None
        torch.testing.assert_close(w.sum(dim=-1), torch.full((3,), 1.5))  # renormalised, times the scaling factor


def _edit_config(d: Path, **changes: Any) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(d: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    edit(tensors)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture()
def fresh(ckpt, tmp_path):
    import shutil

    d = tmp_path / "ck"
    shutil.copytree(ckpt[0], d)
    return d


def _table(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return t["model.layers.0.ffn.gate.tid2eid"]


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda t: t.pop("model.layers.2.attn.wkv.weight"), r"model\.layers\.2\.attn\.wkv\.weight"),
        (lambda t: t.update({"model.layers.1.attn.wo_b.weight": torch.zeros(64, 31)}),
         r"model\.layers\.1\.attn\.wo_b\.weight has shape \[64, 31\]"),
        (lambda t: _table(t).__setitem__((5, 1), 8), r"tid2eid routes to expert 8, outside \[0, 8\)"),
        (lambda t: t.update({"model.layers.0.ffn.gate.tid2eid": _table(t)[:500].clone()}),
         r"tid2eid has 500 rows, shorter than the vocabulary \(512\)"),
    ],
    ids=["missing", "misshapen", "tid2eid-expert", "tid2eid-short"],
)  # fmt: skip
def test_bad_tensors_are_refused_by_name(fresh, edit, match):
    _edit_tensors(fresh, edit)
    with pytest.raises(CheckpointError, match=match):
        _llm(fresh)


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"hc_mult": 2}, r"hc_mult 2 .* residual-stream settings disagree with the weights"),
        ({"compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16}},
         r"has 8 rows, but the compression rate in config.json is 16"),
        ({"compress_rates": {"compressed_sparse_attention": 0, "heavily_compressed_attention": 8}},
         r"compression rate 0 of compressed_sparse_attention is not implemented"),
        ({"layer_types": None, "compress_ratios": [128, 4, 0, 16]}, r"compress_ratios \[16\] .* does not implement"),
        ({"swiglu_limit": 7.0}, r"swiglu_limit is 7.0"),
        ({"scoring_func": "relu"}, r"scoring_func 'relu'"),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                  "expert_dtype": "fp8"}},
         r"expert_dtype 'fp8'.* FP8 routed experts are not implemented"),
    ],
    ids=["hc_mult", "rate-vs-weights", "rate-zero", "legacy-ratio", "swiglu_limit", "scoring", "quantized"],
)  # fmt: skip
def test_bad_settings_are_refused_by_name(fresh, changes, match):
    """Refused at load, and (what config.json alone shows) before a download (``loader/hub_support.py``)."""
    from freetoken.loader.hub_support import support_of

    _edit_config(fresh, **changes)
    with pytest.raises(CheckpointError, match=match):
        _llm(fresh)
    if "rows" not in match and "hc_mult" not in match:  # those two need the weights
        s = support_of(fresh)
        assert not s.served and re.search(match, s.reason), s.reason


def test_served_from_config_alone(ckpt):
    from freetoken.loader.hub_support import support_of

    s = support_of(ckpt[0])
    assert s.served and s.architecture == "DeepseekV4ForCausalLM", s.reason


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_moe_layer_matches_transformers_where_the_clamp_binds(ckpt, backend, cache, fill):
    """A token-id routed layer (0) and a score-routed one (2), MoE part alone, on inputs wide enough that the
    clamped SiLU binds (routed and shared experts): transformers' ``DeepseekV4SparseMoeBlock`` is the oracle."""
    d, model, _, _ = ckpt
    llm = _llm(d, backend, cache, fill)
    ids = torch.randint(3, 512, (12,), generator=torch.Generator().manual_seed(8))
    x = torch.randn((12, 64), generator=torch.Generator().manual_seed(7)) * 40.0
    for i in (0, 2):
        moe = llm.engine.setup.loaded.model.layers[i].ffn
        block = model.model.layers[i].mlp
        with torch.no_grad():
            want = block(x[None], input_ids=ids[None])[0]
            gu = torch.einsum("td,efd->tef", x, block.experts.gate_up_proj)
        assert float(gu[..., :32].max()) > 10.0 and float(gu[..., 32:].abs().max()) > 10.0  # the clamps bind
        llm.engine.setup.loaded.backend.begin_step(12, False)
        got = moe.forward_ids(x, ids)
        torch.testing.assert_close(got, want, atol=1e-4 * max(1.0, float(want.abs().max())), rtol=0)


def test_kv_rows_and_plan_follow_the_config(ckpt):
    """A compressed layer keeps one entry row per m tokens in the KV pool (ceil(S / m) a page); every layer keeps its
    window keys (W of them) and a compressed layer the raw rows its open windows pool (m on HCA, 2 m on CSA) in rings
    of each request's state slot. The plan's KV and state bytes are those tensors', and the formula from the config
    alone (per layer: the window key; the compressor's raw kv and gate, the indexer's raw kv and gate; the entry and
    the indexer's key per m tokens); a layer-major pass keeps hc_mult streams a token."""
    from freetoken.checkpoint.hf_config import load_hf_config
    from freetoken.memory.sizes import model_bytes

    d = ckpt[0]
    hf = load_hf_config(d)
    S = 8
    llm = _llm(d, "hybrid", page_size=S, max_model_len=64, max_running_requests=2)
    eng = llm.engine
    b = model_bytes(hf, 4)
    assert b.kv_layers == len(eng.kv.k) == hf.num_layers
    hd, di, rates, W = hf.raw["head_dim"], hf.raw["index_head_dim"], hf.raw["compress_rates"], hf.raw["sliding_window"]
    raw = {"heavily_compressed_attention": 2 * hd, "compressed_sparse_attention": 2 * (2 * hd) + 2 * (2 * di)}
    span = {"heavily_compressed_attention": 1, "compressed_sparse_attention": 2}  # windows a raw row waits for
    entry = {"heavily_compressed_attention": hd, "compressed_sparse_attention": hd + di}  # per m tokens
    kinds = hf.raw["layer_types"]
    per_page = [-(-S // rates[k]) if k in entry else 0 for k in kinds]
    assert per_page == [1, 2, 0, 2] and all(t.numel() == 0 for t in eng.kv.k + eng.kv.v)
    n_pages = eng.kv.num_pages
    assert [tuple(e.shape) for e in eng.kv.e] == [(n * n_pages, entry.get(k, 0)) for k, n in zip(kinds, per_page)]
    page = sum(n * entry.get(k, 0) for k, n in zip(kinds, per_page)) * 4
    kv = sum(t.numel() * t.element_size() for t in eng.kv.k + eng.kv.v + eng.kv.e)
    assert page == eng.kv.page_bytes == b.page_bytes(S) == 896
    assert kv == page * n_pages == eng.memory.plan.kv_bytes
    rings = [r for k in kinds for r in ((W, hd), (span[k] * rates[k], raw[k]) if k in raw else (0, 0))]
    assert rings == [(8, 32), (8, 64), (8, 32), (8, 192), (8, 32), (0, 0), (8, 32), (8, 192)]
    assert [tuple(r.shape[1:]) for r in eng.states.rows] == rings
    slot = sum(n * w for n, w in rings) * 4
    assert b.state_per_request == slot == eng.states.flat[0, 0].nbytes
    slots = eng.states.num_slots + eng.states.num_checkpoints
    assert eng.states.bytes == eng.memory.plan.states_bytes == slot * slots
    assert b.activations_per_token == 4 * 64 * 4


def test_ftw_conversion_serves_the_same_logits(ckpt, tmp_path):
    from freetoken.loader.ftw_convert import convert

    d, _, refs, full = ckpt
    convert(d, tmp_path / "ftw")
    llm = LLM(model=str(tmp_path / "ftw"), device="cpu", dtype="float32", moe_backend="cpu")
    banks = llm.engine.setup.loaded.banks
    assert banks is not None and banks.activation == "dsv4"
    r = refs[2]
    assert_close_logits(llm.engine.score(r.prompt + r.tokens), full[2])


def test_yarn_compress_rope_matches(tmp_path):
    """The compressed layers' rope under YaRN (as DeepSeek-V4-Flash ships it: without YaRN's magnitude scale), the
    sliding layers' plain: logits of a whole sequence and of it in chunks."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
            "beta_slow": 1}  # fmt: skip
    model = save_dsv4_checkpoint(tmp_path, SEED, rope_parameters=yarn, max_position_embeddings=256)
    assert model.config.rope_parameters["compress"]["rope_type"] == "yarn"
    ids = torch.randint(3, 512, (45,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad(), torch_ops(model):
        ref = model(torch.tensor([ids]), use_cache=False).logits[0].float()
    llm = _llm(tmp_path)
    assert_close_logits(llm.engine.score(ids), ref)
    assert_close_logits(llm.engine.score(ids, chunk=7), ref)


def test_preempted_requests_keep_their_tokens(ckpt, freetoken_env):
    """A KV pool too small for the batch: requests are preempted and resumed (their rows recomputed or reused from
    the tree), and the tokens do not change."""
    d, _, refs, _ = ckpt
    freetoken_env("FREETOKEN_DEBUG", "1")
    llm = _llm(d, page_size=4, kv_pages=14, max_batched_tokens=16)
    outs = llm.generate([r.prompt for r in refs], PARAMS)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()



def test_deepseek_names_as_shipped(fresh, ckpt):
    """DeepSeek's own names (no ``model.`` prefix; ``embed.weight``, ``norm.weight``, ``hc_head_fn``), as the
    released checkpoint has them: read alike."""
    _, _, refs, _ = ckpt

    def bare(t: dict[str, torch.Tensor]) -> None:
        for name in list(t):
            new = name.removeprefix("model.").replace("embed_tokens.", "embed.").replace("hc_head.hc_", "hc_head_")
            t[new] = t.pop(name)

    _edit_tensors(fresh, bare)
    from safetensors import safe_open

    with safe_open(fresh / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {"embed.weight", "norm.weight", "hc_head_fn", "layers.0.ffn.gate.tid2eid"} <= names
    llm = _llm(fresh, "cpu")
    assert_close_logits(llm.engine.score(refs[1].prompt), refs[1].prompt_logits)


@pytest.mark.gpu
@pytest.mark.parametrize("backend,cache,fill", [("fused", None, None), ("hybrid", 0.5, 0.5)])
def test_cuda_logits_and_greedy_tokens_match(ckpt, backend, cache, fill):
    """The same on a GPU (fp32): the torch attention on CUDA, the Triton expert GEMMs under the dsv4 activation, decode
    steps through the step graphs (``layers/v4_decode.py``; graphed == eager: ``test_dsv4_step_graph.py``)."""
    d, _, refs, full = ckpt
    llm = LLM(model=str(d), device="cuda", dtype="float32", moe_backend=backend, expert_cache=cache, fill_fraction=fill)
    for r, ref in zip(refs, full):
        assert_close_logits(llm.engine.score(r.prompt), r.prompt_logits)
        assert_close_logits(llm.engine.score(r.prompt + r.tokens, chunk=5), ref)
    outs = llm.generate([r.prompt for r in refs], PARAMS)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()
