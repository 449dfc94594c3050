"""Elastic VRAM on a GPU, as a timeline: another program takes 8 GiB, then 30 GiB, while the engine streams.

    PYTHONPATH=src python3 bench/elastic_timeline.py --out DIR [--backends offload,hybrid] [--layers 12]
        [--budget 40] [--reserve 1.5] [--free-left 2] [--tokens 512] [--plan 2:8,5:0,8:30,11:0] [--seconds 14]
        [--base-seconds 3] [--tie-margin 0.03125] [--pinned-half]

Per backend: the engine starts with ``--budget`` GiB (expert slots + KV pages + reserve) on a synthetic
checkpoint of the preset's shape (``ft bench e2e``'s, ``--layers`` layers), warms up, and runs greedy requests
of ``--tokens`` tokens back to back (one prompt; no prefix cache, so each computes as the first), undisturbed
for ``--base-seconds``. Then a second process (``bench/elastic_hog.py``: torch allocations of 256 MiB, retried
while the device refuses them — a program that grows until it has what it wants) takes the rest of the card but
``--free-left`` GiB, and the timeline starts: requests back to back for ``--seconds`` (the last
one ends), while the other process follows ``--plan`` (at fixed seconds, GiB over what it took at first).
Recorded every 50 ms: the engine's slots and KV pages, the other process's memory, the device's free memory
(NVML); per token its time, so tok/s over 0.5 s windows. Checks (``runs[].checks``, PASS only if all hold):
no out-of-memory, traceback or error logged; every request complete; every request's tokens equal the
undisturbed one's by the near-tie rule (``compare``: a divergence where the undisturbed margin is below
``--tie-margin`` counts as a tie, equal up to it, and is reported); each phase's first shrink within 1 s; after
each give-back a window back to 90% of the undisturbed median within 2 s. Writes ``timeline-<backend>.csv``,
``resizes-<backend>.csv``, ``summary.json`` and, where matplotlib is installed, ``timeline-<backend>.png``
under ``--out``. ``--pinned-half``: hybrid with half the pool pinned beside the fully pinned run (tok/s, same
tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import logging
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from elastic_hog import CHUNK, Hog  # noqa: E402

GIB = 1 << 30
WINDOW_S = 0.5
# The near-tie rule (DESIGN §8, tests/reference.py: LOGIT_MARGIN = 1e-3 on fp32 logits) carried to bf16: its logits
# carry 8 significant bits, so two within one bf16 ulp of a logit in [4, 8) (2**-5) are a tie; the bench reports
# every divergence with its margin either way.
TIE_MARGIN = 2**-5


# ---- the engine side -----------------------------------------------------------------------------------------
class OomLog(logging.Handler):
    """Log records that speak of running out of memory, or carry a traceback or an error (graph captures, steps,
    resizes, engine commands): each one fails the run."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []
        self.refusals = 0  # sizes the device refused, that a resize fell back from (no failure)

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        self.refusals += "the device refused" in msg
        exc = record.exc_info[1] if record.exc_info else None
        if "out of memory" in msg.lower() or "OutOfMemory" in msg or exc is not None or record.levelno >= logging.ERROR:
            self.records.append((msg + (f" [{type(exc).__name__}: {exc}]" if exc is not None else ""))[:300])


@dataclass
class Stream:
    ids: list[int]
    times: list[float]  # perf_counter of each token's arrival
    margins: list[float]  # top-1 minus top-2 logprob per token (the near-tie rule)
    finish: str | None
    error: str | None


async def stream(llm: Any, prompt: list[int], tokens: int) -> Stream:
    from freetoken import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=2)
    st = Stream([], [], [], None, None)
    async for out in llm.generate(prompt, params):
        now = time.perf_counter()
        st.ids += out.new_token_ids
        st.times += [now] * len(out.new_token_ids)
        for _, _, top in out.logprobs or []:
            st.margins.append(top[0][1] - top[1][1] if len(top) > 1 else float("inf"))
        if out.finished:
            st.finish, st.error = out.finish_reason, out.error
    return st


def back_to_back(llm: Any, prompt: list[int], tokens: int, seconds: float) -> list[Stream]:
    """Requests of ``tokens`` tokens, one after the other, until ``seconds`` have passed (the last one ends)."""
    t0, out = time.perf_counter(), list[Stream]()
    while not out or time.perf_counter() - t0 < seconds:
        out.append(asyncio.run(stream(llm, prompt, tokens)))
    return out


def compare(got: Stream, base: Stream, tie: float) -> dict[str, Any]:
    """The near-tie rule (DESIGN §8) on bf16: tokens equal, or equal up to a divergence where the undisturbed
    run's top-1/top-2 margin was below ``tie`` (a tie: either token is the greedy one)."""
    at = next((i for i, (a, b) in enumerate(zip(got.ids, base.ids)) if a != b), None)
    margin = None if at is None or at >= len(base.margins) else base.margins[at]
    complete = len(got.ids) == len(base.ids)
    same = got.ids == base.ids
    return {"tokens": len(got.ids), "same_tokens": same, "first_divergence": at, "margin_at_divergence": margin,
            "equal_by_near_tie_rule": same or (at is not None and margin is not None and margin < tie),
            "complete": complete, "finish": got.finish, "error": got.error}  # fmt: skip


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
                       prefix_cache=False)  # fmt: skip  # every request computes exactly as the first
    n_oom, n_refused = len(oom.records), oom.refusals
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
    undisturbed = back_to_back(llm, prompt, args.tokens, args.base_seconds)
    base = undisturbed[0]
    D = time.perf_counter() - t0
    base_times = [t for st in undisturbed for t in st.times]
    base_tok_s = len(base_times) / D
    base_wins = [r for _, r in windows(base_times, t0, base_times[-1])]
    base_rate = statistics.median(base_wins) if base_wins else base_tok_s  # --base-seconds under one window
    base_same = all(st.ids == base.ids for st in undisturbed)  # the undisturbed requests agree among themselves
    split0 = llm.stats()["memory"]
    print(f"# {backend}: undisturbed {base_tok_s:.1f} tok/s ({len(undisturbed)} requests, window median "
          f"{base_rate:.1f}); {split0['slots']} slots, {split0['kv_pages']} KV pages, budget "
          f"{split0['budget_gib']:.1f} GiB", flush=True)  # fmt: skip
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
                            "kv_pages": eng.memory.kv_pages, "hog_gib": hog.held / GIB,
                            "free_gib": nvml.free_bytes() / GIB})  # fmt: skip
            time.sleep(0.05)

    def drive() -> None:
        for at, gib in args.plan:
            while time.perf_counter() - start < at and not stop.is_set():
                time.sleep(0.01)
            events.append(
                (time.perf_counter() - start, f"+{gib:g} GiB" if gib else "give back", ballast + int(gib * GIB))
            )
            hog.want(ballast + int(gib * GIB))

    threads = [threading.Thread(target=sample), threading.Thread(target=drive)]
    for t in threads:
        t.start()
    n_resizes = len(eng.memory.history)
    runs = back_to_back(llm, prompt, args.tokens, args.seconds)
    threads[1].join()
    hog.wait_held(30)
    stop.set()
    threads[0].join()
    resizes = list(eng.memory.history[n_resizes:])
    times = [t for st in runs for t in st.times]
    wins = windows(times, start, times[-1])
    checks = [compare(st, base, args.tie_margin) for st in runs]
    summary = {
        "backend": backend, "requests": len(runs), "tokens": len(times),
        "all_complete": all(c["complete"] for c in checks),
        "same_tokens": all(c["same_tokens"] for c in checks),
        "equal_by_near_tie_rule": all(c["equal_by_near_tie_rule"] and c["complete"] for c in checks),
        "near_ties": [dict(c, request=i) for i, c in enumerate(checks) if not c["same_tokens"]],
        "min_margin_undisturbed": min(base.margins, default=None), "undisturbed_requests_agree": base_same,
        "undisturbed_s": D, "undisturbed_tok_s": base_tok_s, "undisturbed_window_median": base_rate,
        "free_at_start_gib": free_start / GIB, "split_at_start": split0, "oom_log": oom.records[n_oom:],
        "hog_refusals": hog.refused, "resizes": len(resizes),
        "refusals_logged": oom.refusals - n_refused, "phases": [],
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
    summary["checks"] = check(summary)
    write_outputs(out, backend, samples, wins, resizes, events)
    asyncio.run(llm.shutdown(drain=False))
    hog.close()
    return summary


def check(s: dict[str, Any]) -> dict[str, bool]:
    """The issue's GPU criteria, one by one."""
    grows, gives = (
        [p for p in s["phases"] if p["what"].startswith("+")],
        [p for p in s["phases"] if "give" in p["what"]],
    )
    return {
        "no_oom_or_error_logged": not s["oom_log"],
        "every_request_complete": s["all_complete"],
        "tokens_equal_near_tie_rule": s["equal_by_near_tie_rule"],
        "shrinks_within_1s": all(
            p["first_shrink_after_s"] is not None and p["first_shrink_after_s"] <= 1.0 for p in grows
        ),  # fmt: skip
        "back_to_90pct_within_2s": all(
            p["back_to_90pct_after_s"] is not None and p["back_to_90pct_after_s"] <= 2.0 for p in gives
        ),  # fmt: skip
    }


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
        ids = asyncio.run(stream(llm, prompt, args.tokens // 2)).ids
        res[name] = {"tok_s": len(ids) / (time.perf_counter() - t0), "ids": ids,
                     "pinned_experts": llm.stats()["pinned_experts"]}  # fmt: skip
        asyncio.run(llm.shutdown(drain=False))
    res["same_tokens"] = res["full"].pop("ids") == res["half"].pop("ids")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--backends", default="offload,hybrid")
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dir", default=None, help="where the synthetic checkpoint is (written once)")
    ap.add_argument("--budget", type=float, default=40.0, help="GiB: slots + KV pages + reserve")
    ap.add_argument("--reserve", type=float, default=1.5)
    ap.add_argument("--free-left", type=float, default=2.0, help="GiB the other process leaves free at first")
    ap.add_argument("--tokens", type=int, default=512, help="tokens per request (requests run back to back)")
    ap.add_argument("--plan", default="2:8,5:0,8:30,11:0",
                    help="SECONDS:GIB,...: at each second of the timeline the other process wants GIB over what it "
                         "took at first (0: gives back)")  # fmt: skip
    ap.add_argument("--seconds", type=float, default=14.0, help="the timeline's length (the last request ends)")
    ap.add_argument("--base-seconds", type=float, default=3.0, help="the undisturbed run's length")
    ap.add_argument("--tie-margin", type=float, default=TIE_MARGIN,
                    help="a divergence where the undisturbed margin is below this counts as a near tie")  # fmt: skip
    ap.add_argument("--cpu-threads", type=int, default=None)
    ap.add_argument("--pinned-half", action="store_true")
    ap.add_argument("--plot", metavar="DIR", help="only draw the PNGs from DIR's CSVs and summary.json")
    args = ap.parse_args(argv)
    if args.plot:
        d = Path(args.plot)
        runs = json.loads((d / "summary.json").read_text())["runs"]
        return 0 if all(plot(d, r["backend"], [p["at_s"] for p in r["phases"]]) for r in runs) else 1
    args.plan = [(float(a), float(b)) for a, b in (x.split(":") for x in args.plan.split(",") if x)]
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
    summary: dict[str, Any] = {"args": vars(args), "runs": []}
    ok = True
    for backend in args.backends.split(","):
        s = run_backend(args, ckpt, backend, out, oom)
        summary["runs"].append(s)
        ok &= all(s["checks"].values())
        print(json.dumps({k: v for k, v in s.items() if k != "split_at_start"}, indent=1), flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))  # kept if a later run dies
    if args.pinned_half:
        summary["pinned_half"] = pinned_half(args, ckpt)
        print(json.dumps(summary["pinned_half"]), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print("PASS" if ok else "FAIL: a check of summary.json's runs[].checks is false", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
