"""``GET /``: the chat page (``assets/chat/index.html``), one self-contained file that talks to this server's own
``/v1/models`` and streaming ``/v1/chat/completions``.

The page is open without the API key (it holds nothing; its requests carry the key the user types in). Its
Content-Security-Policy lets the browser run only the page's own inline script and style (by hash) and connect only
to this origin: no external asset can load, and markup that ever reached the DOM from model text could not run.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import lru_cache
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


@lru_cache(maxsize=1)
def page() -> tuple[bytes, str]:
    """The page's bytes and its Content-Security-Policy header."""
    html = resources.files("freetoken").joinpath("assets/chat/index.html").read_text(encoding="utf-8")
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for kind, body in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        hashes[kind].append(f"'sha256-{digest}'")
    csp = "; ".join(
        [
            "default-src 'none'",
            "script-src " + " ".join(hashes["script"]),
            "style-src " + " ".join(hashes["style"]),
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return html.encode(), csp


def add_chat_page(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def chat_page() -> HTMLResponse:
        body, csp = page()
        headers = {
            "Content-Security-Policy": csp,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        }
        return HTMLResponse(body, headers=headers)
