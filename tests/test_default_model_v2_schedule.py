"""The default model v2's training spread over runs (training/default_model_v2/train.py): the learning-rate schedule
across runs (a resumed run warms up again to where the schedule stands), and two real toy runs on the CPU where the
second continues the first's weights at its schedule position, on other samples, and the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.default_model_v2 import train

TOY = ["--toy", "--steps", "3", "--workers", "1", "--short", "60", "--medium", "4", "--device", "cpu"]


def _cosine(progress: float, peak: float) -> float:
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def test_a_resumed_run_warms_up_to_the_schedule_s_rate() -> None:
    peak = 3e-3
    assert train.lr_at(0.0, 0, peak, 100) == pytest.approx(peak / 100)  # the first run: up to the peak
    assert train.lr_at(0.0, 100, peak, 100) == pytest.approx(peak)
    assert train.lr_at(0.6, 4, peak, 20) == pytest.approx(_cosine(0.6, peak) * 5 / 20)  # a resumed run: up to 60%'s
    assert train.lr_at(0.6, 20, peak, 20) == pytest.approx(_cosine(0.6, peak))
    assert train.lr_at(1.5, 50, peak, 20) == pytest.approx(0.1 * peak)  # past the end: the floor
    s = train.Schedule(total_s=400.0, done_s=100.0)
    assert s.progress(100.0) == pytest.approx(0.5)


def _weights(d: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_two_runs_share_one_schedule(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    train.train(train.parse_args([*TOY, "--out", str(one), "--time-budget", "60", "--schedule-seconds", "500"]))
    s1 = json.loads((one / train.SCHEDULE).read_text())
    assert s1["runs"] == 1 and s1["steps"] == 3 and s1["total_s"] == 500.0 and 0 < s1["done_s"] < 60
    assert [h["seed"] for h in s1["history"]] == [0]
    train.train(train.parse_args([*TOY, "--out", str(two), "--time-budget", "60", "--resume", str(one)]))
    s2 = json.loads((two / train.SCHEDULE).read_text())
    assert s2["runs"] == 2 and s2["steps"] == 6 and s2["tokens"] > s1["tokens"] and s2["total_s"] == 500.0
    assert s2["done_s"] == pytest.approx(s1["done_s"] + s2["history"][1]["seconds"], abs=0.2)
    assert [h["seed"] for h in s2["history"]] == [0, 1]  # the second run on the next seed's samples
    w1, w2 = _weights(one), _weights(two)
    assert w1.keys() == w2.keys()
    # continued, not restarted: 3 more small steps move the weights a little from run one's, far less than a fresh
    # initialisation lies from them
    moved = sum(float((w2[k].float() - w1[k].float()).norm()) for k in w1)
    scale = sum(float(w1[k].float().norm()) for k in w1)
    assert 0 < moved < 0.2 * scale


def test_refusals(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):  # --resume and --init together
        train.parse_args([*TOY, "--out", "x", "--time-budget", "60", "--resume", "a", "--init", "b"])
    with pytest.raises(SystemExit):  # a schedule across runs without a clock
        train.parse_args([*TOY, "--out", "x", "--schedule-seconds", "500"])
    with pytest.raises(SystemExit, match="no schedule.json"):
        train.train(train.parse_args([*TOY, "--out", str(tmp_path / "o"), "--time-budget", "60",
                                      "--resume", str(tmp_path)]))  # fmt: skip
    train.Schedule(total_s=10.0, done_s=10.0, runs=3).save(tmp_path)
    with pytest.raises(SystemExit, match="complete"):
        train.train(train.parse_args([*TOY, "--out", str(tmp_path / "o"), "--time-budget", "60",
                                      "--resume", str(tmp_path)]))  # fmt: skip
