"""FreeToken: an edge-native serving engine for Mixture-of-Experts LLMs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "EngineConfig", "__version__"]

if TYPE_CHECKING:
    from freetoken.config import EngineConfig
    from freetoken.engine.llm import LLM
    from freetoken.runner.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:  # lazy: `import freetoken` stays cheap
    if name == "LLM":
        from freetoken.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from freetoken.runner.sampling_params import SamplingParams

        return SamplingParams
    if name == "EngineConfig":
        from freetoken.config import EngineConfig

        return EngineConfig
    raise AttributeError(name)
