"""Resolve the model, device and dtype; build the model and its expert backend at the sizes of the memory plan
(``loader/memory_plan.py``); load the tokenizer."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig, load_hf_config
from freetoken.checkpoint.tokenizer import load_tokenizer
from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import check_backend
from freetoken.loader.hub import resolve_model
from freetoken.loader.memory_plan import StartPlan
from freetoken.loader.model_build import LoadedModel, build_model
from freetoken.memory.planner import MemoryPlan
from freetoken.models.registry import get_family

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSetup:
    model_path: Path
    hf: HFConfig
    device: torch.device
    dtype: torch.dtype
    loaded: LoadedModel
    tokenizer: Any | None
    max_model_len: int
    kv_pages: int
    eos_token_ids: list[int]
    plan: MemoryPlan  # the sizes every cache starts at (``memory/planner.py``)


def default_model_path() -> Path:
    return Path(__file__).resolve().parent.parent / "assets" / "default_model"


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return dev


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def context_length(config: EngineConfig, hf: HFConfig) -> int:
    """``max_model_len``, or the checkpoint's limit; asking for more than the model was built for is
    refused, not clamped."""
    limit = hf.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise CheckpointError(
            f"--max-model-len {config.max_model_len} is more than this model's context "
            f"(max_position_embeddings = {limit}); use at most {limit}"
        )
    return config.max_model_len


def _close_backend(backend: Any) -> None:
    """Stops the backend's CPU branch in order (queued batches drained, workers joined, pool unpinned) instead of
    leaving it to the interpreter's exit, whose finalizers know no order between the feeder, the kernel pool and
    the pinned pool (a hybrid CUDA process that never closed its backend aborted at exit on the GPU box:
    "terminate called without an active exception")."""
    try:
        backend.close()
    except Exception as exc:  # noqa: BLE001 - closed already, or CUDA torn down: nothing left to release
        log.debug("closing the expert backend: %s: %s", type(exc).__name__, exc)


def setup_model(config: EngineConfig) -> ModelSetup:
    check_backend(config.moe_backend)  # an unknown name is refused before the weights load
    path = resolve_model(config.model) if config.model else default_model_path()  # a local dir, or a Hub repo id
    if config.model is None and not (path / "config.json").exists():
        raise CheckpointError(f"{path}: the embedded default model is not installed; pass a model directory")
    hf = load_hf_config(path)
    family = get_family(hf.architecture, str(path / "config.json"))
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    max_len = context_length(config, hf)
    start = StartPlan(config, hf, family, device, dtype, max_len)
    loaded = build_model(hf, family, device, dtype, start, max_len, config.verify_weights)
    if loaded.backend is not None:  # when the model goes, or at exit if it never does: before the kernels' own
        weakref.finalize(loaded, _close_backend, loaded.backend)  # finalizers (registered earlier, run later)
    tokenizer = load_tokenizer(path)
    eos = list(hf.eos_token_ids)
    if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(int(tokenizer.eos_token_id))
    plan = start.finish()  # its context: max_len, or less where the device has no room for the checkpoint's own
    log.info("loaded %s (%s) on %s as %s; %d KV pages", path.name, hf.architecture, device, dtype, plan.kv_pages)
    return ModelSetup(path, hf, device, dtype, loaded, tokenizer, plan.context, plan.kv_pages, eos, plan)
