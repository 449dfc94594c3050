"""Routed experts in MXFP4 and NVFP4 through the grouped GEMM: the torch paths and the FP4 Triton kernels (decode
and prefill tile sizes, through Triton's interpreter on the CPU; on CUDA on the GPU box) against the torch
reference on the dequantised banks (``ExpertBanks.dequantized``), gpt-oss's biases and clamped activation included,
and the fill kernel copying FP4 banks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.experts.base import ExpertBanks
from freetoken.experts.reference import ExpertAct, moe_reference
from freetoken.experts.slots.gemm import grouped_experts, grouped_experts_gather, grouped_experts_loop
from freetoken.experts.slots.plan import group_routes
from freetoken.experts.slots.weights import SlotWeights
from freetoken.quant import MXFP4, NVFP4, WeightFormat

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

D, I, K_TOP = 64, 96, 2
FORMATS = {"mxfp4": MXFP4, "nvfp4": NVFP4}


def make_fp4_banks(fmt: WeightFormat, L: int, E: int, seed: int) -> ExpertBanks:
    g = torch.Generator().manual_seed(seed)
    gu, gus = fmt.quantize(torch.randn(L * E, 2 * I, D, generator=g) / D**0.5)
    dn, dns = fmt.quantize(torch.randn(L * E, D, I, generator=g) / I**0.5)
    return ExpertBanks(gu, dn, L, E, fmt=fmt, gate_up_scale=gus, down_scale=dns)


def _fp4_case(
    fmt: WeightFormat, T: int, E: int, seed: int, device: str = "cpu", gptoss: bool = False, activation: str = "silu"
):
    """gptoss: gate/up biases by eid and the clamped activation, inputs wide enough that its clamps bind; activation:
    another one without biases (on inputs as wide)."""
    g = torch.Generator().manual_seed(seed)
    banks = make_fp4_banks(fmt, 1, E, seed)
    x = torch.randn(T, D, generator=g) * (6.0 if gptoss or activation != "silu" else 1.0)
    act = ExpertAct("gptoss", torch.randn(E, 2 * I, generator=g).to(device)) if gptoss else ExpertAct.of(
        activation, None, torch.device(device)
    )
    ids = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K_TOP]
    w = torch.softmax(torch.randn(T, K_TOP, generator=g), dim=-1)
    groups = group_routes(ids.reshape(-1), E)
    # slot of each group: the expert itself (slots = pool + a scratch slot), every third group elsewhere (-1)
    slot = torch.where(torch.arange(T * K_TOP) % 3 == 2, -1, groups.eid.clamp(max=E - 1))
    slot = torch.where(groups.valid, slot, -1)
    parts = [torch.cat([t, torch.zeros_like(t[:1])]) for t in banks.tensors()]
    sw = SlotWeights(*(p.to(device) for p in parts[:2]), fmt, *(p.to(device) for p in parts[2:]), act)
    on = slot[groups.route_group] >= 0
    w_on = torch.where(on.view(T, K_TOP), w, torch.zeros_like(w))
    gu, dn = banks.dequantized(slice(None), torch.float32)
    bias = None if act is None or act.gate_up_bias is None else act.gate_up_bias.cpu()
    ref = moe_reference(x, ids, w_on, gu, dn, None if act is None else ExpertAct(act.name, bias))
    if gptoss:  # the clamps bind: gate above 7, up outside [-7, 7], on some routes
        pre = torch.einsum("td,efd->tef", x, gu) + act.gate_up_bias.cpu()
        assert float(pre[..., :I].max()) > 7.0 and float(pre[..., I:].abs().max()) > 7.0
    ref = ref.float()
    dev = torch.device(device)
    return x.to(dev), group_routes(ids.reshape(-1).to(dev), E), slot.to(dev), w.to(dev), sw, ref.to(dev)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp4_gemm_torch_paths(fmt: str) -> None:
    x, groups, slot, w, sw, ref = _fp4_case(FORMATS[fmt], 5, 12, seed=1)
    for fn in (grouped_experts_gather, grouped_experts_loop):
        torch.testing.assert_close(fn(x, groups, slot, w, sw), ref, rtol=1e-5, atol=1e-5)


@TRITON_INTERPRETER
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("T", [1, 5, 600])
def test_fp4_triton_kernels_in_interpreter(fmt: str, T: int) -> None:
    """Decode (T = 1, 5) and prefill (T = 600: the big token tile) through TRITON_INTERPRET=1; then the fill
    kernel over FP4 banks (uint8 weights and scale rows, copied as words)."""
    from freetoken.experts.slots.copy_triton import gather_rows_triton
    from freetoken.experts.slots.gemm_fp4_triton import grouped_experts_fp4_triton

    x, groups, slot, w, sw, ref = _fp4_case(FORMATS[fmt], T, 12, seed=T)
    out = grouped_experts_fp4_triton(x, groups, slot, w, sw, 12)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    banks = make_fp4_banks(FORMATS[fmt], 1, 8, seed=3)
    src = banks.tensors()
    dst = tuple(torch.zeros((6, *t.shape[1:]), dtype=t.dtype) for t in src)
    gather_rows_triton(src, dst, torch.tensor([3, 7, 0, 0]), torch.tensor([2, 0, 5, 5]), torch.tensor(2))
    for s, d in zip(src, dst):
        assert torch.equal(d[2], s[3]) and torch.equal(d[0], s[7]) and int(d[5].sum()) == 0


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp4_gpt_oss_torch_paths(fmt: str) -> None:
    x, groups, slot, w, sw, ref = _fp4_case(FORMATS[fmt], 5, 12, seed=4, gptoss=True)
    for fn in (grouped_experts_gather, grouped_experts_loop):
        torch.testing.assert_close(fn(x, groups, slot, w, sw), ref, rtol=1e-5, atol=1e-4)


@TRITON_INTERPRETER
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("T", [1, 5, 300])
def test_fp4_triton_gpt_oss_in_interpreter(fmt: str, T: int) -> None:
    """gpt-oss's gate/up biases (by eid) and clamped activation in the FP4 kernel: decode and prefill tiles."""
    from freetoken.experts.slots.gemm_fp4_triton import grouped_experts_fp4_triton

    x, groups, slot, w, sw, ref = _fp4_case(FORMATS[fmt], T, 12, seed=10 + T, gptoss=True)
    out = grouped_experts_fp4_triton(x, groups, slot, w, sw, 12)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


@TRITON_INTERPRETER
@pytest.mark.parametrize("activation", ["gelu_tanh", "dsv4"])
@pytest.mark.parametrize("T", [1, 40])
def test_fp4_triton_activations_in_interpreter(activation: str, T: int) -> None:
    """Gemma-4's GELU(tanh) and DeepSeek-V4's clamped SiLU in the FP4 kernel (its ``ACT`` index), against the
    kernel under plain SiLU (which differs from it on these inputs)."""
    from freetoken.experts.slots.gemm_fp4_triton import grouped_experts_fp4_triton

    x, groups, slot, w, sw, ref = _fp4_case(MXFP4, T, 12, seed=20 + T, activation=activation)
    out = grouped_experts_fp4_triton(x, groups, slot, w, sw, 12)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    silu = grouped_experts_fp4_triton(x, groups, slot, w, replace(sw, act=None), 12)
    assert not torch.allclose(silu, ref, rtol=1e-5, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("T", [1, 5, 40, 600])
@pytest.mark.parametrize("gptoss", [False, True])
def test_fp4_triton_gemm_cuda(fmt: str, T: int, gptoss: bool) -> None:
    """On the GPU: fp32 compute equals the reference; bf16 compute stays within bf16 rounding of it; gpt-oss's
    experts stay on the FP4 kernel (the dispatch no longer falls back to torch for them)."""
    x, groups, slot, w, sw, ref = _fp4_case(FORMATS[fmt], T, 12, seed=T, device="cuda", gptoss=gptoss)
    out = grouped_experts(x, groups, slot, w, sw, 12)  # the dispatch takes the FP4 Triton kernel
    # fp32 sums in the kernel's K-tile order, not torch's: gpt-oss's case at T=600 once differed by 1.05e-5 (H100)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4 if gptoss else 1e-5)
    out16 = grouped_experts(x.bfloat16(), groups, slot, w, sw, 12)
    assert float((out16 - ref).abs().max()) <= 2e-2 * max(1.0, float(ref.abs().max()))


def test_fp4_presets_and_synthetic_banks() -> None:
    """The FP4 presets count packed bytes (what the split and the bandwidth bounds use); synthetic banks follow
    the preset's format."""
    from freetoken.bench.presets import PRESETS, MoEShape
    from freetoken.bench.synthetic import random_banks

    nv = PRESETS["qwen3.6-35b-a3b-nvfp4"]
    assert nv.expert_bytes() == 3 * 2048 * 512 // 2 + 2 * 512 * (2048 // 16 + 4) + 2048 * (512 // 16 + 4)
    assert PRESETS["qwen3.6-35b-a3b"].expert_bytes() / nv.expert_bytes() > 3.5  # bf16 / NVFP4
    ds = PRESETS["deepseek-v4-flash-experts"]
    assert ds.fmt == MXFP4 and ds.expert_bytes() == 3 * 4096 * 2048 // 2 + 3 * 4096 * 2048 // 32
    for name, fmt in FORMATS.items():
        tiny = MoEShape(f"tiny-{name}", D, I, 8, 2, 2, weights=name)
        banks = random_banks(tiny, 2, torch.float32, seed=1)
        assert banks.fmt == fmt and banks.expert_bytes == tiny.expert_bytes() and banks.gate_up.dtype == torch.uint8
        gu, _ = banks.dequantized(slice(0, 8), torch.float32)
        assert torch.isfinite(gu).all() and 0.5 < float(gu.std() * D**0.5) < 2.0


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fp4_synthetic_checkpoint_generates(tmp_path, fmt: str) -> None:
    """``bench/synthetic_checkpoint.py`` writes an FP4 preset's checkpoint (NVFP4 in ModelOpt's layout, MXFP4
    experts per weight): it loads packed and decodes alike on fused and hybrid."""
    from freetoken import LLM, SamplingParams
    from freetoken.bench.synthetic_checkpoint import write_qwen3_moe

    write_qwen3_moe(tmp_path, num_layers=2, hidden=64, num_experts=8, moe_inter=32, vocab=512, fmt=FORMATS[fmt])
    outs = []
    for name in ("fused", "hybrid"):
        llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", moe_backend=name, expert_cache=0.5)
        banks = llm.engine.setup.loaded.banks
        assert banks is not None and banks.fmt == FORMATS[fmt] and banks.gate_up.dtype == torch.uint8
        outs.append(llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0])
    assert outs[0].token_ids == outs[1].token_ids and len(outs[0].token_ids) == 6


try:  # the decode check's kernel (module level: a Triton function sees only globals)
    import triton
    import triton.language as tl

    from freetoken.experts.slots import gemm_fp4_triton as _fp4k

    @triton.jit
    def _decode_every_code(b_ptr, lo_ptr, hi_ptr, s_ptr):
        i = tl.arange(0, 256)
        b = tl.load(b_ptr + i).to(tl.int32)
        tl.store(lo_ptr + i, _fp4k._e2m1_lo(b))
        tl.store(hi_ptr + i, _fp4k._e2m1_hi(b))
        tl.store(s_ptr + i, _fp4k._e4m3(b))

except ImportError:  # no Triton here: the test below is skipped
    pass


@TRITON_INTERPRETER
def test_fp4_triton_decode_every_code() -> None:
    """The FP4 kernel's decodes, every input: both nibbles of all 256 bytes against e2m1's table (signed zeros
    included), and all 254 finite e4m3 scale codes (as the NVFP4 path decodes them) against torch's float8_e4m3fn."""
    from freetoken.quant.e2m1 import E2M1_VALUES

    b = torch.arange(256, dtype=torch.uint8)
    lo, hi, sc = (torch.empty(256) for _ in range(3))
    _decode_every_code[(1,)](b, lo, hi, sc)
    table = torch.tensor(E2M1_VALUES)
    for got, want in ((lo, table[b.long() & 15]), (hi, table[b.long() >> 4])):
        assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())
    finite = (b & 0x7F) != 0x7F
    want_s = b.view(torch.float8_e4m3fn).float()
    assert torch.equal(sc[finite], want_s[finite]) and torch.equal(sc[finite].signbit(), want_s[finite].signbit())
