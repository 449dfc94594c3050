"""Do external CUDA events work inside our per-layer graphs on this box's torch? (a 30 s probe)

Two questions decide two possible changes (docs/architecture.md, closing notes of the eighth session):
1. Timing: ``torch.cuda.Event(enable_timing=True, external=True)`` recorded inside a captured graph; after each
   replay, ``elapsed_time`` gives the bracketed part's time (would keep the fills' online rate live under graphs).
2. Waiting: a graph that waits (``stream.wait_event``) on an external event the host records on another stream
   *before each replay* must wait for that replay's record, not the one at capture time (would let a split fill's
   tail be joined right before the next layer's fills instead of before its whole graph).

    PYTHONPATH=src python3 bench/gpu/probe_external_events.py
"""

from __future__ import annotations

import torch


def _busy_iters(ms: float) -> int:
    """How many ``_busy`` iterations keep a stream busy for about ``ms`` (measured once, synchronously)."""
    a = torch.randn(512, 512, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        a = torch.tanh(a @ a)
    end.record()
    end.synchronize()
    return max(1, int(200 * ms / max(start.elapsed_time(end), 1e-3)))


def _busy(n: int, stream: torch.cuda.Stream) -> None:
    """Enqueue n small matmuls on ``stream`` without waiting for them."""
    with torch.cuda.stream(stream):
        a = torch.randn(512, 512, device="cuda")
        for _ in range(n):
            a = torch.tanh(a @ a)


def timing() -> str:
    x = torch.randn(1 << 22, device="cuda")
    t0, t1 = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x.mul_(1.0)  # warm-up outside capture
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        t0.record()
        for _ in range(50):
            x.mul_(1.0001)
        t1.record()
    out = []
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        out.append(t0.elapsed_time(t1))
    return f"timing inside a graph: OK, {', '.join(f'{v:.3f}' for v in out)} ms per replay"


def waiting() -> str:
    side = torch.cuda.Stream()
    flag = torch.zeros(1, device="cuda")
    seen = torch.zeros(1, device="cuda")
    ev = torch.cuda.Event(external=True)
    ev.record(side)  # something recorded before capture
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        torch.cuda.current_stream().wait_event(ev)
        seen.copy_(flag)  # what the side stream had written when the wait ended
    results = []
    n = _busy_iters(20.0)
    for i in range(1, 4):
        _busy(n, side)  # side busy for ~20 ms (queued, not waited for), then writes i
        with torch.cuda.stream(side):
            flag.fill_(float(i))
        ev.record(side)  # the host records the event on the side stream, then replays
        g.replay()
        torch.cuda.synchronize()
        results.append(int(seen.item()))
    ok = results == [1, 2, 3]
    return f"external wait inside a graph: {'waits for the latest record' if ok else 'does NOT'} (seen {results})"


def main() -> None:
    for probe in (timing, waiting):
        try:
            print(probe())
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{probe.__name__}: FAILED {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
