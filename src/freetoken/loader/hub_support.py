"""Whether this engine serves a checkpoint, from its ``config.json`` alone (no weight read): the same checks the
loader makes (``models/registry.py`` for the family, ``quant/registry.py`` for the weight format), so a repo the
engine cannot serve is refused before a weight byte is downloaded, and ``ft models`` says which cached ones it
serves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.loader.model_build import family_hook
from freetoken.models.registry import get_family
from freetoken.quant.base import QuantizationError
from freetoken.quant.registry import format_from_config


@dataclass(frozen=True)
class Support:
    architecture: str  # config.json's ``architectures[0]`` ("?" when unreadable)
    format: str  # the weight format: a quant/ format's name, else the stored dtype
    served: bool
    reason: str  # why not ("" when served)


def support_of(directory: Path) -> Support:
    """What the engine makes of the checkpoint in ``directory`` (only its config files are read)."""
    try:
        hf = load_hf_config(directory)
    except CheckpointError as e:
        return Support("?", "?", False, str(e))
    try:
        fmt = format_from_config(hf.raw)
        form = fmt.name if fmt is not None else str(hf.dtype or "unquantised")
    except QuantizationError as e:
        return Support(hf.architecture, "?", False, f"config.json: {e}")
    try:
        family = get_family(hf.architecture, "config.json")
        check = family_hook(family, "check_config")
        if check is not None:  # its switches and format, as its own assembly checks them (DeepSeek-V4)
            check(hf)
        layout = family_hook(family, "checkpoint_layout")
        named = layout(hf) if layout is not None else None  # a family's own quantisation layout (DeepSeek-V4)
        form = str(getattr(named, "name", form))
    except CheckpointError as e:
        return Support(hf.architecture, form, False, str(e))
    return Support(hf.architecture, form, True, "")
