"""FP4 e2m1 elements, the values MXFP4 and NVFP4 share: 1 sign bit, 2 exponent bits, 1 mantissa bit, so the 16
codes are ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} (code ``c``: sign ``c >> 3``, magnitude ``E2M1_VALUES[c & 7]``).

Two codes a byte, the element of even index in the low nibble (OCP MX, ModelOpt, compressed-tensors and gpt-oss
all pack so): a ``[..., cols]`` matrix of codes is ``[..., cols / 2]`` bytes.
"""

from __future__ import annotations

import torch

E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Midpoints between neighbouring magnitudes: a magnitude rounds to the code of how many it exceeds (ties to even
# codes, as round-to-nearest-even does: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0,
# 5 -> 4.0).
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIES_UP = (False, True, False, True, False, True, False)  # a tie at midpoint i rounds up when the upper code is even


def table(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 code values, as a lookup table."""
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` uint8 -> ``[..., 2n]`` codes (uint8 in [0, 16)), low nibble first."""
    lo, hi = packed & 0x0F, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def pack(codes: torch.Tensor) -> torch.Tensor:
    """``[..., 2n]`` codes -> ``[..., n]`` uint8, low nibble first."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def decode(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[..., n]`` uint8 -> ``[..., 2n]`` element values in ``dtype`` (exact: every e2m1 value is)."""
    return table(dtype, packed.device)[unpack(packed).long()]


def encode(x: torch.Tensor) -> torch.Tensor:
    """Floats (already divided by their scale) -> nearest e2m1 codes (ties to even, saturating at ±6)."""
    a = x.float().abs()
    mag = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for m, up in zip(_MIDPOINTS, _TIES_UP):
        mag += ((a > m) | (a == m) if up else a > m).to(torch.uint8)
    sign = (x.float() < 0) & (mag > 0)
    return mag | (sign.to(torch.uint8) << 3)
