"""``GET /``: the chat page and its files are served without the API key, load nothing from elsewhere, and its
scripts build the DOM from text only (the browser tests in test_chat_page_browser.py drive it)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from freetoken.server.chat_page import FILES
from freetoken.server.settings import ServerConfig
from scripted_engine import ScriptedEngine
from server_harness import MODEL, serve

PATHS = {name: "/" if name == "index.html" else f"/chat/{name}" for name in FILES}


@pytest.fixture(scope="module")
def served(tokenizer: Any) -> dict[str, httpx.Response]:
    with serve(ScriptedEngine(tokenizer), ServerConfig(served_model_names=(MODEL,), api_key="k1")) as s:
        files = {name: httpx.get(s.url + path) for name, path in PATHS.items()}
        # the page is open, the API behind it is not
        assert httpx.get(s.url + "/v1/models").status_code == 401
        assert httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200
        missing = httpx.get(s.url + "/chat/other.js")
        assert missing.status_code == 404 and missing.json()["error"]["message"]
        return files


def test_files_are_served_with_their_types(served: dict[str, httpx.Response]) -> None:
    for name, r in served.items():
        assert r.status_code == 200, name
        assert r.headers["content-type"] == FILES[name] and r.headers["x-content-type-options"] == "nosniff"
    page = served["index.html"].text
    assert page.startswith("<!doctype html>") and "<title>FreeToken chat</title>" in page


def test_no_external_assets(served: dict[str, httpx.Response]) -> None:
    for name, r in served.items():
        assert not re.search(r"(?i)https?://|//[a-z0-9.-]+\.[a-z]{2,}/", r.text), f"an absolute URL in {name}"
        assert not re.search(r"(?i)@import|url\(", r.text), name
    page = served["index.html"].text
    refs = re.findall(r"""(?i)\b(?:src|href|action|srcset|poster|data)\s*=\s*["']?([^"'\s>]*)""", page)
    assert sorted(refs) == ["chat/chat.css", "chat/chat.js", "data:,"]  # the icon is empty: no request
    assert not re.search(r"(?i)<(iframe|img|object|embed|svg|base|audio|video|source)\b", page)
    # the scripts import only each other and fetch only this server's API
    js = served["chat.js"].text + served["markdown.js"].text
    assert re.findall(r"""\bimport\b[^;]*?from\s*["']([^"']+)""", js) == ["./markdown.js"]
    assert "import(" not in js and "XMLHttpRequest" not in js and "WebSocket" not in js
    targets = re.findall(r"\bfetch\(\s*([^,)]+)", js)
    assert targets and all(re.fullmatch(r'"/v1/[a-z/_.]+"', t) for t in targets), targets


def test_csp_allows_only_this_origin(served: dict[str, httpx.Response]) -> None:
    for name, r in served.items():
        csp = dict(part.strip().split(" ", 1) for part in r.headers["content-security-policy"].split(";"))
        assert csp["default-src"] == "'none'", name
        assert csp["script-src"] == csp["style-src"] == csp["connect-src"] == "'self'", name  # no unsafe-inline
    page = served["index.html"].text
    assert "<style" not in page and not re.search(r"<script(?![^>]*\bsrc=)", page)  # nothing inline to allow
    assert not re.search(r"(?i)\son[a-z]+\s*=", page) and 'style="' not in page


def test_scripts_never_parse_markup(served: dict[str, httpx.Response]) -> None:
    """Model text reaches the DOM only through text nodes (textContent, append(string)): the scripts have no sink
    that parses HTML or code."""
    js = served["chat.js"].text + served["markdown.js"].text
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(", "srcdoc"):
        assert sink not in js, sink
    assert "createContextualFragment" not in js and "DOMParser" not in js and "setAttribute" not in js
