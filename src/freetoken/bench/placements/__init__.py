"""The peers' expert placements, as benchmark policies beside the engine's backends: ``static-layers``
(llama.cpp's ``--n-cpu-moe``) and ``static-freq`` (KTransformers). Each is a ``SlotBackend`` whose placement is
fixed (locked slots, no fills); importing this package registers both with the expert-backend registry
(``experts/backends/registry.py``), so ``EngineConfig(moe_backend="static-layers")`` builds one in this process.
"""

from __future__ import annotations

from freetoken.bench.placements.static_freq import StaticFreqBackend
from freetoken.bench.placements.static_layers import StaticLayersBackend
from freetoken.experts.backends.registry import register_backend
from freetoken.experts.backends.slot_backend import SlotBackend

PLACEMENTS: dict[str, type[SlotBackend]] = {"static-layers": StaticLayersBackend, "static-freq": StaticFreqBackend}

for _name, _cls in PLACEMENTS.items():
    register_backend(_name, _cls.create)
