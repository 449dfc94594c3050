"""Writing FTW files: a bank's rows by layer range, zero-padded to ``ALIGNMENT``, each with its checksum; the
non-expert weights as safetensors shards; the manifest last (a directory whose conversion stopped half-way has
none, so it is never taken for FTW)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import xxhash
from safetensors.torch import save_file

from freetoken.checkpoint.ftw_io import byte_view
from freetoken.checkpoint.ftw_manifest import ALIGNMENT, MANIFEST, Bank, FilePart, Manifest, dtype_name, round_up
from freetoken.checkpoint.ftw_verify import xxh3_of_file

_STEP = 64 << 20
SHARD_BYTES = 2 << 30  # non-expert safetensors shard size


def write_bytes(path: Path, data: memoryview) -> FilePart:
    """``data`` then zeros up to ``ALIGNMENT``; returns the part (no rows) with the data's checksum."""
    h = xxhash.xxh3_64()
    with open(path, "wb") as f:
        for at in range(0, len(data), _STEP):
            piece = data[at : at + _STEP]
            h.update(piece)
            f.write(piece)
        pad = round_up(len(data)) - len(data)
        f.write(b"\0" * pad)
        f.flush()
        os.fsync(f.fileno())
    return FilePart(path.name, len(data), len(data) + pad, h.hexdigest())


def layer_ranges(num_layers: int, row_bytes: int, experts: int, layers_per_file: int) -> list[tuple[int, int]]:
    """Layer ranges of at most ``layers_per_file`` layers whose starts lie on the ``ALIGNMENT`` grid of the bank;
    one range when some would not (the whole bank in one file)."""
    step = max(1, layers_per_file) if layers_per_file > 0 else num_layers
    starts = list(range(0, num_layers, step))
    if any((s * experts * row_bytes) % ALIGNMENT for s in starts):
        return [(0, num_layers)]
    return [(s, min(s + step, num_layers)) for s in starts]


def write_bank(directory: Path, name: str, bank: torch.Tensor, experts: int, layers_per_file: int) -> Bank:
    """Bank ``name`` (``[L*E, ...]``, contiguous, CPU) as layer-range files in ``directory``."""
    bank = bank.contiguous()
    rows = int(bank.shape[0])
    row_bytes = bank[0].numel() * bank.element_size() if rows else 0
    parts = []
    for l0, l1 in layer_ranges(rows // experts, row_bytes, experts, layers_per_file):
        r0, r1 = l0 * experts, l1 * experts
        part = write_bytes(directory / f"experts-{name}-L{l0:03d}-L{l1 - 1:03d}.ftw",
                           byte_view(bank, r0 * row_bytes, (r1 - r0) * row_bytes))  # fmt: skip
        parts.append(FilePart(part.file, part.nbytes, part.file_bytes, part.xxh3_64, (r0, r1), r0 * row_bytes))
    return Bank(name, dtype_name(bank.dtype), tuple(int(s) for s in bank.shape), tuple(parts))


def write_safetensors(directory: Path, tensors: dict[str, torch.Tensor]) -> list[FilePart]:
    """``tensors`` in shards of about ``SHARD_BYTES`` (``model-0000i-of-0000n.safetensors`` and the index), in
    name order; returns the shards with their checksums."""
    import json

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t.contiguous()
        size += nbytes
    n = len(shards)
    weight_map: dict[str, str] = {}
    out = []
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(directory / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
        nbytes = (directory / fname).stat().st_size
        out.append(FilePart(fname, nbytes, nbytes, xxh3_of_file(directory / fname, nbytes)))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return out


def write_manifest(m: Manifest) -> None:
    tmp = m.directory / (MANIFEST + ".tmp")
    tmp.write_text(m.to_json())
    os.replace(tmp, m.directory / MANIFEST)
