"""The 1,000-request soak of `ft serve` (bench/soak.py) as CI runs it: a real server process on the
embedded model with integrity checks every step, good, malformed, mutated and aborted requests on all
three APIs. Asserts the verdict, not the latencies (those are the benchmark's figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_soak_1000_requests(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "bench" / "soak.py"), "--requests", "1000", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    assert report["soak_requests"] == 1000 and report["requests"] >= 1000
    assert all(report["checks"].values()), report["checks"]
    assert not report["five_xx"] and not report["wrong_shape"]
    kinds = report["by_kind"]
    assert min(kinds[k] for k in ("good", "malformed", "mutated", "abort")) >= 50, kinds
    assert report["rss_growth_mb"] <= 50
