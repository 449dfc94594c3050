"""``GET /``: the chat page is served as one self-contained HTML file, without the API key, and its script builds
the DOM from text only (the browser tests in test_chat_page_browser.py drive it)."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

import httpx
import pytest

from freetoken.server.settings import ServerConfig
from scripted_engine import ScriptedEngine
from server_harness import MODEL, serve


@pytest.fixture(scope="module")
def page(tokenizer: Any) -> httpx.Response:
    with serve(ScriptedEngine(tokenizer), ServerConfig(served_model_names=(MODEL,), api_key="k1")) as s:
        r = httpx.get(s.url + "/")
        # the page is open, the API behind it is not
        assert httpx.get(s.url + "/v1/models").status_code == 401
        assert httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200
        return r


def test_page_is_html_without_the_key(page: httpx.Response) -> None:
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.text.startswith("<!doctype html>") and "<title>FreeToken chat</title>" in page.text
    assert page.headers["x-content-type-options"] == "nosniff"


def test_no_external_assets(page: httpx.Response) -> None:
    html = page.text
    assert not re.search(r"(?i)https?://", html), "an absolute URL in the page"
    markup = re.sub(r"<script>.*?</script>", "", html, flags=re.S).replace('<link rel="icon" href="data:,">', "")
    assert not re.search(r"(?i)\b(src|href|action)\s*=", markup), "the page loads nothing by attribute"
    assert not re.search(r"(?i)<link|<iframe|<img|<object|<embed|<svg|<base", markup)
    assert not re.search(r"(?i)@import|url\(", html)
    assert len(re.findall(r"<script>", html)) == 1 and "<script " not in html  # one inline script, no src=


def test_csp_allows_only_the_inline_script_and_style(page: httpx.Response) -> None:
    csp = dict(part.strip().split(" ", 1) for part in page.headers["content-security-policy"].split(";"))
    assert csp["default-src"] == "'none'" and csp["connect-src"] == "'self'"
    for kind in ("script", "style"):
        (body,) = re.findall(rf"<{kind}>(.*?)</{kind}>", page.text, re.S)
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert csp[f"{kind}-src"] == f"'sha256-{digest}'", kind  # no 'unsafe-inline': injected markup cannot run


def test_script_never_parses_markup(page: httpx.Response) -> None:
    """Model text reaches the DOM only through text nodes (textContent, append(string)): the script has no
    sink that parses HTML or code."""
    (script,) = re.findall(r"<script>(.*?)</script>", page.text, re.S)
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "srcdoc"):
        assert sink not in script, sink
    assert "createContextualFragment" not in script and "DOMParser" not in script
