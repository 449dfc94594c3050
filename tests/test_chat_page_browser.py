"""The chat page at ``/`` in a real browser (Debian's Chromium, headless, driven by Playwright) against the real
HTTP server on loopback: the embedded default model behind a real ``ft serve`` answers, thinks and calls a demo
tool; a scripted engine (in-process, so the test can count its aborts) streams markdown with hostile markup in it,
is stopped mid-answer and fails mid-stream.

Screenshots go to ``/tmp/freetoken-chat-page/`` (CI keeps them as artifacts) and are checked to be real pictures.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from freetoken.server.settings import ServerConfig
from scripted_engine import ScriptedEngine
from server_harness import MODEL, Running, free_port, serve

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path("/tmp/freetoken-chat-page")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",  # a container's small /dev/shm would crash the renderer
]
WAIT_MS = 180_000  # one default-model answer on a loaded 2-core machine takes seconds; this is only a bound

pytestmark = pytest.mark.slow


def chromium(*extra_args: str) -> Iterator[Any]:
    """Chromium through Playwright, with ``ARGS`` and ``extra_args``; absent, the tests skip, except in CI (.ci/run
    installs both)."""
    missing = None if os.path.exists(CHROMIUM) else f"no {CHROMIUM} (apt-get install chromium)"
    try:
        from playwright import sync_api
    except ImportError:
        missing = missing or "no playwright (pip install -e '.[test]')"
    if missing:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[*ARGS, *extra_args])
        yield b
        b.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


def open_page(browser: Any, url: str, **context: Any) -> tuple[Any, list[str]]:
    """The chat page, loaded and with its model list filled; the list collects console errors (a CSP violation
    or a script error shows there)."""
    ctx = browser.new_context(viewport={"width": 1000, "height": 900}, **context)
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/")
    page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
    return page, errors


def set_setting(page: Any, selector: str, value: str | bool) -> None:
    if not page.is_visible("#settings"):
        page.click("#toggle-settings")
    if isinstance(value, bool):
        page.set_checked(selector, value)
    else:
        page.fill(selector, value)
    page.dispatch_event(selector, "change")


def say(page: Any, text: str, state: str = "done") -> Any:
    """Types ``text``, presses Enter and waits until one more assistant turn reached ``state``; returns it."""
    before = page.locator(".msg.assistant").count()
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    return wait_turn(page, before + 1, state)


def wait_turn(page: Any, n: int, state: str = "done") -> Any:
    page.wait_for_function(
        "([n, s]) => { const a = document.querySelectorAll('.msg.assistant');"
        " return a.length >= n && a[n - 1].dataset.state === s; }",
        arg=[n, state],
    )
    return page.locator(".msg.assistant").nth(n - 1)


# ---- the embedded default model, behind a real `ft serve` process ---------------------------------------------
@pytest.fixture(scope="module")
def ft_serve() -> Iterator[str]:
    """``ft serve`` with its defaults (the embedded model) on a free loopback port; the URL its banner prints
    for the chat page."""
    port = free_port()
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stdout is not None
        banner = [proc.stdout.readline() for _ in range(3)]
        assert banner[2].strip() == f"chat in a browser: http://127.0.0.1:{port}/", banner
        yield banner[2].split(": ", 1)[1].strip().rstrip("/")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_default_model_chat(browser: Any, ft_serve: str) -> None:
    page, errors = open_page(browser, ft_serve)
    assert page.input_value("#model") == httpx.get(ft_serve + "/v1/models").json()["data"][0]["id"]
    set_setting(page, "#temperature", "0")
    set_setting(page, "#max-tokens", "160")

    turn = say(page, "What is 23 + 19?")
    assert "42" in turn.locator(".body").inner_text()
    fold = turn.locator("details.think")
    assert fold.count() == 1 and fold.get_attribute("open") is None  # thinking is there, folded
    assert fold.locator(".text").text_content().strip()
    assert "tok/s" in turn.locator(".meta").inner_text()

    # Offered the demo tools, the model calls one: a card with the name and the pretty-printed arguments.
    set_setting(page, "#demo-tools", True)
    turn = say(page, "What is the weather in Paris?")
    card = turn.locator(".toolcall")
    assert card.count() == 1 and card.get_attribute("data-name") == "get_weather"
    args = card.locator("pre.args").text_content()
    assert json.loads(args) == {"city": "Paris"} and "\n" in args  # indented JSON
    # The user answers for the tool (the box holds the demo result); the model goes on with it.
    card.locator(".result button").click()
    turn = wait_turn(page, 3)
    assert "21" in turn.locator(".body").inner_text()
    history = page.evaluate("window.FT.messages")
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert history[3]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert history[4]["tool_call_id"] == history[3]["tool_calls"][0]["id"]

    page.click("#toggle-settings")  # closed, and one thinking fold opened, for the picture
    page.locator("details.think").first.click()
    check_png(shoot(page, "default-model-light.png"))
    background = "() => getComputedStyle(document.body).backgroundColor"
    assert page.evaluate(background) == "rgb(247, 247, 248)"
    page.emulate_media(color_scheme="dark")
    assert page.evaluate(background) == "rgb(22, 23, 26)"  # prefers-color-scheme: dark
    check_png(shoot(page, "default-model-dark.png"))
    page.set_viewport_size({"width": 390, "height": 800})
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390  # nothing sticks out sideways
    assert page.locator("#send").bounding_box()["x"] + page.locator("#send").bounding_box()["width"] <= 390
    check_png(shoot(page, "default-model-narrow.png"))
    assert errors == []


# ---- a scripted engine: markdown, hostile markup, stop, errors ---------------------------------------------------
REPLY = """<think>
plan the answer
</think>

# Title

Some **bold**, *italic*, `x < y` and [a link](https://example.com/a?b=1) but [no script](javascript:alert(1)).

1. one
2. two
   - nested

```python
print("<b>not bold</b>")
```

| tool | calls |
|:-----|------:|
| `read_file` | 3 |
| <i>x</i> | 1 |

<img src=x onerror="window.pwned = 1"><script>window.pwned = 2</script> & done"""
LONG = "word " * 2000


def script(tokenizer: Any) -> Any:
    def reply(ids: list[int]) -> str:
        last_user_turn = tokenizer.decode(ids).rsplit("<|im_start|>user", 1)[-1]
        return LONG if "long" in last_user_turn else REPLY

    return reply


@pytest.fixture(scope="module")
def scripted(tokenizer: Any) -> Iterator[Running]:
    engine = ScriptedEngine(tokenizer, script=script(tokenizer), max_model_len=4096, step_s=0.01)
    with serve(engine) as running:
        yield running


def test_markdown_is_rendered_and_markup_stays_text(browser: Any, scripted: Running) -> None:
    page, errors = open_page(browser, scripted.url, permissions=["clipboard-read", "clipboard-write"])
    turn = say(page, "show me markdown")
    body = turn.locator(".body")
    assert body.locator("h1").text_content() == "Title"
    assert body.locator("strong").text_content() == "bold" and body.locator("em").text_content() == "italic"
    assert body.locator("p code").text_content() == "x < y"
    links = body.locator("a")
    assert links.count() == 1 and links.get_attribute("href") == "https://example.com/a?b=1"
    assert links.get_attribute("rel") == "noopener noreferrer"
    assert "[no script](javascript:alert(1))" in body.inner_text()  # an unsafe link stays visible text
    assert body.locator("ol > li").count() == 2 and body.locator("ol li ul li").text_content() == "nested"
    # The hostile markup is shown as text; nothing of it became an element or ran.
    assert body.locator("img, script, b, i").count() == 0
    assert '<img src=x onerror="window.pwned = 1"><script>window.pwned = 2</script> & done' in body.inner_text()
    assert page.evaluate("window.pwned") is None
    assert turn.locator("details.think .text").text_content() == "plan the answer"
    cells = body.locator("table td")
    assert body.locator("table th").all_text_contents() == ["tool", "calls"] and cells.count() == 4
    assert cells.nth(0).locator("code").text_content() == "read_file" and cells.nth(2).text_content() == "<i>x</i>"
    assert cells.nth(1).get_attribute("class") == "right"
    code = turn.locator(".codeblock")
    assert code.locator(".head span").text_content() == "python"
    assert code.locator("code").text_content() == 'print("<b>not bold</b>")'
    code.locator("button.copy").click()
    page.wait_for_function("() => document.querySelector('.codeblock button.copy').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == 'print("<b>not bold</b>")'
    check_png(shoot(page, "markdown.png"))
    assert errors == []


def test_think_tags_in_the_content_fold_too(browser: Any, tokenizer: Any) -> None:
    """A server without a reasoning parser streams ``<think>…</think>`` as content: the page folds it the same way."""
    engine = ScriptedEngine(tokenizer, script=lambda ids: REPLY)
    with serve(engine, ServerConfig(served_model_names=(MODEL,), reasoning_parser="none")) as s:
        page, errors = open_page(browser, s.url)
        turn = say(page, "hi")
        assert turn.locator("details.think .text").text_content() == "plan the answer"
        assert "think>" not in turn.locator(".body").inner_text()
        assert turn.locator("h1").text_content() == "Title"
        history = page.evaluate("window.FT.messages")
        assert history[-1]["reasoning_content"] == "plan the answer" and history[-1]["content"].startswith("# Title")
        assert errors == []


def test_api_key_typed_into_the_page(browser: Any, tokenizer: Any) -> None:
    """Behind ``--api-key`` the page still loads; the model list asks for the key, and with it typed in the
    settings the page lists the models and chats."""
    config = ServerConfig(served_model_names=(MODEL,), api_key="k1")
    with serve(ScriptedEngine(tokenizer, script=lambda ids: "# Title"), config) as s:
        ctx = browser.new_context()
        page = ctx.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(s.url + "/")
        page.locator(".msg.error").wait_for()
        assert "401" in page.locator(".msg.error").inner_text()
        set_setting(page, "#api-key", "k1")
        page.wait_for_function("() => document.querySelectorAll('#model option').length > 0")
        assert say(page, "hi").locator("h1").text_content() == "Title"
        ctx.close()


def test_stop_aborts_the_server_request(browser: Any, scripted: Running) -> None:
    page, errors = open_page(browser, scripted.url)
    aborted = scripted.engine.aborted
    page.fill("#prompt", "a long answer please")
    page.press("#prompt", "Enter")
    page.wait_for_function("() => document.querySelector('.msg.assistant .body')?.textContent.includes('word')")
    assert page.text_content("#send") == "Stop"
    page.click("#send")
    turn = wait_turn(page, 1, "stopped")
    assert_cancelled(scripted, aborted)
    kept = page.evaluate("window.FT.messages")[-1]
    assert kept["role"] == "assistant" and 0 < kept["content"].count("word") < 300
    assert turn.locator(".meta").text_content() == "stopped"
    # the page goes on: the next turn streams to its end
    assert "Title" in say(page, "now markdown").locator("h1").text_content()
    # a new chat in the middle of an answer aborts it, and nothing of it comes back into the new conversation
    page.fill("#prompt", "another long one")
    page.press("#prompt", "Enter")
    page.wait_for_function("() => document.querySelector('.msg.assistant .body')?.textContent.includes('word')")
    aborted = scripted.engine.aborted
    page.click("#new-chat")
    assert_cancelled(scripted, aborted)
    page.wait_for_function("() => document.getElementById('send').textContent === 'Send'")
    assert page.evaluate("window.FT.messages") == [] and page.locator(".msg").count() == 0
    assert errors == []


def assert_cancelled(server: Running, aborted_before: int) -> None:
    """The engine request ends within 3 s of the click: cancelled, not run out (the long reply takes the page's
    1024 max tokens at 10 ms a token)."""
    deadline = time.time() + 3
    while (server.engine.running or server.engine.aborted == aborted_before) and time.time() < deadline:
        time.sleep(0.02)
    assert server.engine.running == 0 and server.engine.aborted == aborted_before + 1


def test_errors_show_as_bubbles_and_the_page_goes_on(browser: Any, scripted: Running) -> None:
    page, errors = open_page(browser, scripted.url)
    # HTTP 400 (max_tokens 0): an error bubble, the turn taken back, its text in the box again
    set_setting(page, "#max-tokens", "0")
    page.fill("#prompt", "hello")
    page.press("#prompt", "Enter")
    bubble = page.locator(".msg.error")
    bubble.wait_for()
    assert "HTTP 400" in bubble.inner_text() and "max_tokens" in bubble.inner_text()
    assert page.evaluate("window.FT.messages") == [] and page.input_value("#prompt") == "hello"
    assert page.locator(".msg.user.failed").count() == 1
    # an error event in the middle of the stream: the partial answer stays, the error is shown under it
    set_setting(page, "#max-tokens", "512")
    scripted.engine.fail_after = 8
    try:
        say(page, "hello", state="error")
    finally:
        scripted.engine.fail_after = None
    assert page.locator(".msg.error").count() == 2
    assert "kernel fault" in page.locator(".msg.error").nth(1).inner_text()
    # and a good request after both works
    assert say(page, "hello again").locator("h1").text_content() == "Title"
    roles = [m["role"] for m in page.evaluate("window.FT.messages")]
    assert roles == ["user", "assistant", "user", "assistant"]
    check_png(shoot(page, "errors.png"))
    # the console shows the failed fetch's 400, nothing else
    assert all("400" in e for e in errors), errors


# ---- screenshots ---------------------------------------------------------------------------------------------
def shoot(page: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.evaluate("() => { const s = document.getElementById('scroller'); s.scrollTop = s.scrollHeight; }")
    page.screenshot(path=str(path))
    return path


def check_png(path: Path) -> None:
    """A real picture: a PNG of the viewport's size, with text and colour in it (not one flat fill)."""
    width, height, pixels = read_png(path.read_bytes())
    assert width >= 390 and height >= 700
    counts = Counter(pixels)
    background = counts.most_common(1)[0][1]
    assert len(counts) > 50, "too few colours: a blank page"
    assert 1 - background / len(pixels) > 0.03, "almost every pixel is the background"


def read_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the pixels of an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + size]
        pos += 12 + size
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw, stride = zlib.decompress(idat), width * channels
    prev, pixels = bytearray(stride), []
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += [bytes(line[x : x + 3]) for x in range(0, stride, channels)]
        prev = line
    return width, height, pixels
