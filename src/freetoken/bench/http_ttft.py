"""TTFT through the HTTP server: concurrent streaming chat clients against ``ft serve`` on loopback (issue 20).

``ft bench http`` (``python -m freetoken.bench.http_ttft``). Starts ``ft serve`` as its own process on 127.0.0.1 (a
free port; the same engine options as ``ft bench e2e``), waits for ``/health``, then runs ``--rounds`` rounds of
``--clients`` concurrent streaming ``/v1/chat/completions`` requests, each a fresh prompt of about
``--prompt-tokens`` tokens (random vocabulary text: no prefix shared beyond the chat template). TTFT per request:
from sending it to its first SSE frame (the server sends the first frame once the engine produced the request's
first token); p50 / p99 over all requests. A checkpoint without a tokenizer (``ft bench e2e``'s synthetic one) gets
the embedded model's tokenizer and chat template copied in (its ids are below the synthetic vocabulary).

    python -m freetoken.bench.http_ttft --model default --clients 4 --prompt-tokens 1024 --rounds 3
    python -m freetoken.bench.http_ttft --preset qwen3-30b-a3b --layers 12 --policy hybrid --prompt-tokens 8192
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from freetoken.bench.placements import PLACEMENTS
from freetoken.bench.presets import PRESETS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# ``ft`` with the placements registered, for a placement policy: production ``ft serve`` knows only the engine's
# backends, and the benchmarks may not import the CLI (DESIGN.md §3), so the server process does it itself
SERVE_PLACED = ("from freetoken.bench.placements import register; register(); "
                "from freetoken.cli.main import main; raise SystemExit(main())")


@dataclass
class HttpTTFT:
    clients: int
    prompt_tokens: int  # as the server counted them (usage), median
    rounds: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    ttft_ms: list[float] = field(default_factory=list)
    errors: int = 0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def with_tokenizer(path: Path) -> Path:
    """``path`` itself when it has a tokenizer; else the embedded model's tokenizer files are copied in."""
    if (path / "tokenizer.json").exists():
        return path
    from freetoken.loader.model_setup import default_model_path

    for name in TOKENIZER_FILES:
        shutil.copy(default_model_path() / name, path / name)
    print(f"# {path}: the embedded model's tokenizer copied in", file=sys.stderr, flush=True)
    return path


def prompt_text(tokenizer_json: Path, tokens: int, seed: int) -> str:
    """Random vocabulary text of about ``tokens`` tokens (encoded again and cut to length)."""
    import random

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    rng = random.Random(seed)
    special = {i for t, i in tok.get_vocab(with_added_tokens=True).items() if t.startswith("<")}
    pool = [i for i in range(tok.get_vocab_size(with_added_tokens=False)) if i not in special]
    ids = tok.encode(tok.decode([rng.choice(pool) for _ in range(tokens + tokens // 4 + 8)])).ids
    return tok.decode(ids[:tokens])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(path: Path, args: argparse.Namespace, port: int, log: Any) -> subprocess.Popen[bytes]:
    ft = ["-c", SERVE_PLACED] if args.policy in PLACEMENTS else ["-m", "freetoken.cli"]
    cmd = [sys.executable, *ft, "serve", "--model", str(path), "--host", "127.0.0.1",
           "--port", str(port), "--moe-backend", args.policy, "--expert-cache", str(args.expert_cache),
           "--max-running-requests", str(max(args.clients, 4)), "--served-model-name", "bench", "--log-level",
           "warning"]  # fmt: skip
    for opt, val in (("--device", args.device), ("--dtype", args.dtype), ("--cpu-threads", args.cpu_threads),
                     ("--max-model-len", args.max_model_len)):  # fmt: skip
        if val is not None:
            cmd += [opt, str(val)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ft serve exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"ft serve not ready after {timeout_s:.0f} s")


def one_request(url: str, text: str, max_tokens: int, out: dict[str, Any]) -> None:
    """One streaming chat request: ``out['ttft']`` (s to the first SSE frame), ``out['prompt_tokens']``."""
    import httpx

    body = {"model": "bench", "messages": [{"role": "user", "content": text}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                out["error"] = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                return
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                out.setdefault("ttft", time.perf_counter() - t0)
                data = line[6:]
                if data != "[DONE]" and (usage := json.loads(data).get("usage")):
                    out["prompt_tokens"] = usage["prompt_tokens"]
    except httpx.HTTPError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"


def run_rounds(url: str, texts: list[list[str]], max_tokens: int) -> tuple[list[float], list[int], int]:
    ttft: list[float] = []
    counted: list[int] = []
    errors = 0
    for round_texts in texts:
        outs: list[dict[str, Any]] = [{} for _ in round_texts]
        threads = [threading.Thread(target=one_request, args=(url, t, max_tokens, o))
                   for t, o in zip(round_texts, outs)]  # fmt: skip
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for o in outs:
            if "error" in o or "ttft" not in o:
                errors += 1
                print(f"#   request failed: {o.get('error', 'no frame')}", file=sys.stderr, flush=True)
                continue
            ttft.append(o["ttft"] * 1e3)
            counted.append(int(o.get("prompt_tokens", 0)))
    return ttft, counted, errors


def run(args: argparse.Namespace) -> int:
    from freetoken.bench.e2e import checkpoint

    synthetic = args.model is None
    path = checkpoint(args)
    if synthetic:
        path = with_tokenizer(path)
    elif not (path / "tokenizer.json").exists():
        raise SystemExit(f"{path} has no tokenizer.json: the chat API needs one")
    texts = [[prompt_text(path / "tokenizer.json", args.prompt_tokens, 1000 * r + c) for c in range(args.clients)]
             for r in range(args.rounds + 1)]  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(args.server_log)
    with log_path.open("wb") as log:
        proc = start_server(path, args, port, log)
        try:
            wait_ready(url, proc, args.start_timeout)
            run_rounds(url, texts[:1], args.max_tokens)  # warm-up round (first captures, kernel loads): untimed
            ttft, counted, errors = run_rounds(url, texts[1:], args.max_tokens)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    counted.sort()
    row = HttpTTFT(args.clients, counted[len(counted) // 2] if counted else 0, args.rounds, _pct(ttft, 0.5),
                   _pct(ttft, 0.99), max(ttft, default=float("nan")), ttft, errors)  # fmt: skip
    print("| policy | clients | prompt tokens (server's count) | rounds | TTFT p50 ms | TTFT p99 ms | max ms "
          "| errors |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.policy} | {row.clients} | {row.prompt_tokens} | {row.rounds} | {row.p50_ms:.1f} | {row.p99_ms:.1f} "
          f"| {row.max_ms:.1f} | {row.errors} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"policy": args.policy, **asdict(row)}, indent=1))
    return 1 if errors else 0


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model", default=None, help="a checkpoint directory ('default': the embedded model); "
                   "none: ft bench e2e's synthetic checkpoint of --preset/--layers")  # fmt: skip
    p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS))
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dir", default=None, help="where the synthetic checkpoint is (written once)")
    p.add_argument("--clients", type=int, default=4, help="concurrent streaming clients per round")
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (after one untimed)")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens generated per request")
    return add_server_arguments(p, "hybrid", "/tmp/ft-bench-http-server.log")


def add_server_arguments(p: argparse.ArgumentParser, policy: str, log: str) -> argparse.ArgumentParser:
    """The ``ft serve`` process's options ``start_server`` reads (and the run's log and JSON), shared by the
    benchmarks that measure through it."""
    p.add_argument("--policy", default=policy, help="the server's MoE backend")
    p.add_argument("--expert-cache", type=float, default=0.25)
    p.add_argument("--cpu-threads", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--server-log", default=log)
    p.add_argument("--json", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="ft bench http", description=__doc__.split("\n")[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
