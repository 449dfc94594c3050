"""``ft bench decode``'s results: one policy's figures, the bandwidths and BENCH.md bound they are held to,
medians over repeats, and the printed table and acceptance ratios (``decode.py`` runs the policies)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import torch

from freetoken.experts.backends.split_policy import load_machine_profile, profile_bandwidth
from freetoken.experts.base import ExpertBanks


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
    # per MoE layer (the backend's ``layer_counts()``; None where it counts none): the bound sums each layer's own
    misses_per_layer: list[float] | None = None
    cpu_runs_per_layer: list[float] | None = None
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
    """The BENCH.md floor for one layer of one step under this policy's measured miss counts: the mean over MoE
    layers of each layer's own max(T_gpu, miss time) where the backend counted per layer (the mean's max is lower
    when misses differ between layers), else of the mean counts."""
    gb = expert_bytes / 1e9
    if r.backend == "fused":
        return t_gpu_layer if t_gpu_layer > 0 else None
    if r.backend == "offload":
        gbps, counts, mean = bw.copy, r.misses_per_layer, r.misses_per_layer_step
    elif r.backend == "hybrid":
        both = None if bw.copy_c is None or bw.cpu_c is None else bw.copy_c + bw.cpu_c
        gbps, counts, mean = both, r.misses_per_layer, r.misses_per_layer_step
    else:  # cpu, static-layers, static-freq: the misses run on the CPU only
        gbps, counts, mean = bw.cpu, r.cpu_runs_per_layer, r.cpu_runs_per_layer_step
    if gbps is None:
        return None
    per_layer = counts or [mean]
    return sum(max(t_gpu_layer, m * gb / gbps) for m in per_layer) / len(per_layer)


def summarize(
    policy: str, name: str, s0: dict, s1: dict, elapsed: float, steps: int, batch: int, expert_bytes: int,
    layers0: dict[str, list[int]] | None = None, layers1: dict[str, list[int]] | None = None,
) -> PolicyResult:  # fmt: skip
    """One policy's figures from the backend's stats (and ``layer_counts()``) before and after ``steps`` steps."""
    d = {k: s1.get(k, 0) - s0.get(k, 0) for k in s1 if isinstance(s1.get(k), (int, float))}

    def per_step(key: str) -> list[float] | None:
        if not layers0 or not layers1:
            return None
        return [(b - a) / steps for a, b in zip(layers0[key], layers1[key])]

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
        misses_per_layer=per_step("misses"),
        cpu_runs_per_layer=per_step("cpu_runs"),
        stats=s1,
    )


def measured_bandwidths(threads: int | None, banks: ExpertBanks, dev: torch.device) -> Bandwidths:
    """B_P, B_H alone and concurrently, measured in this process on this model's expert shape."""
    from freetoken.bench.bw import measure_at
    from freetoken.hardware.bandwidth import BandwidthConfig

    cfg = BandwidthConfig(
        read_bytes=2**30, hidden=banks.hidden_size, inter=banks.intermediate_size,
        layer_experts=banks.num_experts, seconds=1.0, device=str(dev) if dev.type == "cuda" else "meta",
    )  # fmt: skip  (a meta device: no copy figure, as without CUDA)
    r = measure_at(cfg, threads)
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
