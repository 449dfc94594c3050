"""What a weight format is: a packed tensor plus scale tensors per weight matrix, and a torch reference that turns
them back into floats. Every kernel that reads a format is tested against that reference.

A weight matrix is ``[rows, cols]`` (``cols``: the reduction dimension, the one formats pack along). Formats pack
``cols`` only, so ``rows`` are the same in every format; a leading expert dimension ``[N, rows, cols]`` passes
through every method unchanged.

Two layouts: the checkpoint's (its tensors, names and dtypes: what ``checkpoint/`` checks) and the bank's (one
packed tensor and at most one scale tensor per weight, what the pool, the slots and the kernels hold). They differ
where a format has a second scale: NVFP4's per-tensor fp32 scale is folded into its bank scale rows
(``bank_scale``), so banks keep one scale tensor in every format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from freetoken.errors import FreeTokenError


class QuantizationError(FreeTokenError):
    """A quantisation the engine does not implement, or tensors that do not fit their declared format."""


class WeightFormat(ABC):
    name: str = "base"
    quantized: bool = True
    packed_dtype: torch.dtype | None = None  # None: the compute dtype (unquantised)
    scale_dtype: torch.dtype | None = None  # None: no scale tensor
    checkpoint_dtypes: tuple[str, ...] = ()  # safetensors dtype names of the packed weights
    scale_checkpoint_dtypes: tuple[str, ...] = ("F32", "BF16", "F16")  # ... of their scale tensors
    ignored_suffixes: tuple[str, ...] = ()  # tensors of the format read and ignored (NVFP4's ``input_scale``)

    @abstractmethod
    def packed_cols(self, cols: int) -> int:
        """Columns of the packed tensor of a ``[rows, cols]`` weight."""

    @abstractmethod
    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        """Shape of the scale tensor of one ``[rows, cols]`` weight (``()``: none)."""

    @abstractmethod
    def scale_name(self, weight_name: str) -> str:
        """The checkpoint's name of the scale tensor beside weight ``weight_name``."""

    def scale2_name(self, weight_name: str) -> str:
        """The checkpoint's name of a second, per-tensor scale beside ``weight_name`` ("": the format has none)."""
        return ""

    def checkpoint_packed_shape(self, weight_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The checkpoint's shape of packed weight ``weight_name`` whose unpacked shape is ``shape``."""
        return (*shape[:-1], self.packed_cols(shape[-1]))

    def checkpoint_scale_shape(self, weight_name: str, packed_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The checkpoint's shape of the scale tensor beside packed weight ``weight_name`` of ``packed_shape``."""
        return (*packed_shape[:-2], *self.scale_shape(packed_shape[-2], packed_shape[-1]))

    def bank_scale(self, scale: torch.Tensor, scale2: torch.Tensor | None = None) -> torch.Tensor:
        """The checkpoint's scale tensor (and second scale) of one weight -> its bank scale rows (``scale_dtype``,
        ``scale_shape``)."""
        assert self.scale_dtype is not None
        return scale.to(self.scale_dtype)

    def checkpoint_tensors(self, weight_name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """``w`` quantised into the tensors a checkpoint of this format stores for it, by name (synthetic
        checkpoints in the real layout)."""
        packed, scale = self.quantize(w)
        return {weight_name: packed, self.scale_name(weight_name): scale} if scale is not None else {weight_name: w}

    @abstractmethod
    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The reference: ``[..., rows, cols]`` floats in ``dtype`` from the packed tensor and its bank scales."""

    @abstractmethod
    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[..., rows, cols]`` floats -> (packed, bank scale): the reference quantiser (tests, synthetic models)."""

    def check_expert_shape(self, rows: int, cols: int, what: str) -> None:  # noqa: B027 - optional check
        """Raise QuantizationError unless routed-expert weights of this shape can be banked in this format
        (kernels address whole blocks; gate and up rows share one bank)."""

    def row_bytes(self, rows: int, cols: int, itemsize: int) -> int:
        """Bytes of one ``[rows, cols]`` weight, packed data plus scales (``itemsize``: unquantised dtype)."""
        if self.packed_dtype is None:
            return rows * cols * itemsize
        n = rows * self.packed_cols(cols) * self.packed_dtype.itemsize
        if self.scale_dtype is not None:
            s = 1
            for d in self.scale_shape(rows, cols):
                s *= d
            n += s * self.scale_dtype.itemsize
        return n
