"""NVFP4: e2m1 elements (``quant/e2m1.py``), two a byte, with one float8 e4m3 scale per 16 elements along the
reduction dimension and one float32 scale per tensor. Weight-only here: activations stay in the compute dtype
(a checkpoint's ``input_scale`` / ``input_global_scale`` is read past and said once).

Checkpoint layouts (``layout``), which differ in the names and in what the per-tensor scale means:

- ``modelopt`` (NVIDIA ModelOpt, ``quant_method: modelopt``, ``quant_algo: NVFP4``): ``weight`` ``[rows, cols/2]``
  uint8, ``weight_scale`` ``[rows, cols/16]`` float8_e4m3fn, ``weight_scale_2`` float32 (one value), which
  **multiplies**: ``w = e2m1 * weight_scale * weight_scale_2`` (``weight_scale_2 = amax / (6 * 448)``);
- ``compressed-tensors`` (``format: nvfp4-pack-quantized``): ``weight_packed``, ``weight_scale`` (the same
  shapes and dtypes) and ``weight_global_scale`` float32 ``[1]``, which **divides**:
  ``w = e2m1 * (weight_scale / weight_global_scale)`` (``weight_global_scale = 6 * 448 / amax``).

Bank layout: packed ``[rows, cols/2]`` uint8 and one scale row per weight row, ``[rows, cols/16 + 4]`` uint8:
the row's e4m3 codes, then the tensor's multiplier (``weight_scale_2``, or ``1 / weight_global_scale`` rounded
once in float32) as 4 little-endian float32 bytes. Folding the second scale into each row keeps one scale bank
per weight (pool, slots, fills and FTW see opaque rows) at 4 bytes a row, and lets gate and up rows of one bank
keep their own per-tensor scales. The reference dequantises ``e2m1 * (e4m3 * multiplier)`` in float32, rounded
once to the compute dtype; the kernels do the same.
"""

from __future__ import annotations

import torch

from freetoken.quant import e2m1
from freetoken.quant.base import QuantizationError, WeightFormat

GROUP = 16  # elements per e4m3 scale
EXPERT_COLS = 32  # routed experts' reduction dimensions are whole multiples of this
E4M3_MAX = 448.0
LAYOUTS = ("modelopt", "compressed-tensors")
_MULT_BYTES = 4  # the float32 multiplier at the end of each bank scale row


class Nvfp4Format(WeightFormat):
    name = "nvfp4"
    packed_dtype = torch.uint8
    scale_dtype = torch.uint8
    checkpoint_dtypes = ("U8",)
    scale_checkpoint_dtypes = ("F8_E4M3",)

    def __init__(self, layout: str = "modelopt") -> None:
        if layout not in LAYOUTS:
            raise QuantizationError(f"nvfp4 checkpoint layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        self.layout = layout
        self.ignored_suffixes = ("input_scale",) if layout == "modelopt" else ("input_global_scale",)

    def __repr__(self) -> str:
        return f"Nvfp4Format({self.layout!r})"

    def __eq__(self, other: object) -> bool:  # one bank layout: checkpoints of either layout bank alike
        return isinstance(other, Nvfp4Format)

    def __hash__(self) -> int:
        return hash(self.name)

    def packed_cols(self, cols: int) -> int:
        return cols // 2

    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        return (rows, cols // GROUP + _MULT_BYTES)

    def checkpoint_scale_shape(self, weight_name: str, packed_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*packed_shape[:-1], packed_shape[-1] * 2 // GROUP)

    def scale_name(self, weight_name: str) -> str:
        if self.layout == "compressed-tensors":
            return _stem(weight_name, "weight_packed") + "weight_scale"
        return weight_name + "_scale"

    def scale2_name(self, weight_name: str) -> str:
        if self.layout == "compressed-tensors":
            return _stem(weight_name, "weight_packed") + "weight_global_scale"
        return weight_name + "_scale_2"

    def bank_scale(self, scale: torch.Tensor, scale2: torch.Tensor | None = None) -> torch.Tensor:
        """e4m3 ``scale [..., rows, cols/16]`` and the per-tensor ``scale2`` (one value, or one per leading
        index) -> bank rows ``[..., rows, cols/16 + 4]``."""
        if scale.dtype != torch.float8_e4m3fn:
            raise QuantizationError(f"nvfp4 block scales must be float8_e4m3fn, got {scale.dtype}")
        if scale2 is None:
            raise QuantizationError("nvfp4 weights need their per-tensor scale")
        lead = scale.shape[:-2]
        g = scale2.float().reshape(-1)
        if g.numel() not in (1, max(1, lead.numel())):
            raise QuantizationError(f"nvfp4 per-tensor scale has {g.numel()} values for weights of {list(lead)}")
        mult = (1.0 / g) if self.layout == "compressed-tensors" else g
        mult = mult.reshape(*([1] * len(lead) if g.numel() == 1 else lead), 1, 1).expand(*lead, scale.shape[-2], 1)
        tail = mult.contiguous().view(torch.uint8)  # [..., rows, 4]
        return torch.cat((scale.view(torch.uint8), tail), dim=-1).contiguous()

    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        assert scale is not None
        rows, cols = packed.shape[-2], packed.shape[-1] * 2
        codes, mult = split_bank_scale(scale)
        s = codes.view(torch.float8_e4m3fn).float() * mult  # [..., rows, cols/16]
        v = e2m1.decode(packed).reshape(*packed.shape[:-1], cols // GROUP, GROUP)
        return (v * s[..., None]).reshape(*packed.shape[:-2], rows, cols).to(dtype)

    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = self._checkpoint_parts(w)
        return t[0], self.bank_scale(t[1], t[2])

    def checkpoint_tensors(self, weight_name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        packed, scale, scale2 = self._checkpoint_parts(w)
        out = {weight_name: packed, self.scale_name(weight_name): scale, self.scale2_name(weight_name): scale2}
        stem = weight_name[: -len("weight")] if weight_name.endswith("weight") else _stem(weight_name, "weight_packed")
        if self.layout == "modelopt":  # activation scales the engine reads past (weight-only)
            out[stem + "input_scale"] = torch.tensor(1.0, dtype=torch.float32)
        return out

    def _checkpoint_parts(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(packed, e4m3 block scales, per-tensor scale as the layout stores it) of ``[rows, cols]`` weights
        (a leading dimension: one per-tensor scale per index)."""
        rows, cols = w.shape[-2:]
        self._check_cols(cols, "weight")
        lead = w.shape[:-2]
        g = w.float().reshape(*lead, rows, cols // GROUP, GROUP)
        amax = g.abs().amax(dim=(-3, -2, -1), keepdim=True)  # [..., 1, 1, 1]
        mult = torch.where(amax > 0, amax / (e2m1.E2M1_MAX * E4M3_MAX), torch.ones_like(amax))
        stored = (1.0 / mult) if self.layout == "compressed-tensors" else mult
        mult = (1.0 / stored) if self.layout == "compressed-tensors" else stored  # what dequantising uses
        block = (g.abs().amax(dim=-1, keepdim=True) / e2m1.E2M1_MAX / mult).clamp(max=E4M3_MAX)
        s8 = block.to(torch.float8_e4m3fn)
        eff = s8.float() * mult
        codes = e2m1.encode(torch.where(eff > 0, g / eff, torch.zeros_like(g)))
        packed = e2m1.pack(codes.reshape(*lead, rows, cols))
        scale2 = stored.reshape(*lead, 1) if lead else stored.reshape(())
        if self.layout == "compressed-tensors" and not lead:
            scale2 = scale2.reshape(1)
        return packed, s8.reshape(*lead, rows, cols // GROUP).contiguous(), scale2.contiguous()

    def check_expert_shape(self, rows: int, cols: int, what: str) -> None:
        if cols % EXPERT_COLS:  # kernels decode 32 elements (16 bytes) at a time
            raise QuantizationError(f"{what} has {cols} columns: nvfp4 experts need a multiple of {EXPERT_COLS}")

    @staticmethod
    def _check_cols(cols: int, what: str) -> None:
        if cols % GROUP:
            raise QuantizationError(f"{what} has {cols} columns, not whole nvfp4 groups of {GROUP}")


def split_bank_scale(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bank scale rows ``[..., rows, G + 4]`` -> (e4m3 codes ``[..., rows, G]`` uint8, multiplier ``[..., rows, 1]``
    float32)."""
    codes = scale[..., :-_MULT_BYTES]
    mult = scale[..., -_MULT_BYTES:].clone(memory_format=torch.contiguous_format).view(torch.float32)
    return codes, mult


def _stem(name: str, suffix: str) -> str:
    return name[: -len(suffix)] if name.endswith(suffix) else name + "."


NVFP4 = Nvfp4Format("modelopt")
NVFP4_COMPRESSED_TENSORS = Nvfp4Format("compressed-tensors")
