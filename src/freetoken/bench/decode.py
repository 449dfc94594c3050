"""Decode tok/s of each MoE expert policy on a synthetic model of exact per-layer shape, vs its bound.

``ft bench decode`` (``python -m freetoken.bench.decode``).

Per policy: tokens/s, distinct-expert miss rate, mean q, bytes per token over PCIe and through the CPU
kernel, and the bandwidth-model bound of BENCH.md:
``T_layer >= max(T_gpu, m * S / B)`` with ``B = B_P'`` (offload), ``B_H`` (cpu, static-*),
``B_P' + B_H'`` (hybrid), ``T_gpu`` from the fused run (every expert resident) when it ran.
All policies run in one process on identical inputs (same seeds; ``--routing-trace`` for identical
routing). Only the routed-expert path is modelled: no attention, embeddings or sampling.

    python -m freetoken.bench.decode --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 \
        --routing-trace /work/shared/traces/locality-48x128x8.npy
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from freetoken.bench.presets import PRESETS, MoEShape, get_preset
from freetoken.bench.synthetic import SyntheticRouter, TraceRouter, random_banks, rms_norm
from freetoken.config import EngineConfig
from freetoken.experts.auto import choose_backend
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.registry import create_backend
from freetoken.experts.split import load_machine_profile, profile_bandwidth

DEFAULT_POLICIES = "fused,offload,hybrid,cpu,static-layers,static-freq"
# Policy variants, side by side: "<backend>+<option>+...", e.g. "hybrid+share", "hybrid+share+zc".
POLICY_OPTIONS = {"share": "EngineConfig.hybrid_share_expert", "zc": "EngineConfig.cpu_branch_zero_copy"}


class Router(Protocol):
    def route(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class PolicyResult:
    policy: str
    backend: str  # what actually ran (a pageable pool falls back to cpu)
    steps: int
    tok_s: float
    step_ms: float
    miss_rate: float  # distinct (layer, expert) misses / (hits + misses)
    mean_q: float
    pcie_mb_per_token: float
    cpu_mb_per_token: float
    misses_per_layer_step: float
    cpu_runs_per_layer_step: float
    fills_per_layer_step: float
    bound_tok_s: float | None = None
    of_bound: float | None = None
    runahead: float | None = None  # share of steps where the host queued the last layer before the GPU ended the first
    host_ms: float | None = None  # host time per step (queuing the work; ≈ ms/step when the host sets the pace)
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class Bandwidths:
    """GB/s; ``copy``/``cpu`` solo, ``copy_c``/``cpu_c`` measured while both run (B_P', B_H')."""

    copy: float | None
    cpu: float | None
    copy_c: float | None
    cpu_c: float | None
    source: str


def bandwidths(args: argparse.Namespace) -> Bandwidths:
    prof = load_machine_profile() or {}
    copy_c = args.bw_copy or profile_bandwidth(prof, "copy")
    cpu_c = args.bw_cpu or profile_bandwidth(prof, "cpu")
    copy = args.bw_copy or _num(prof.get("fill")) or copy_c
    cpu = args.bw_cpu or _num(prof.get("cpu_kernel")) or cpu_c
    src = "arguments" if args.bw_copy or args.bw_cpu else ("machine profile" if prof else "none")
    return Bandwidths(copy, cpu, copy_c, cpu_c, src)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def layer_bound_s(r: PolicyResult, expert_bytes: int, bw: Bandwidths, t_gpu_layer: float) -> float | None:
    """The BENCH.md floor for one layer of one step under this policy's measured miss counts."""
    gb = expert_bytes / 1e9
    if r.backend == "fused":
        return t_gpu_layer if t_gpu_layer > 0 else None
    if r.backend == "offload":
        if bw.copy is None:
            return None
        miss_s = r.misses_per_layer_step * gb / bw.copy
    elif r.backend == "hybrid":
        if bw.copy_c is None or bw.cpu_c is None:
            return None
        miss_s = r.misses_per_layer_step * gb / (bw.copy_c + bw.cpu_c)
    else:  # cpu, static-layers, static-freq: the misses run on the CPU only
        if bw.cpu is None:
            return None
        miss_s = r.cpu_runs_per_layer_step * gb / bw.cpu
    return max(t_gpu_layer, miss_s)


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
    unknown = [o for o in opts if o not in POLICY_OPTIONS]
    if unknown:
        raise SystemExit(f"unknown policy option(s) {unknown} in {policy!r}; known: {sorted(POLICY_OPTIONS)}")
    return EngineConfig(
        moe_backend=base, expert_cache=args.expert_cache, fill_fraction=args.fill_fraction,
        cpu_threads=_threads(args), moe_cuda_graphs=args.cuda_graphs,
        hybrid_share_expert="share" in opts or args.share_expert, cpu_branch_zero_copy="zc" in opts or args.zero_copy,
    )  # fmt: skip


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def run_policy(
    policy: str, banks: ExpertBanks, shape: MoEShape, args: argparse.Namespace, dev: torch.device, dtype: torch.dtype
) -> PolicyResult:
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
        s0 = backend.stats()
        t0, host = time.perf_counter(), 0.0
        for _ in range(args.steps):
            x = inputs()
            th = time.perf_counter()
            decode_step(backend, router, L, x)
            host += time.perf_counter() - th  # the host's own time: nothing waits for the device here
        sync()
        elapsed = time.perf_counter() - t0
        s1 = backend.stats()
        ahead = None
        if dev.type == "cuda" and args.runahead:
            from freetoken.bench.runahead import profile_steps, runahead_share

            def step(x: torch.Tensor, after: Callable[[int], None] | None) -> None:
                decode_step(backend, router, L, x, after)

            ahead = runahead_share(step, inputs)
            if args.profile_dir and policy == "hybrid":
                profile_steps(step, inputs, Path(args.profile_dir) / f"{policy}-threads{_threads(args)}.json")
    finally:
        close: Callable[[], None] | None = getattr(backend, "close", None)
        if close is not None:
            close()
    r = summarize(policy, backend.name, s0, s1, elapsed, args.steps, B, banks.expert_bytes)
    r.runahead = ahead
    r.host_ms = host / args.steps * 1e3
    return r


def summarize(
    policy: str, name: str, s0: dict, s1: dict, elapsed: float, steps: int, batch: int, expert_bytes: int
) -> PolicyResult:
    d = {k: s1.get(k, 0) - s0.get(k, 0) for k in s1 if isinstance(s1.get(k), (int, float))}
    tokens = steps * batch
    hits, misses = d.get("expert_hits", 0), d.get("expert_misses", 0)
    layer_steps = max(d.get("layer_steps", 0), 1)
    fills, cpu_runs = d.get("expert_fills", 0), d.get("expert_cpu_runs", 0)
    return PolicyResult(
        policy=policy,
        backend=name,
        steps=steps,
        tok_s=tokens / elapsed,
        step_ms=elapsed / steps * 1e3,
        miss_rate=misses / (hits + misses) if hits + misses else 0.0,
        mean_q=s1.get("q_mean", 0.0),
        pcie_mb_per_token=fills * expert_bytes / tokens / 1e6,
        cpu_mb_per_token=cpu_runs * expert_bytes / tokens / 1e6,
        misses_per_layer_step=misses / layer_steps,
        cpu_runs_per_layer_step=cpu_runs / layer_steps,
        fills_per_layer_step=fills / layer_steps,
        stats=s1,
    )


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS), help="per-layer model shape")
    p.add_argument("--layers", type=int, default=12, help="MoE layers to build (the preset's shape per layer)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help="comma-separated MoE backends to compare")
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
        "--share-expert",
        action="store_true",
        help="hybrid: share one miss per layer between both branches (EngineConfig.hybrid_share_expert); "
        "the policy 'hybrid+share' runs that beside plain hybrid",
    )
    p.add_argument(
        "--zero-copy",
        action="store_true",
        help="CPU branch hand-off through mapped host memory (EngineConfig.cpu_branch_zero_copy; policy option '+zc')",
    )
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
    p.add_argument("--profile-dir", default=None, help="with --runahead: write a profiler trace of hybrid here")
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


def measured_bandwidths(threads: int | None, banks: ExpertBanks, dev: torch.device) -> Bandwidths:
    """B_P, B_H alone and concurrently, measured in this process on this model's expert shape."""
    from freetoken.hardware.bandwidth import BandwidthConfig, measure

    cfg = BandwidthConfig(
        threads=threads, read_bytes=2**30, hidden=banks.hidden_size, inter=banks.intermediate_size,
        layer_experts=banks.num_experts, seconds=1.0, device=str(dev) if dev.type == "cuda" else "none",
    )  # fmt: skip
    r = measure(cfg)
    return Bandwidths(r.fill, r.cpu_kernel, r.fill_concurrent, r.cpu_kernel_concurrent, "measured in this run")


def median_result(rs: list[PolicyResult]) -> PolicyResult:
    """The repeat with the median tok/s, annotated with the spread."""
    ordered = sorted(rs, key=lambda r: r.tok_s)
    mid = ordered[len(ordered) // 2]
    mid.stats = {**mid.stats, "tok_s_runs": [round(r.tok_s, 2) for r in rs]}
    return mid


def _ratios(name: str, h: PolicyResult, by: dict[str, PolicyResult]) -> list[str]:
    others = ("static-layers", "static-freq", "offload", "cpu")
    parts = [f"{name}/{o} {h.tok_s / by[o].tok_s:.2f}x" for o in others if o in by]
    best = max((by[p].tok_s for p in ("offload", "cpu") if p in by), default=None)
    if best:
        parts.append(f"{name}/max(offload,cpu) {h.tok_s / best:.2f}x")
    if h.of_bound:
        parts.append(f"{name} of bound {h.of_bound:.0%}")
    return parts


def print_acceptance(results: list[PolicyResult]) -> None:
    by = {r.policy: r for r in results}
    names = [n for n in by if n.split("+")[0] == "hybrid"]
    if not names:
        return
    runs = ", ".join(f"{r.policy} {r.stats.get('tok_s_runs')}" for r in results)
    print("# acceptance: " + "; ".join(p for n in names for p in _ratios(n, by[n], by)))
    print("# runs (tok/s): " + runs)
    for n in names:
        st = by[n].stats
        if "share" in st:
            print(
                f"# {n} online: share {st['share']:.2f}, B_P' {st.get('b_copy_online', 0):.1f} GB/s, "
                f"B_H' {st.get('b_cpu_online', 0):.1f} GB/s (smoothed branch measurements)"
            )


def print_table(results: list[PolicyResult], have_fused: bool) -> None:
    head = f"{'policy':<14}{'ran':<14}{'tok/s':>9}{'ms/step':>9}{'miss%':>7}{'mean q':>8}"
    head += f"{'PCIe MB/tok':>12}{'CPU MB/tok':>11}{'bound tok/s':>12}{'of bound':>9}{'ahead':>7}{'host ms':>8}"
    print(head)
    for r in results:
        bound = f"{r.bound_tok_s:12.1f}{r.of_bound:9.0%}" if r.bound_tok_s and r.of_bound else f"{'n/a':>12}{'':>9}"
        print(
            f"{r.policy:<14}{r.backend:<14}{r.tok_s:9.1f}{r.step_ms:9.2f}{r.miss_rate * 100:7.1f}{r.mean_q:8.2f}"
            f"{r.pcie_mb_per_token:12.1f}{r.cpu_mb_per_token:11.1f}{bound}"
            + (f"{r.runahead:7.0%}" if r.runahead is not None else f"{'–':>7}")
            + (f"{r.host_ms:8.2f}" if r.host_ms is not None else f"{'–':>8}")
        )
    if not have_fused:
        print("# bound without T_gpu (no fused run): bandwidth term only")


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="ft bench decode", description=__doc__.split("\n")[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
