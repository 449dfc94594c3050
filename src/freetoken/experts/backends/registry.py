"""Expert backends by name (lazy imports): adding one is one new file plus one line here.

Code outside the engine (the benchmarks' placement policies, ``bench/placements/``) adds backends with
``register_backend``; ``EngineConfig.moe_backend`` then names them like the built-in ones.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from freetoken.config import EngineConfig
    from freetoken.experts.base import ExpertBackend, ExpertBanks

# A factory takes (config, banks, device, dtype) and returns a backend (``SlotBackend.create`` is one).
BackendFactory = Callable[["EngineConfig", "ExpertBanks", torch.device, torch.dtype], "ExpertBackend"]

# name -> "module:factory"
BACKENDS: dict[str, str] = {
    "fused": "freetoken.experts.backends.fused:create",
    "offload": "freetoken.experts.backends.offload:create",
    "cpu": "freetoken.experts.backends.cpu:create",
    "hybrid": "freetoken.experts.backends.hybrid:create",
}
_REGISTERED: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Adds a backend under ``name`` for this process (again with the same factory: no change)."""
    if name == "auto" or name in BACKENDS or _REGISTERED.get(name, factory) != factory:
        raise ValueError(f"MoE backend {name!r} is taken")
    _REGISTERED[name] = factory


def backend_names() -> list[str]:
    """Every name ``create_backend`` takes (``auto`` first)."""
    return ["auto", *BACKENDS, *_REGISTERED]


def check_backend(name: str) -> None:
    """Raises ``ValueError`` (one line) for a name no backend answers to."""
    if name not in backend_names():
        raise ValueError(f"MoE backend {name!r} is not available; available: {', '.join(backend_names())}")


def create_backend(
    config: EngineConfig, banks: ExpertBanks, device: torch.device, dtype: torch.dtype
) -> ExpertBackend:
    name = config.moe_backend
    check_backend(name)
    if name == "auto":
        from freetoken.experts.backends.auto import resolve_auto

        name = resolve_auto(banks, device)
    if name in _REGISTERED:
        return _REGISTERED[name](config, banks, device, dtype)
    module, _, attr = BACKENDS[name].partition(":")
    factory: BackendFactory = getattr(importlib.import_module(module), attr)
    return factory(config, banks, device, dtype)
