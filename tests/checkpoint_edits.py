"""Bad-input tests' checkpoints: a copy of a tiny single-file checkpoint with its config or tensors changed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

State = dict[str, torch.Tensor]


def edited_checkpoint(
    src: Path,
    dst: Path,
    config: Callable[[dict[str, Any]], dict[str, Any] | None] | dict[str, Any] | None = None,
    tensors: Callable[[State], State] | None = None,
    edit: Callable[[State], object] | None = None,
    drop: str | None = None,
    add: State | None = None,
) -> Path:
    """``src`` copied to ``dst`` (tokenizer and all); config.json through ``config`` (a function of the dict that
    returns the new one or changes it in place, or keys to set); model.safetensors through ``tensors`` (the new
    dict) or ``edit`` (changes in place; what it returns is ignored), less ``drop``, plus ``add``."""
    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        new = config(cfg) if callable(config) else {**cfg, **config}
        (dst / "config.json").write_text(json.dumps(cfg if new is None else new))
    if tensors is not None or edit is not None or drop is not None or add:
        state = load_file(dst / "model.safetensors")
        state = tensors(state) if tensors is not None else state
        if edit is not None:
            edit(state)
        if drop is not None:
            del state[drop]
        save_file({**state, **(add or {})}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst
