"""FTW, FreeToken's pre-banked weight format: the manifest (``ftw.json``) and its checks against the files.

An FTW directory holds the routed experts as the host pool's banks (``gate_up``, ``down`` and, for a quantised
format, their scale banks: ``[N, ...]`` rows, ``eid = moe_layer * E + expert``), each bank's raw bytes split into
files by layer range (``experts-<bank>-<first layer>-<last layer>.ftw``: the bytes of rows ``[r0, r1)`` from file
offset 0, zero-padded to ``ALIGNMENT``, so a direct read lands them in place), beside the non-expert weights as
safetensors and the checkpoint's config and tokenizer files. The manifest names every file with its byte size and
xxh3-64 checksum, every bank's dtype and shape, and the expert dimensions of the model it was made for. A
directory without ``ftw.json`` is an ordinary checkpoint (``read_manifest`` returns None).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from freetoken.checkpoint.errors import CheckpointError

MANIFEST = "ftw.json"
FORMAT = "freetoken-ftw"
VERSION = 1
ALIGNMENT = 4096  # direct I/O: file offsets, lengths and memory addresses are multiples of this
HUGE_PAGE = 2 << 20  # bank memory starts on a huge-page boundary; layer-range files start on one when they can
BANK_NAMES = ("gate_up", "down", "gate_up_scale", "down_scale")
# The dtypes a bank may hold (by torch's name): the unquantised compute dtypes, packed bytes, block scales.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "uint8": torch.uint8,
    "int32": torch.int32,
}


def round_up(n: int, to: int = ALIGNMENT) -> int:
    return -(-n // to) * to


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise CheckpointError(f"FTW cannot store a bank of dtype {name}")
    return name


@dataclass(frozen=True)
class FilePart:
    """One file of the directory: ``nbytes`` of data from offset 0 (``file_bytes`` with the padding)."""

    file: str
    nbytes: int
    file_bytes: int
    xxh3_64: str  # hex digest of the data bytes (not the padding)
    rows: tuple[int, int] = (0, 0)  # bank rows [r0, r1) a bank part holds; (0, 0) for other files
    bank_offset: int = 0  # where in the bank's bytes the part starts (r0 * row bytes)


@dataclass(frozen=True)
class Bank:
    name: str  # one of BANK_NAMES
    dtype: str  # a DTYPES key
    shape: tuple[int, ...]  # [N, ...]
    parts: tuple[FilePart, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        n = self.torch_dtype.itemsize
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class ExpertDims:
    """What the banks were made for, checked against config.json at load."""

    num_moe_layers: int
    num_experts: int
    hidden_size: int
    moe_intermediate_size: int
    moe_layer_ids: tuple[int, ...]


@dataclass(frozen=True)
class Manifest:
    directory: Path
    expert_format: str  # a ``quant/`` format name (``format_by_name``)
    dims: ExpertDims
    banks: tuple[Bank, ...]
    files: tuple[FilePart, ...]  # the non-expert safetensors (checked and verified like the banks)
    config: dict[str, Any] = field(default_factory=dict)  # the config.json the banks were made from
    source: str = ""

    def bank(self, name: str) -> Bank | None:
        return next((b for b in self.banks if b.name == name), None)

    @property
    def bank_bytes(self) -> int:
        return sum(b.nbytes for b in self.banks)

    def to_json(self) -> str:
        body = {"format": FORMAT, "version": VERSION, "alignment": ALIGNMENT, "expert_format": self.expert_format,
                "experts": asdict(self.dims), "banks": [asdict(b) for b in self.banks],
                "files": [asdict(f) for f in self.files], "source": self.source, "config": self.config}  # fmt: skip
        return json.dumps(body, indent=1)


def is_ftw(directory: str | os.PathLike[str]) -> bool:
    return (Path(directory) / MANIFEST).is_file()


def read_manifest(directory: str | os.PathLike[str]) -> Manifest | None:
    """The directory's manifest, its structure checked and every file it names present at its stated size; None
    when the directory has no ``ftw.json``. Refusals name the file."""
    d = Path(directory)
    path = d / MANIFEST
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text())
        if body.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not an FTW manifest (format {body.get('format')!r})")
        if body.get("version") != VERSION:
            raise CheckpointError(f"{path}: FTW version {body.get('version')} is not supported (this build "
                                  f"reads {VERSION}): convert the checkpoint again")  # fmt: skip
        m = Manifest(
            directory=d,
            expert_format=str(body["expert_format"]),
            dims=_dims(body["experts"]),
            banks=tuple(_bank(b) for b in body["banks"]),
            files=tuple(_part(f) for f in body["files"]),
            config=dict(body.get("config", {})),
            source=str(body.get("source", "")),
        )
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from e
    _check_structure(m, path)
    _check_files(m)
    return m


def _dims(x: dict[str, Any]) -> ExpertDims:
    return ExpertDims(int(x["num_moe_layers"]), int(x["num_experts"]), int(x["hidden_size"]),
                      int(x["moe_intermediate_size"]), tuple(int(i) for i in x["moe_layer_ids"]))  # fmt: skip


def _part(x: dict[str, Any]) -> FilePart:
    r0, r1 = (int(r) for r in x.get("rows", (0, 0)))
    return FilePart(str(x["file"]), int(x["nbytes"]), int(x["file_bytes"]), str(x["xxh3_64"]), (r0, r1),
                    int(x.get("bank_offset", 0)))  # fmt: skip


def _bank(x: dict[str, Any]) -> Bank:
    return Bank(str(x["name"]), str(x["dtype"]), tuple(int(s) for s in x["shape"]), tuple(_part(p) for p in x["parts"]))


def _check_structure(m: Manifest, path: Path) -> None:
    """Each bank's parts cover its rows in order, with byte sizes that add up."""
    for b in m.banks:
        if b.name not in BANK_NAMES or b.dtype not in DTYPES:
            raise CheckpointError(f"{path}: unknown bank {b.name!r} or dtype {b.dtype!r}")
        if not b.shape or not b.parts:
            raise CheckpointError(f"{path}: bank {b.name} has no shape or no files")
        row = b.nbytes // b.shape[0] if b.shape[0] else 0
        at = 0
        for p in b.parts:
            r0, r1 = p.rows
            if r0 != at or r1 <= r0 or p.nbytes != (r1 - r0) * row or p.bank_offset != r0 * row:
                raise CheckpointError(f"{path}: {p.file} (rows {r0}..{r1}, {p.nbytes} bytes) does not continue bank "
                                      f"{b.name} at row {at} ({row} bytes a row)")  # fmt: skip
            if p.file_bytes != round_up(p.nbytes):
                raise CheckpointError(f"{path}: {p.file}: file_bytes {p.file_bytes} is not {p.nbytes} bytes padded "
                                      f"to {ALIGNMENT}")  # fmt: skip
            if p.bank_offset % ALIGNMENT:  # a direct read lands each part in place
                raise CheckpointError(f"{path}: {p.file} starts off the {ALIGNMENT}-byte grid of bank {b.name}")
            at = r1
        if at != b.shape[0]:
            raise CheckpointError(f"{path}: the files of bank {b.name} hold rows 0..{at}, its shape has {b.shape[0]}")


def _check_files(m: Manifest) -> None:
    """Every file the manifest names exists with the size it states (a truncated or padded file is refused)."""
    for p in [p for b in m.banks for p in b.parts] + list(m.files):
        f = m.directory / p.file
        if Path(p.file).name != p.file:
            raise CheckpointError(f"{m.directory / MANIFEST}: file name {p.file!r} is not a plain name")
        try:
            size = f.stat().st_size
        except OSError:
            raise CheckpointError(f"{f}: named in {MANIFEST} but missing") from None
        if size != p.file_bytes:
            why = "truncated" if size < p.file_bytes else "longer than stated"
            raise CheckpointError(f"{f}: {size} bytes, {MANIFEST} says {p.file_bytes} ({why}): convert it again")
