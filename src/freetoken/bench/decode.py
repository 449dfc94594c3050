"""Decode tok/s of each MoE expert policy on a synthetic model of exact per-layer shape, vs its bound.

``ft bench decode`` (``python -m freetoken.bench.decode``).

Per policy: tokens/s, distinct-expert miss rate, mean q, bytes per token over PCIe and through the CPU
kernel, and the bandwidth-model bound of BENCH.md:
``T_layer >= max(T_gpu, m * S / B)`` with ``B = B_P'`` (offload), ``B_H`` (cpu, static-*),
``B_P' + B_H'`` (hybrid), ``T_gpu`` from the fused run (every expert resident) when it ran.
All policies run in one process on identical inputs (same seeds; ``--routing-trace`` for identical
routing). Only the routed-expert path is modelled: no attention, embeddings or sampling.

    python -m freetoken.bench.decode --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 \
        --routing-trace bench/traces/locality-48x128x8.npy
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import torch

from freetoken.bench.decode_report import (
    PolicyResult,
    bandwidths,
    layer_bound_s,
    measured_bandwidths,
    median_result,
    print_acceptance,
    print_table,
    summarize,
)
from freetoken.bench.placements import PLACEMENTS, register
from freetoken.bench.presets import PRESETS, MoEShape, get_preset
from freetoken.bench.synthetic import SyntheticRouter, TraceRouter, random_banks, rms_norm
from freetoken.config import EngineConfig
from freetoken.experts.backends.auto import choose_backend
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.base import ExpertBackend, ExpertBanks

DEFAULT_POLICIES = ",".join(["fused", "offload", "hybrid", "cpu", *PLACEMENTS])  # static-layers, static-freq
# Policy variants, side by side: "<backend>+<option>+...", e.g. "hybrid+ff40", "hybrid+lag".
POLICY_OPTIONS = {
    "lag": "the host sleeps until the step before the last is done (--host-lag 1 for this policy)",
    "ffNN": "EngineConfig.fill_fraction = NN/100 (a fixed share of misses filled: hybrid+ff40 beside hybrid)",
}


def _fill_fraction(opt: str) -> float | None:
    """``ffNN`` -> NN / 100 (0..100), else None."""
    if len(opt) > 2 and opt.startswith("ff") and opt[2:].isdigit() and int(opt[2:]) <= 100:
        return int(opt[2:]) / 100
    return None


class Router(Protocol):
    def route(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def make_router(args: argparse.Namespace, shape: MoEShape, device: torch.device, dtype: torch.dtype) -> Router:
    if args.routing_trace:
        return TraceRouter(args.routing_trace, shape, args.layers, args.batch, device)
    return SyntheticRouter(shape, args.layers, device, dtype, seed=args.seed)


def decode_step(
    backend: ExpertBackend, router: Router, layers: int, x: torch.Tensor,
    after_layer: Callable[[int], None] | None = None,
) -> None:  # fmt: skip
    """One decode step of the batch through every MoE layer; x [B, D] in the compute dtype."""
    backend.begin_step(x.shape[0], True)
    for layer in range(layers):
        ids, w = router.route(layer, x)
        x = rms_norm(x + backend.forward(layer, x, ids, w))
        if after_layer is not None:
            after_layer(layer)
    if isinstance(router, TraceRouter):
        router.advance()


def _threads(args: argparse.Namespace) -> int | None:
    """The thread count of the current group (``--cpu-threads`` may list several)."""
    t = getattr(args, "threads", None)
    if t is None and args.cpu_threads:
        t = int(str(args.cpu_threads).split(",")[0])
    return t


def policy_config(policy: str, args: argparse.Namespace) -> EngineConfig:
    """The engine config of a policy name (``POLICY_OPTIONS``); the command's switches apply to every policy."""
    base, *opts = policy.split("+")
    unknown = [o for o in opts if o not in POLICY_OPTIONS and _fill_fraction(o) is None]
    fractions = [f for f in map(_fill_fraction, opts) if f is not None]
    if unknown:
        raise SystemExit(f"unknown policy option(s) {unknown} in {policy!r}; known: {sorted(POLICY_OPTIONS)}")
    return EngineConfig(
        moe_backend=base, expert_cache=args.expert_cache,
        fill_fraction=fractions[-1] if fractions else args.fill_fraction,
        cpu_threads=_threads(args), moe_cuda_graphs=args.cuda_graphs,
    )  # fmt: skip


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def run_policy(
    policy: str, banks: ExpertBanks, shape: MoEShape, args: argparse.Namespace, dev: torch.device, dtype: torch.dtype
) -> PolicyResult:
    register()  # the placements, when a policy names one
    backend = create_backend(policy_config(policy, args), banks, dev, dtype)
    router = make_router(args, shape, dev, dtype)
    g = torch.Generator(device=dev).manual_seed(args.seed)
    B, L = args.batch, args.layers

    def inputs() -> torch.Tensor:  # a fresh token embedding per step, identical across policies
        return torch.randn(B, shape.hidden, generator=g, device=dev).to(dtype)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    try:
        for _ in range(math.ceil(args.warmup_tokens / B)):
            decode_step(backend, router, L, inputs())
        sync()
        runner = getattr(backend, "cpu", None) or getattr(backend, "runner", None)  # slot backends / cpu
        kern = getattr(runner, "kernel", None) if args.cpu_trace else None
        if kern is not None:
            kern.trace(1 << 16)
        s0, l0 = backend.stats(), backend.layer_counts()
        lag = max(args.host_lag, int("lag" in policy.split("+")[1:]))
        marks: deque[torch.cuda.Event] = deque()
        t0, host = time.perf_counter(), 0.0
        for _ in range(args.steps):
            x = inputs()
            th = time.perf_counter()
            decode_step(backend, router, L, x)
            host += time.perf_counter() - th  # the host's own time: nothing waits for the device here
            if lag and dev.type == "cuda":  # as an engine that waits for each step's token, sleeping
                marks.append(torch.cuda.Event(blocking=True))
                marks[-1].record()
                if len(marks) > lag:
                    marks.popleft().synchronize()
        sync()
        elapsed = time.perf_counter() - t0
        s1, l1 = backend.stats(), backend.layer_counts()
        if kern is not None:
            print_batch_trace(policy, kern, banks)
        ahead = None
        if dev.type == "cuda" and args.runahead:
            from freetoken.bench.runahead import profile_steps, runahead_share

            def step(x: torch.Tensor, after: Callable[[int], None] | None) -> None:
                decode_step(backend, router, L, x, after)

            ahead = runahead_share(step, inputs)
            if args.profile_dir:
                profile_steps(step, inputs, Path(args.profile_dir) / f"{policy}-threads{_threads(args)}.json")
    finally:
        close: Callable[[], None] | None = getattr(backend, "close", None)
        if close is not None:
            close()
    r = summarize(policy, backend.name, s0, s1, elapsed, args.steps, B, banks.expert_bytes, l0, l1)
    r.runahead = ahead
    r.host_ms = host / args.steps * 1e3
    return r


def print_batch_trace(policy: str, kern: object, banks: ExpertBanks) -> None:
    """The measured steps' CPU batches: where their time went (``experts/cpu/batch_trace.py``)."""
    from freetoken.experts.cpu.batch_trace import format_rows, summarize

    trace = kern.take_trace()  # type: ignore[attr-defined]
    kern.trace(0)  # type: ignore[attr-defined]
    print(f"# {policy}: CPU batches of the measured steps, median µs per part by batch size (experts)")
    for line in format_rows(summarize(trace, banks.expert_bytes)):
        print("#   " + line)


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS), help="per-layer model shape")
    p.add_argument("--layers", type=int, default=12, help="MoE layers to build (the preset's shape per layer)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help="comma-separated MoE backends, placements to compare")
    p.add_argument("--expert-cache", type=float, default=0.25, help="slot cache: fraction of the pool (<= 1)")
    p.add_argument("--fill-fraction", type=float, default=None, help="fixed share of misses to fill (hybrid)")
    p.add_argument("--cpu-threads", default=None, help="CPU expert kernel threads; a comma list runs each in turn")
    p.add_argument("--repeats", type=int, default=1, help="interleaved repeats (policy order inside each); medians")
    p.add_argument("--measure-bw", action="store_true", help="measure B_P, B_H, B_P', B_H' in this process first")
    p.add_argument("--batch", type=int, default=1, help="decode tokens per step (concurrent requests)")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps")
    p.add_argument("--warmup-tokens", type=int, default=200, help="untimed tokens first (static-freq profiles these)")
    p.add_argument("--routing-trace", default=None, help="replay [tokens, layers, k] uint8 routing (.npy)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=sorted(_DTYPES), help="default: bfloat16 (cuda), float32 (cpu)")
    p.add_argument("--bw-copy", type=float, default=None, help="B_P' GB/s for the bound (default: machine profile)")
    p.add_argument("--bw-cpu", type=float, default=None, help="B_H' GB/s for the bound (default: machine profile)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay MoE decode layers as CUDA graphs (the engine's default; --no-cuda-graphs: eager)",
    )
    p.add_argument(
        "--runahead",
        action="store_true",
        help="CUDA: also measure how often the host queues the last MoE layer before the GPU ends the first",
    )
    p.add_argument("--cpu-trace", action="store_true",
                   help="trace the CPU branch's batches in the measured steps: idle, start, phases, GB/s by size")
    p.add_argument("--profile-dir", default=None, help="with --runahead: write a profiler trace of each policy here")
    p.add_argument("--host-lag", type=int, default=0,
                   help="CUDA: the host sleeps (blocking event) until step i-N is done before queuing step i+1; "
                   "0: it runs ahead until the driver's queue blocks it (the policy option '+lag': 1)")
    return p


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run(args: argparse.Namespace) -> int:
    shape = get_preset(args.preset)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = _DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if not 0 < args.expert_cache <= 1:
        raise SystemExit("--expert-cache is a fraction of the pool in (0, 1]")
    t0 = time.perf_counter()
    banks = random_banks(shape, args.layers, dtype, seed=args.seed)
    build_s = time.perf_counter() - t0
    bw = bandwidths(args)
    pool_gb = banks.pool_bytes / 1e9
    print(
        f"# {shape.name}: {args.layers} of {shape.layers} MoE layers, E={shape.experts}, top-{shape.top_k}, "
        f"expert {banks.expert_bytes / 1e6:.2f} MB, pool {pool_gb:.1f} GB (built in {build_s:.1f} s); "
        f"{dev} {str(dtype).removeprefix('torch.')}; batch {args.batch}; cache {args.expert_cache:.0%}; "
        f"routing {args.routing_trace or 'from the model'}; bandwidths from {bw.source}"
    )
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    threads_list = [int(t) for t in str(args.cpu_threads).split(",")] if args.cpu_threads else [None]
    if "fused" in policies and dev.type == "cuda" and choose_backend(banks, dev, load_profile=False)[0] != "fused":
        print(f"# fused skipped: the {pool_gb:.1f} GB pool does not fit the VRAM budget")
        policies.remove("fused")
    all_results: list[PolicyResult] = []
    for threads in threads_list:
        args.threads = threads
        if args.measure_bw:
            bw = measured_bandwidths(threads, banks, dev)
        runs: dict[str, list[PolicyResult]] = {p: [] for p in policies}
        for rep in range(args.repeats):
            for policy in policies:
                r = run_policy(policy, banks, shape, args, dev, dtype)
                runs[policy].append(r)
                print(f"#   threads {threads} rep {rep}: {policy} {r.tok_s:.1f} tok/s", file=sys.stderr)
        results = [median_result(rs) for rs in runs.values()]
        fused = next((r for r in results if r.backend == "fused"), None)
        t_gpu_layer = fused.step_ms / 1e3 / args.layers if fused else 0.0
        for r in results:
            lb = layer_bound_s(r, banks.expert_bytes, bw, t_gpu_layer)
            if lb:
                r.bound_tok_s = args.batch / (lb * args.layers)
                r.of_bound = r.tok_s / r.bound_tok_s
        print(f"## CPU threads {threads or 'default'}; medians of {args.repeats}; bandwidths (GB/s) {asdict(bw)}")
        print_table(results, fused is not None)
        print_acceptance(results)
        all_results += results
    results = all_results
    if args.json:
        meta = {
            "preset": asdict(shape), "layers": args.layers, "batch": args.batch, "steps": args.steps,
            "expert_cache": args.expert_cache, "device": str(dev), "dtype": str(dtype),
            "routing": args.routing_trace or "model", "bandwidths": asdict(bw), "commit": _commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": [asdict(r) for r in results]}, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="ft bench decode", description=__doc__.split("\n")[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
