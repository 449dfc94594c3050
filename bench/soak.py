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
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from freetoken.bench.http_ttft import wait_ready

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_requests import CHAT, MODEL, Tally, merged, run_mix, send  # noqa: E402

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
