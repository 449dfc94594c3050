"""The expert banks of an FTW directory, read straight into the host pool's memory.

The manifest is checked against config.json (the expert dimensions, then each bank's dtype and shape against what
the pool of this model needs); the banks are allocated unwritten on huge-page boundaries (``ftw_io``) and filled by
parallel direct reads, no repacking: the files are the pool's bytes. The pool pins them after the fill
(``HostExpertPool``). Unquantised banks stored in another dtype than the compute dtype are converted while they are
read (through a small staging buffer; said once). The checksums are checked now (``verify="load"``), in the
background once serving starts (``"background"``, the engine starts it), or not at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_io import Read, aligned_empty, byte_view, read_parts, read_threads
from freetoken.checkpoint.ftw_manifest import MANIFEST, Bank, Manifest, dtype_name
from freetoken.checkpoint.ftw_progress import tracked
from freetoken.checkpoint.ftw_verify import WeightsCheck
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.experts.base import ExpertBanks
from freetoken.quant import QuantizationError, WeightFormat, format_by_name

log = logging.getLogger(__name__)

_STAGE_ROWS_BYTES = 64 << 20


def _check_dims(m: Manifest, hf: HFConfig) -> None:
    want = {"num_moe_layers": len(hf.moe_layer_ids), "num_experts": hf.num_experts, "hidden_size": hf.hidden_size,
            "moe_intermediate_size": hf.moe_intermediate_size, "moe_layer_ids": tuple(hf.moe_layer_ids)}  # fmt: skip
    for key, value in want.items():
        got = getattr(m.dims, key)
        if got != value:
            raise CheckpointError(f"{m.directory / MANIFEST}: the banks were made for {key} = {got}, config.json "
                                  f"says {value}: the manifest does not match this model")  # fmt: skip


def _needed(fmt: WeightFormat, hf: HFConfig) -> dict[str, tuple[int, ...]]:
    """The pool's bank shapes for this model (``ExpertBanks.empty``'s layout)."""
    n, D, I = len(hf.moe_layer_ids) * hf.num_experts, hf.hidden_size, hf.moe_intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"gate_up": (n, 2 * I, fmt.packed_cols(D)), "down": (n, D, fmt.packed_cols(I))}
    if fmt.scale_dtype is not None:
        shapes["gate_up_scale"] = (n, *fmt.scale_shape(2 * I, D))
        shapes["down_scale"] = (n, *fmt.scale_shape(D, I))
    return shapes


def _check_bank(m: Manifest, bank: Bank | None, name: str, shape: tuple[int, ...], fmt: WeightFormat) -> Bank:
    if bank is None:
        raise CheckpointError(f"{m.directory / MANIFEST}: no bank {name}, which {fmt.name} experts need")
    where = m.directory / bank.parts[0].file
    if bank.shape != shape:
        raise CheckpointError(f"{where}: bank {name} has shape {list(bank.shape)} in {MANIFEST}, this model's pool "
                              f"needs {list(shape)}")  # fmt: skip
    packed = fmt.scale_dtype if name.endswith("_scale") else fmt.packed_dtype
    if packed is not None and bank.torch_dtype != packed:
        raise CheckpointError(f"{where}: bank {name} is {bank.dtype}, {fmt.name} needs {dtype_name(packed)}")
    if packed is None and not bank.torch_dtype.is_floating_point:
        raise CheckpointError(f"{where}: bank {name} is {bank.dtype}, unquantised experts need a float dtype")
    return bank


def _convert_into(m: Manifest, bank: Bank, dst: torch.Tensor, on_bytes: Callable[[int], None]) -> None:
    """Read ``bank``'s files through a staging buffer, converting each block of rows into ``dst``'s dtype."""
    row = bank.nbytes // bank.shape[0]
    per = max(1, _STAGE_ROWS_BYTES // max(row, 1))
    stage = torch.empty((per, *bank.shape[1:]), dtype=bank.torch_dtype)
    for p in bank.parts:
        with open(m.directory / p.file, "rb") as f:
            for r in range(p.rows[0], p.rows[1], per):
                k = min(per, p.rows[1] - r)
                view = byte_view(stage, 0, k * row)
                if f.readinto(view) != k * row:
                    raise CheckpointError(f"{m.directory / p.file}: ends early (truncated?)")
                dst[r : r + k].copy_(stage[:k])
                on_bytes(k * row)


def read_ftw_banks(m: Manifest, hf: HFConfig, dtype: torch.dtype, verify: str) -> tuple[ExpertBanks, WeightsCheck]:
    try:
        fmt = format_by_name(m.expert_format)
    except (QuantizationError, KeyError, ValueError) as e:
        raise CheckpointError(f"{m.directory / MANIFEST}: expert format {m.expert_format!r}: {e}") from e
    _check_dims(m, hf)
    banks = {name: _check_bank(m, m.bank(name), name, shape, fmt) for name, shape in _needed(fmt, hf).items()}
    extra = [b.name for b in m.banks if b.name not in banks]
    if extra:
        raise CheckpointError(f"{m.directory / MANIFEST}: bank {extra[0]} does not belong to {fmt.name} experts")
    dest = {name: aligned_empty(b.shape, b.torch_dtype if fmt.quantized else dtype) for name, b in banks.items()}
    verbatim = {name: t for name, t in dest.items() if t.dtype == banks[name].torch_dtype}
    total = sum(b.nbytes for b in banks.values())
    with tracked(total, f"reading {m.directory.name}'s expert banks") as progress:
        reads = [Read(m.directory / p.file, byte_view(t, p.bank_offset, p.file_bytes), p.nbytes)
                 for name, t in verbatim.items() for p in banks[name].parts]  # fmt: skip
        read_parts(reads, on_bytes=progress.advance)
        for name in sorted(set(dest) - set(verbatim)):
            log.info("%s: FTW bank %s is %s, computing in %s: converting while reading (ft convert --dtype %s "
                     "reads it directly)", m.directory, name, banks[name].dtype, dtype_name(dtype),
                     dtype_name(dtype))  # fmt: skip
            _convert_into(m, banks[name], dest[name], progress.advance)
    check = WeightsCheck(m, verbatim)
    if verify == "load":
        check.run(read_threads())
    out = ExpertBanks(gate_up=dest["gate_up"], down=dest["down"], num_layers=len(hf.moe_layer_ids),
                      num_experts=hf.num_experts, top_k=hf.top_k, fmt=fmt, gate_up_scale=dest.get("gate_up_scale"),
                      down_scale=dest.get("down_scale"))  # fmt: skip
    return out, check
