"""Prompt preparation under many short messages: does its time grow with the prompt (not its square), and does it
hold up the requests beside it?

    python3 bench/prompt_prep.py [--messages 10000,20000] [--repeats 5] [--small-requests 20] [--json OUT]

Starts `ft serve` on a tiny random Qwen3.5-MoE (``freetoken.bench.tiny_hybrid``) on the CPU with a context large
enough to accept every conversation (262,144 tokens), then for each size N:
1. N one-character messages to ``/v1/messages/count_tokens``: render with the chat template, keep message text
   apart from markup, tokenise: the whole of prompt preparation, and nothing else (no prefill) — median of repeats;
2. an 8-token chat completion ("hi", greedy) alone, then while another process sends the N-message count_tokens
   back to back — median latency of each and their ratio.
Checks: time(largest N) / time(smallest N) <= 2.2 x (largest / smallest) / 2 (linear, with slack); the 8-token
request beside the preparation within 2x its solo time. Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from freetoken.bench.http_ttft import wait_ready
from freetoken.bench.loopback import free_port
from freetoken.bench.tiny_hybrid import make_model, save_tokenizer

MODEL = "tiny"
CONTEXT = 262_144
CORPUS = ["The quick brown fox jumps over the lazy dog. Hello world, how are you today?"] * 20
SMALL = {"model": MODEL, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
         "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip

SENDER = """
import sys, httpx
url, path, stop = sys.argv[1], sys.argv[2], sys.argv[3]
raw = open(path, "rb").read()
n = 0
with httpx.Client(timeout=600) as c:
    print("ready", flush=True)
    while True:
        try:
            open(stop).close()
            break
        except FileNotFoundError:
            pass
        r = c.post(url + "/v1/messages/count_tokens", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        n += 1
        print(n, flush=True)
"""


def conversation(n: int) -> dict[str, Any]:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(n)]
    if n % 2 == 0:
        messages.append({"role": "user", "content": "x"})
    return {"model": MODEL, "messages": messages}


def checkpoint(directory: Path) -> Path:
    make_model(max_position_embeddings=CONTEXT).save_pretrained(directory)
    save_tokenizer(directory, CORPUS)
    return directory


def small_latency(client: httpx.Client, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        r = client.post(url + "/v1/chat/completions", json=SMALL)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8, r.text
        out.append(time.perf_counter() - start)
    return out


def beside(client: httpx.Client, url: str, body: bytes, n: int) -> tuple[list[float], int]:
    """The 8-token request's latencies while another process sends ``body`` to count_tokens back to back."""
    tmp = Path(tempfile.mkdtemp())
    (tmp / "body.json").write_bytes(body)
    stop = tmp / "stop"
    args = [sys.executable, "-c", SENDER, url, str(tmp / "body.json"), str(stop)]
    sender = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert sender.stdout is not None
    assert sender.stdout.readline().strip() == "ready"
    time.sleep(0.05)  # its first count_tokens is under way
    lat = small_latency(client, url, n)
    stop.touch()
    rest, _ = sender.communicate(timeout=600)
    assert sender.returncode == 0, rest
    return lat, len(rest.split())


def measure(url: str, sizes: list[int], repeats: int, small_n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"sizes": {}}
    with httpx.Client(timeout=600) as c:
        small_latency(c, url, 3)  # warm
        for n in sizes:
            body = json.dumps(conversation(n)).encode()
            headers = {"content-type": "application/json"}
            times, tokens = [], 0
            for _ in range(repeats):
                start = time.perf_counter()
                r = c.post(url + "/v1/messages/count_tokens", content=body, headers=headers)
                times.append(time.perf_counter() - start)
                assert r.status_code == 200, r.text
                tokens = r.json()["input_tokens"]
            solo = small_latency(c, url, small_n)
            near, counted = beside(c, url, body, small_n)
            out["sizes"][str(n)] = {
                "body_bytes": len(body),
                "prompt_tokens": tokens,
                "count_tokens_s": statistics.median(times),
                "count_tokens_all_s": times,
                "small_solo_s": statistics.median(solo),
                "small_beside_s": statistics.median(near),
                "small_beside_ratio": statistics.median(near) / statistics.median(solo),
                "count_tokens_done_meanwhile": counted,
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", default="10000,20000", help="comma-separated conversation sizes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--small-requests", type=int, default=20, help="8-token requests per phase")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.messages.split(",")]
    model = checkpoint(Path(tempfile.mkdtemp()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "freetoken.cli.main", "serve", "--device", "cpu", "--port", str(port),
           "--model", str(model), "--served-model-name", MODEL, "--max-model-len", str(CONTEXT)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(url, proc, 300)
        report = measure(url, sizes, args.repeats, args.small_requests)
    finally:
        proc.terminate()
        proc.wait(30)
    lo, hi = report["sizes"][str(min(sizes))], report["sizes"][str(max(sizes))]
    growth = hi["count_tokens_s"] / lo["count_tokens_s"]
    allowed = 2.2 * max(sizes) / min(sizes) / 2
    report["growth"] = growth
    checks = {
        f"time x{max(sizes) / min(sizes):g} messages <= {allowed:.1f}x": growth <= allowed,
        "8-token request beside it <= 2x solo": all(s["small_beside_ratio"] <= 2 for s in report["sizes"].values()),
    }
    report["checks"] = checks
    print("| messages | body | prompt tokens | count_tokens (median) | 8-token alone | beside it | ratio |")
    print("|---|---|---|---|---|---|---|")
    for n, s in report["sizes"].items():
        print(f"| {int(n):,} | {s['body_bytes'] / 1e3:.0f} kB | {s['prompt_tokens']:,} | {s['count_tokens_s']:.2f} s"
              f" | {s['small_solo_s'] * 1e3:.0f} ms | {s['small_beside_s'] * 1e3:.0f} ms"
              f" | {s['small_beside_ratio']:.2f}x |")  # fmt: skip
    print(f"growth {growth:.2f}x")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
