"""A gated DeltaNet layer's fused decode kernels (``kernels/deltanet_triton.py``, ``norm_triton.gated_rms_norm_triton``)
against their torch references (``gated_delta.deltanet_step_reference``, ``norm.gated_rms_norm_reference``): Triton's
interpreter on the CPU, the kernels on CUDA. Random in_proj rows (the kernel reads them as views), GVA and plain
heads, several dv blocks (one partial), fresh sequences (position 0, stale slot contents) beside continuing ones,
slots out of order and a padding row repeating row 0's slot (as the step graph pads); three steps in a row (the conv
window each step leaves is the next one's input); the other slots untouched; bf16 and float32."""

from __future__ import annotations

import pytest
import torch

from devices import _NO_INTERPRETER, assert_bf16_close
from freetoken.kernels.gated_delta import deltanet_step_reference
from freetoken.kernels.norm import gated_rms_norm_reference

DEVICES = [
    pytest.param("cpu", marks=[pytest.mark.interp, _NO_INTERPRETER]),  # Triton's interpreter
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
]
DTYPES = [torch.float32, torch.bfloat16]
# (Hk, H, dk, dv, K, block_v): GVA with 2 dv blocks; no GVA with a partial second block; GVA 3:1, one block
SHAPES = [(1, 2, 16, 16, 4, 8), (2, 2, 8, 12, 4, 8), (1, 3, 8, 8, 3, None)]
SLOTS, POSITIONS = [5, 1, 3, 5], [4, 0, 9, 4]  # the last row pads: row 0's slot and position again


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """float32: elementwise 1e-5; bf16 (the kernel sums the conv in float32, the reference rounds each product):
    the shared bf16 tolerance (``devices.assert_bf16_close``)."""
    if dtype == torch.float32:
        torch.testing.assert_close(got.float(), ref.float(), rtol=1e-5, atol=1e-5, msg=what)
        return
    assert_bf16_close(got, ref, what)


def _weights(hk, h, dk, dv, K, dtype, device, g):
    C = 2 * hk * dk + h * dv
    conv_w = (torch.randn(C, K, generator=g) * 0.5).to(device, dtype)
    A_log, dt_bias = (torch.randn(h, generator=g) * 0.5).to(device), torch.randn(h, generator=g).to(device)
    return C, conv_w, A_log, dt_bias


def _rows(B, C, h, dv, dtype, device, g):
    """An in_proj output [B, C + H*dv + 2H] (q, k, v, z, b, a) and its mixed / b / a views."""
    proj = (torch.randn(B, C + h * dv + 2 * h, generator=g) * 2).to(device, dtype)
    proj[-1] = proj[0]  # the padding row repeats row 0
    mixed, _, b, a = proj.split([C, h * dv, h, h], dim=-1)
    return mixed, b, a


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hk,h,dk,dv,K,block_v", SHAPES)
def test_step_matches_the_reference(device, dtype, hk, h, dk, dv, K, block_v):
    from freetoken.kernels.deltanet_triton import _arrivals, deltanet_step_triton

    g = torch.Generator().manual_seed(dk * 10 + dv + K)
    C, conv_w, A_log, dt_bias = _weights(hk, h, dk, dv, K, dtype, device, g)
    S = 7
    conv = (torch.randn(S, C, K - 1, generator=g)).to(device, dtype)  # stale: fresh sequences must not read it
    ssm = (torch.randn(S, h, dk, dv, generator=g) * 0.5).to(device)
    before = conv.clone(), ssm.clone()
    ref_conv, ref_ssm = conv.clone(), ssm.clone()
    slots = torch.tensor(SLOTS, device=device)
    positions = torch.tensor(POSITIONS, device=device)
    live = len(SLOTS) - 1  # the padding row's output is not compared (it may read row 0's new state)
    for step in range(3):
        mixed, b, a = _rows(len(SLOTS), C, h, dv, dtype, device, g)
        args = (slots, positions, conv_w, A_log, dt_bias, hk, dk)
        core = deltanet_step_triton(mixed, b, a, conv, ssm, *args, out_dtype=dtype, block_v=block_v)
        ref = deltanet_step_reference(mixed, b, a, ref_conv, ref_ssm, *args)
        assert core.shape == (len(SLOTS), h, dv) and core.dtype == dtype
        _close(core[:live], ref[:live], dtype, f"step {step} core")
        assert torch.equal(conv, ref_conv), f"step {step}: conv windows"  # the inputs themselves, no arithmetic
        _close(ssm, ref_ssm, dtype, f"step {step} state")
        positions = positions + 1
    others = [s for s in range(S) if s not in SLOTS]
    assert torch.equal(conv[others], before[0][others]) and torch.equal(ssm[others], before[1][others])
    assert not _arrivals(torch.device(device), S * hk).any()  # the counters are back to 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm_matches_the_reference(device, dtype):
    from freetoken.kernels.norm_triton import gated_rms_norm_triton

    g = torch.Generator().manual_seed(7)
    for T, H, n in ((1, 2, 16), (5, 3, 12)):
        proj = (torch.randn(T, H * n + 9, generator=g) * 3).to(device, dtype)
        z = proj[:, 4 : 4 + H * n].view(T, H, n)  # a column view of the in_proj output, as the layer passes it
        w = (torch.rand(n, generator=g) + 0.5).to(device, dtype)
        for x in (torch.randn(T, H, n, generator=g).to(device), torch.randn(T, H, n, generator=g).to(device, dtype)):
            got = gated_rms_norm_triton(x, z, w, 1e-6)
            ref = gated_rms_norm_reference(x, z, w, 1e-6)
            assert got.dtype == dtype and got.shape == (T, H, n) and got.is_contiguous()
            tol = 1e-6 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_step_at_qwen36_shape_replays_from_a_cuda_graph():
    """Qwen3.6-35B-A3B's layer (Hk 16, H 32, dk = dv = 128, K 4) in bf16 against the reference, eager and replayed
    from a captured graph (as the whole-step graph holds it), the states carried from step to step."""
    from freetoken.kernels.deltanet_triton import deltanet_step_triton

    dev, dtype, hk, h, dk, dv, K = "cuda", torch.bfloat16, 16, 32, 128, 128, 4
    g = torch.Generator().manual_seed(3)
    C, conv_w, A_log, dt_bias = _weights(hk, h, dk, dv, K, dtype, dev, g)
    conv = torch.randn(8, C, K - 1, generator=g).to(dev, dtype)
    ssm = (torch.randn(8, h, dk, dv, generator=g) * 0.5).to(dev)
    ref_conv, ref_ssm = conv.clone(), ssm.clone()
    slots, positions = torch.tensor(SLOTS, device=dev), torch.tensor(POSITIONS, device=dev)
    mixed, b, a = _rows(len(SLOTS), C, h, dv, dtype, dev, g)
    static = mixed, b, a
    args = (slots, positions, conv_w, A_log, dt_bias, hk, dk)
    deltanet_step_triton(*static, conv.clone(), ssm.clone(), *args, out_dtype=dtype)  # compiled before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        core = deltanet_step_triton(*static, conv, ssm, *args, out_dtype=dtype)
    for step in range(3):
        fresh = _rows(len(SLOTS), C, h, dv, dtype, dev, g)
        for buf, new in zip(static, fresh):
            buf.copy_(new)
        graph.replay()
        ref = deltanet_step_reference(*static, ref_conv, ref_ssm, *args)
        _close(core[:3], ref[:3], dtype, f"replay {step} core")
        assert torch.equal(conv, ref_conv), f"replay {step}: conv windows"
        _close(ssm, ref_ssm, dtype, f"replay {step} state")
        positions.add_(1)


@pytest.mark.parametrize("device", DEVICES)
def test_layer_decode_through_the_kernel(device, monkeypatch):
    """A layer's decode step with the fused kernel (the step's dispatch forced to it, in the interpreter on a CPU)
    equals its torch path (forced to the reference): output and both pools, a padded batch with a fresh sequence,
    two steps."""
    from freetoken.cache.state_pool import StatePool, StateShape
    from freetoken.kernels import gated_delta
    from freetoken.layers.attention import AttnBatch
    from freetoken.layers.deltanet import DeltaNetWeights, GatedDeltaNet

    hk, h, dk, dv, K, D = 1, 2, 16, 8, 4, 32
    g = torch.Generator().manual_seed(5)
    C = 2 * hk * dk + h * dv
    w = DeltaNetWeights(
        in_proj=torch.randn(C + h * dv + 2 * h, D, generator=g) * 0.2, conv=torch.randn(C, K, generator=g) * 0.5,
        A_log=torch.randn(h, generator=g) * 0.5, dt_bias=torch.randn(h, generator=g) * 0.5,
        norm=torch.rand(dv, generator=g) + 0.5, out=torch.randn(D, h * dv, generator=g) * 0.2,
    )  # fmt: skip
    w = DeltaNetWeights(*(t.to(device) for t in vars(w).values()))
    ref, fused = GatedDeltaNet(w, 0, hk, h, dk, dv, 1e-6), GatedDeltaNet(w, 0, hk, h, dk, dv, 1e-6)
    pools = [StatePool(StateShape(1, C, K - 1, h, dk, dv), 6, torch.float32, torch.device(device)) for _ in range(2)]
    for t in (pools[0].conv, pools[0].ssm):
        t.copy_(torch.randn(t.shape, generator=g))
    pools[1].conv.copy_(pools[0].conv)
    pools[1].ssm.copy_(pools[0].ssm)
    positions = torch.tensor(POSITIONS, device=device)
    for _ in range(2):
        batch = AttnBatch(positions, torch.zeros_like(positions), decode=object(),  # type: ignore[arg-type]
                          state_slots=torch.tensor(SLOTS, device=device))  # fmt: skip
        x = torch.randn(len(SLOTS), D, generator=g).to(device)
        x[-1] = x[0]
        with monkeypatch.context() as m:
            m.setattr(gated_delta, "use_triton", lambda _: False)
            want = ref.forward(x, batch, pools[0])
            m.setattr(gated_delta, "use_triton", lambda _: True)
            got = fused.forward(x, batch, pools[1])
        torch.testing.assert_close(got[:-1], want[:-1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pools[1].ssm, pools[0].ssm, rtol=1e-5, atol=1e-5)
        assert torch.equal(pools[1].conv, pools[0].conv)
        positions = positions + 1
