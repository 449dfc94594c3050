"""Browser safety in a real browser (Debian's Chromium, headless, through Playwright) against the real HTTP server on
loopback, a scripted engine in-process so the test can read its counters:

- a page on another origin (a second loopback HTTP server on another port) sends what a browser lets any page send
  without asking — ``no-cors`` and ``text/plain`` fetches, form posts (``text/plain`` and url-encoded) — and a JSON
  fetch that needs a preflight: each reaches the server and is refused; nothing generates or resizes;
- a DNS-rebinding name (``--host-resolver-rules`` maps evil.example to 127.0.0.1): the chat page does not load under
  it, and a page of that origin (as served before the rebinding) cannot generate through same-origin fetches
  (Chromium's own Local Network Access checks off, so that the server alone has to refuse);
- an origin listed in ``--cors-origins`` gets its answers through fetch, streams included;
- the chat page still works on the server's own origin under another loopback name (``localhost``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from freetoken.server.settings import ServerConfig
from server_harness import MODEL, Running, free_port, serve
from test_browser_safety import BODIES, CHAT, MEMORY, CountingEngine, snapshot
from test_chat_page_browser import WAIT_MS, chromium, open_page, say

pytestmark = pytest.mark.slow
OTHER = free_port()  # the second server: the attacker's page on 127.0.0.1, the listed one on localhost
FRIEND = f"http://localhost:{OTHER}"
# Chromium's own Local Network Access checks block a public page's requests to loopback (no other browser has
# them, and older Chromium had none): off, so that every request the page makes reaches the server, which must refuse
# it by itself.
NO_LNA = "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests," \
         "PrivateNetworkAccessRespectPreflightResults"  # fmt: skip
PAGE = b"<!doctype html><meta charset=utf-8><title>another site</title><iframe name=sink></iframe>"


class Pages(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def other_site() -> Iterator[None]:
    httpd = ThreadingHTTPServer(("127.0.0.1", OTHER), Pages)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield
    httpd.shutdown()
    thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium("--no-proxy-server", "--host-resolver-rules=MAP evil.example 127.0.0.1", NO_LNA)


class Recorder:
    """An ASGI layer around the whole app: what reached the server, as the browser sent it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            h = {k.decode(): v.decode() for k, v in scope["headers"]}
            self.seen.append((scope["method"], scope["path"], h.get("origin", ""), h.get("content-type", "")))
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def srv(tokenizer: Any, other_site: None) -> Iterator[tuple[Running, Recorder]]:
    recorders: list[Recorder] = []

    def wrap(app: Any) -> Recorder:
        recorders.append(Recorder(app))
        return recorders[-1]

    config = ServerConfig(served_model_names=(MODEL,), cors_origins=(FRIEND,))
    with serve(CountingEngine(tokenizer, step_s=0.005), config, wrap=wrap) as s:
        yield s, recorders[0]


def new_page(browser: Any, url: str) -> Any:
    page = browser.new_context().new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(url)
    return page


def wait_refusals(s: Running, before: int, n: int) -> None:
    """Until the server has refused ``n`` more requests (the browser's requests all arrived)."""
    deadline = time.time() + 30
    while s.state.metrics.errors_total.get("forbidden", 0) < before + n:
        assert time.time() < deadline, (s.state.metrics.errors_total, "engine calls", s.engine.calls, s.engine.resizes)
        time.sleep(0.05)


ATTACK = """async ([server, bodies]) => {
  const out = {};
  for (const [path, body] of Object.entries(bodies)) {
    const text = JSON.stringify(body);
    const simple = {method: 'POST', body: text, headers: {'Content-Type': 'text/plain'}};
    out[path + ' no-cors'] = (await fetch(server + path, {...simple, mode: 'no-cors'})).type;
    out[path + ' text/plain'] = await fetch(server + path, simple).then(r => r.status, e => e.name);
    const json = {method: 'POST', body: text, headers: {'Content-Type': 'application/json'}};
    out[path + ' json'] = await fetch(server + path, json).then(r => r.status, e => e.name);
    for (const enctype of ['text/plain', 'application/x-www-form-urlencoded']) {
      const form = document.createElement('form');
      Object.assign(form, {method: 'POST', action: server + path, enctype, target: 'sink'});
      const field = document.createElement('input');  // name=value makes the body {"...", "pad": "="}
      Object.assign(field, {name: text.slice(0, -1) + ', "pad": "', value: '"}'});
      form.append(field);
      document.body.append(form);
      form.submit();
      await new Promise(done => setTimeout(done, 300));
    }
  }
  return out;
}"""


def test_another_origin_cannot_generate_or_resize(browser: Any, srv: tuple[Running, Recorder]) -> None:
    s, rec = srv
    page = new_page(browser, f"http://127.0.0.1:{OTHER}/")
    before, refusals, seen = snapshot(s), s.state.metrics.errors_total.get("forbidden", 0), len(rec.seen)
    got = page.evaluate(ATTACK, [s.url, {CHAT: BODIES[CHAT], MEMORY: BODIES[MEMORY]}])
    for path in (CHAT, MEMORY):  # the page learns nothing: opaque answers, failed fetches
        assert got[f"{path} no-cors"] == "opaque" and got[f"{path} text/plain"] == "TypeError", got
        assert got[f"{path} json"] == "TypeError", got
    wait_refusals(s, refusals, 10)  # per route: no-cors, text/plain, the JSON fetch's preflight, two forms
    assert snapshot(s) == before and s.engine.calls == 0 and s.engine.resizes == []
    arrived = rec.seen[seen:]
    origin = f"http://127.0.0.1:{OTHER}"
    for path in (CHAT, MEMORY):
        mine = [(m, o, ct.split(";")[0]) for m, p, o, ct in arrived if p == path]
        assert sorted(mine) == sorted([("POST", origin, "text/plain")] * 3 + [("OPTIONS", origin, ""),
                                       ("POST", origin, "application/x-www-form-urlencoded")]), mine  # fmt: skip


REBOUND = """async () => {
  const body = JSON.stringify({model: 'tiny', max_tokens: 2, messages: [{role: 'user', content: 'hi'}]});
  const post = (path, b) => fetch(path, {method: 'POST', body: b, headers: {'Content-Type': 'application/json'}});
  const read = async r => [r.status, await r.text()];
  return [await read(await post('/v1/chat/completions', body)),
          await read(await post('/v1/engine/memory', JSON.stringify({vram_budget: 1}))),
          await read(await fetch('/v1/models'))];
}"""


def test_a_rebinding_name_cannot_generate(browser: Any, srv: tuple[Running, Recorder]) -> None:
    s, _ = srv
    port = int(s.url.rsplit(":", 1)[1])
    before, refusals = snapshot(s), s.state.metrics.errors_total.get("forbidden", 0)
    ctx = browser.new_context()
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    r = page.goto(f"http://evil.example:{port}/")  # the chat page under the rebinding name: not served
    assert r.status == 403 and "--allowed-hosts" in page.content()
    # The attacker's page as its own server sent it before the name was rebound to 127.0.0.1: its same-origin
    # fetches now reach this server (the routing serves only this one document; the fetches go to the network).
    ctx.route(
        f"http://evil.example:{port}/rebound.html", lambda route: route.fulfill(body=PAGE, content_type="text/html")
    )
    page.goto(f"http://evil.example:{port}/rebound.html")
    answers = page.evaluate(REBOUND)
    assert [a[0] for a in answers] == [403, 403, 403], answers
    assert all("--allowed-hosts" in a[1] for a in answers), answers
    wait_refusals(s, refusals, 4)
    assert snapshot(s) == before and s.engine.resizes == []
    ctx.close()


LISTED = """async ([server, body]) => {
  const headers = {'Content-Type': 'application/json', 'Authorization': 'Bearer none', 'x-stainless-os': 'Linux',
                   'x-stainless-retry-count': '0', 'anthropic-version': '2023-06-01'};
  const r = await fetch(server + '/v1/chat/completions', {method: 'POST', headers, body: JSON.stringify(body)});
  const one = await r.json();
  const s = await fetch(server + '/v1/messages', {method: 'POST', headers,
                        body: JSON.stringify({...body, stream: true})});
  return [r.status, one.choices[0].message.content, s.status, await s.text()];
}"""


def test_a_listed_origin_gets_its_answers(browser: Any, srv: tuple[Running, Recorder]) -> None:
    s, rec = srv
    page = new_page(browser, FRIEND + "/")
    calls, seen = s.engine.calls, len(rec.seen)
    status, text, stream_status, stream = page.evaluate(LISTED, [s.url, BODIES[CHAT]])
    assert status == 200 and text and stream_status == 200
    assert "event: message_stop" in stream and "content_block_delta" in stream
    assert s.engine.calls == calls + 2
    methods = [m for m, p, o, _ in rec.seen[seen:] if o == FRIEND]
    assert methods.count("OPTIONS") == 2 and methods.count("POST") == 2  # preflights, then the requests


def test_the_chat_page_on_its_own_origin_under_localhost(browser: Any, srv: tuple[Running, Recorder]) -> None:
    s, _ = srv
    port = int(s.url.rsplit(":", 1)[1])
    page, errors = open_page(browser, f"http://localhost:{port}")
    calls = s.engine.calls
    turn = say(page, "hello")
    assert turn.locator(".body").inner_text().strip()
    assert s.engine.calls == calls + 1 and errors == []
