"""Checked reads of a checkpoint's tensors by name, and the record of which tensors were taken.

``CheckpointWeights`` reads a tensor once, straight into its final dtype and device, after checking its shape
against what the config implies (the tensor is named in the error). Every name the model's assembly asks for
(``get``, ``opt``, ``read_into``, ``claim``) is recorded, so ``check_all_used`` can refuse a checkpoint holding
tensors no one reads (weights the engine would silently drop) before the expert banks are read. A weight stored
packed in the checkpoint's format (``layout``) is read with its scale tensor: dequantised by the format's
reference (``get``: non-expert weights), or kept packed (``read_packed_into``: the expert banks).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.quantization import PackedLayout
from freetoken.checkpoint.safetensors_io import SafetensorsReader

log = logging.getLogger(__name__)


class CheckpointWeights:
    def __init__(
        self, reader: SafetensorsReader, device: torch.device, dtype: torch.dtype, layout: PackedLayout | None = None
    ) -> None:
        self.reader, self.device, self.dtype, self.layout = reader, device, dtype, layout
        self.used: set[str] = set()

    def is_packed(self, name: str) -> bool:
        """Whether ``name`` is stored in the layout's packed dtype (then a scale tensor sits beside it)."""
        info = self.reader.tensors.get(name)
        return self.layout is not None and info is not None and info.dtype_name in self.layout.checkpoint_dtypes

    def __contains__(self, name: str) -> bool:
        return name in self.reader

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Tensor ``name`` of ``shape`` in the compute dtype (or ``dtype``), on the compute device."""
        got = self.reader.shape(name)
        if got != shape:
            raise CheckpointError(
                f"{self.reader.directory}: tensor {name} has shape {list(got)}, expected {list(shape)} from config.json"
            )
        self.used.add(name)
        if self.is_packed(name):
            assert self.layout is not None
            scale = self.layout.scale_name(name)  # its shape was checked with the headers (check_supported)
            self.used.add(scale)
            raw, scales = self.reader.read(name), self.reader.read(scale, torch.float32)
            w = self.layout.dequantize(raw, scales, dtype or self.dtype)
            return w.to(self.device)
        return self.reader.read(name, dtype or self.dtype).to(self.device)

    def opt(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self.get(name, shape) if name in self.reader else None

    def claim(self, names: Iterable[str]) -> None:
        """Names read later (``read_into``) or deliberately not read (a tied head): they count as used."""
        self.used.update(names)

    def read_into(self, name: str, dst: torch.Tensor, shape: tuple[int, ...]) -> None:
        """Read ``name`` (checked against ``shape``) into ``dst``, a CPU tensor of any dtype."""
        self.reader.read_into(name, dst, shape)
        self.used.add(name)

    def read_packed_into(self, name: str, dst: torch.Tensor, scale_dst: torch.Tensor, shape: tuple[int, ...]) -> None:
        """Read packed weight ``name`` (checked against ``shape``) into ``dst`` as it is, and its scale tensor into
        ``scale_dst`` (float32)."""
        assert self.layout is not None
        self.read_into(name, dst, shape)
        scale = self.layout.scale_name(name)
        self.reader.read_into(scale, scale_dst)
        self.used.add(scale)

    def check_all_used(self, architecture: str, skippable: tuple[str, ...]) -> None:
        """Refuse tensors nobody read, except those matching a ``skippable`` pattern (fnmatch), said once."""
        left = sorted(set(self.reader.tensors) - self.used)
        skipped = [n for n in left if any(fnmatch.fnmatchcase(n, p) for p in skippable)]
        unknown = [n for n in left if n not in set(skipped)]
        if unknown:
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            raise CheckpointError(
                f"{self.reader.directory}: {len(unknown)} tensor(s) {architecture} does not read: "
                f"{', '.join(unknown[:3])}{more}: not supported yet"
            )
        if skipped:
            log.info("%s: skipping %d tensor(s) %s does not use (%s)", self.reader.directory, len(skipped),
                     architecture, ", ".join(skippable))  # fmt: skip
