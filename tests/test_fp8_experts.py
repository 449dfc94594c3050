"""Routed experts in fp8 e4m3 with 128x128 block scales through every backend and both GEMM kernels, against the
torch reference on the dequantised banks (``ExpertBanks.dequantized``: ``quant/fp8_block.py``). Parametrised by
device (CPU always; CUDA on the GPU box) and, for the Triton kernels, Triton's interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from devices import DEVICES, TRITON_INTERPRETER
from freetoken.bench.placements import register
from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.base import ExpertBanks
from freetoken.experts.reference import moe_reference
from freetoken.experts.slots.gemm import grouped_experts, grouped_experts_gather, grouped_experts_loop
from freetoken.experts.slots.plan import group_routes
from freetoken.experts.slots.weights import SlotWeights
from freetoken.quant import FP8_BLOCK_128

register()  # the static-layers and static-freq backends

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

D, I, K_TOP = 256, 128, 2
BACKENDS = ["fused", "offload", "cpu", "hybrid", "static-layers", "static-freq"]


def make_fp8_banks(L: int, E: int, seed: int) -> ExpertBanks:
    g = torch.Generator().manual_seed(seed)
    gu, gus = FP8_BLOCK_128.quantize(torch.randn(L * E, 2 * I, D, generator=g) / D**0.5)
    dn, dns = FP8_BLOCK_128.quantize(torch.randn(L * E, D, I, generator=g) / I**0.5)
    return ExpertBanks(gu, dn, L, E, fmt=FP8_BLOCK_128, gate_up_scale=gus, down_scale=dns)


def _routing(T: int, E: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K_TOP]
    return ids, torch.softmax(torch.randn(T, K_TOP, generator=g), dim=-1)


def test_fp8_banks_sizes() -> None:
    banks = make_fp8_banks(2, 4, seed=0)
    assert banks.hidden_size == D and banks.intermediate_size == I
    assert banks.expert_bytes == 3 * D * I + (2 * 2 + 2) * 4  # one byte per weight + six block scales
    assert len(banks.tensors()) == 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKENDS)
def test_fp8_backend_equals_reference(name: str, device: str) -> None:
    L, E = 2, 8
    banks = make_fp8_banks(L, E, seed=1)
    dev = torch.device(device)
    fill = 0.5 if name == "hybrid" else None
    backend = create_backend(EngineConfig(moe_backend=name, expert_cache=0.4, fill_fraction=fill), banks, dev,
                             torch.float32)  # fmt: skip
    gu, dn = (t.to(dev) for t in banks.dequantized(slice(None), torch.float32))
    g = torch.Generator().manual_seed(2)
    for step in range(6):
        T = (1, 3, 40)[step % 3]
        backend.begin_step(T, T == 1)
        for layer in range(L):
            x = torch.randn(T, D, generator=g)
            ids, w = _routing(T, E, g)
            x, ids, w = x.to(dev), ids.to(dev), w.to(dev)
            ref = moe_reference(x, ids + layer * E, w, gu, dn)
            out = backend.forward(layer, x, ids, w)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        backend.check_integrity()
    getattr(backend, "close", lambda: None)()


def _fp8_case(T: int, E: int, seed: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    banks = make_fp8_banks(1, E, seed)
    x = torch.randn(T, D, generator=g)
    ids, w = _routing(T, E, g)
    groups = group_routes(ids.reshape(-1), E)
    # slot of each group: the expert itself (slots = pool + a scratch slot), every third group elsewhere (-1)
    slot = torch.where(torch.arange(T * K_TOP) % 3 == 2, -1, groups.eid.clamp(max=E - 1))
    slot = torch.where(groups.valid, slot, -1)
    parts = [torch.cat([t, torch.zeros_like(t[:1])]) for t in banks.tensors()]
    sw = SlotWeights(*(p.to(device) for p in parts[:2]), FP8_BLOCK_128, *(p.to(device) for p in parts[2:]))
    on = slot[groups.route_group] >= 0
    w_on = torch.where(on.view(T, K_TOP), w, torch.zeros_like(w))
    gu, dn = banks.dequantized(slice(None), torch.float32)
    ref = moe_reference(x, ids, w_on, gu, dn).float()
    dev = torch.device(device)
    return x.to(dev), group_routes(ids.reshape(-1).to(dev), E), slot.to(dev), w.to(dev), sw, ref.to(dev)


@pytest.mark.parametrize("T", [1, 4, 33])
def test_fp8_gemm_torch_paths(T: int) -> None:
    x, groups, slot, w, sw, ref = _fp8_case(T, 12, seed=T)
    for fn in (grouped_experts_gather, grouped_experts_loop):
        torch.testing.assert_close(fn(x, groups, slot, w, sw), ref, rtol=1e-5, atol=1e-5)


@TRITON_INTERPRETER
@pytest.mark.parametrize("T", [1, 5, 40, 600])
def test_fp8_triton_kernels_in_interpreter(T: int) -> None:
    """The fp8 grouped GEMM (decode and prefill tile sizes) and the four-bank fill, on the CPU through Triton's
    interpreter (TRITON_INTERPRET=1)."""
    from freetoken.experts.slots.copy_triton import gather_rows_triton
    from freetoken.experts.slots.gemm_fp8_triton import grouped_experts_fp8_triton

    x, groups, slot, w, sw, ref = _fp8_case(T, 12, seed=T)
    torch.testing.assert_close(grouped_experts_fp8_triton(x, groups, slot, w, sw, 12), ref, rtol=1e-5, atol=1e-5)
    banks = make_fp8_banks(1, 8, seed=3)
    src = banks.tensors()
    dst = tuple(torch.zeros((6, *t.shape[1:]), dtype=t.dtype) for t in src)
    gather_rows_triton(src, dst, torch.tensor([3, 7, 0, 0]), torch.tensor([2, 0, 5, 5]), torch.tensor(2))
    for s, d in zip(src, dst):
        assert torch.equal(d[2].view(torch.uint8), s[3].view(torch.uint8))
        assert torch.equal(d[0].view(torch.uint8), s[7].view(torch.uint8))
        assert int(d[5].view(torch.uint8).sum()) == 0  # padding skipped


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 5, 40, 600])
def test_fp8_triton_gemm_cuda(T: int) -> None:
    """On the GPU: fp32 compute equals the reference; bf16 compute stays within bf16 rounding of it."""
    x, groups, slot, w, sw, ref = _fp8_case(T, 12, seed=T, device="cuda")
    out = grouped_experts(x, groups, slot, w, sw, 12)  # the dispatch takes the fp8 Triton kernel
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out16 = grouped_experts(x.bfloat16(), groups, slot, w, sw, 12)
    assert float((out16 - ref).abs().max()) <= 2e-2 * max(1.0, float(ref.abs().max()))


def test_fp8_synthetic_checkpoint_generates(tmp_path) -> None:
    """``bench/synthetic_checkpoint.py`` writes an fp8 preset's checkpoint: it loads packed and decodes alike on
    fused and hybrid (the benchmarks' path to whole-model figures)."""
    from freetoken import LLM, SamplingParams
    from freetoken.bench.synthetic_checkpoint import write_qwen3_moe

    write_qwen3_moe(tmp_path, num_layers=2, hidden=256, num_experts=8, moe_inter=128, vocab=512, fmt=FP8_BLOCK_128)
    outs = []
    for name in ("fused", "hybrid"):
        llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", moe_backend=name, expert_cache=0.5)
        banks = llm.engine.setup.loaded.banks
        assert banks is not None and banks.fmt == FP8_BLOCK_128 and banks.gate_up.dtype == torch.float8_e4m3fn
        outs.append(llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0])
    assert outs[0].token_ids == outs[1].token_ids and len(outs[0].token_ids) == 6


def test_fp8_presets_and_synthetic_banks() -> None:
    """The -fp8 presets: the bf16 shapes with packed experts (their byte counts drive the split and the bounds);
    synthetic banks follow the preset's format and dequantise to the values they were drawn from, within e4m3."""
    from freetoken.bench.presets import PRESETS, MoEShape
    from freetoken.bench.synthetic import random_banks

    assert PRESETS["qwen3-30b-a3b-fp8"].expert_bytes() == 3 * 2048 * 768 + 6 * 3 * 16 * 4
    assert PRESETS["qwen3.6-35b-a3b-fp8"].expert_bytes() == 3 * 2048 * 512 + 4 * 3 * 16 * 4
    assert PRESETS["qwen3-30b-a3b"].expert_bytes() == 3 * 2048 * 768 * 2
    tiny = MoEShape("tiny-fp8", D, I, 8, 2, 2, weights="fp8_block")
    banks = random_banks(tiny, 2, torch.float32, seed=1)
    assert banks.fmt == FP8_BLOCK_128 and banks.expert_bytes == tiny.expert_bytes()
    gu, _ = banks.dequantized(slice(0, 8), torch.float32)
    assert torch.isfinite(gu).all() and 0.5 < float(gu.std() * D**0.5) < 2.0  # std D**-0.5, as drawn
