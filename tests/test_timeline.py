"""``bench/gpu/timeline.py --layers``: a profiler trace cut into MoE layer steps at each plan kernel, with each
step's fill, GEMM, other kernels and idle time (here on a synthetic Chrome trace)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu import timeline


def _trace(path: Path, fills: list[float], wait: float) -> None:
    evs, t = [], 0.0
    for fill in fills:  # per layer: plan, stage, fill, GEMM, then a wait for the CPU branch, then the add
        steps = (("_plan_kernel", 10, 0), ("_stage_kernel", 2, 1), ("_gather_rows_kernel", fill, 1),
                 ("_gate_up_kernel", 15, 1), ("_down_kernel", 11, 0), ("add_kernel", 3, wait))  # fmt: skip
        for name, dur, gap in steps:
            t += gap
            evs.append({"cat": "kernel", "name": name, "ts": t, "dur": dur})
            t += dur
    evs.append({"cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 5})  # host events are ignored
    path.write_text(json.dumps({"traceEvents": evs}))


def test_layer_breakdown(tmp_path: Path, capsys) -> None:
    tl = timeline
    f = tmp_path / "t.json"
    _trace(f, [400, 200, 300, 500], wait=40)
    cols = tl.layer_breakdown(tl.gpu_events(f))
    assert len(cols["span"]) == 3  # plan to plan: the last layer has no end
    assert cols["fill"] == [400, 200, 300] and cols["gemm"] == [26, 26, 26]
    assert cols["plan"] == [10, 10, 10] and cols["stage"] == [2, 2, 2] and cols["other"] == [3, 3, 3]
    assert cols["idle"] == [43, 43, 43]  # 3 gaps of 1 + the 40 µs wait
    assert cols["maxgap"] == [40, 40, 40]
    assert [s - i for s, i in zip(cols["span"], cols["idle"])] == [441, 241, 341]  # busy = the kernels
    assert tl.main([str(f), "--layers"]) == 0
    out = capsys.readouterr().out
    assert "3 layer steps" in out and "fill" in out
