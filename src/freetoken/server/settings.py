"""HTTP-side settings (the engine's are ``freetoken.config.EngineConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

from freetoken.server.origins import normalize_origin, split_host


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 1919
    """Port to listen on."""
    api_key: str | None = None
    """If set, every route but the liveness probe /health must carry it (Authorization: Bearer KEY or
    x-api-key: KEY); /health then says no more than ok / loading / unhealthy."""
    served_model_names: tuple[str, ...] = ()
    """Names clients may use in "model" (the first is reported). Empty: the checkpoint's name."""
    tool_parser: str | None = None
    """Tool-call parser family (see freetoken.chat.registry). None: chosen from the checkpoint."""
    keepalive_s: float = 10.0
    """Seconds of silence after which a stream sends a keep-alive (Anthropic ping, SSE comment)."""
    reasoning_parser: str | None = None
    """Reasoning parser family, or "none" to return reasoning as plain content. None: from the checkpoint."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body accepted (413 past it). The default holds a 1M-token context of text."""
    responses_store: int = 64
    """Responses kept in memory for previous_response_id and GET /v1/responses/{id} (those not sent with
    store: false; the least recently used go first); 0 keeps none."""
    shutdown_timeout_s: float = 15.0
    """On SIGTERM or Ctrl-C: seconds running requests may take to finish before each ends with an error."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names clients may use besides localhost, 127.0.0.1, [::1] and the listening address (which must come
    with this server's port); these match with any port. '*' allows any Host and turns off the DNS-rebinding check."""
    cors_origins: tuple[str, ...] = ()
    """Web page origins (scheme://host[:port], 'null', or '*' for any) allowed to call the API from a browser; they
    get CORS answers. Requests from any other page's origin are refused (the chat page at / is this server's own)."""

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty: give a non-empty key, or none to serve without one")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        if self.responses_store < 0:
            raise ValueError(f"responses_store must be >= 0, got {self.responses_store}")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        self._check_browser_lists()

    def _check_browser_lists(self) -> None:
        """Host names and origins compared as browsers send them: lower case, origins without a default port."""
        hosts = tuple(h.strip().lower() for h in self.allowed_hosts if h.strip())
        for h in hosts:
            if h != "*" and split_host(h) is None:
                raise ValueError(f"allowed host {h!r} is not a host name (name, name:port, or [IPv6])")
        object.__setattr__(self, "allowed_hosts", hosts)
        object.__setattr__(self, "cors_origins", tuple(normalize_origin(o) for o in self.cors_origins if o.strip()))
