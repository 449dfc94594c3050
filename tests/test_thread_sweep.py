"""``ft bench bw --sweep``: the CPU kernel's thread count chosen by measurement (the fewest threads within 3% of the
best miss bandwidth, B_P' + B_H' where copies ran, else B_H), saved in the machine's profile, and the engine's CPU
kernel taking it when ``--cpu-threads`` is not given."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from freetoken.bench.bw import sweep_counts
from freetoken.cli.main import main as ft_main
from freetoken.hardware.bandwidth import BandwidthResult
from freetoken.hardware.cpus import default_kernel_threads
from freetoken.hardware.probe import probe
from freetoken.hardware.profile import HardwareProfile, load_profile, miss_gbps, pick_threads, save_profile


def _bw(threads: int, cpu: float, fill_c: float | None = None, cpu_c: float | None = None) -> BandwidthResult:
    return BandwidthResult(threads, "avx2", 9_437_184, 100.0, cpu, 40.0, 50.0, fill_c, cpu_c)


def test_pick_threads_takes_the_fewest_within_3_percent_of_the_best() -> None:
    # with copies: B_P' + B_H' decides (16 threads starve the copies: their sum is below 8's)
    swept = {6: _bw(6, 50, 30, 35), 8: _bw(8, 60, 29, 50), 12: _bw(12, 80, 27, 53.5), 16: _bw(16, 100, 15, 60)}
    assert [miss_gbps(b) for b in swept.values()] == [65, 79, 80.5, 75]
    assert pick_threads(swept) == 8  # 79 >= 0.97 * 80.5
    assert pick_threads(swept, tolerance=0.0) == 12
    # no copies measured (no GPU): B_H alone
    cpu_only = {4: _bw(4, 40), 8: _bw(8, 70), 15: _bw(15, 71)}
    assert pick_threads(cpu_only) == 8
    with pytest.raises(ValueError, match="no thread counts"):
        pick_threads({})


def test_sweep_counts() -> None:
    assert sweep_counts("auto", 16) == [2, 4, 6, 8, 12, 15]
    assert sweep_counts("auto", 32) == [2, 4, 6, 8, 12, 16, 20, 24, 28, 31]
    assert sweep_counts("auto", 4) == [2, 3]
    assert sweep_counts("auto", 1) == [1]
    assert sweep_counts("16,6,6", 8) == [6, 16]
    with pytest.raises(ValueError, match="must be >= 1"):
        sweep_counts("0,4", 8)


def test_profile_keeps_the_chosen_count_and_reads_older_profiles(tmp_path: Path) -> None:
    machine = probe(gpus=False)
    prof = HardwareProfile(machine, _bw(6, 50), kernel_threads=6)
    path = save_profile(prof, cache_dir=str(tmp_path))
    assert load_profile(path, machine) == prof
    data = json.loads(path.read_text())
    del data["kernel_threads"]  # a profile saved before sweeps existed
    path.write_text(json.dumps(data))
    assert load_profile(path, machine) == dataclasses.replace(prof, kernel_threads=None)


def test_ft_bench_bw_sweep_saves_the_choice_and_the_kernel_takes_it(
    tmp_path: Path, freetoken_env: Callable[[str, str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    from freetoken.experts.cpu.runner import make_kernel

    freetoken_env("FREETOKEN_CACHE", str(tmp_path))
    default = make_kernel(torch.bfloat16, None)
    assert default is not None and default.num_threads == max(1, default_kernel_threads() - 1)  # no profile yet
    argv = ["bench", "bw", "--read-gib", "0.004", "--pool-gib", "0.004", "--hidden", "64", "--inter", "32",
            "--seconds", "0.05", "--device", "cpu", "--sweep", "1,2"]  # fmt: skip
    assert ft_main(argv) == 0
    out = capsys.readouterr().out
    assert "| threads | B_H |" in out and out.count("(chosen)") == 1
    saved = load_profile(tmp_path / "profiles" / f"{probe().fingerprint()}.json", probe())
    assert saved.kernel_threads in (1, 2) and saved.bandwidth.threads == saved.kernel_threads
    assert f"| {saved.kernel_threads} (chosen) |" in out
    # the engine's kernel: the chosen count in all (workers + the feeder that helps)
    save_profile(dataclasses.replace(saved, kernel_threads=3), cache_dir=str(tmp_path))
    kern = make_kernel(torch.bfloat16, None)
    assert kern is not None and kern.num_threads == 2
    explicit = make_kernel(torch.bfloat16, 5)
    assert explicit is not None and explicit.num_threads == 4  # --cpu-threads wins over the profile
