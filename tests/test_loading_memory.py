"""Loading reads each tensor once into its final place: peak RSS stays near the weight size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from freetoken.bench.synthetic_checkpoint import write_qwen3_moe
from subproc import child_env

ROOT = Path(__file__).resolve().parent.parent


def test_peak_rss_under_1_3x_weights(tmp_path):
    written = write_qwen3_moe(tmp_path, num_layers=3, hidden=768, num_experts=48, moe_inter=512)
    assert written > 150e6
    env = child_env()
    r = subprocess.run([sys.executable, "-m", "freetoken.bench.load_memory", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert abs(res["weights_bytes"] - written) / written < 0.01  # every byte written was loaded
    assert res["ratio"] <= 1.3, res
