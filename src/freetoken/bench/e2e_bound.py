"""``ft bench e2e``'s bound columns: each decode row held to the bandwidth bound of ``bound.py`` (BENCH.md).

What goes in, per row: the misses and CPU runs per MoE layer-step counted by the engine over the row's *timed* tokens
only, per MoE layer where the backend counts them so (``ExpertBackend.layer_counts``), else their mean over layers
(``LLM.stats()``); the expert size ``S`` of the loaded pool (``ExpertBanks.expert_bytes``, packed + scales);
the fused GPU time per layer from the fused row of the same batch in this command, else from a short fused run of
its own (``fused_tok_s``); and ``B_P'``, ``B_H'`` (and the streaming read for ``cpu``) from, in order: the
``--bw-*`` arguments, this machine's saved profile (``ft bench bw``) when it was measured at the row's thread count,
or one measurement per thread count in this process on the model's expert shape and format (``--measure-bw`` forces
it). Without CUDA there is no PCIe figure: rows that need it print n/a.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from freetoken.bench.bound import Bound, PerLayer, policy_bound, t_gpu_layer_s
from freetoken.bench.e2e_row import BoundBandwidths, Row

if TYPE_CHECKING:
    from freetoken.hardware.profile import HardwareProfile


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bound", action=argparse.BooleanOptionalAction, default=True,
                   help="print each decode row's bandwidth bound (BENCH.md) and e2e / bound")  # fmt: skip
    p.add_argument("--bw-copy", type=float, default=None, help="B_P' GB/s for the bound (default: profile/measured)")
    p.add_argument("--bw-cpu", type=float, default=None, help="B_H' GB/s for the bound (default: profile/measured)")
    p.add_argument("--bw-read", type=float, default=None, help="streaming host read GB/s (the cpu policy's bound)")
    p.add_argument("--measure-bw", action="store_true", help="measure the bandwidths even when a profile exists")
    p.add_argument("--bw-seconds", type=float, default=1.0, help="measurement window per bandwidth figure")


def kind_of(backend_name: str) -> str:
    """``bound.policy_bound``'s kind for a backend that ran."""
    return backend_name if backend_name in ("fused", "cpu") else "misses"


def timed_counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Misses and CPU runs per MoE layer-step between two ``LLM.stats()`` (the timed tokens of one run)."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in ("expert_misses", "expert_cpu_runs", "layer_steps")}
    steps = d["layer_steps"]
    return {"layer_steps": steps, "misses": d["expert_misses"], "cpu_runs": d["expert_cpu_runs"]} if steps > 0 else {}


LAYER_COUNTS = "layer_counts"  # the key ``snapshot`` adds to the stats: the backend's per-layer counts


def snapshot(llm: Any) -> dict[str, Any]:
    """``LLM.stats()`` with the backend's per-layer counts under ``LAYER_COUNTS`` (where it counts them)."""
    backend = llm.engine.setup.loaded.backend
    layers = backend.layer_counts() if backend is not None else None
    return {**llm.stats(), **({LAYER_COUNTS: layers} if layers is not None else {})}


def timed_layer_counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[int]]:
    """Misses and CPU runs of each MoE layer between two ``snapshot``s ({} where either lacks them)."""
    b, a = before.get(LAYER_COUNTS), after.get(LAYER_COUNTS)
    if not b or not a:
        return {}
    return {k: [y - x for x, y in zip(b[k], a[k])] for k in ("misses", "cpu_runs")}


def expert_bytes_of(llm: Any) -> int | None:
    pool = getattr(llm.engine.setup.loaded.backend, "pool", None)
    return None if pool is None else int(pool.expert_bytes)


def bandwidths(
    args: argparse.Namespace, llm: Any, threads: int | None, seen: dict[Any, BoundBandwidths]
) -> BoundBandwidths:
    """The figures for rows at ``threads`` (measured at most once per thread count per command)."""
    if args.bw_copy or args.bw_cpu or args.bw_read:
        return BoundBandwidths(args.bw_copy, args.bw_cpu, args.bw_read, args.bw_cpu, "arguments")
    if threads in seen:
        return seen[threads]
    from freetoken.experts.backends.split_policy import saved_profile

    prof = None if args.measure_bw else from_profile(saved_profile(), threads, torch.cuda.is_available())
    seen[threads] = prof or _measure(args, llm, threads)
    return seen[threads]


def from_profile(prof: HardwareProfile | None, threads: int | None, cuda: bool) -> BoundBandwidths | None:
    """A saved profile's figures, unless it was measured at another thread count or without the GPU this run has."""
    if prof is None:
        return None
    b = prof.bandwidth
    if (threads is not None and b.threads != threads) or (b.fill_concurrent is None and cuda):
        return None
    return BoundBandwidths(b.fill_concurrent, b.cpu_kernel_concurrent, b.host_read, b.cpu_kernel,
                           f"saved profile {prof.fingerprint}, {b.threads} threads")  # fmt: skip


def _measure(args: argparse.Namespace, llm: Any, threads: int | None) -> BoundBandwidths:
    from freetoken.bench.bw import measure_at
    from freetoken.hardware.bandwidth import BandwidthConfig

    hf, dev = llm.engine.hf, llm.engine.device
    pool = getattr(llm.engine.setup.loaded.backend, "pool", None)
    fmt = pool.banks.fmt.name if pool is not None else "bf16"
    fmt = fmt if fmt in ("bf16", "fp8_block", "mxfp4", "nvfp4") else "bf16"  # the formats ``measure`` knows
    cfg = BandwidthConfig(
        read_bytes=2**30, hidden=hf.hidden_size, inter=hf.moe_intermediate_size, top_k=max(1, hf.top_k or 1),
        layer_experts=hf.num_experts, seconds=args.bw_seconds, device=str(dev) if dev.type == "cuda" else "meta",
        weights=fmt,
    )  # fmt: skip  (a meta device: no copy figure, as without CUDA)
    r = measure_at(cfg, threads)
    src = f"measured in this command, {r.threads} threads, {fmt} experts"
    return BoundBandwidths(r.fill_concurrent, r.cpu_kernel_concurrent, r.host_read, r.cpu_kernel, src)


def row_bound(row: Row, layers: int, fused_tok_s: float | None) -> Bound | None:
    """``row`` with its counts, ``S`` and bandwidths filled in."""
    c, kind = row.counts, kind_of(row.backend)
    bw = row.bandwidths or BoundBandwidths(None, None, None, None, "none")
    t_gpu = t_gpu_layer_s(fused_tok_s, row.batch, layers)
    if kind == "fused":  # no misses: nothing counted is needed
        return policy_bound(kind, row.batch, layers, t_gpu, 0.0, 0.0, 0, None, None, None)
    if not c or row.expert_bytes is None:
        return None
    per_step = c["layer_steps"]
    misses: PerLayer = c["misses"] / per_step  # the mean over layers, unless counted per layer
    cpu_runs: PerLayer = c["cpu_runs"] / per_step
    if len(row.layer_counts.get("misses", ())) == layers:  # each layer ran layer_steps / layers steps
        misses, cpu_runs = ([v * layers / per_step for v in row.layer_counts[k]] for k in ("misses", "cpu_runs"))
    return policy_bound(
        kind, row.batch, layers, t_gpu, misses, cpu_runs, row.expert_bytes, bw.copy_c, bw.cpu_c, bw.read or bw.cpu,
    )  # fmt: skip


def bound_rows(
    rows: list[Row], args: argparse.Namespace, fused_tok_s: Callable[[list[int]], dict[int, float]]
) -> None:
    """Each row's bound: T_gpu from the fused rows of this command, else from ``fused_tok_s`` (one short fused
    run per batch that lacks a fused row); prints where T_gpu and the bandwidths came from."""
    fused = fused_by_batch(rows)
    need = sorted({r.batch for r in rows if r.backend != "cpu"} - set(fused))
    t_gpu = "the fused rows of this command"
    if need:
        try:
            fused |= fused_tok_s(need)
            shown = ", ".join(f"{fused[b]:.1f}" for b in need)
            t_gpu = f"a fused run of {args.tokens} tokens per batch ({shown} tok/s)"
        except Exception as e:  # e.g. every expert does not fit the GPU: the bandwidth term alone
            why = (str(e).splitlines() or [type(e).__name__])[0]
            t_gpu = f"nowhere (fused did not run: {why}): the miss term alone"
    annotate(rows, fused)
    misses = "per MoE layer" if any(r.layer_counts for r in rows) else "their mean over MoE layers"
    print(f"# bound (BENCH.md, bench/bound.py): {rows[0].moe_layers} MoE layers; T_gpu per layer from {t_gpu}; "
          f"misses {misses}")  # fmt: skip
    figures = {r.bandwidths for r in rows if r.bandwidths is not None}
    for bw in sorted(figures, key=lambda b: b.source):
        print(f"# bound bandwidths: {bw.describe()}")


def annotate(rows: list[Row], fused: dict[int, float]) -> None:
    """Fill ``bound_tok_s`` and ``of_bound`` of every row (``fused``: batch -> fused e2e tok/s)."""
    for r in rows:
        b = row_bound(r, r.moe_layers, fused.get(r.batch))
        r.bound_tok_s, r.of_bound = (None, None) if b is None else (b.tok_s, b.of(r.e2e_tok_s))


def fused_by_batch(rows: list[Row]) -> dict[int, float]:
    """The fused rows' e2e tok/s per batch (the first thread count's: the fused step uses no CPU threads)."""
    out: dict[int, float] = {}
    for r in rows:
        if r.backend == "fused":
            out.setdefault(r.batch, r.e2e_tok_s)
    return out


def cells(r: Row) -> str:
    """The two table cells: bound tok/s and e2e / bound."""
    if r.bound_tok_s is None or r.of_bound is None:
        return "n/a | n/a"
    return f"{r.bound_tok_s:.1f} | {r.of_bound:.2f}"
