"""Run the real HTTP app under uvicorn on 127.0.0.1 (free port) in a thread, for the server tests
(``freetoken.bench.loopback``, shared with the benchmarks that measure through the server)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from freetoken.bench.loopback import MODEL, Running, free_port, serve

__all__ = ["MODEL", "Running", "free_port", "real_engine", "serve", "tiny_checkpoint"]


def tiny_checkpoint(directory: str) -> str:
    """A tiny random MoE checkpoint with tokenizer and chat template (tests/tiny_models.py)."""
    from pathlib import Path

    from tiny_models import save_checkpoint

    save_checkpoint("qwen3_moe", Path(directory), seed=0, tokenizer=True)
    return directory


def real_engine(model_dir: str, **config: Any) -> Callable[[], Any]:
    """A factory for the real engine on the CPU, started on the server's event loop."""
    from freetoken.config import EngineConfig
    from freetoken.engine.async_llm import AsyncLLM

    cfg = EngineConfig(model=model_dir, device="cpu", dtype="float32", **config)
    return lambda: AsyncLLM.start(cfg)
