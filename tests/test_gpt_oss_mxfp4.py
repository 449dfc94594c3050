"""gpt-oss as shipped: routed experts in MXFP4 (``*_blocks`` / ``*_scales``, ``tests/gpt_oss_mxfp4.py``), a tiny fake
checkpoint quantised by a writer from the OCP MX specification (checked on a hand-computed block). The engine banks
the experts packed, without dequantising (pool, slot and fill bytes are the packed bytes); their dequantisation
equals transformers' own ``Mxfp4Config(dequantize=True)`` load, which runs on the CPU and is the oracle: greedy
tokens of ``fused``, ``offload``, ``cpu`` and ``hybrid`` at a small cache equal its (fp32) forward's. Bad input is
refused at load naming the tensor: scales of the wrong shape or dtype, a block size MXFP4 does not have, experts
mixing formats; scales typed float8_e8m0fnu bank the same bytes as uint8 ones."""

from __future__ import annotations

import shutil

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.checkpoint.errors import CheckpointError
from freetoken.quant import MXFP4
from gpt_oss_mxfp4 import load_dequantised, rewrite, spec_dequantize, spec_quantize, write_mxfp4_checkpoint
from reference import LOGIT_MARGIN, ROUTER_MARGIN, assert_close_logits, fp4_logit_rel, reference_greedy
from tiny_models import gpt_oss_model

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

SEED = 0
STEPS = 12  # past the 8-token window
PROMPT_LENGTHS = (5, 11)
BACKENDS = [("fused", None, None), ("offload", 0.5, None), ("cpu", None, None), ("hybrid", 0.5, 0.5)]
E, D, I = 8, 64, 32  # the tiny gpt-oss (``tiny_models.make_config("gpt_oss")``)
PACKED = 2 * I * D // 2 + D * I // 2 + 2 * I * (D // 32) + D * (I // 32)  # an expert: e2m1 pairs + e8m0 bytes


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    tensors = write_mxfp4_checkpoint(gpt_oss_model(SEED), d)
    ref = load_dequantised(d)
    g = torch.Generator().manual_seed(1000 + SEED)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    runs = [reference_greedy(ref, p, STEPS, top_k=2) for p in prompts]
    for r in runs:  # the near-tie rule: this seed must be free of ties, else pick another
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        assert r.min_router_margin > ROUTER_MARGIN, f"seed has a router near-tie ({r.min_router_margin:.2g})"
    return d, tensors, ref, prompts, runs


def _llm(d, backend: str = "cpu", cache: float | None = None, fill: float | None = None) -> LLM:
    return LLM(model=str(d), device="cpu", dtype="float32", moe_backend=backend, expert_cache=cache, fill_fraction=fill)


def test_spec_writer_on_a_hand_computed_block() -> None:
    """amax 3.0: exponent floor(log2 3) - 2 = -1 (e8m0 byte 126); x * 2 -> 6, 1.5, -2, 0, 1.75 (a tie: the even code,
    2.0), -0.6 (-> -0.5), 5.8 (-> 6); codes 7, 3, 12, 0, 4, 9, 7, 0, two a byte, low nibble first."""
    block = torch.zeros(1, 32)
    block[0, :7] = torch.tensor([3.0, 0.75, -1.0, 0.0, 0.875, -0.3, 2.9])
    blocks, scales = spec_quantize(block)
    assert scales.tolist() == [[126]]
    assert blocks.tolist() == [[[0x37, 0x0C, 0x94, 0x07] + [0] * 12]]
    want = torch.zeros(1, 32)
    want[0, :7] = torch.tensor([3.0, 0.75, -1.0, 0.0, 1.0, -0.25, 3.0])
    assert torch.equal(spec_dequantize(blocks, scales), want)
    assert torch.equal(MXFP4.dequantize(blocks.reshape(1, 16), scales, torch.float32), want)  # the engine's reference


def test_experts_are_banked_packed_and_equal_transformers_dequantisation(ckpt) -> None:
    d, tensors, ref, _, _ = ckpt
    llm = _llm(d)
    banks = llm.engine.setup.loaded.banks
    assert banks is not None and banks.fmt == MXFP4 and banks.activation == "gptoss"
    assert banks.gate_up.dtype == torch.uint8 and banks.gate_up.shape == (4 * E, 2 * I, D // 2)  # 4 MoE layers
    assert banks.expert_bytes == PACKED
    for li, layer in enumerate(range(4)):
        experts = ref.model.layers[layer].mlp.experts  # [E, D, 2I] interleaved, [E, I, D]
        gu, dn = banks.dequantized(slice(li * E, (li + 1) * E), torch.float32)  # [E, 2I, D] gate then up, [E, D, I]
        want_gu = experts.gate_up_proj.detach().transpose(1, 2)
        assert torch.equal(gu, torch.cat((want_gu[:, 0::2], want_gu[:, 1::2]), dim=1))
        assert torch.equal(dn, experts.down_proj.detach().transpose(1, 2))
        p = f"model.layers.{layer}.mlp.experts.down_proj_"
        assert torch.equal(dn, spec_dequantize(tensors[p + "blocks"], tensors[p + "scales"]))
        gate = banks.gate_up[li * E : (li + 1) * E, :I]  # gate rows hold the shipped even rows' bytes as they are
        assert torch.equal(gate, tensors[p.replace("down", "gate_up") + "blocks"][:, 0::2].reshape(E, I, D // 2))


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_greedy_tokens_equal_the_dequantised_model(ckpt, backend, cache, fill) -> None:
    d, _, _, prompts, runs = ckpt
    llm = _llm(d, backend, cache, fill)
    for r in runs:
        assert_close_logits(llm.engine.score(r.prompt), r.prompt_logits, fp4_logit_rel())
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in runs]
    llm.check_integrity()
    stats = llm.stats()
    if backend in ("offload", "hybrid"):
        assert stats["expert_fills"] > 0
    if backend in ("cpu", "hybrid"):
        assert stats["expert_cpu_runs"] > 0


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_moe_layer_matches_transformers_where_the_clamp_binds(ckpt, backend, cache, fill) -> None:
    """Layer 0's MoE part on wide inputs (the activation's clamps bind): transformers' ``GptOssMLP`` over its
    dequantised experts is the oracle."""
    d, _, ref, _, _ = ckpt
    llm = _llm(d, backend, cache, fill)
    moe = llm.engine.setup.loaded.model.layers[0].ffn
    mlp = ref.model.layers[0].mlp
    x = torch.randn((12, D), generator=torch.Generator().manual_seed(7)) * 3.0
    with torch.no_grad():
        want = mlp(x[None])[0][0]
        gu = torch.einsum("td,edf->tef", x, mlp.experts.gate_up_proj) + mlp.experts.gate_up_proj_bias
    assert float(gu[..., 0::2].max()) > 7.0 and float(gu[..., 1::2].abs().max()) > 7.0  # the clamps bind
    llm.engine.setup.loaded.backend.begin_step(12, False)
    got = moe.forward(x)
    torch.testing.assert_close(got, want, atol=1e-4 * max(1.0, float(want.abs().max())), rtol=0)


@pytest.mark.parametrize("backend", ["offload", "hybrid"])
def test_pool_and_slot_bytes_are_packed_bytes(ckpt, backend: str) -> None:
    """An expert in the pool, in a slot and in a fill is 2I x D/2 + D x I/2 bytes of e2m1 pairs and a byte per 32."""
    d, _, _, prompts, _ = ckpt
    llm = _llm(d, backend, 0.5)
    b = llm.engine.setup.loaded.backend
    pool, cache = b.pool, b.cache  # type: ignore[union-attr]
    assert pool.expert_bytes == PACKED and b.slot_bytes == PACKED
    assert sum(t[0].numel() * t.element_size() for t in pool.tensors) == PACKED
    assert sum(t[0].numel() * t.element_size() for t in cache.slots) == PACKED
    assert all(t.dtype == torch.uint8 for t in cache.slots)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    stats = llm.stats()
    assert stats["expert_fills"] > 0 and stats["pcie_bytes"] == stats["expert_fills"] * PACKED


GU = "model.layers.1.mlp.experts.gate_up_proj_"


def _bad_inputs(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[dict[str, torch.Tensor | None], str]]:
    blocks, scales = tensors[GU + "blocks"], tensors[GU + "scales"]
    halves = blocks.reshape(E, 2 * I, D // 16, 8)  # the same bytes as blocks of 16 elements
    float_gu = torch.zeros(E, D, 2 * I)
    return {
        "scale shape": ({GU + "scales": scales[..., :1].contiguous()}, GU + "scales"),
        "scale dtype": ({GU + "scales": scales.float()}, GU + "scales"),
        "block size": ({GU + "blocks": halves, GU + "scales": scales.repeat_interleave(2, -1)}, "blocks of 16"),
        "mixed formats": ({GU + "blocks": None, GU + "scales": None, GU.removesuffix("_"): float_gu}, "mix formats"),
    }


@pytest.mark.parametrize("case", ["scale shape", "scale dtype", "block size", "mixed formats"])
def test_bad_input_is_refused_naming_the_tensor(ckpt, tmp_path, case: str) -> None:
    d, tensors, _, _, _ = ckpt
    edit, said = _bad_inputs(tensors)[case]
    shutil.copytree(d, tmp_path / "bad")
    rewrite(tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match=said) as err:
        _llm(tmp_path / "bad")
    assert "gate_up_proj" in str(err.value)


def test_ftw_holds_the_packed_banks(ckpt, tmp_path) -> None:
    """``ft convert`` banks the shipped experts as they are; the FTW copy serves the same tokens."""
    from freetoken.loader.ftw_convert import convert

    d, _, _, prompts, runs = ckpt
    manifest = convert(d, tmp_path / "ftw")
    assert manifest.expert_format == "mxfp4"
    llm = _llm(tmp_path / "ftw", "hybrid", 0.5, 0.5)
    banks = llm.engine.setup.loaded.banks
    assert banks is not None and banks.gate_up.dtype == torch.uint8 and banks.gate_up_bias is not None
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in runs]


def test_e8m0_typed_scales_bank_the_same_bytes(ckpt, tmp_path) -> None:
    """Scales stored as ``float8_e8m0fnu`` (safetensors F8_E8M0) rather than uint8: the same bank bytes."""
    d, tensors, _, _, _ = ckpt
    shutil.copytree(d, tmp_path / "e8m0")
    rewrite(tmp_path / "e8m0", {n: t.view(torch.float8_e8m0fnu) for n, t in tensors.items() if n.endswith("_scales")})
    a, b = _llm(d).engine.setup.loaded.banks, _llm(tmp_path / "e8m0").engine.setup.loaded.banks
    assert a is not None and b is not None and b.gate_up_scale is not None and a.gate_up_scale is not None
    assert torch.equal(a.gate_up_scale, b.gate_up_scale) and torch.equal(a.gate_up, b.gate_up)
    assert b.gate_up_scale.dtype == torch.uint8
