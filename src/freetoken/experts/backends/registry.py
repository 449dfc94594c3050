"""Expert backends by name (lazy imports): adding one is one new file plus one line here."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from freetoken.config import EngineConfig
    from freetoken.experts.base import ExpertBackend, ExpertBanks

# name -> "module:factory"; a factory takes (config, banks, device, dtype) and returns a backend.
BACKENDS: dict[str, str] = {
    "fused": "freetoken.experts.backends.fused:create",
    "offload": "freetoken.experts.backends.offload:create",
    "cpu": "freetoken.experts.backends.cpu:create",
    "hybrid": "freetoken.experts.backends.hybrid:create",
    "static-layers": "freetoken.experts.backends.static_layers:create",
    "static-freq": "freetoken.experts.backends.static_freq:create",
}


def create_backend(
    config: EngineConfig, banks: ExpertBanks, device: torch.device, dtype: torch.dtype
) -> ExpertBackend:
    name = config.moe_backend
    if name == "auto":
        from freetoken.experts.backends.auto import resolve_auto

        name = resolve_auto(banks, device)
    if name not in BACKENDS:
        raise ValueError(f"MoE backend {name!r} is not available; available: {', '.join(sorted(BACKENDS))}")
    module, _, attr = BACKENDS[name].partition(":")
    factory: Callable[..., ExpertBackend] = getattr(importlib.import_module(module), attr)
    return factory(config, banks, device, dtype)
