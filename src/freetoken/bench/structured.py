"""structured output: forced tool calls (OpenAI named/required, Anthropic tool/any) and JSON answers, validated

Sends ``--n`` requests of each mode to a running server (``--server``) or to one started here on
loopback (``--model``, default: the embedded model), all at once, and counts the answers that pass:
a call of an allowed tool whose arguments validate against its schema with no markup in the content,
or JSON content that validates against the requested schema.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from freetoken.bench.structured_cases import MODES, Case, cases


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=None, help="URL of a running server (default: start one here)")
    p.add_argument("--model", default=None, help="checkpoint to serve when no --server is given (default: embedded)")
    p.add_argument("--n", type=int, default=50, help="requests per mode")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--workers", type=int, default=16, help="requests in flight")
    p.add_argument("--bounded", action="store_true",
                   help="only tools and schemas of bounded length (for random test models)")  # fmt: skip
    p.add_argument("--json", dest="json_out", default=None, help="write the figures here")


def run(args: argparse.Namespace) -> int:
    import httpx
    from rich.progress import Progress

    with _server(args) as (url, model), Progress(transient=True) as progress:
        client = httpx.Client(base_url=url, timeout=600)
        report: dict[str, Any] = {}
        for mode in args.modes:
            todo = cases(mode, args.n, model, args.max_tokens, bounded=args.bounded)
            task = progress.add_task(mode, total=len(todo))

            def one(case: Case, task: Any = task) -> str:
                why = _one(client, case)
                progress.advance(task)
                return why

            start = time.perf_counter()
            with ThreadPoolExecutor(args.workers) as pool:
                fails = [f for f in pool.map(one, todo) if f]
            took = time.perf_counter() - start
            progress.remove_task(task)
            report[mode] = {"n": len(todo), "passed": len(todo) - len(fails), "seconds": round(took, 1),
                            "failures": fails[:5]}  # fmt: skip
            progress.console.print(f"{mode:16s} {len(todo) - len(fails):3d}/{len(todo)} passed  ({took:.1f} s)")
            for f in fails[:5]:
                progress.console.print(f"    {f}", highlight=False, markup=False)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0 if all(r["passed"] == r["n"] for r in report.values()) else 1


def _one(client: Any, case: Case) -> str:
    r = client.post(case.path, json=case.body)
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    return case.check(r.json())


@contextmanager
def _server(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    import httpx

    if args.server:
        url = args.server.rstrip("/")
        yield url, httpx.get(url + "/v1/models").json()["data"][0]["id"]
        return
    import socket
    import threading

    import uvicorn

    from freetoken.config import EngineConfig
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.server.app import build_app
    from freetoken.server.settings import ServerConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cfg = EngineConfig(model=args.model, max_running_requests=max(4, args.workers))
    app = build_app(lambda: AsyncLLM.start(cfg), ServerConfig(port=port))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    while True:
        time.sleep(0.2)
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
    try:
        yield url, app.state.freetoken.model_names[0]
    finally:
        server.should_exit = True
        thread.join(30)
