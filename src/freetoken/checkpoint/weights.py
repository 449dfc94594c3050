"""Checked reads of a checkpoint's tensors by name, and the record of which tensors were taken.

``CheckpointWeights`` reads a tensor once, straight into its final dtype and device, after checking its shape
against what the config implies (the tensor is named in the error). Every name the model's assembly asks for
(``get``, ``opt``, ``read_into``, ``claim``) is recorded, so ``check_all_used`` can refuse a checkpoint holding
tensors no one reads (weights the engine would silently drop) before the expert banks are read. A weight stored
packed in the checkpoint's format (``layout``) is read with its scale tensor: dequantised by the format's
reference (``get``: non-expert weights), or kept packed (``read_packed_into``: the expert banks). Names are the
float checkpoint's: where a layout stores a packed ``<name>_packed`` instead (compressed-tensors), that is read.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.quantization import PackedLayout
from freetoken.checkpoint.safetensors_io import SafetensorsReader
from freetoken.errors import FreeTokenError

log = logging.getLogger(__name__)


class CheckpointWeights:
    def __init__(
        self, reader: SafetensorsReader, device: torch.device, dtype: torch.dtype, layout: PackedLayout | None = None
    ) -> None:
        self.reader, self.device, self.dtype, self.layout = reader, device, dtype, layout
        self.used: set[str] = set()

    def resolve(self, name: str) -> str:
        """The stored name of weight ``name``: ``<name>_packed`` where the checkpoint has that and not ``name``."""
        if self.layout is not None and name not in self.reader and name + "_packed" in self.reader:
            return name + "_packed"
        return name

    def is_packed(self, name: str) -> bool:
        """Whether ``name`` is stored in the layout's packed dtype (then a scale tensor sits beside it)."""
        info = self.reader.tensors.get(self.resolve(name))
        return self.layout is not None and info is not None and info.dtype_name in self.layout.checkpoint_dtypes

    def __contains__(self, name: str) -> bool:
        return self.resolve(name) in self.reader

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> torch.Tensor:
        """Tensor ``name`` of ``shape`` in the compute dtype (or ``dtype``), on the compute device (or ``device``)."""
        packed = self.is_packed(name)
        name = self.resolve(name)
        got = self.reader.shape(name)
        if packed:
            assert self.layout is not None
            shape = self.layout.checkpoint_packed_shape(name, shape)
        if got != shape:
            raise CheckpointError(
                f"{self.reader.directory}: tensor {name} has shape {list(got)}, expected {list(shape)} from config.json"
            )
        self.used.add(name)
        if packed:
            assert self.layout is not None
            w = self.layout.dequantize(self.reader.read(name), self._bank_scale(name), dtype or self.dtype)
            return w.to(device or self.device)
        return self.reader.read(name, dtype or self.dtype).to(device or self.device)

    def opt(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self.get(name, shape) if name in self else None

    def claim(self, names: Iterable[str]) -> None:
        """Names read later (``read_into``) or deliberately not read (a tied head): they count as used."""
        self.used.update(self.resolve(n) for n in names)

    def read_into(self, name: str, dst: torch.Tensor, shape: tuple[int, ...]) -> None:
        """Read ``name`` (checked against ``shape``) into ``dst``, a CPU tensor of any dtype."""
        self.reader.read_into(name, dst, shape)
        self.used.add(name)

    def read_packed_into(self, name: str, dst: torch.Tensor, scale_dst: torch.Tensor, shape: tuple[int, ...]) -> None:
        """Read packed weight ``name`` (``shape``: its unpacked shape, checked against the packed one) into ``dst``
        as it is, and its scales into ``scale_dst`` as the bank holds them (``WeightFormat.bank_scale``)."""
        assert self.layout is not None
        name = self.resolve(name)
        stored = self.reader.tensors[name].dtype
        if stored is not None and stored != dst.dtype and stored.itemsize == dst.dtype.itemsize:
            dst = dst.view(stored)  # packed bytes under another integer name (DeepSeek's int8 e2m1): bytes as stored
        self.read_into(name, dst, self.layout.checkpoint_packed_shape(name, shape))
        scale_dst.copy_(self._bank_scale(name).view(scale_dst.shape))

    def side_tensors(self, name: str) -> list[str]:
        """The scale tensors read with packed weight ``name``."""
        assert self.layout is not None
        name = self.resolve(name)
        return [s for s in (self.layout.scale_name(name), self.layout.scale2_name(name)) if s]

    def _bank_scale(self, name: str) -> torch.Tensor:
        """Packed ``name``'s scale tensors (shapes and dtypes checked with the headers: ``check_supported``) as
        one bank scale tensor."""
        assert self.layout is not None
        scale, scale2 = self.layout.scale_name(name), self.layout.scale2_name(name)
        self.used.update(s for s in (scale, scale2) if s)
        s2 = self.reader.read(scale2) if scale2 else None
        try:
            return self.layout.bank_scale(self.reader.read(scale), s2)
        except FreeTokenError as exc:  # a quant/ QuantizationError (quant/ sits on this row)
            raise CheckpointError(f"{self.reader.directory}: scales of {name}: {exc}") from exc

    def check_all_used(self, architecture: str, skippable: tuple[str, ...]) -> None:
        """Refuse tensors nobody read, except those matching a ``skippable`` pattern (fnmatch), said once."""
        left = sorted(set(self.reader.tensors) - self.used)
        ignored = self.layout.ignored_suffixes if self.layout is not None else ()
        passed = [n for n in left if ignored and n.endswith(ignored)]
        if passed:  # weight-only: activation scales have no use here
            log.info("%s: %d activation scale tensor(s) (%s) read and ignored: %s runs weight-only, activations "
                     "stay in the compute dtype", self.reader.directory, len(passed), ", ".join(ignored),
                     self.layout.name if self.layout is not None else "")  # fmt: skip
            left = [n for n in left if n not in set(passed)]
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
