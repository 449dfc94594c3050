"""The peers' expert placements, as benchmark policies beside the engine's backends: ``static-layers``
(llama.cpp's ``--n-cpu-moe``) and ``static-freq`` (KTransformers). Each is a ``SlotBackend`` whose placement is
fixed (locked slots, no fills); ``register()`` adds both to the expert-backend registry
(``experts/backends/registry.py``) of this process, so ``EngineConfig(moe_backend="static-layers")`` builds one.
The benchmarks that run them register them (``decode``, ``e2e``, and the server ``http_ttft`` starts); importing
this package does not, so ``ft serve``, whose parser imports the benchmarks' modules for their flags, never takes
a placement.
"""

from __future__ import annotations

from freetoken.bench.placements.static_freq import StaticFreqBackend
from freetoken.bench.placements.static_layers import StaticLayersBackend
from freetoken.experts.backends.registry import register_backend
from freetoken.experts.backends.slot_backend import SlotBackend

PLACEMENTS: dict[str, type[SlotBackend]] = {"static-layers": StaticLayersBackend, "static-freq": StaticFreqBackend}


def register() -> None:
    """Adds the placements to this process's expert-backend registry (again: no change)."""
    for name, cls in PLACEMENTS.items():
        register_backend(name, cls.create)
