"""``GET /``: the chat page, and ``GET /chat/<file>`` for its style and scripts: static files in ``assets/chat/``
(package data) that talk only to this server's own ``/v1/models`` and streaming ``/v1/chat/completions``.

The page is open without the API key (it holds nothing; its requests carry the key the user types in). Its
Content-Security-Policy lets the browser load script and style from this origin only (no inline script, no
``eval``) and connect only to this origin: no external asset can load, and markup that ever reached the DOM from
model text could not run.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

FILES = {
    "index.html": "text/html; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
}
CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@lru_cache(maxsize=len(FILES))
def asset(name: str) -> bytes:
    return resources.files("freetoken").joinpath("assets/chat", name).read_bytes()


def add_chat_page(app: FastAPI) -> None:
    def route(name: str) -> None:
        async def serve_file() -> Response:
            return Response(asset(name), media_type=FILES[name], headers=HEADERS)

        path = "/" if name == "index.html" else f"/chat/{name}"
        app.add_api_route(path, serve_file, methods=["GET"], include_in_schema=False, name=f"chat_{name}")

    for name in FILES:
        route(name)
