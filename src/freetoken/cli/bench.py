"""``ft bench <benchmark>``: one module per benchmark under ``freetoken.bench``, imported lazily.

Each benchmark module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

BENCHMARKS: dict[str, str] = {
    "agent-edits": "freetoken.bench.agent_edits",
    "agent-ttft": "freetoken.bench.agent_ttft",
    "bw": "freetoken.bench.bw",
    "decode": "freetoken.bench.decode",
    "e2e": "freetoken.bench.e2e",
    "http": "freetoken.bench.http_ttft",
    "load": "freetoken.bench.ftw_load",
    "predict-routing": "freetoken.bench.predict_routing",
    "prefill": "freetoken.bench.prefill",
    "record-routing": "freetoken.bench.record_routing",
    "structured": "freetoken.bench.structured",
}


def _summary(module: Any) -> str:
    doc = (module.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "bench", help="benchmarks: bandwidth profile, decode, prefill, routing traces"
    )
    bench_sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for name, module_name in BENCHMARKS.items():
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
