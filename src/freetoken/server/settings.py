"""HTTP-side settings (the engine's are ``freetoken.config.EngineConfig``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 1919
    """Port to listen on."""
    api_key: str | None = None
    """If set, requests to /v1/* must carry it (Authorization: Bearer KEY or x-api-key: KEY)."""
    served_model_names: tuple[str, ...] = ()
    """Names clients may use in "model" (the first is reported). Empty: the checkpoint's name."""
    tool_parser: str | None = None
    """Tool-call parser family (see freetoken.chat.registry). None: chosen from the checkpoint."""
    keepalive_s: float = 10.0
    """Seconds of silence after which a stream sends a keep-alive (Anthropic ping, SSE comment)."""
    reasoning_parser: str | None = None
    """Reasoning parser family, or "none" to return reasoning as plain content. None: from the checkpoint."""
