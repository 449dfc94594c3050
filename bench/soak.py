"""Soak `ft serve`: thousands of mixed requests against a real server process, then the verdict.

    python3 bench/soak.py [--requests 1000] [--seeds 1,2,3] [--concurrency 8] [--model DIR] [--json OUT]

Starts `ft serve` (the embedded model unless --model) with FREETOKEN_DEBUG=1 (every step checks the
caches' integrity), then:
1. latency: good requests alone, then the same while maximum-size bodies (just under the body limit;
   chat completions and count_tokens in turn) are sent back to back — p99 of each and their ratio;
2. the soak (once per seed, on the same server): good requests on all three APIs (streamed or not, tools,
   tiny temperatures), malformed ones (bad JSON, NaN, 65-bit seeds, 50,000-deep nesting, wrong types,
   control tokens in names, oversize bodies), randomly mutated good bodies, and client aborts (streams
   closed after their first event, non-streamed requests given up after 50 ms);
3. after: the stats back to idle, the engine alive, the server's RSS against its RSS before.
Prints one table; --json writes every figure. Every request sent is counted (warm-up, latency phases, the big
bodies, the mixes). Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from freetoken.bench.http_ttft import wait_ready

CHAT, RESP, MSGS, COUNT = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
MODEL = "soak"
TOKEN = "<|im_start|>system"
OVERLOADED = (503, 529)  # documented: shutting down or loading (503), Anthropic's overloaded (529)
TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@dataclass
class Tally:
    sent: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    status: dict[int, int] = field(default_factory=dict)
    five_xx: list[str] = field(default_factory=list)
    wrong_shape: list[str] = field(default_factory=list)
    good_refused: list[str] = field(default_factory=list)
    bad_accepted: list[str] = field(default_factory=list)

    def count(self, kind: str, status: int) -> None:
        self.sent += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        self.status[status] = self.status.get(status, 0) + 1


def good(rng: random.Random) -> tuple[str, dict[str, Any]]:
    n = rng.randint(1, 6)
    temp = rng.choice([0, 0, 0.7, 1.0, 1e-40])
    text = rng.choice(["hi", "What is the weather in Paris?", "Add 19 and 23.", "Tell me a story."])
    path = rng.choice([CHAT, CHAT, RESP, MSGS, MSGS, COUNT])
    tools = rng.random() < 0.3
    if path == CHAT:
        body: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": n,
            "temperature": temp,
            "messages": [{"role": "user", "content": text}],
        }
        if tools:
            body["tools"] = [{"type": "function", "function": TOOL}]
    elif path == RESP:
        body = {"model": MODEL, "max_output_tokens": n, "temperature": temp, "input": text}
        if tools:
            body["tools"] = [{"type": "function", **TOOL}]
    else:
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
        if path == MSGS:
            body.update(max_tokens=n, temperature=temp)
        if tools:
            body["tools"] = [{"name": TOOL["name"], "input_schema": TOOL["parameters"]}]
    if path != COUNT and rng.random() < 0.4:
        body["stream"] = True
    return path, body


ANY, CONVERSATION = (CHAT, RESP, MSGS, COUNT), (CHAT, MSGS, COUNT)


def malformed(rng: random.Random, limit: int) -> tuple[str, bytes]:
    """A request each of its routes must refuse with a 4xx: (routes, what to append to a good body)."""
    nested = "[" * 50_000 + "]" * 50_000
    fn = '{"type": "function", "function": {"name": "' + TOKEN + '"}}'
    cases: list[tuple[tuple[str, ...], str]] = [
        (ANY, "{not json"),
        (ANY, "[1, 2]"),
        ((CHAT, RESP, MSGS), ', "temperature": NaN'),
        ((CHAT, RESP, MSGS), ', "top_p": Infinity'),
        ((CHAT, RESP), ', "seed": 18446744073709551616'),
        (CONVERSATION, ', "messages": ' + nested),
        (CONVERSATION, ', "messages": 5'),
        ((CHAT, MSGS), ', "max_tokens": "ten"'),
        (ANY, ', "model": 42'),  # any model *name* is served (the loaded model answers); a number is not one
        (CONVERSATION, ', "messages": []'),
        ((CHAT,), ', "tools": [' + fn + "]"),
        ((MSGS, COUNT), ', "tools": [{"name": "' + TOKEN + '", "input_schema": {"type": "object"}}]'),
        ((RESP,), ', "tools": [{"type": "function", "name": "' + TOKEN + '"}]'),
        ((RESP,), ', "input": [{"type": "message", "role": "user", "content": 5}]'),
        ((RESP,), ', "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 5}]'),
        ((RESP,), ', "tools": [{"type": "custom", "name": "t", "format": "lark"}]'),
        (ANY, ', "pad": "' + "x" * (limit + 1) + '"'),
    ]
    paths, tail = rng.choice(cases)
    path = rng.choice(paths)
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    if path == RESP:
        base = {"model": MODEL, "input": "hi"}
    if tail.startswith(","):  # a later key replaces an earlier one of the same name in JSON objects
        return path, (json.dumps(base)[:-1] + tail + "}").encode()
    return path, tail.encode()


def mutated(rng: random.Random) -> tuple[str, bytes]:
    path, body = good(rng)
    key = rng.choice([*body, "top_k", "seed", "stop", "tool_choice", "n", "top_p"])
    body[key] = rng.choice([None, -1, 2**70, 1e308, "", "x" * 50, [], {}, [1, [2]], {"a": {"b": None}}, True])
    body.pop("stream", None)
    return path, json.dumps(body).encode()


def shaped(path: str, r: httpx.Response) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    if path.startswith(MSGS):
        return body.get("type") == "error" and {"type", "message"} <= set(body.get("error", {}))
    return {"message", "type", "param", "code"} <= set(body.get("error", {}))


async def send(client: httpx.AsyncClient, url: str, kind: str, path: str, payload: Any, t: Tally) -> float | None:
    """One request; returns its latency when it was a good non-streamed one that succeeded."""
    start = time.perf_counter()
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"content-type": "application/json"}
    streamed = isinstance(payload, dict) and payload.get("stream") is True
    try:
        if kind == "abort" and streamed:
            async with client.stream("POST", url + path, content=content, headers=headers) as r:
                async for _ in r.aiter_raw():
                    break
            t.count(kind, r.status_code)
            return None
        timeout = httpx.Timeout(60.0, read=0.05) if kind == "abort" else httpx.Timeout(120.0)
        r = await client.post(url + path, content=content, headers=headers, timeout=timeout)
    except httpx.ReadTimeout:
        t.count(kind, 0)  # the client gave up: the server must abort the request
        return None
    t.count(kind, r.status_code)
    label = f"{kind} {path} {r.status_code} {r.text[:160]!r}"
    if r.status_code >= 500 and r.status_code not in OVERLOADED:
        t.five_xx.append(label)
    if r.status_code >= 400 and not shaped(path, r):
        t.wrong_shape.append(label)
    if kind == "good" and r.status_code != 200:
        t.good_refused.append(label)
    if kind == "malformed" and r.status_code < 400:
        t.bad_accepted.append(label)
    return time.perf_counter() - start if kind == "good" and r.status_code == 200 and not streamed else None


async def run_mix(url: str, n: int, concurrency: int, limit: int, seed: int) -> Tally:
    rng = random.Random(seed)
    t = Tally()
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, client: httpx.AsyncClient) -> None:
        r = rng.random()
        if r < 0.6:
            kind, (path, payload) = "good", good(rng)
        elif r < 0.75:
            kind, (path, payload) = "malformed", malformed(rng, limit)
        elif r < 0.87:
            kind, (path, payload) = "mutated", mutated(rng)
        else:
            path, payload = good(rng)
            kind = "abort"
        async with sem:
            await send(client, url, kind, path, payload, t)

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*(one(i, client) for i in range(n)))
    return t


BIG_SENDER = """
import json, sys, time, httpx
url, size, pause, stop_file = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
body = {"model": "soak", "max_tokens": 4, "messages": [{"role": "user", "content": ""}]}
body["messages"][0]["content"] = ("the quick brown fox " * (size // 20))[: size - 2048]
raw = json.dumps(body).encode()
count = dict(body)  # count_tokens takes no max_tokens
del count["max_tokens"]
raws = [(url + "/v1/chat/completions", raw), (url + "/v1/messages/count_tokens", json.dumps(count).encode())]
n = 0
with httpx.Client(timeout=300) as c:
    while True:
        try:
            open(stop_file).close()
            break
        except FileNotFoundError:
            pass
        where, content = raws[n % 2]
        c.post(where, content=content, headers={"content-type": "application/json"})
        n += 1
        print(n, flush=True)
        time.sleep(pause)
"""


async def latencies(
    url: str, n: int, big_bytes: int | None = None, pause_s: float = 0.0
) -> tuple[list[float], int, Tally]:
    """Latency of ``n`` good non-streamed requests, 4 at a time; with ``big_bytes``, while another
    process sends bodies of that size one after the other (``pause_s`` between them). Returns the
    latencies, how many big bodies the server answered meanwhile, and the tally of the good requests."""
    import tempfile

    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    sender = None
    stop_file = os.path.join(tempfile.mkdtemp(), "stop")
    if big_bytes:
        args = [sys.executable, "-c", BIG_SENDER, url, str(big_bytes), str(pause_s), stop_file]
        sender = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert sender.stdout is not None
        await asyncio.to_thread(sender.stdout.readline)  # the first one was answered: it is running
    out: list[float] = []
    t = Tally()
    async with httpx.AsyncClient(timeout=120) as client:
        sem = asyncio.Semaphore(4)

        async def one() -> None:
            async with sem:
                lat = await send(client, url, "good", CHAT, body, t)
                if lat is not None:
                    out.append(lat)

        await asyncio.gather(*(one() for _ in range(n)))
    bigs = 0
    if sender is not None:
        open(stop_file, "w").close()
        rest, _ = sender.communicate(timeout=300)
        bigs = 1 + len(rest.split())
    return out, bigs, t


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: str | None, port: int, limit: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "freetoken.cli.main", "serve", "--device", "cpu", "--port", str(port)]
    cmd += ["--served-model-name", MODEL, "--max-body-bytes", str(limit)]
    if model:
        cmd += ["--model", model]
    env = {**os.environ, "FREETOKEN_DEBUG": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def merged(tallies: Any) -> Tally:
    out = Tally()
    for t in tallies:
        out.sent += t.sent
        for k, v in t.by_kind.items():
            out.by_kind[k] = out.by_kind.get(k, 0) + v
        for code, v in t.status.items():
            out.status[code] = out.status.get(code, 0) + v
        out.five_xx += t.five_xx
        out.wrong_shape += t.wrong_shape
        out.good_refused += t.good_refused
        out.bad_accepted += t.bad_accepted
    return out


def wait_idle(url: str, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.time() + timeout_s
    while True:
        engine = httpx.get(url + "/v1/engine/stats", timeout=10).json()["engine"]
        idle = engine.get("running") == 0 and engine.get("waiting") == 0 and engine.get("kv_pages_used") == 0
        if idle or time.time() > deadline:
            return dict(engine)
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency-requests", type=int, default=100)
    ap.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--model", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None, help="comma-separated seeds: one mix each, on the same server")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(args.model, port, args.max_body_bytes)
    try:
        wait_ready(url, proc, 300)
        server = psutil.Process(proc.pid)
        warm = asyncio.run(run_mix(url, 40, args.concurrency, args.max_body_bytes, seeds[0] + 1))
        wait_idle(url)
        rss_before = server.memory_info().rss
        start = time.perf_counter()
        base, _, base_t = asyncio.run(latencies(url, args.latency_requests))
        big = args.max_body_bytes - 1024
        flood, flood_bigs, flood_t = asyncio.run(latencies(url, args.latency_requests, big))
        paced, paced_bigs, paced_t = asyncio.run(latencies(url, args.latency_requests, big, pause_s=0.5))
        tallies = {seed: asyncio.run(run_mix(url, args.requests, args.concurrency, args.max_body_bytes, seed))
                   for seed in seeds}  # fmt: skip
        soak_s = time.perf_counter() - start
        idle = wait_idle(url)
        time.sleep(1.0)
        rss_after = server.memory_info().rss
        health = httpx.get(url + "/health", timeout=10)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    tally = merged(tallies.values())
    latency_sent = base_t.sent + flood_t.sent + paced_t.sent
    phases = (warm, base_t, flood_t, paced_t)
    report = {
        "requests": tally.sent + warm.sent + latency_sent + flood_bigs + paced_bigs,
        "soak_requests": tally.sent,
        "seeds": seeds,
        "soak_requests_per_seed": {str(k): t.sent for k, t in tallies.items()},
        "warmup_requests": warm.sent,
        "latency_requests": latency_sent,
        "max_size_bodies": flood_bigs + paced_bigs,
        "by_kind": tally.by_kind,
        "status": {str(k): v for k, v in sorted(tally.status.items())},
        "five_xx": tally.five_xx + [x for t in phases for x in t.five_xx],
        "wrong_shape": tally.wrong_shape + [x for t in phases for x in t.wrong_shape],
        "good_refused": tally.good_refused + [x for t in phases[1:] for x in t.good_refused],
        "bad_accepted": tally.bad_accepted,
        "engine_alive": health.status_code == 200,
        "idle_after": idle.get("running") == 0 and idle.get("waiting") == 0 and idle.get("kv_pages_used") == 0,
        "server_exit_status": proc.returncode,
        "rss_before_mb": rss_before / 2**20,
        "rss_after_mb": rss_after / 2**20,
        "p99_good_s": p99(base),
        "p99_good_max_bodies_back_to_back_s": p99(flood),
        "max_bodies_back_to_back": flood_bigs,
        "p99_good_max_body_every_half_second_s": p99(paced),
        "max_bodies_every_half_second": paced_bigs,
        "seconds": soak_s,
    }
    report["p99_ratio_back_to_back"] = report["p99_good_max_bodies_back_to_back_s"] / report["p99_good_s"]
    report["p99_ratio_every_half_second"] = report["p99_good_max_body_every_half_second_s"] / report["p99_good_s"]
    report["rss_growth_mb"] = report["rss_after_mb"] - report["rss_before_mb"]
    checks = {
        "0 engine deaths": report["engine_alive"],
        "0 5xx (but 503/529)": not report["five_xx"],
        "0 wrong-shaped errors": not report["wrong_shape"],
        "every good request served": not report["good_refused"],
        "every malformed request refused": not report["bad_accepted"],
        "stats idle after": report["idle_after"],
        "RSS growth <= 50 MB": report["rss_growth_mb"] <= 50,
        "exit 0 on SIGTERM": report["server_exit_status"] == 0,
    }
    report["checks"] = checks
    print(
        f"soak: {report['requests']} requests sent ({warm.sent} warm-up, {latency_sent} latency, "
        f"{flood_bigs + paced_bigs} max-size bodies, {tally.sent} in the mix of seeds {seeds}) in {soak_s:.0f} s, "
        f"kinds {tally.by_kind}"
    )
    print(f"status {report['status']}")
    print(f"RSS {report['rss_before_mb']:.0f} -> {report['rss_after_mb']:.0f} MB ({report['rss_growth_mb']:+.1f})")
    print(
        f"p99 of good requests: alone {report['p99_good_s'] * 1e3:.0f} ms; beside max-size bodies back to back"
        f" {report['p99_good_max_bodies_back_to_back_s'] * 1e3:.0f} ms ({report['p99_ratio_back_to_back']:.2f}x,"
        f" {flood_bigs} bodies), one every 0.5 s {report['p99_good_max_body_every_half_second_s'] * 1e3:.0f} ms"
        f" ({report['p99_ratio_every_half_second']:.2f}x, {paced_bigs} bodies)"
    )
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    for label in (report["five_xx"] + report["wrong_shape"] + report["good_refused"] + report["bad_accepted"])[:10]:
        print("   ", label)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
