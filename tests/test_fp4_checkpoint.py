"""Fake FP4 Qwen3-MoE checkpoints in their releases' layouts (``tests/fp4_checkpoints.py``: NVFP4 from ModelOpt and
from compressed-tensors, MXFP4 from compressed-tensors), written by our quantisers: our dequantised weights equal
independent references (the ``compressed-tensors`` package's decompressor; the formats' specifications written out
here), the routed experts stay packed in the pool and the slots (their bytes are the packed bytes), and greedy
tokens of every backend equal the dequantised model's (transformers, float32, the near-tie rule of DESIGN §8)."""

from __future__ import annotations

import pytest
import torch

from fp4_checkpoints import LAYOUTS, layout_format, save_dequantised_twin, save_fp4_checkpoint
from freetoken import LLM, SamplingParams
from freetoken.config import EngineConfig
from freetoken.loader.model_setup import setup_model
from reference import LOGIT_MARGIN, ROUTER_MARGIN, assert_close_logits, fp4_logit_rel, reference_greedy

SEED = 3  # picked: no near ties in any layout (asserted in the fixture)
STEPS = 16
PROMPT_LENGTHS = (5, 11)
BACKENDS = ("fused", "offload", "cpu", "hybrid")
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture(scope="module", params=LAYOUTS)
def fp4_ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    layout = request.param
    d = tmp_path_factory.mktemp(layout)
    tensors = save_fp4_checkpoint(d / "q", layout, seed=SEED)
    ref = save_dequantised_twin(d / "q", d / "f", layout, tensors)
    g = torch.Generator().manual_seed(1000 + SEED)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    runs = [reference_greedy(ref, p, STEPS, top_k=2) for p in prompts]
    for r in runs:  # the near-tie rule: this seed must be free of ties, else pick another
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        assert r.min_router_margin > ROUTER_MARGIN, f"seed has a router near-tie ({r.min_router_margin:.2g})"
    return layout, d / "q", tensors, ref, prompts, runs


def _by_spec(layout: str, tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """Weight ``name`` dequantised from the formats' specifications, independently of ``quant/``: e2m1 nibbles
    (low first) times e8m0 2^(s - 127) per 32 (MXFP4) or e4m3 per 16 times the per-tensor scale (ModelOpt's
    ``weight_scale_2`` multiplies; compressed-tensors' ``weight_global_scale`` divides)."""
    p = name + "_packed" if layout.endswith("-ct") else name
    b = tensors[p].to(torch.int64)
    codes = torch.stack((b & 15, b >> 4), dim=-1).reshape(b.shape[0], -1)
    lut = torch.tensor(E2M1 + [-v for v in E2M1])
    v = lut[codes]
    rows, cols = v.shape
    s = tensors[p.removesuffix("_packed") + "_scale"] if layout.endswith("-ct") else tensors[p + "_scale"]
    if layout == "mxfp4-ct":
        f = torch.pow(2.0, s.to(torch.float32) - 127)
        return (v.reshape(rows, cols // 32, 32) * f[..., None]).reshape(rows, cols)
    s = s.to(torch.float32)
    f = s * tensors[p + "_scale_2"] if layout == "nvfp4" else s / tensors[p.removesuffix("_packed") + "_global_scale"]
    return (v.reshape(rows, cols // 16, 16) * f[..., None]).reshape(rows, cols)


def test_dequantised_weights_equal_references(fp4_ckpt) -> None:
    layout, d, tensors, ref, _, _ = fp4_ckpt
    setup = setup_model(EngineConfig(model=str(d), device="cpu", dtype="float32", moe_backend="cpu"))
    loaded, fmt = setup.loaded, layout_format(layout)
    banks = loaded.banks
    assert banks is not None and banks.fmt == fmt and banks.gate_up.dtype == torch.uint8  # packed in the pool
    D, I, E = 64, 32, banks.num_experts
    assert banks.expert_bytes == fmt.row_bytes(2 * I, D, 4) + fmt.row_bytes(D, I, 4) < 3 * I * D  # < a byte a weight
    for li, layer in enumerate((0, 2)):  # the MoE layers
        gu, dn = banks.dequantized(slice(li * E, (li + 1) * E), torch.float32)
        for e in (0, 5):
            p = f"model.layers.{layer}.mlp.experts.{e}."
            spec = torch.cat([_by_spec(layout, tensors, p + f"{w}_proj.weight") for w in ("gate", "up")])
            torch.testing.assert_close(gu[e], spec, rtol=2.4e-7, atol=0)  # product order, 1/global
            torch.testing.assert_close(dn[e], _by_spec(layout, tensors, p + "down_proj.weight"), rtol=2.4e-7, atol=0)
        experts = ref.model.layers[layer].mlp.experts  # the oracle's model holds the reference's dequantisation
        assert torch.equal(gu, experts.gate_up_proj.detach()) and torch.equal(dn, experts.down_proj.detach())
    if layout == "nvfp4":  # gate and up keep their own per-tensor scales in one bank (each row carries its own)
        p = "model.layers.0.mlp.experts.0."
        assert float(tensors[p + "gate_proj.weight_scale_2"]) != float(tensors[p + "up_proj.weight_scale_2"])
    q = loaded.model.layers[0].attn.w.q
    assert torch.equal(q, ref.model.layers[0].self_attn.q_proj.weight.detach())
    if layout.startswith("nvfp4"):  # attention was NVFP4 too: dequantised at load
        spec = _by_spec(layout, tensors, "model.layers.0.self_attn.q_proj.weight")
        torch.testing.assert_close(q, spec, rtol=2.4e-7, atol=0)
    loaded.backend.close()


def test_nvfp4_equals_the_compressed_tensors_decompressor(fp4_ckpt) -> None:
    layout, _, tensors, ref, _, _ = fp4_ckpt
    if layout != "nvfp4-ct":
        pytest.skip("the compressed-tensors layout only")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    for layer, e in ((0, 1), (2, 7)):
        p = f"model.layers.{layer}.mlp.experts.{e}.down_proj."
        sd = {k: tensors[p + k] for k in ("weight_packed", "weight_scale", "weight_global_scale")}
        theirs = NVFP4PackedCompressor.decompress(sd, scheme)["weight"]  # bfloat16
        ours = ref.model.layers[layer].mlp.experts.down_proj.detach()[e]
        # ours multiplies by 1/global (rounded once in float32) where theirs divides: within a bf16 ulp
        torch.testing.assert_close(ours.to(theirs.dtype), theirs, rtol=2**-7, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_tokens_equal_the_dequantised_model(fp4_ckpt, backend: str) -> None:
    _, d, _, _, prompts, runs = fp4_ckpt
    fill = 0.5 if backend == "hybrid" else None
    llm = LLM(model=str(d), device="cpu", dtype="float32", moe_backend=backend, expert_cache=0.5, fill_fraction=fill)
    for r in runs:
        assert_close_logits(llm.engine.score(r.prompt).cpu(), r.prompt_logits, fp4_logit_rel())
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    for out, r in zip(outs, runs):
        assert out.token_ids == r.tokens
    llm.check_integrity()
    stats = llm.stats()
    if backend in ("offload", "hybrid"):
        assert stats["expert_fills"] > 0
    if backend in ("cpu", "hybrid"):
        assert stats["expert_cpu_runs"] > 0


@pytest.mark.parametrize("backend", ["offload", "hybrid"])
def test_pool_and_slot_bytes_are_packed_bytes(fp4_ckpt, backend: str) -> None:
    """An expert in the pool, in a slot and in a fill is its packed bytes: 2I x D/2 + D x I/2 bytes of e2m1 pairs
    and its scale rows (MXFP4: a byte per 32; NVFP4: a byte per 16 and the row's 4-byte multiplier)."""
    layout, d, _, _, prompts, _ = fp4_ckpt
    D, I = 64, 32
    scales = (
        2 * I * (D // 32) + D * (I // 32) if layout.startswith("mxfp4") else 2 * I * (D // 16 + 4) + D * (I // 16 + 4)
    )
    packed = 2 * I * D // 2 + D * I // 2 + scales
    llm = LLM(model=str(d), device="cpu", dtype="float32", moe_backend=backend, expert_cache=0.5)
    b = llm.engine.setup.loaded.backend
    pool, cache = b.pool, b.cache  # type: ignore[union-attr]
    assert pool.expert_bytes == packed and b.slot_bytes == packed
    assert sum(t[0].numel() * t.element_size() for t in pool.tensors) == packed
    assert sum(t[0].numel() * t.element_size() for t in cache.slots) == packed
    assert all(t.dtype == torch.uint8 for t in cache.slots)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    stats = llm.stats()
    assert stats["expert_fills"] > 0 and stats["pcie_bytes"] == stats["expert_fills"] * packed


def test_ftw_holds_packed_banks(fp4_ckpt, tmp_path) -> None:
    """``ft convert`` banks FP4 experts as they are (packed bytes and scale rows) and the FTW copy serves the same
    tokens as the dequantised model."""
    from freetoken.loader.ftw_convert import convert

    layout, d, _, _, prompts, runs = fp4_ckpt
    manifest = convert(d, tmp_path / "ftw")
    assert manifest.expert_format == layout_format(layout).name
    llm = LLM(model=str(tmp_path / "ftw"), device="cpu", dtype="float32", moe_backend="hybrid", expert_cache=0.5,
              fill_fraction=0.5)  # fmt: skip
    banks = llm.engine.setup.loaded.banks
    assert banks is not None and banks.gate_up.dtype == torch.uint8 and banks.gate_up_scale is not None
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in runs]


def test_activation_scales_are_read_past_once(fp4_ckpt, caplog: pytest.LogCaptureFixture) -> None:
    """Weight-only: ModelOpt's ``input_scale`` tensors are accepted and said once, not refused as unread."""
    import logging

    layout, d, tensors, _, _, _ = fp4_ckpt
    if layout != "nvfp4":
        pytest.skip("ModelOpt's layout ships input_scale")
    assert any(n.endswith("input_scale") for n in tensors)
    with caplog.at_level(logging.INFO, logger="freetoken.checkpoint.weights"):
        setup = setup_model(EngineConfig(model=str(d), device="cpu", dtype="float32", moe_backend="cpu"))
    said = [r.getMessage() for r in caplog.records if "read and ignored" in r.getMessage()]
    assert len(said) == 1 and "input_scale" in said[0] and "weight-only" in said[0]
    setup.loaded.backend.close()
