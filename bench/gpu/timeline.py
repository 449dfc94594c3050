"""Print the GPU timeline of a ``torch.profiler`` Chrome trace: what the device did, in order, with gaps.

``python3 bench/gpu/timeline.py TRACE.json [--start 0.33] [--count 80]``: the GPU events (kernels,
copies, memsets) sorted by start; a run of ``--count`` of them from the fraction ``--start`` of the trace,
each with its start (µs from the first shown), duration and the idle gap before it; then per kernel name
the count, total and mean device time over the whole trace, and the busy share of the span. Gaps are
where the device waited: for the host, for a stream wait (the CPU branch) or between graph nodes.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def gpu_events(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    evs = data["traceEvents"] if isinstance(data, dict) else data
    out = [e for e in evs if e.get("cat") in GPU_CATS and "dur" in e]
    return sorted(out, key=lambda e: float(e["ts"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--start", type=float, default=0.34, help="fraction of the GPU events to start at")
    p.add_argument("--count", type=int, default=80, help="events to list")
    p.add_argument("--width", type=int, default=60, help="characters of each name")
    a = p.parse_args(argv)
    evs = gpu_events(a.trace)
    if not evs:
        print("no GPU events in", a.trace)
        return 1
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
