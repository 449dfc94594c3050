"""The soak of `ft serve` (bench/soak.py) as CI runs it: `--requests 1000 --latency-requests 300` for seeds 1, 2
and 3 (one server, one mix per seed, so the three fit CI's time on 2 cores): a real server process on the embedded
model with integrity checks every step, good, malformed, mutated and aborted requests on all three APIs, maximum-size
bodies on chat completions and count_tokens. Asserts the verdict, not the latencies (those are the benchmark's
figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_soak_1000_requests_for_3_seeds(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "bench" / "soak.py"), "--requests", "1000", "--latency-requests", "300"]
    cmd += ["--seeds", "1,2,3", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    assert report["soak_requests_per_seed"] == {"1": 1000, "2": 1000, "3": 1000}
    sent = report["warmup_requests"] + report["latency_requests"] + report["max_size_bodies"] + 3000
    assert report["latency_requests"] == 900 and report["requests"] == sent  # what it printed is what it sent
    assert all(report["checks"].values()), report["checks"]
    assert not report["five_xx"] and not report["wrong_shape"]  # 5xx but the documented 503/529
    kinds = report["by_kind"]
    assert min(kinds[k] for k in ("good", "malformed", "mutated", "abort")) >= 150, kinds
    assert report["rss_growth_mb"] <= 50
