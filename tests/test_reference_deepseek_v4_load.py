"""Loading DeepSeek-V4's tiny random checkpoint (``tiny_dsv4.py``): bad tensors and settings refused by name (at
load, and from config.json alone before a download), DeepSeek's own tensor names as shipped, the FTW conversion, and
the KV rows and memory plan following the config."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from freetoken import LLM
from freetoken.checkpoint.errors import CheckpointError
from reference import assert_close_logits
from tiny_dsv4 import dsv4_llm, reference_case

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return reference_case(tmp_path_factory.mktemp("dsv4"))


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
        dsv4_llm(fresh)


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
        dsv4_llm(fresh)
    if "rows" not in match and "hc_mult" not in match:  # those two need the weights
        s = support_of(fresh)
        assert not s.served and re.search(match, s.reason), s.reason


def test_served_from_config_alone(ckpt):
    from freetoken.loader.hub_support import support_of

    s = support_of(ckpt[0])
    assert s.served and s.architecture == "DeepseekV4ForCausalLM", s.reason


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
    llm = dsv4_llm(d, "hybrid", page_size=S, max_model_len=64, max_running_requests=2)
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
    llm = dsv4_llm(fresh, "cpu")
    assert_close_logits(llm.engine.score(refs[1].prompt), refs[1].prompt_logits)
