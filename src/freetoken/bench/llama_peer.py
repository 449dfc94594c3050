"""``ft bench e2e --peer-llama-cpp BIN GGUF``: llama.cpp's ``llama-bench`` on a GGUF of the same shape, run
alternately with our rows (ours, peer, ours, peer, … one round per repeat) so that both see the same machine state.

The peer's placement follows each row's expert share: ``--n-cpu-moe N`` keeps the experts of ``N`` layers on the CPU,
so a row whose cache holds a share ``f`` of the pool gets ``N = layers - round(f·layers)`` (fused: 0, ``cpu``: every
layer); ``-t`` is the row's CPU threads, ``-n`` its timed tokens, ``-p 0`` (decode only), ``-ngl 99``, ``-r 1``
(the rounds repeat it). llama-bench generates one sequence, so only batch-1 rows get a peer. Output: ``-o json``
(``../shared/baselines/`` and ``bench/gpu/lib.sh`` read its csv; the json carries the same fields by name).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freetoken.bench.e2e_row import Row


@dataclass(frozen=True)
class PeerResult:
    """One llama-bench test: tokens generated per second (mean over its repetitions and each one)."""

    model: str
    threads: int
    n_gen: int
    n_cpu_moe: int | None
    avg_ts: float
    stddev_ts: float
    samples_ts: tuple[float, ...]


def parse_llama_bench_json(text: str) -> list[PeerResult]:
    """The decode tests (``n_prompt`` 0, ``n_gen`` > 0) of llama-bench's ``-o json`` output (a JSON array of one
    object per test); a clear error on anything else."""
    start = text.find("[")
    try:
        tests = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError as e:
        raise ValueError(f"llama-bench output is not JSON: {e}") from None
    if not isinstance(tests, list):
        raise ValueError("llama-bench output has no JSON array of tests (was it run with -o json?)")
    out = []
    for t in tests:
        if not isinstance(t, dict) or int(t.get("n_gen", 0)) <= 0 or int(t.get("n_prompt", 0)) != 0:
            continue
        ncm = t.get("n_cpu_moe")
        out.append(PeerResult(
            model=str(t.get("model_filename", "")), threads=int(t["n_threads"]), n_gen=int(t["n_gen"]),
            n_cpu_moe=None if ncm is None else int(ncm), avg_ts=float(t["avg_ts"]),
            stddev_ts=float(t.get("stddev_ts", 0.0)),
            samples_ts=tuple(float(x) for x in t.get("samples_ts", [t["avg_ts"]])),
        ))  # fmt: skip
    return out


def n_cpu_moe_for(gpu_share: float, layers: int) -> int:
    """Layers whose experts llama.cpp keeps on the CPU for a row whose GPU holds ``gpu_share`` of the experts."""
    return layers - round(max(0.0, min(1.0, gpu_share)) * layers)


def gpu_share(stats: dict[str, object], backend: str, layers: int, experts: int) -> float:
    """The share of the expert pool a row keeps on the GPU (its slots), 1 for fused and 0 for ``cpu``."""
    if backend == "fused":
        return 1.0
    slots = stats.get("expert_slots", 0)
    return float(slots) / (layers * experts) if isinstance(slots, (int, float)) and layers * experts else 0.0


def command(binary: str, gguf: str, n_cpu_moe: int, threads: int | None, tokens: int) -> list[str]:
    cmd = [binary, "-m", gguf, "-ngl", "99", "--n-cpu-moe", str(n_cpu_moe), "-p", "0", "-n", str(tokens), "-r", "1"]
    return cmd + (["-t", str(threads)] if threads else []) + ["-o", "json"]


def run_peer(binary: str, gguf: str, n_cpu_moe: int, threads: int | None, tokens: int, timeout: float = 300) -> float:
    """One llama-bench decode run; its tok/s."""
    cmd = command(binary, gguf, n_cpu_moe, threads, tokens)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-300:]}")
    tests = parse_llama_bench_json(p.stdout)
    if not tests:
        raise RuntimeError(f"{' '.join(cmd)}: no decode test in its output")
    return tests[0].avg_ts


def try_peer(binary: str, gguf: str, n_cpu_moe: int, threads: int | None, tokens: int) -> float | None:
    """``run_peer``, or None with the reason printed (a failed peer run never costs our rows)."""
    try:
        return run_peer(binary, gguf, n_cpu_moe, threads, tokens)
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        print(f"# llama-bench failed: {e}", file=sys.stderr, flush=True)
        return None


def print_table(rows: list[Row]) -> None:
    """Medians of ours and the peer's alternating runs, and ours / peer, per row that had a peer."""
    had = [r for r in rows if r.peer_runs]
    if not had:
        return
    print("| threads | policy | batch | --n-cpu-moe | ours tok/s (runs) | llama.cpp tok/s (runs) | ours / llama.cpp |")
    print("|---|---|---|---|---|---|---|")
    for r in had:
        ours, peer = statistics.median(r.runs), statistics.median(r.peer_runs)
        o, q = ", ".join(f"{x:.1f}" for x in r.runs), ", ".join(f"{x:.1f}" for x in r.peer_runs)
        print(f"| {r.threads or 'default'} | {r.policy} | {r.batch} | {r.peer_n_cpu_moe} | {ours:.1f} ({o}) "
              f"| {peer:.1f} ({q}) | {ours / peer:.2f} |")  # fmt: skip
