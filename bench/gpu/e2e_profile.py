"""How busy the GPU is during decode steps through the engine: the union of the device's kernel intervals
(torch profiler, CUPTI: kernels inside CUDA graphs included) over the steps' wall time.

    python3 bench/gpu/e2e_profile.py CHECKPOINT [--backend fused] [--steps 50] [--batch 1] [--no-overlap]

Each ``LLMEngine.step`` reads one decode step; with overlap (the engine's default on CUDA) it launches the next
one first, so the wall time of the steps counts the host's work only where the device waited for it.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from freetoken import LLM, SamplingParams


def busy_fraction(intervals: list[tuple[float, float]], wall_us: float) -> float:
    merged, end = 0.0, float("-inf")
    start = float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            if end > start:
                merged += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if end > start:
        merged += end - start
    return merged / wall_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--backend", default="fused")
    ap.add_argument("--expert-cache", type=float, default=None)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                    help="launch decode step N+1 before reading step N (EngineConfig.overlap_steps)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=0, help="also print the N kernels of most launches per step")
    ap.add_argument("--cprofile", type=int, default=0,
                    help="instead: the host's Python functions over the steps (cProfile), the N of most own time")
    ap.add_argument("--host-ops", action="store_true",
                    help="also record the host's torch ops (their recording slows the host: the busy share drops)")
    args = ap.parse_args()
    llm = LLM(args.checkpoint, device="cuda", moe_backend=args.backend, expert_cache=args.expert_cache,
              max_running_requests=max(4, args.batch), cuda_graphs=args.cuda_graphs,
              overlap_steps=args.overlap)  # fmt: skip
    eng = llm.engine
    params = SamplingParams(max_tokens=args.steps + 40, temperature=args.temperature, ignore_eos=True, seed=1)
    for b in range(args.batch):
        eng.add_request(f"p{b}", [5 + b, 6, 7, 8, 9, 10, 11, 12], params)
    for _ in range(20):
        eng.step()
    torch.cuda.synchronize()
    if args.cprofile:
        import cProfile
        import pstats

        prof_py = cProfile.Profile()
        t0 = time.perf_counter()
        prof_py.runcall(lambda: [eng.step() for _ in range(args.steps)])
        torch.cuda.synchronize()
        print(f"{(time.perf_counter() - t0) / args.steps * 1e3:.2f} ms/step under cProfile")
        pstats.Stats(prof_py).sort_stats("tottime").print_stats(args.cprofile)
        return
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if args.host_ops else [ProfilerActivity.CUDA]
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    kernels = [
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    ]
    busy = busy_fraction(kernels, wall_us)
    if args.top:
        per: dict[str, list[float]] = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
                per.setdefault(e.name[:70], []).append(e.time_range.end - e.time_range.start)
        for name, ts in sorted(per.items(), key=lambda kv: -sum(kv[1]))[: args.top]:
            print(f"  {len(ts) / args.steps:6.1f}/step {sum(ts) / args.steps:8.1f} us/step  {name}")
    stats = llm.stats()
    graphs, ahead = stats.get("step_graph_replays", 0), stats.get("steps_launched_ahead", 0)
    ms = wall_us / args.steps / 1e3
    print(f"{args.backend} batch {args.batch} graphs {args.cuda_graphs} overlap {args.overlap}: {ms:.2f} ms/step, "
          f"{len(kernels) / args.steps:.0f} kernels/step, GPU busy {busy:.1%} (graph replays {graphs}, "
          f"launched ahead {ahead}, eager fallbacks {stats.get('step_graph_eager_fallback_reasons', {})}, "
          f"MoE graph failures {stats.get('moe_graph_failures', 0)})")  # fmt: skip


if __name__ == "__main__":
    main()
