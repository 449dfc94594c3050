"""DeepSeek-V4 in the layout DeepSeek releases (``quant/dsv4_layout.py``; the fake: ``dsv4_released.py``, written from
the formats' specifications): FP8 block weights dequantised at load equal the specification's values; the MXFP4
routed experts sit in the host pool and in the slots byte for byte as stored; greedy tokens of the fused, offload,
cpu and hybrid backends equal transformers' forward on the dequantised model (the near-tie rule); what the layout
lacks is refused naming the tensor or the field."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from dsv4_released import EXPERT, fp4_dequantize, fp8_dequantize, load_twin, write_released
from freetoken import LLM, SamplingParams
from freetoken.checkpoint.errors import CheckpointError
from reference import (
    INDEX_MARGIN,
    LOGIT_MARGIN,
    ROUTER_MARGIN,
    assert_close_logits,
    fp4_logit_rel,
    margins,
    reference_greedy,
)
from tiny_dsv4 import save_dsv4_checkpoint

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

SEED = 0
STEPS = 12
PARAMS = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
BACKENDS = [("fused", None, None), ("offload", 0.5, None), ("cpu", None, None), ("hybrid", 0.5, 0.5)]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("dsv4q")
    save_dsv4_checkpoint(root / "float", SEED)
    tensors = write_released(root / "float", root / "released", root / "twin")
    twin = load_twin(root / "twin")
    g = torch.Generator().manual_seed(2000 + SEED)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (6, 17)]
    refs = [reference_greedy(twin, p, STEPS) for p in prompts]
    for r in refs:  # the near-tie rule on the dequantised model
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        router, index = margins(twin, r.prompt + r.tokens)
        assert router > ROUTER_MARGIN and index > INDEX_MARGIN, f"seed has a near-tie ({router:.2g}, {index:.2g})"
    return root / "released", tensors, refs


def _llm(d: Path, backend: str = "cpu", cache: float | None = None, fill: float | None = None, **kw: Any) -> LLM:
    return LLM(model=str(d), device="cpu", dtype="float32", moe_backend=backend, expert_cache=cache, fill_fraction=fill,
               **kw)  # fmt: skip


def test_the_fake_is_the_released_layout(released):
    _, t, _ = released
    assert t["layers.0.ffn.experts.3.w1.weight"].dtype == torch.int8
    assert t["layers.0.ffn.experts.3.w1.weight"].shape == (32, 32)  # [I, D / 2]
    assert t["layers.0.ffn.experts.3.w2.scale"].dtype == torch.float8_e8m0fnu
    assert t["layers.0.ffn.experts.3.w2.scale"].shape == (64, 1)  # [D, I / 32]
    assert t["layers.1.attn.wq_b.weight"].dtype == torch.float8_e4m3fn
    assert t["layers.1.attn.wq_b.scale"].shape == (1, 1)  # [ceil(128 / 128), ceil(32 / 128)]
    assert t["layers.1.attn.compressor.wkv.weight"].dtype == torch.bfloat16  # no scale beside it
    assert "layers.1.attn.compressor.wkv.scale" not in t
    assert "layers.1.attn.kv_norm.weight" in t and "layers.1.attn.compressor.norm.weight" in t  # DeepSeek's names


def test_transformers_dequantising_load_is_the_twin(released):
    """transformers reads the fake as the release (``FineGrainedFP8Config(dequantize=True)``: DeepSeek's ``.scale``
    names, int8 FP4 experts, e8m0 scales): no tensor missing or left over, and every weight equals the twin's."""
    import transformers as tf

    d, _, _ = released
    q, info = tf.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, output_loading_info=True, quantization_config=tf.FineGrainedFP8Config(dequantize=True)
    )
    assert not any(info.values()), info
    twin = load_twin(d.parent / "twin").state_dict()
    got = q.state_dict()
    assert set(got) == set(twin)
    assert [k for k in twin if not torch.equal(got[k].float(), twin[k].float())] == []


def test_dequantised_weights_equal_the_specification(released):
    """Every FP8 weight the model holds is the specification's dequantisation (exact in float32), and the layout's
    reference dequantises the experts the same."""
    from freetoken.quant.dsv4_layout import Dsv4Layout

    d, t, _ = released
    model = _llm(d).engine.setup.loaded.model
    for i, layer in enumerate(model.layers):
        w, p = layer.attn.w, f"layers.{i}.attn."
        for field in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b"):
            want = fp8_dequantize(t[p + field + ".weight"], t[p + field + ".scale"])
            assert torch.equal(getattr(w, field), want), f"{p}{field}"
        sh, s = layer.ffn.shared_mlp, f"layers.{i}.ffn.shared_experts."
        for field, n in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
            assert torch.equal(getattr(sh, field), fp8_dequantize(t[s + n + ".weight"], t[s + n + ".scale"]))
    layout = Dsv4Layout()
    for name in (n for n in t if EXPERT.search(n)):
        q, s = t[name], t[name.removesuffix(".weight") + ".scale"]
        got = layout.dequantize(q, layout.bank_scale(s), torch.float32)
        assert torch.equal(got, fp4_dequantize(q, s)), name


def _packed(t: dict[str, torch.Tensor], layer: int, e: int) -> tuple[torch.Tensor, ...]:
    p = f"layers.{layer}.ffn.experts.{e}."
    b = {k: t[p + k].view(torch.uint8) for k in ("w1.weight", "w3.weight", "w2.weight", "w1.scale", "w3.scale",
                                                 "w2.scale")}  # fmt: skip
    return (torch.cat((b["w1.weight"], b["w3.weight"])), b["w2.weight"], torch.cat((b["w1.scale"], b["w3.scale"])),
            b["w2.scale"])  # fmt: skip


def test_pool_and_slots_hold_the_packed_bytes(released):
    """The host pool's rows and every filled slot are the checkpoint's bytes (gate rows, then up rows)."""
    d, t, refs = released
    llm = _llm(d, "offload", 0.5)
    backend = llm.engine.setup.loaded.backend
    banks = llm.engine.setup.loaded.banks
    assert banks.fmt.name == "mxfp4" and banks.activation == "dsv4"
    E = banks.num_experts
    for eid in range(banks.num_layers * E):
        for got, want in zip(backend.pool.tensors, _packed(t, eid // E, eid % E)):
            assert torch.equal(got[eid], want), eid
    llm.generate([refs[0].prompt], PARAMS)
    resident = backend.cache.resident()
    assert resident
    for eid, slot in resident.items():
        for got, want in zip(backend.cache.slots, _packed(t, eid // E, eid % E)):
            assert torch.equal(got[slot].cpu(), want), eid


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_greedy_tokens_match_the_dequantised_model(released, backend, cache, fill):
    d, _, refs = released
    llm = _llm(d, backend, cache, fill)
    for r in refs:
        assert_close_logits(llm.engine.score(r.prompt), r.prompt_logits, fp4_logit_rel())
    outs = llm.generate([r.prompt for r in refs], PARAMS)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()


@pytest.fixture()
def fresh(released, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(released[0], d)
    return d


def _edit(d: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(d / "model.safetensors")
    edit(tensors)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def _fp8_expert(t: dict[str, torch.Tensor]) -> None:
    n = "layers.2.ffn.experts.5.w2"
    t[n + ".weight"] = torch.zeros(64, 32, dtype=torch.float8_e4m3fn)
    t[n + ".scale"] = torch.ones(1, 1)


def _bf16_expert(t: dict[str, torch.Tensor]) -> None:
    n = "layers.3.ffn.experts.0.w1"
    t[n + ".weight"] = torch.zeros(32, 64, dtype=torch.bfloat16)
    del t[n + ".scale"]


E1 = "layers.1.ffn.experts.4.w3"


@pytest.mark.parametrize(
    "edit,match",
    [
        (_fp8_expert, r"routed expert layers\.2\.ffn\.experts\.5\.w2\.weight is FP8"),
        (lambda t: t.update({E1 + ".scale": t[E1 + ".scale"][:, :1].clone()}),
         r"scale tensor layers\.1\.ffn\.experts\.4\.w3\.scale has shape \[32, 1\]"),
        (lambda t: t.update({E1 + ".scale": torch.ones(32, 2)}),
         r"scale tensor layers\.1\.ffn\.experts\.4\.w3\.scale is F32: mxfp4 expert scales are e8m0"),
        (lambda t: t.update({"layers.0.attn.wkv.scale": t["layers.0.attn.wkv.scale"].expand(2, 1).clone()}),
         r"scale tensor layers\.0\.attn\.wkv\.scale has shape \[2, 1\]"),
        (lambda t: t.pop("layers.2.attn.wo_b.scale"), r"layers\.2\.attn\.wo_b\.scale is missing"),
        (lambda t: t.update({"layers.0.attn.compressor.wkv.scale": torch.ones(1, 1)}),
         r"layers\.0\.attn\.compressor\.wkv\.scale sits beside layers\.0\.attn\.compressor\.wkv\.weight"),
        (_bf16_expert, r"routed experts mix formats"),
    ],
    ids=["fp8-expert", "scale-shape", "scale-dtype", "fp8-scale-shape", "scale-missing", "stray-scale", "mixed"],
)  # fmt: skip
def test_bad_tensors_are_refused_by_name(fresh, edit, match):
    _edit(fresh, edit)
    with pytest.raises(CheckpointError, match=match):
        _llm(fresh)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"weight_block_size": [64, 64]}, r"weight_block_size \[64, 64\]: only \[128, 128\] is implemented"),
        ({"expert_dtype": "fp8"}, r"expert_dtype 'fp8'.*FP8 routed experts are not implemented"),
        ({"fmt": "e5m2"}, r"'e5m2'.*only e4m3"),
        ({"quant_method": "mxfp4"}, r"quantization_config uses 'mxfp4'"),
    ],
    ids=["block", "fp8-experts", "e5m2", "method"],
)  # fmt: skip
def test_bad_settings_are_refused_by_name(fresh, change, match):
    """Refused at load, and from config.json alone (``loader/hub_support.py``)."""
    from freetoken.loader.hub_support import support_of

    cfg = json.loads((fresh / "config.json").read_text())
    cfg["quantization_config"] = {**cfg["quantization_config"], **change}
    (fresh / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        _llm(fresh)
    s = support_of(fresh)
    assert not s.served and re.search(match, s.reason), s.reason


def test_served_from_config_alone(released):
    from freetoken.loader.hub_support import support_of

    s = support_of(released[0])
    assert s.served and s.format.endswith("+ mxfp4 experts"), (s.reason, s.format)


def test_ftw_conversion_keeps_the_packed_experts(released, tmp_path):
    """``ft convert``: the banks written are the pool's MXFP4 bytes; the FP8 weights are copied with their scales
    and dequantised at load as before: the same logits."""
    from freetoken.loader.ftw_convert import convert

    d, t, refs = released
    m = convert(d, tmp_path / "ftw")
    assert m.expert_format == "mxfp4"
    llm = _llm(tmp_path / "ftw")
    banks = llm.engine.setup.loaded.banks
    assert banks.fmt.name == "mxfp4" and banks.activation == "dsv4"
    assert all(torch.equal(got[9], want) for got, want in zip(banks.tensors(), _packed(t, 1, 1)))
    assert_close_logits(llm.engine.score(refs[1].prompt), refs[1].prompt_logits, fp4_logit_rel())


@pytest.mark.gpu
@pytest.mark.parametrize("backend,cache,fill", [("fused", None, None), ("hybrid", 0.5, 0.5)])
def test_cuda_greedy_tokens_match_the_dequantised_model(released, backend, cache, fill):
    """On a GPU (fp32): the MXFP4 slots through the FP4 grouped GEMM under the dsv4 activation, the pool's misses
    through the CPU kernel (hybrid), the FP8 weights dequantised on the device."""
    d, t, refs = released
    llm = LLM(model=str(d), device="cuda", dtype="float32", moe_backend=backend, expert_cache=cache, fill_fraction=fill)
    for r in refs:
        assert_close_logits(llm.engine.score(r.prompt), r.prompt_logits, fp4_logit_rel())
    outs = llm.generate([r.prompt for r in refs], PARAMS)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()
    if backend == "hybrid":
        backend_ = llm.engine.setup.loaded.backend
        E = llm.engine.setup.loaded.banks.num_experts
        for eid, slot in backend_.cache.resident().items():
            for got, want in zip(backend_.cache.slots, _packed(t, eid // E, eid % E)):
                assert torch.equal(got[slot].cpu(), want), eid


def test_float_block_scales_read_alike(fresh, released):
    """``scale_fmt: float``: the FP8 weights' block scales stored as float32 values instead of e8m0 bytes (the routed
    experts' stay e8m0): the same model."""
    _, _, refs = released

    def widen(t: dict[str, torch.Tensor]) -> None:
        for name in [n for n in t if n.endswith(".scale") and not EXPERT.search(n.removesuffix(".scale") + ".weight")]:
            t[name] = torch.pow(2.0, t[name].view(torch.uint8).float() - 127)

    _edit(fresh, widen)
    cfg = json.loads((fresh / "config.json").read_text())
    cfg["quantization_config"]["scale_fmt"] = "float"
    (fresh / "config.json").write_text(json.dumps(cfg))
    llm = _llm(fresh)
    assert_close_logits(llm.engine.score(refs[1].prompt), refs[1].prompt_logits, fp4_logit_rel())
