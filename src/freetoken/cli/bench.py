"""``ft bench <benchmark>``: one module per benchmark under ``freetoken.bench``, imported lazily.

Each benchmark module exposes ``add_arguments(parser)`` and ``run(args) -> int``; a benchmark whose
module is absent is simply not offered.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from typing import Any

BENCHMARKS: dict[str, str] = {
    "bw": "freetoken.bench.bw",
    "decode": "freetoken.bench.decode",
    "prefill": "freetoken.bench.prefill",
    "agent": "freetoken.bench.agent",
    "record-routing": "freetoken.bench.record_routing",
}


def _summary(module: Any) -> str:
    doc = (module.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "bench", help="benchmarks: bandwidth profile, decode, prefill, agent traces"
    )
    bench_sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for name, module_name in BENCHMARKS.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        summary = _summary(module)
        p = bench_sub.add_parser(name, help=summary, description=summary)
        module.add_arguments(p)
        p.set_defaults(_bench_run=module.run)
    parser.set_defaults(_bench_help=parser.print_help)
    return parser


def run(args: argparse.Namespace) -> int:
    if not hasattr(args, "_bench_run"):
        args._bench_help()
        return 2
    return int(args._bench_run(args) or 0)
