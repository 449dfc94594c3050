"""What a weight format is: a packed tensor plus scale tensors per weight matrix, and a torch reference that turns
them back into floats. Every kernel that reads a format is tested against that reference.

A weight matrix is ``[rows, cols]`` (``cols``: the reduction dimension, the one formats pack along). Formats pack
``cols`` only, so ``rows`` are the same in every format; a leading expert dimension ``[N, rows, cols]`` passes
through every method unchanged.
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

    @abstractmethod
    def packed_cols(self, cols: int) -> int:
        """Columns of the packed tensor of a ``[rows, cols]`` weight."""

    @abstractmethod
    def scale_shape(self, rows: int, cols: int) -> tuple[int, ...]:
        """Shape of the scale tensor of one ``[rows, cols]`` weight (``()``: none)."""

    @abstractmethod
    def scale_name(self, weight_name: str) -> str:
        """The checkpoint's name of the scale tensor beside weight ``weight_name``."""

    @abstractmethod
    def dequantize(self, packed: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The reference: ``[..., rows, cols]`` floats in ``dtype`` from the packed tensor and its scales."""

    @abstractmethod
    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[..., rows, cols]`` floats -> (packed, scale): the reference quantiser (tests, synthetic models)."""

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
