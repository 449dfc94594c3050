"""Elastic VRAM on a GPU, as a timeline: another program takes 8 GiB, then 30 GiB, while the engine streams.

    PYTHONPATH=src python3 bench/elastic_timeline.py --out DIR [--backends offload,hybrid] [--layers 12]
        [--budget 40] [--reserve 1.5] [--free-left 2] [--tokens 512] [--phases 8,30] [--pinned-half]

Per backend: the engine starts with ``--budget`` GiB (expert slots + KV pages + reserve) on a synthetic
checkpoint of the preset's shape (``ft bench e2e``'s, ``--layers`` layers), warms up, streams ``--tokens``
greedy tokens undisturbed, then a second process (``--hog`` mode of this file, torch allocations of 256 MiB,
retried while the device refuses them — a program that grows until it has what it wants) takes the rest of
the card but ``--free-left`` GiB, and during the same stream again takes ``--phases`` GiB more, one phase
after the other, each held for a quarter of the undisturbed stream and then given back. Recorded every 50 ms:
the engine's slots and KV pages, the other process's memory, the device's free memory (NVML); per token its
time, so tok/s over 0.5 s windows. Asserts the stream's tokens equal the undisturbed run's and that no
out-of-memory error was logged; reports the time from each phase's start to the engine's first shrink, until
the other process had all it wanted, and from each give-back until a window is back to 90% of the undisturbed
median. Writes ``timeline-<backend>.csv``, ``resizes-<backend>.csv``, ``summary.json`` and, where matplotlib
is installed, ``timeline-<backend>.png`` under ``--out``. ``--pinned-half``: hybrid with half the pool pinned
beside the fully pinned run (tok/s, same tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
CHUNK = 256 << 20
WINDOW_S = 0.5


# ---- the other program ---------------------------------------------------------------------------------------
def hog_main() -> int:
    """Reads target byte counts on stdin; grows (chunks, retrying while refused) or shrinks to each; prints
    ``held <bytes> <refusals>`` every 50 ms."""
    import torch

    target, refused = [0], 0
    held: list[Any] = []
    torch.cuda.init()

    def reader() -> None:
        for line in sys.stdin:
            target[0] = int(line.strip() or 0)

    threading.Thread(target=reader, daemon=True).start()
    last = 0.0
    while True:
        want, have = target[0], len(held) * CHUNK
        if want < 0:
            return 0
        if have + CHUNK <= want:
            try:
                held.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                refused += 1
                time.sleep(0.01)
        elif have > want:
            while len(held) * CHUNK > want:
                held.pop()
            torch.cuda.empty_cache()
        else:
            time.sleep(0.005)
        now = time.monotonic()
        if now - last > 0.05:
            print(f"held {len(held) * CHUNK} {refused}", flush=True)
            last = now


class Hog:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--hog"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)  # fmt: skip
        self.held, self.refused, self.target = 0, 0, 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            _, held, refused = line.split()
            self.held, self.refused = int(held), int(refused)

    def want(self, nbytes: int) -> None:
        self.target = nbytes
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{nbytes}\n")
        self.proc.stdin.flush()

    def wait_held(self, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if abs(self.held - self.target) < CHUNK:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self.want(-1)
        self.proc.wait(10)


# ---- the engine side -----------------------------------------------------------------------------------------
class OomLog(logging.Handler):
    """Counts log records that speak of running out of memory (graph captures, steps, resizes)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "out of memory" in msg.lower() or "OutOfMemory" in msg:
            self.records.append(msg[:300])


MARGINS: dict[int, list[float]] = {}  # id(ids list) -> top-1 minus top-2 logprob per token (the near-tie rule)


async def stream(llm: Any, prompt: list[int], tokens: int) -> tuple[list[int], list[float]]:
    from freetoken import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=2)
    ids: list[int] = []
    times: list[float] = []
    margins: list[float] = []
    async for out in llm.generate(prompt, params):
        now = time.perf_counter()
        ids += out.new_token_ids
        times += [now] * len(out.new_token_ids)
        for _, _, top in out.logprobs or []:
            margins.append(top[0][1] - top[1][1] if len(top) > 1 else float("inf"))
    MARGINS[id(ids)] = margins
    return ids, times


def windows(times: list[float], t0: float, end: float) -> list[tuple[float, float]]:
    """(window end relative to t0, tok/s) over WINDOW_S windows."""
    out, t = [], t0
    while t + WINDOW_S <= end + 1e-9:
        n = sum(1 for x in times if t <= x < t + WINDOW_S)
        out.append((t + WINDOW_S - t0, n / WINDOW_S))
        t += WINDOW_S
    return out


def run_backend(args: argparse.Namespace, ckpt: Path, backend: str, out: Path, oom: OomLog) -> dict[str, Any]:
    import torch

    from freetoken.config import EngineConfig
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.engine.vram_watch import NvmlSource

    cfg = EngineConfig(model=str(ckpt), moe_backend=backend, vram_budget=args.budget, vram_reserve=args.reserve,
                       max_model_len=4096, max_running_requests=1, cpu_threads=args.cpu_threads,
                       prefix_cache=False)  # fmt: skip  # the second stream computes exactly as the first
    n_oom = len(oom.records)
    hog = Hog()
    llm = AsyncLLM.start(cfg)
    assert llm.wait_loaded(600) and llm.state == "ready", llm.error
    eng = llm.engine
    assert eng is not None
    nvml = NvmlSource.open(eng.device)
    assert nvml is not None and llm.watcher is not None, "the VRAM watcher needs nvidia-ml-py (pynvml)"
    vocab = eng.hf.vocab_size
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (64,), generator=g).tolist()
    warm = torch.randint(0, vocab, (64,), generator=g).tolist()
    asyncio.run(stream(llm, warm, 64))  # graphs captured, kernels compiled
    t0 = time.perf_counter()
    base, base_times = asyncio.run(stream(llm, prompt, args.tokens))
    D = time.perf_counter() - t0
    base_rate = statistics.median(r for _, r in windows(base_times, base_times[0], base_times[-1])) if D > 1 else 0
    split0 = llm.stats()["memory"]
    print(f"# {backend}: undisturbed {args.tokens / D:.1f} tok/s; {split0['slots']} slots, {split0['kv_pages']} KV "
          f"pages, budget {split0['budget_gib']:.1f} GiB", flush=True)
    ballast = max(0, nvml.free_bytes() - int(args.free_left * GIB))
    hog.want(ballast)
    hog.wait_held(60)
    free_start = nvml.free_bytes()
    samples: list[dict[str, float]] = []
    events: list[tuple[float, str, int]] = []
    stop = threading.Event()
    start, start_wall = time.perf_counter(), time.time()

    def sample() -> None:
        while not stop.is_set():
            samples.append({"t": time.perf_counter() - start, "slots": eng.memory.num_slots,
                            "kv_pages": eng.kv.num_pages, "hog_gib": hog.held / GIB,
                            "free_gib": nvml.free_bytes() / GIB})  # fmt: skip
            time.sleep(0.05)

    def drive() -> None:
        plan = []
        for i, gib in enumerate(args.phases):
            at = D * (0.1 + i * 0.45)
            plan += [(at, f"+{gib:g} GiB", ballast + int(gib * GIB)), (at + D * 0.25, "give back", ballast)]
        for at, what, nbytes in plan:
            while time.perf_counter() - start < at and not stop.is_set():
                time.sleep(0.01)
            events.append((time.perf_counter() - start, what, nbytes))
            hog.want(nbytes)

    threads = [threading.Thread(target=sample), threading.Thread(target=drive)]
    for t in threads:
        t.start()
    n_resizes = len(eng.memory.history)
    got, times = asyncio.run(stream(llm, prompt, args.tokens))
    threads[1].join()
    hog.wait_held(30)
    time.sleep(max(0.0, D * 0.1))
    stop.set()
    threads[0].join()
    resizes = list(eng.memory.history[n_resizes:])
    wins = windows(times, start, times[-1])
    diverge = next((i for i, (a, b) in enumerate(zip(got, base)) if a != b), None)
    base_margins = MARGINS.get(id(base), [])
    summary = {
        "backend": backend, "same_tokens": got == base, "first_divergence": diverge,
        "margin_at_divergence": None if diverge is None or diverge >= len(base_margins) else base_margins[diverge],
        "min_margin_undisturbed": min(base_margins, default=None),
        "tokens": len(got), "undisturbed_s": D, "undisturbed_tok_s": args.tokens / D,
        "undisturbed_window_median": base_rate, "free_at_start_gib": free_start / GIB,
        "split_at_start": split0, "oom_log": oom.records[n_oom:], "hog_refusals": hog.refused,
        "resizes": len(resizes), "phases": [],
    }  # fmt: skip
    for at, what, nbytes in events:
        ph: dict[str, Any] = {"at_s": round(at, 3), "what": what, "other_target_gib": round(nbytes / GIB, 2)}
        after = [r for r in resizes if r.at - start_wall >= at]
        if what.startswith("+"):
            first = next((r for r in after if r.slots_after < r.slots_before or r.kv_pages_after < r.kv_pages_before),
                         None)  # fmt: skip
            ph["first_shrink_after_s"] = None if first is None else round(first.at - start_wall - at, 3)
            had = next((x["t"] for x in samples if x["t"] >= at and x["hog_gib"] * GIB >= nbytes - CHUNK), None)
            ph["other_had_all_after_s"] = None if had is None else round(had - at, 3)
        else:
            back = next((end for end, r in wins if end - WINDOW_S >= at and r >= 0.9 * base_rate), None)
            ph["back_to_90pct_after_s"] = None if back is None else round(back - at, 3)
        summary["phases"].append(ph)
    write_outputs(out, backend, samples, wins, resizes, events)
    asyncio.run(llm.shutdown(drain=False))
    hog.close()
    return summary


def write_outputs(out: Path, backend: str, samples: list[dict[str, float]], wins: list[tuple[float, float]],
                  resizes: list[Any], events: list[tuple[float, str, int]]) -> None:  # fmt: skip
    with open(out / f"timeline-{backend}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "tok_s_window", "slots", "kv_pages", "other_gib", "free_gib"])
        for s in samples:
            t = s["t"]
            r = next((v for end, v in wins if end - WINDOW_S <= t < end), "")
            w.writerow([f"{t:.3f}", r, s["slots"], s["kv_pages"], f"{s['hog_gib']:.3f}", f"{s['free_gib']:.3f}"])
    with open(out / f"resizes-{backend}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["unix_time", "source", "reason", "budget_gib", "slots", "kv_pages", "preempted", "seconds"])
        for r in resizes:
            w.writerow([f"{r.at:.3f}", r.source, r.reason, r.budget_gib, f"{r.slots_before}->{r.slots_after}",
                        f"{r.kv_pages_before}->{r.kv_pages_after}", r.preempted, f"{r.seconds:.3f}"])  # fmt: skip
    plot(out, backend, [e[0] for e in events])


def plot(out: Path, backend: str, event_times: list[float]) -> bool:
    """``timeline-<backend>.png`` from its CSV; False where matplotlib is missing (plot later with --plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    with open(out / f"timeline-{backend}.csv") as f:
        rows = list(csv.DictReader(f))
    t = [float(r["t_s"]) for r in rows]
    fig, ax = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    ax[0].plot(t, [float(r["tok_s_window"]) if r["tok_s_window"] else float("nan") for r in rows])
    ax[0].set_ylabel("tok/s (0.5 s)")
    ax[1].plot(t, [int(r["slots"]) for r in rows])
    ax[1].set_ylabel("expert slots")
    ax[2].plot(t, [int(r["kv_pages"]) for r in rows])
    ax[2].set_ylabel("KV pages")
    ax[3].plot(t, [float(r["other_gib"]) for r in rows], label="other process")
    ax[3].plot(t, [float(r["free_gib"]) for r in rows], label="device free")
    ax[3].set_ylabel("GiB")
    ax[3].legend()
    for a in ax:
        for at in event_times:
            a.axvline(at, color="grey", lw=0.5)
    ax[3].set_xlabel(f"seconds ({backend})")
    fig.tight_layout()
    fig.savefig(out / f"timeline-{backend}.png", dpi=110)
    return True


def pinned_half(args: argparse.Namespace, ckpt: Path) -> dict[str, Any]:
    """Hybrid, fully pinned vs half the pool pinned: tok/s and tokens of one stream each."""
    import torch

    from freetoken.config import EngineConfig
    from freetoken.engine.async_llm import AsyncLLM

    res: dict[str, Any] = {}
    for name, pinned in (("full", None), ("half", args.pool_gib / 2)):
        cfg = EngineConfig(model=str(ckpt), moe_backend="hybrid", expert_cache=0.25, pinned_budget=pinned,
                           max_model_len=4096, max_running_requests=1, cpu_threads=args.cpu_threads)  # fmt: skip
        llm = AsyncLLM.start(cfg)
        assert llm.wait_loaded(600) and llm.state == "ready", llm.error
        assert llm.engine is not None
        vocab = llm.engine.hf.vocab_size
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, vocab, (64,), generator=g).tolist()
        asyncio.run(stream(llm, prompt, 32))
        t0 = time.perf_counter()
        ids, _ = asyncio.run(stream(llm, prompt, args.tokens // 2))
        res[name] = {"tok_s": len(ids) / (time.perf_counter() - t0), "ids": ids,
                     "pinned_experts": llm.stats()["pinned_experts"]}  # fmt: skip
        asyncio.run(llm.shutdown(drain=False))
    res["same_tokens"] = res["full"].pop("ids") == res["half"].pop("ids")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hog", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--backends", default="offload,hybrid")
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dir", default=None, help="where the synthetic checkpoint is (written once)")
    ap.add_argument("--budget", type=float, default=40.0, help="GiB: slots + KV pages + reserve")
    ap.add_argument("--reserve", type=float, default=1.5)
    ap.add_argument("--free-left", type=float, default=2.0, help="GiB the other process leaves free at first")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--phases", default="8,30", help="GiB the other process takes, one phase each")
    ap.add_argument("--cpu-threads", type=int, default=None)
    ap.add_argument("--pinned-half", action="store_true")
    ap.add_argument("--plot", metavar="DIR", help="only draw the PNGs from DIR's CSVs and summary.json")
    args = ap.parse_args(argv)
    if args.hog:
        return hog_main()
    if args.plot:
        d = Path(args.plot)
        runs = json.loads((d / "summary.json").read_text())["runs"]
        return 0 if all(plot(d, r["backend"], [p["at_s"] for p in r["phases"]]) for r in runs) else 1
    args.phases = [float(x) for x in args.phases.split(",") if x]
    from freetoken.bench.e2e import checkpoint
    from freetoken.bench.presets import get_preset

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    oom = OomLog()
    logging.getLogger().addHandler(oom)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(argparse.Namespace(model=None, preset=args.preset, layers=args.layers, dir=args.dir))
    shape = get_preset(args.preset)
    args.pool_gib = args.layers * shape.experts * 3 * shape.hidden * shape.inter * 2 / GIB
    summary: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "hog"}, "runs": []}
    ok = True
    for backend in args.backends.split(","):
        s = run_backend(args, ckpt, backend, out, oom)
        summary["runs"].append(s)
        ok &= s["same_tokens"] and not s["oom_log"]
        print(json.dumps({k: v for k, v in s.items() if k != "split_at_start"}, indent=1), flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))  # kept if a later run dies
    if args.pinned_half:
        summary["pinned_half"] = pinned_half(args, ckpt)
        print(json.dumps(summary["pinned_half"]), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print("PASS" if ok else "FAIL: tokens differ or out-of-memory logged", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
