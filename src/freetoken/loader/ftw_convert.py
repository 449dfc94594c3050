"""``ft convert``: a Hugging Face checkpoint directory -> an FTW directory (``checkpoint/ftw_manifest.py``).

The source is loaded by the loader itself (``build_model`` on the CPU), so a checkpoint the loader refuses is
refused here with the loader's error, and the banks written are the host pool's banks byte for byte (packed
experts stay packed, with their scale banks). The non-expert tensors are copied as they are stored (quantised ones
with their scales: the loader reads them as before), the config and tokenizer files are copied, and the manifest
is written last. Memory: the pool plus the non-expert weights, as when serving.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import cast

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_manifest import MANIFEST, ExpertDims, Manifest, is_ftw
from freetoken.checkpoint.ftw_write import write_bank, write_manifest, write_safetensors
from freetoken.checkpoint.hf_config import HFConfig, load_hf_config
from freetoken.checkpoint.quantization import PackedLayout
from freetoken.checkpoint.safetensors_io import SafetensorsReader
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.loader.model_build import build_model, family_hook, weight_format
from freetoken.models import gpt_oss
from freetoken.models.base import Family
from freetoken.models.blocks import expert_reads
from freetoken.models.registry import get_family

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Copied beside the weights: config, generation config, tokenizer and chat-template files (never code).
_COPIED_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
_NOT_COPIED = ("model.safetensors.index.json", MANIFEST)


class _Unused(ExpertBackend):
    """Stands in for the backend: the converter only needs the banks ``build_model`` fills."""

    name = "convert"

    def forward(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a model built for conversion does not run")


def _expert_names(reader: SafetensorsReader, hf: HFConfig, family: Family) -> list[str]:
    """The routed experts' tensors and scale tensors: what goes into banks (the rest is copied)."""
    own = family_hook(family, "checkpoint_layout")  # a family's own quantisation layout (DeepSeek-V4 as released)
    layout = cast("PackedLayout | None", own(hf)) if own is not None else weight_format(reader, hf)
    w = CheckpointWeights(reader, torch.device("cpu"), torch.float32, layout)
    names: list[str] = []
    for li, i in enumerate(hf.moe_layer_ids):
        reads = gpt_oss.expert_reads(w, hf, i, li) if family.gpt_oss_experts else expert_reads(w, family, hf, i, li)
        for name, *_ in reads:
            names.append(w.resolve(name))  # a compressed-tensors ``<name>_packed``
            if w.is_packed(name) and w.layout is not None:
                names += w.side_tensors(name)  # its scales (and an NVFP4 per-tensor scale)
    return names


def _bank_dtype(reader: SafetensorsReader, expert_names: list[str], dtype: str | None) -> torch.dtype:
    """``--dtype``, else the dtype the experts are stored in (bf16 for packed experts: not used by their banks)."""
    if dtype is not None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        return _DTYPES[dtype]
    stored = reader.tensors[expert_names[0]].dtype if expert_names and expert_names[0] in reader else None
    return stored if stored in _DTYPES.values() and stored is not None else torch.bfloat16


def convert(src: str | Path, dst: str | Path, dtype: str | None = None, layers_per_file: int = 8) -> Manifest:
    """Write the FTW form of checkpoint ``src`` into ``dst`` (new or empty); returns its manifest."""
    src, dst = Path(src), Path(dst)
    if is_ftw(src):
        raise CheckpointError(f"{src}: is an FTW directory already")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CheckpointError(f"{dst}: exists and is not an empty directory; choose a new one")
    t0 = time.perf_counter()
    hf = load_hf_config(src)
    family = get_family(hf.architecture, str(src / "config.json"))
    reader = SafetensorsReader(src)
    named = family_hook(family, "checkpoint_family")
    if named is not None:  # its own tensor names (DeepSeek-V4: ``model.`` prefixed or not)
        own = named(reader)
        assert isinstance(own, Family)
        family = own
    names = _expert_names(reader, hf, family)
    if not names:
        raise CheckpointError(f"{src}: {hf.architecture} has no routed experts; FTW pre-banks MoE experts only")
    bdtype = _bank_dtype(reader, names, dtype)
    held: list[ExpertBanks] = []

    def keep(banks: ExpertBanks) -> ExpertBackend:
        held.append(banks)
        return _Unused()

    loaded = build_model(hf, family, torch.device("cpu"), bdtype, keep, 2, verify="off")  # the loader's checks
    del loaded  # the non-expert weights as the model holds them (they are copied as stored instead)
    banks = held[0]
    fmt_name = banks.fmt.name
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for bank_name, t in zip(("gate_up", "down", "gate_up_scale", "down_scale"), banks.tensors()):
        written.append(write_bank(dst, bank_name, t, banks.num_experts, layers_per_file))
    held.clear()
    del banks
    expert = set(names)
    rest = {n: reader.read(n) for n in reader.tensors if n not in expert}
    files = write_safetensors(dst, rest)
    del rest
    for f in sorted(src.iterdir()):
        if f.is_file() and f.suffix in _COPIED_SUFFIXES and f.name not in _NOT_COPIED:
            shutil.copy2(f, dst / f.name)
    dims = ExpertDims(len(hf.moe_layer_ids), hf.num_experts, hf.hidden_size, hf.moe_intermediate_size,
                      tuple(hf.moe_layer_ids))  # fmt: skip
    m = Manifest(dst, fmt_name, dims, tuple(written), tuple(files), hf.raw, str(src.resolve()))
    write_manifest(m)
    log.info("converted %s to FTW in %s (%.1f s)", src, dst, time.perf_counter() - t0)
    return m

