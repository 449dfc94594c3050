"""Hardware probe, bandwidth figures (tiny sizes), profiles per machine, backend advice, `ft bench bw`."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from freetoken.cli.main import main as ft_main
from freetoken.experts.cpu.kernel import CpuExpertKernel
from freetoken.hardware.bandwidth import BandwidthConfig, BandwidthResult, measure
from freetoken.hardware.cpus import default_kernel_threads, physical_core_cpus, worker_cpus
from freetoken.hardware.probe import ISA_FLAGS, GpuInfo, MachineInfo, probe
from freetoken.hardware.profile import (
    HardwareProfile,
    ProfileMismatchError,
    current_profile,
    load_profile,
    recommend,
    save_profile,
)

TINY = BandwidthConfig(read_bytes=1 << 22, pool_bytes=1 << 22, hidden=64, inter=32, top_k=4, seconds=0.05)


def test_probe_reports_this_machine() -> None:
    m = probe()
    assert 1 <= m.physical_cores <= m.logical_cpus == os.cpu_count()
    assert 0 < m.ram_available <= m.ram_total
    assert m.numa_nodes >= 1
    assert set(m.isa_flags) <= set(ISA_FLAGS)
    assert m.cpu_model
    assert len(m.gpus) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    cores = physical_core_cpus()
    assert len(cores) == m.physical_cores and set(cores) <= os.sched_getaffinity(0)
    assert default_kernel_threads() == max(1, m.physical_cores - 1)
    for n in range(1, m.physical_cores + 1):
        pinned = worker_cpus(n)
        assert len(pinned) == n == len(set(pinned)) and set(pinned) <= set(cores)
        assert (cores[0] in pinned) == (n == m.physical_cores)  # core 0 stays free while one is spare


def test_fingerprint_tracks_hardware_not_momentary_state() -> None:
    m = probe(gpus=False)
    assert m.fingerprint() == probe(gpus=False).fingerprint()
    assert dataclasses.replace(m, ram_available=1).fingerprint() == m.fingerprint()
    assert dataclasses.replace(m, cpu_model="Other CPU").fingerprint() != m.fingerprint()
    assert dataclasses.replace(m, ram_total=m.ram_total + 8 * 2**30).fingerprint() != m.fingerprint()
    gpu = GpuInfo(0, "Some GPU", 24 * 2**30)
    with_gpu = dataclasses.replace(m, gpus=(gpu,))
    assert with_gpu.fingerprint() != m.fingerprint()
    bigger = dataclasses.replace(m, gpus=(dataclasses.replace(gpu, vram_total=48 * 2**30),))
    assert bigger.fingerprint() != with_gpu.fingerprint()
    assert MachineInfo.from_dict(with_gpu.to_dict()) == with_gpu
    old = with_gpu.to_dict()  # a profile saved before the free bytes were dropped still reads
    old["gpus"][0]["vram_free"] = 20 * 2**30
    assert MachineInfo.from_dict(old) == with_gpu


def _measure(cfg: BandwidthConfig) -> BandwidthResult:
    kern = CpuExpertKernel(caller_helps=False)
    try:
        return measure(cfg, kern)
    finally:
        kern.close()


def test_bandwidth_tiny_sizes_cpu_figures() -> None:
    bw = _measure(TINY)
    assert bw.host_read > 0 and bw.cpu_kernel > 0
    assert bw.expert_bytes == 3 * 64 * 32 * 2
    assert bw.threads == default_kernel_threads()
    if not torch.cuda.is_available():
        assert bw.fill is None and bw.layer is None and bw.fill_concurrent is None
        assert bw.cpu_kernel_concurrent is None


def test_bandwidth_of_fp8_experts_counts_packed_bytes() -> None:
    """weights="fp8_block": the kernel runs packed experts and B_H counts their bytes (one per weight + scales)."""
    bw = _measure(dataclasses.replace(TINY, hidden=128, inter=128, weights="fp8_block"))
    assert bw.expert_bytes == 3 * 128 * 128 + 3 * 4 and bw.cpu_kernel > 0


@pytest.mark.parametrize("weights, scale_bytes", [("mxfp4", 64 * 2 + 64 * 1), ("nvfp4", 64 * 8 + 64 * 6)])
def test_bandwidth_of_fp4_experts_counts_packed_bytes(weights: str, scale_bytes: int) -> None:
    """FP4 weights: half a byte per weight plus the scale rows (D = 64, I = 32)."""
    bw = _measure(dataclasses.replace(TINY, hidden=64, inter=32, weights=weights))
    assert bw.expert_bytes == 3 * 64 * 32 // 2 + scale_bytes and bw.cpu_kernel > 0


def test_bandwidth_tiny_sizes_cpu_pool_copies() -> None:
    """device="cpu": fills are memcpy into a CPU slot pool; every copy figure is measured."""
    bw = _measure(dataclasses.replace(TINY, device="cpu", layer_experts=16))
    for value in (bw.fill, bw.layer, bw.fill_concurrent, bw.cpu_kernel_concurrent):
        assert value is not None and value > 0


@pytest.mark.gpu
def test_bandwidth_tiny_sizes_gpu_figures() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    bw = _measure(dataclasses.replace(TINY, layer_experts=16))
    for value in (bw.fill, bw.layer, bw.fill_concurrent, bw.cpu_kernel_concurrent):
        assert value is not None and value > 0


def _profile(machine: MachineInfo, **bw: float | None) -> HardwareProfile:
    base = dict(threads=2, isa="avx2", expert_bytes=9_437_184, host_read=20.0, cpu_kernel=15.0)
    return HardwareProfile(machine, BandwidthResult(**{**base, **bw}))  # type: ignore[arg-type]


def test_profile_round_trip_and_current(tmp_path) -> None:
    machine = probe(gpus=False)
    prof = _profile(machine)
    path = save_profile(prof, cache_dir=str(tmp_path))
    assert path == tmp_path / "profiles" / f"{machine.fingerprint()}.json"
    loaded = load_profile(path, machine)
    assert loaded == prof
    assert current_profile(cache_dir=str(tmp_path), machine=machine) == prof
    assert current_profile(cache_dir=str(tmp_path / "empty"), machine=machine) is None


def test_profile_from_another_machine_is_detected(tmp_path) -> None:
    here = probe(gpus=False)
    elsewhere = dataclasses.replace(here, cpu_model="A different CPU", physical_cores=here.physical_cores + 6)
    path = save_profile(_profile(elsewhere), cache_dir=str(tmp_path))
    with pytest.raises(ProfileMismatchError, match="measured on machine"):
        load_profile(path, here)
    assert load_profile(path).is_for(elsewhere) and not load_profile(path).is_for(here)
    # copied into this machine's slot: still refused (the stored fingerprint is checked)
    (tmp_path / "profiles" / f"{here.fingerprint()}.json").write_text(path.read_text())
    with pytest.warns(UserWarning, match="ignoring hardware profile"):
        assert current_profile(cache_dir=str(tmp_path), machine=here) is None


def test_profile_rejects_unknown_version(tmp_path) -> None:
    machine = probe(gpus=False)
    path = save_profile(_profile(machine), cache_dir=str(tmp_path))
    data = json.loads(path.read_text())
    data["version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="version"):
        load_profile(path)


def test_recommend() -> None:
    cpu_only = probe(gpus=False)
    gpu = dataclasses.replace(cpu_only, gpus=(GpuInfo(0, "GPU", 80 * 2**30),))
    S = 9_437_184
    none = recommend(_profile(cpu_only), S)
    assert none.backend == "cpu" and str(none).startswith("cpu: no GPU")
    pcie = dict(fill=42.0, layer=54.0)
    hybrid = _profile(gpu, **pcie, fill_concurrent=40.0, cpu_kernel_concurrent=30.0)
    rec = recommend(hybrid, S)
    assert rec.backend == "hybrid" and f"fill {rec.fill_share:.0%} of misses" in rec.reason
    weak_cpu = _profile(gpu, **pcie, fill_concurrent=42.0, cpu_kernel_concurrent=2.0)
    assert recommend(weak_cpu, S).backend == "offload" and recommend(weak_cpu, S).fill_share == 1.0
    weak_link = _profile(gpu, fill=2.0, layer=3.0, fill_concurrent=2.0, cpu_kernel_concurrent=60.0)
    assert recommend(weak_link, S).backend == "cpu"
    # per-copy overhead (fill < layer) weighs more on small experts: their fill share drops
    assert recommend(hybrid, S // 16).fill_share < rec.fill_share


def test_ft_bench_bw_cli(tmp_path, freetoken_env, capsys: pytest.CaptureFixture[str]) -> None:
    freetoken_env("FREETOKEN_CACHE", str(tmp_path))
    argv = ["bench", "bw", "--read-gib", "0.004", "--pool-gib", "0.004", "--hidden", "64", "--inter", "32"]
    assert ft_main([*argv, "--seconds", "0.05", "--expert-mb", "3"]) == 0
    out = capsys.readouterr().out
    assert "| B_H |" in out and "recommendation per expert size" in out and "3 MB" in out
    saved = tmp_path / "profiles" / f"{probe().fingerprint()}.json"
    assert saved.exists() and load_profile(saved, probe()).bandwidth.cpu_kernel > 0


def test_ft_bench_without_benchmark_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert ft_main(["bench"]) == 2
    assert "bw" in capsys.readouterr().out


def test_auto_follows_the_saved_profiles_recommendation(monkeypatch: pytest.MonkeyPatch) -> None:
    """``moe_backend="auto"`` over a pool larger than VRAM takes the saved profile's typed recommendation:
    hybrid as recommended, and hybrid too where only the CPU pays (one fill per layer keeps the cache warm)."""
    from freetoken.experts.backends import auto
    from freetoken.experts.base import ExpertBanks

    gpu = dataclasses.replace(probe(gpus=False), gpus=(GpuInfo(0, "GPU", 80 * 2**30),))
    banks = ExpertBanks(torch.zeros(4, 2 * 768, 2048, dtype=torch.bfloat16),
                        torch.zeros(4, 2048, 768, dtype=torch.bfloat16), 1, 4)  # fmt: skip
    cuda = torch.device("cuda")
    for bw, want in ((dict(fill=42.0, layer=54.0, fill_concurrent=40.0, cpu_kernel_concurrent=30.0), "hybrid"),
                     (dict(fill=42.0, layer=54.0, fill_concurrent=42.0, cpu_kernel_concurrent=2.0), "offload"),
                     (dict(fill=2.0, layer=3.0, fill_concurrent=2.0, cpu_kernel_concurrent=60.0), "hybrid")):
        prof = _profile(gpu, **bw)
        name, why = auto.choose_backend(banks, cuda, pool_fits=False, profile=prof)
        assert name == want and why == f"machine profile: {recommend(prof, banks.expert_bytes)}"
        monkeypatch.setattr(auto, "saved_profile", lambda prof=prof: prof)  # the same, read from this machine
        assert auto.choose_backend(banks, cuda, pool_fits=False) == (name, why)
