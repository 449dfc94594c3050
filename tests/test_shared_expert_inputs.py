"""The shared expert's input GEMM (``layers/mlp.fuse_inputs``): gate, up and the sigmoid gate's row read as one weight
give the separate GEMMs' output, hold no second copy, and are left apart where they cannot share a weight."""

from __future__ import annotations

import torch

from freetoken.layers.mlp import DenseMLP, fuse_inputs


def _mlp(D: int = 48, I: int = 20, dtype: torch.dtype = torch.float32, seed: int = 0) -> DenseMLP:
    g = torch.Generator().manual_seed(seed)
    return DenseMLP(*(torch.randn(*s, generator=g).to(dtype) for s in ((I, D), (I, D), (D, I))))


def test_one_gemm_gives_the_separate_gemms_output_and_the_gate_logit() -> None:
    mlp, gate = _mlp(), torch.randn(1, 48)
    fused, fused_gate = fuse_inputs(mlp, gate)
    x = torch.randn(5, 48)
    out, logit = fused.forward_with_extra(x)
    assert fused.inputs is not None and fused_gate is not None and logit is not None
    torch.testing.assert_close(out, mlp.forward(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logit, x @ gate.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_gate, gate, rtol=0, atol=0)
    # gate, up and the gate row are views of the one weight: no second copy
    base = fused.inputs.untyped_storage().data_ptr()
    assert {t.untyped_storage().data_ptr() for t in (fused.gate, fused.up, fused_gate)} == {base}
    assert fused.inputs.shape == (41, 48)


def test_without_a_gate_row_gate_and_up_still_share_one_gemm() -> None:
    mlp = _mlp()
    fused, none = fuse_inputs(mlp)
    x = torch.randn(3, 48)
    out, extra = fused.forward_with_extra(x)
    assert none is None and fused.inputs is not None and extra is not None and extra.shape == (3, 0)
    torch.testing.assert_close(out, mlp.forward(x), rtol=1e-5, atol=1e-5)


def test_rows_that_cannot_share_a_weight_stay_apart() -> None:
    mlp = _mlp()
    gate32 = torch.randn(1, 48, dtype=torch.float64)  # another dtype
    same, g = fuse_inputs(mlp, gate32)
    assert same is mlp and g is gate32 and same.inputs is None
    biased = DenseMLP(mlp.gate, mlp.up, mlp.down, gate_bias=torch.zeros(20))
    assert fuse_inputs(biased)[0] is biased
    fused, _ = fuse_inputs(mlp)
    assert fuse_inputs(fused)[0] is fused  # already fused
