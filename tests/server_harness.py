"""Run the real HTTP app under uvicorn on 127.0.0.1 (free port) in a thread, for the server tests
(``freetoken.bench.loopback``, shared with the benchmarks that measure through the server)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from freetoken.bench.loopback import MODEL, Running, free_port, serve

__all__ = [
    "MEMORY_AUTH", "MEMORY_KEY", "MODEL", "Running", "engine_memory", "free_port", "real_engine", "resizable_server",
    "serve", "tiny_checkpoint",
]  # fmt: skip


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


MEMORY_KEY = "sekrit"
MEMORY_AUTH = {"Authorization": f"Bearer {MEMORY_KEY}"}


@contextmanager
def resizable_server(directory: str) -> Iterator[Running]:
    """The memory route's server: the real engine (hybrid backend, a budget small enough for resizes to move the
    split) behind an API key (``MEMORY_AUTH``), on a tiny checkpoint written to ``directory``."""
    from freetoken.server.settings import ServerConfig

    engine = real_engine(tiny_checkpoint(directory), moe_backend="hybrid", max_running_requests=4, max_model_len=256,
                         page_size=8, vram_budget=0.004, vram_reserve=0.0)  # fmt: skip
    with serve(engine, ServerConfig(served_model_names=(MODEL,), api_key=MEMORY_KEY)) as s:
        yield s


def engine_memory(srv: Running) -> dict[str, Any]:
    """``/v1/engine/stats``' memory split and last resizes."""
    import httpx

    r = httpx.get(srv.url + "/v1/engine/stats", headers=MEMORY_AUTH)
    assert r.status_code == 200
    return r.json()["engine"]["memory"]
