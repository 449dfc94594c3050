"""Lazy, zero-copy reads of safetensors checkpoints (single file or sharded with an index).

Tensors are read one at a time straight into caller-provided destination tensors with ``readinto``
(no mmap): peak host memory stays near the final weight size, and the pool can be filled in its
final layout. The format is a little-endian u64 header length, a JSON header
``{name: {dtype, shape, data_offsets}}``, then the raw bytes.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from freetoken.checkpoint.errors import CheckpointError

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype_name: str  # the header's name, e.g. "BF16", "F8_E4M3"
    dtype: torch.dtype | None  # None: a dtype torch has no type for (e.g. "F8_E8M0"); never read
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


def _read_header(path: Path) -> dict[str, TensorInfo]:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{path}: not a safetensors file (truncated header)")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise CheckpointError(f"{path}: not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a safetensors file (bad JSON header)") from e
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dt = str(meta["dtype"])
        info = TensorInfo(path, dt, _DTYPES.get(dt), tuple(meta["shape"]), 8 + n + start, end - start)
        if info.offset + info.nbytes > size:
            raise CheckpointError(f"{path}: tensor {name} lies beyond the end of the file (truncated?)")
        out[name] = info
    return out


class SafetensorsReader:
    """All tensors of a checkpoint directory, by name; nothing is read until asked."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.tensors: dict[str, TensorInfo] = {}
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: malformed index (no weight_map)") from e
            for shard in sorted(set(weight_map.values())):
                path = self.directory / shard
                if not path.exists():
                    raise CheckpointError(f"{path}: shard named in {index.name} is missing")
                self.tensors.update(_read_header(path))
            missing = [k for k in weight_map if k not in self.tensors]
            if missing:
                raise CheckpointError(f"{index}: tensor {missing[0]} is listed but absent from its shard")
        else:
            files = sorted(self.directory.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{self.directory}: no *.safetensors weights found")
            for path in files:
                self.tensors.update(_read_header(path))

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info(name).shape

    def _info(self, name: str) -> TensorInfo:
        try:
            info = self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.directory}: tensor {name} is missing from the checkpoint") from None
        if info.dtype is None:
            raise CheckpointError(f"{info.file.name}: tensor {name} has dtype {info.dtype_name}, which cannot be read")
        return info

    def read_into(self, name: str, dst: torch.Tensor, expect_shape: tuple[int, ...] | None = None) -> None:
        """Read tensor ``name`` into ``dst`` (a contiguous CPU tensor of the same shape; any dtype)."""
        info = self._info(name)
        shape = tuple(expect_shape) if expect_shape is not None else tuple(dst.shape)
        if info.shape != shape:
            raise CheckpointError(
                f"{info.file.name}: tensor {name} has shape {list(info.shape)}, expected {list(shape)}"
            )
        assert info.dtype is not None  # _info refuses the others
        if dst.dtype == info.dtype and dst.is_contiguous() and dst.device.type == "cpu":
            self._readinto(info, dst)
        else:
            tmp = torch.empty(info.shape, dtype=info.dtype)
            self._readinto(info, tmp)
            dst.copy_(tmp.view(dst.shape))

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        info = self._info(name)
        assert info.dtype is not None  # _info refuses the others
        t = torch.empty(info.shape, dtype=info.dtype)
        self._readinto(info, t)
        return t if dtype is None else t.to(dtype)

    @staticmethod
    def _readinto(info: TensorInfo, dst: torch.Tensor) -> None:
        if info.nbytes == 0:
            return
        buf = memoryview(dst.reshape(-1).view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]
        if len(buf) != info.nbytes:
            raise CheckpointError(f"{info.file.name}: size mismatch reading a tensor ({info.nbytes} bytes)")
        with open(info.file, "rb") as f:
            f.seek(info.offset)
            got = f.readinto(buf)
        if got != info.nbytes:
            raise CheckpointError(f"{info.file.name}: truncated tensor data")
