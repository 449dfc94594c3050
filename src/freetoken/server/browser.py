"""Browser safety, the outermost ASGI layer: a web page the user happens to visit cannot drive the server.

A page on another origin may send "simple" requests (``text/plain`` or form bodies: no CORS preflight) and, through
DNS rebinding, make its own name resolve to 127.0.0.1 and read the answers. So, before anything reaches a route
(and so the engine):

- ``Host`` must name this server: ``localhost``, ``127.0.0.1``, ``[::1]``, the ``--host`` it was started with or the
  address the connection came in on, with the server's port (no port only where the port is the scheme's default,
  as clients send it), or a name in ``--allowed-hosts`` (any port; ``*``: any Host). A rebinding page's Host is its
  own name: 403.
- A request with ``Origin`` (``null`` included) must come from this server's own origin (``scheme://Host``, the Host
  checked above: the chat page at ``/``) or from an origin in ``--cors-origins``, which gets CORS answers (the
  preflight, ``Access-Control-Allow-Origin`` and ``Vary: Origin`` on every answer, streams included); any other: 403.
- ``POST`` bodies must be declared JSON (``application/json`` or ``application/*+json``, parameters allowed): a
  browser sends ``text/plain`` and form bodies without asking first; anything else is a 415.
- ``/v1/engine/*`` (the control routes: resize, stats) answer only loopback clients unless ``--api-key`` is set.

Refusals are JSON in the route's API shape (``errors.py``), counted in ``/metrics``, with the request body read and
dropped so the client sees the answer.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import TYPE_CHECKING

from freetoken.server.errors import APIError, flavor_for_path
from freetoken.server.guard import ASGIApp, Message, Receive, Scope, Send, discard_body
from freetoken.server.origins import DEFAULT_PORTS, split_host

if TYPE_CHECKING:
    from freetoken.server.state import ServerState

log = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
CONTROL_PREFIX = "/v1/engine/"
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = frozenset(
    {
        "authorization",
        "x-api-key",
        "content-type",
        "accept",
        "anthropic-version",
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
        "openai-organization",
        "openai-project",
        "openai-beta",
        "idempotency-key",
    }
)
CORS_HEADER_PREFIXES = ("x-stainless-",)  # the OpenAI and Anthropic SDKs' platform/retry/timeout headers
PREFLIGHT_MAX_AGE_S = 600


class BrowserSafety:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state  # its config: host, port, api_key, allowed_hosts, cors_origins, max_body_bytes
        self.any_host = "*" in state.config.allowed_hosts
        self.allowed_hosts = [h for h in map(split_host, state.config.allowed_hosts) if h is not None]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        cfg = self.state.config
        host, origin = headers.get("host"), headers.get("origin")
        if not self.host_allowed(scope, host):
            what = f"Host {host!r}" if host is not None else "the request"
            why = f"{what} does not name this server (a DNS-rebinding page?); to allow a name: ft serve --allowed-hosts"
            await self.refuse(scope, receive, send, APIError("forbidden", why, code="host_not_allowed"))
            return
        listed = origin is not None and origin_listed(origin, cfg.cors_origins)
        if origin is not None and not listed and origin.lower() != own_origin(scope, host):
            why = f"Origin {origin!r} may not use this server; to allow a web page's origin: ft serve --cors-origins"
            await self.refuse(scope, receive, send, APIError("forbidden", why, code="origin_not_allowed"))
            return
        if listed:
            assert origin is not None
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                await _preflight(send, origin, headers.get("access-control-request-headers", ""))
                return
            send = _with_cors(send, origin)
        err = self.refusal(scope, headers)
        if err is not None:
            await self.refuse(scope, receive, send, err)
            return
        await self.app(scope, receive, send)

    def host_allowed(self, scope: Scope, host: str | None) -> bool:
        """No Host (HTTP/1.0) is allowed: a browser always sends one, so no page can leave it out."""
        if host is None:
            return True
        parsed = split_host(host)
        if parsed is None:
            return False
        name, port = _bracketed(parsed[0]), parsed[1]
        if self.any_host or any(n == name and p in (None, port) for n, p in self.allowed_hosts):
            return True
        server = scope.get("server") or (None, self.state.config.port)
        names = LOOPBACK_NAMES | {_bracketed(self.state.config.host)}
        if server[0]:
            names |= {_bracketed(server[0])}
        if port is None:  # clients leave out the scheme's default port, and only that one
            return name in names and DEFAULT_PORTS.get(scope.get("scheme", "http")) == server[1]
        return name in names and port == server[1]

    def refusal(self, scope: Scope, headers: dict[str, str]) -> APIError | None:
        """The checks that do not depend on where the request came from in the browser."""
        path = str(scope.get("path", ""))
        if path.startswith(CONTROL_PREFIX) and self.state.config.api_key is None and not is_loopback(scope):
            why = f"{path} answers loopback clients only while the server has no API key (ft serve --api-key)"
            return APIError("forbidden", why, code="loopback_only")
        if scope["method"] in BODY_METHODS and not is_json(headers.get("content-type")):
            given = headers.get("content-type")
            said = f"Content-Type {given!r}" if given else "no Content-Type"
            why = f"request body must be JSON (Content-Type: application/json), got {said}"
            return APIError("unsupported_media_type", why, code="unsupported_media_type")
        return None

    async def refuse(self, scope: Scope, receive: Receive, send: Send, err: APIError) -> None:
        """The error in the route's shape, after the body was read and dropped (past the body limit: the
        connection is closed instead of read on)."""
        whole = await discard_body(receive, self.state.config.max_body_bytes)
        log.info("refused %s %s: %s", scope.get("method"), scope.get("path"), err.message)
        self.state.metrics.error(err.kind)
        flavor = flavor_for_path(str(scope.get("path", "")))
        body = json.dumps(err.body(flavor)).encode()
        out = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if not whole:
            out.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": err.status(flavor), "headers": out})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def own_origin(scope: Scope, host: str | None) -> str | None:
    """The origin a page served by this server under ``host`` sends: scheme://name[:port], no default port."""
    parsed = split_host(host) if host is not None else None
    if parsed is None:
        return None
    scheme = str(scope.get("scheme", "http"))
    name, port = parsed
    return f"{scheme}://{name}" if port in (None, DEFAULT_PORTS.get(scheme)) else f"{scheme}://{name}:{port}"


def origin_listed(origin: str, listed: tuple[str, ...]) -> bool:
    return "*" in listed or origin.strip().lower() in listed


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def is_loopback(scope: Scope) -> bool:
    """The client's address is loopback (a Unix socket, with no address, is local too)."""
    client = scope.get("client")
    if not client:
        return True
    return is_loopback_address(str(client[0]))


def is_loopback_address(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def exposure_warning(host: str, port: int, api_key: str | None) -> str | None:
    """One line for ``ft serve`` when it listens beyond loopback without a key; None otherwise."""
    if api_key is not None or is_loopback_address(host):
        return None
    return (
        f"warning: listening on {host}:{port} without --api-key: anyone who can reach it can generate with the model "
        "(the /v1/engine/* control routes stay loopback-only); set --api-key KEY to require a key"
    )


def _bracketed(host: str) -> str:
    host = host.lower()
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ip.ipv4_mapped) if ip.ipv4_mapped is not None else f"[{ip}]"
    return str(ip)


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name; of a repeated header, the first."""
    out: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _with_cors(send: Send, origin: str) -> Send:
    async def send_with_cors(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            headers += [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
            message = {**message, "headers": headers}
        await send(message)

    return send_with_cors


async def _preflight(send: Send, origin: str, requested: str) -> None:
    """204 naming what this origin may send: of the requested headers, those the APIs' SDKs use."""
    names = [h.strip().lower() for h in requested.split(",") if h.strip()]
    allowed = [h for h in names if h in CORS_HEADERS or h.startswith(CORS_HEADER_PREFIXES)]
    headers: list[tuple[bytes, bytes]] = [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-methods", CORS_METHODS.encode()),
        (b"access-control-allow-headers", ", ".join(allowed or sorted(CORS_HEADERS)).encode()),
        (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode()),
        (b"vary", b"Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
