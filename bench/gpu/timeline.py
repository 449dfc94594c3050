"""Print the GPU timeline of a ``torch.profiler`` Chrome trace: what the device did, in order, with gaps.

``python3 bench/gpu/timeline.py TRACE.json [--start 0.33] [--count 80]``: the GPU events (kernels,
copies, memsets) sorted by start; a run of ``--count`` of them from the fraction ``--start`` of the trace,
each with its start (µs from the first shown), duration and the idle gap before it; then per kernel name
the count, total and mean device time over the whole trace, and the busy share of the span. Gaps are
where the device waited: for the host, for a stream wait (the CPU branch) or between graph nodes.

``--layers`` instead cuts the trace into MoE layer steps at each plan kernel and prints, per layer, the
mean / median / p90 of its span, fill, GEMM and other kernels' device time and its idle time (the wait for
the CPU branch, mostly): where a hybrid layer's time goes, over every layer of the trace.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
PARTS = (("fill", "_gather_rows"), ("gemm", "_gate_up_kernel|_down_kernel"), ("plan", "_plan_kernel"),
         ("stage", "_stage_kernel"))  # fmt: skip


def gpu_events(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    evs = data["traceEvents"] if isinstance(data, dict) else data
    out = [e for e in evs if e.get("cat") in GPU_CATS and "dur" in e]
    return sorted(out, key=lambda e: float(e["ts"]))


def _pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


def layer_breakdown(evs: list[dict], plan: str = "_plan_kernel") -> dict[str, list[float]]:
    """Per MoE layer step (from one plan kernel to the next): span, the parts' device µs, other kernels, idle."""
    starts = [i for i, e in enumerate(evs) if plan in e["name"]]
    cols: dict[str, list[float]] = defaultdict(list)
    for a, b in zip(starts, starts[1:]):
        seg = evs[a:b]
        t0, t1 = float(seg[0]["ts"]), float(evs[b]["ts"])
        busy = {k: 0.0 for k, _ in PARTS}
        other, covered, end, gap = 0.0, 0.0, t0, 0.0
        for e in seg:
            ts, dur = float(e["ts"]), float(e["dur"])
            gap = max(gap, ts - end)
            covered += max(0.0, min(ts + dur, t1) - max(ts, end))
            end = max(end, ts + dur)
            for k, pat in PARTS:
                if any(x in e["name"] for x in pat.split("|")):
                    busy[k] += dur
                    break
            else:
                other += dur
        cols["span"].append(t1 - t0)
        for k, v in busy.items():
            cols[k].append(v)
        cols["other"].append(other)
        cols["idle"].append(t1 - t0 - covered)
        cols["maxgap"].append(max(gap, t1 - end))  # the longest wait: for the CPU branch, mostly
    return cols


def print_layers(evs: list[dict]) -> int:
    cols = layer_breakdown(evs)
    if not cols:
        print("no plan kernels in the trace")
        return 1
    n = len(cols["span"])
    print(f"{n} layer steps (plan to plan), device µs per layer step")
    print(f"{'part':>7} {'mean':>8} {'median':>8} {'p10':>8} {'p90':>8}")
    for k, v in cols.items():
        print(f"{k:>7} {sum(v) / n:8.1f} {_pct(v, 0.5):8.1f} {_pct(v, 0.1):8.1f} {_pct(v, 0.9):8.1f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--start", type=float, default=0.34, help="fraction of the GPU events to start at")
    p.add_argument("--count", type=int, default=80, help="events to list")
    p.add_argument("--width", type=int, default=60, help="characters of each name")
    p.add_argument("--layers", action="store_true", help="per MoE layer step: span, fill, GEMM, idle")
    a = p.parse_args(argv)
    evs = gpu_events(a.trace)
    if not evs:
        print("no GPU events in", a.trace)
        return 1
    if a.layers:
        return print_layers(evs)
    i0 = int(len(evs) * a.start)
    shown = evs[i0 : i0 + a.count]
    t0 = float(shown[0]["ts"])
    prev_end = float(evs[i0 - 1]["ts"]) + float(evs[i0 - 1]["dur"]) if i0 > 0 else t0
    print(f"{'start us':>9} {'dur us':>8} {'gap us':>8}  name")
    for e in shown:
        ts, dur = float(e["ts"]), float(e["dur"])
        print(f"{ts - t0:9.1f} {dur:8.1f} {ts - prev_end:8.1f}  {e['name'][: a.width]}")
        prev_end = max(prev_end, ts + dur)
    span = float(evs[-1]["ts"]) + float(evs[-1]["dur"]) - float(evs[0]["ts"])
    agg: dict[str, list[float]] = defaultdict(list)
    for e in evs:
        agg[e["name"][: a.width]].append(float(e["dur"]))
    busy = sum(sum(v) for v in agg.values())
    print(f"\nspan {span / 1e3:.2f} ms, device busy {busy / 1e3:.2f} ms ({busy / span:.0%}), {len(evs)} events")
    print(f"{'count':>6} {'total ms':>9} {'mean us':>8}  name")
    for name, v in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:25]:
        print(f"{len(v):6d} {sum(v) / 1e3:9.3f} {sum(v) / len(v):8.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
