"""bench/cpu_kernel.py end to end on tiny shapes: every variant (pages x call/queued) measures and reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from freetoken.experts.cpu.kernel import load_library
from subproc import child_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(load_library() is None, reason="needs the native CPU kernel (queued batches)")
def test_kernel_bench_reports_every_variant() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "cpu_kernel.py"), "--threads", "1", "--read-gib", "0.03125",
           "--hidden", "256", "--inter", "128", "--pool-gib", "0.01", "--iters", "2", "--seq", "3",
           "--huge-pages", "off,on", "--queued", "--rows", "1"]  # fmt: skip
    env = child_env()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=True).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 1 |")]
    # threads, isa, rows, pages, calls, batch, kernel GB/s, torch GB/s, ...
    seen = {(r[3].strip(), r[4].strip(), r[5].strip()) for r in rows}
    assert seen == {(p, m, b) for p in ("4K", "2M") for m in ("call", "queue") for b in ("1", "4")}
    for r in rows:
        assert float(r[6]) > 0 and float(r[7]) > 0
