"""Rotary in one Triton launch (``kernels/rope_triton.py``) against the torch paths: DeepSeek-V4's interleaved pairs
(``InterleavedRope.reference``: heads of [nope | rope] and all-rope rows, the inverse rotation) and ``Rotary``'s
half-split pairs (``Rotary.reference``: whole heads and partial rotary, YaRN's scaled tables); 2-d and 3-d inputs,
float32 and bf16; Triton's interpreter on the CPU (CI's interp stage) and CUDA (marked ``gpu``); bad shapes refused."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_CASES, assert_bf16_close
from freetoken.checkpoint.hf_config import RopeConfig
from freetoken.layers.rope import Rotary
from freetoken.layers.v4_rope import InterleavedRope

CASES = [((5, 4, 32), 8), ((3, 24), 24), ((2, 3, 48), 16)]  # (x shape, rot)
YARN = {"factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0}
HALF_CASES = [((5, 4, 32), "default", {}), ((3, 1, 64), "default", {"partial_rotary_factor": 0.5}),
              ((2, 3, 48), "yarn", YARN)]  # fmt: skip


def _check(device: str, dtype: torch.dtype) -> None:
    from freetoken.kernels.rope_triton import interleaved_rope_triton

    g = torch.Generator().manual_seed(0)
    for shape, rot in CASES:
        rope = InterleavedRope(RopeConfig(10000.0, "default", {}), rot, 64, torch.device(device))
        x = (torch.randn(shape, generator=g) * 2).to(device, dtype)
        pos = torch.randint(0, 64, (shape[0],), generator=g).to(device)
        for inverse in (False, True):
            got = interleaved_rope_triton(x, pos, rope.cos, rope.sin, rot, inverse)
            want = rope.reference(x, pos, inverse)
            assert got.dtype == dtype and got.shape == x.shape
            assert torch.equal(got[..., : shape[-1] - rot], x[..., : shape[-1] - rot])  # nope channels pass through
            if dtype == torch.float32:
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
            else:
                assert_bf16_close(got, want, (shape, rot, inverse))
        back = interleaved_rope_triton(interleaved_rope_triton(x, pos, rope.cos, rope.sin, rot), pos, rope.cos,
                                       rope.sin, rot, inverse=True)  # fmt: skip
        if dtype == torch.float32:
            torch.testing.assert_close(back, x, rtol=1e-5, atol=1e-5)  # the inverse undoes the rotation


def _check_half(device: str, dtype: torch.dtype) -> None:
    from freetoken.kernels.rope_triton import half_rope_triton

    g = torch.Generator().manual_seed(1)
    for shape, kind, params in HALF_CASES:
        rope = Rotary(RopeConfig(10000.0, kind, params), shape[-1], 64, torch.device(device))
        x = (torch.randn(shape, generator=g) * 2).to(device, dtype)
        pos = torch.randint(0, 64, (shape[0],), generator=g).to(device)
        got, want = half_rope_triton(x, pos, rope.cos, rope.sin), rope.reference(x, pos)
        assert got.dtype == dtype and got.shape == x.shape
        assert torch.equal(got[..., rope.rot_dim :], x[..., rope.rot_dim :])  # the channels past rot pass through
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        else:
            assert_bf16_close(got, want, (shape, kind))


@pytest.mark.parametrize("device,dtype", TRITON_CASES)
def test_kernel(device: str, dtype: torch.dtype) -> None:
    _check(device, dtype)
    _check_half(device, dtype)


def test_bad_shapes_are_refused() -> None:
    pytest.importorskip("triton")
    from freetoken.kernels.rope_triton import half_rope_triton, interleaved_rope_triton

    rope = InterleavedRope(RopeConfig(10000.0, "default", {}), 8, 16, torch.device("cpu"))
    x, pos = torch.zeros(2, 16), torch.zeros(2, dtype=torch.long)
    for bad in ((x, pos[:1], 8), (x, pos, 7), (x, pos, 24)):
        with pytest.raises(ValueError, match="rope: x"):
            interleaved_rope_triton(bad[0], bad[1], rope.cos, rope.sin, bad[2])
    half = Rotary(RopeConfig(10000.0, "default", {}), 32, 16, torch.device("cpu"))  # 32 rotated channels
    with pytest.raises(ValueError, match="rope: x"):
        half_rope_triton(x, pos, half.cos, half.sin)  # rows of 16
    fits = Rotary(RopeConfig(10000.0, "default", {}), 16, 16, torch.device("cpu"))
    with pytest.raises(ValueError, match="rope: x"):
        half_rope_triton(x, pos, fits.cos.double(), fits.sin.double())  # tables are float32
