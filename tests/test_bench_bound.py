"""The decode bandwidth bound of BENCH.md (bench/bound.py) on fixed numbers: the max per layer, the sum over
layers, packed expert bytes, the batch, and the fused and cpu cases."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from freetoken.bench.bound import (
    cpu_step_bound_s,
    layer_bound_s,
    miss_time_s,
    policy_bound,
    step_bound_s,
    t_gpu_layer_s,
)
from freetoken.experts.base import ExpertBanks
from freetoken.quant.registry import format_by_name

MB = 1_000_000


def test_miss_term_is_bytes_over_both_bandwidths() -> None:
    # 10 misses of 10 MB over 60 + 40 GB/s: 100 MB / 100 GB/s = 1 ms
    assert layer_bound_s(0.0, 10, 10 * MB, 60.0, 40.0) == pytest.approx(1e-3)
    assert miss_time_s(0, 10 * MB, None) == 0.0  # no misses need no bandwidth
    assert miss_time_s(3, 10 * MB, None) is None  # misses without a bandwidth: unknown, not zero


def test_layer_takes_the_larger_of_gpu_and_misses() -> None:
    assert layer_bound_s(2e-3, 10, 10 * MB, 60.0, 40.0) == pytest.approx(2e-3)  # GPU-bound layer
    assert layer_bound_s(0.5e-3, 10, 10 * MB, 60.0, 40.0) == pytest.approx(1e-3)  # miss-bound layer
    assert layer_bound_s(0.5e-3, 0, 10 * MB, None, None) == pytest.approx(0.5e-3)  # no misses: GPU alone
    assert layer_bound_s(0.5e-3, 10, 10 * MB, None, 40.0) is None  # no PCIe figure (a CPU run): n/a


def test_step_sums_the_max_of_each_layer() -> None:
    # T_gpu 1 ms per layer; misses 0, 10, 30 of 10 MB at 100 GB/s: layers take 1, 1, 3 ms -> 5 ms (not 3 * max(1, 4/3))
    step = step_bound_s(1e-3, [0, 10, 30], 10 * MB, 60.0, 40.0)
    assert step == pytest.approx(5e-3)
    assert step_bound_s(1e-3, [10, 10], 10 * MB, None, None) is None


def test_packed_expert_bytes_set_the_miss_term() -> None:
    """S is the expert as the pool holds it: fp8 block weights are one byte each plus their fp32 block scales."""
    bf16 = ExpertBanks.empty(1, 2, 2048, 768, dtype=torch.bfloat16)
    fp8 = ExpertBanks.empty(1, 2, 2048, 768, dtype=torch.bfloat16, fmt=format_by_name("fp8_block"))
    assert bf16.expert_bytes == 3 * 2048 * 768 * 2
    assert fp8.expert_bytes == 3 * 2048 * 768 + (12 * 16 + 16 * 6) * 4  # gate_up 12x16 blocks, down 16x6
    t16 = layer_bound_s(0.0, 8, bf16.expert_bytes, 50.0, 50.0)
    t8 = layer_bound_s(0.0, 8, fp8.expert_bytes, 50.0, 50.0)
    assert t16 == pytest.approx(8 * 9_437_184 / 100e9)
    assert t8 == pytest.approx(8 * fp8.expert_bytes / 100e9) and t8 is not None and t16 is not None and t8 < t16


def test_batch_divides_the_step_into_tokens() -> None:
    """A step of batch b serves b tokens: the same step time is b times the tok/s."""
    one = policy_bound("misses", 1, 12, 0.1e-3, 20.0, 0.0, 10 * MB, 60.0, 40.0)
    four = policy_bound("misses", 4, 12, 0.1e-3, 20.0, 0.0, 10 * MB, 60.0, 40.0)
    assert one is not None and four is not None
    assert one.step_s == pytest.approx(12 * 2e-3) and four.step_s == pytest.approx(one.step_s)
    assert one.tok_s == pytest.approx(1 / 24e-3) and four.tok_s == pytest.approx(4 * one.tok_s)
    assert one.of(20.0) == pytest.approx(20.0 / one.tok_s)


def test_fused_is_its_gpu_time() -> None:
    t = t_gpu_layer_s(fused_tok_s=800.0, batch=4, layers=10)  # a step of 4 tokens at 800 tok/s: 5 ms, 0.5 ms/layer
    assert t == pytest.approx(0.5e-3)
    b = policy_bound("fused", 4, 10, t, 0.0, 0.0, 0, None, None, None)
    assert b is not None and b.tok_s == pytest.approx(800.0) and b.of(400.0) == pytest.approx(0.5)
    assert policy_bound("fused", 1, 10, None, 0.0, 0.0, 0, None, None, None) is None  # no fused timing: n/a
    assert t_gpu_layer_s(None, 1, 10) is None


def test_cpu_reads_every_routed_expert_from_host_memory() -> None:
    # 8 distinct experts per layer-step of 9.4 MB, 48 layers, over a 40 GB/s streaming read; the GPU time plays no part
    s = 3 * 2048 * 768 * 2
    assert cpu_step_bound_s([8.0] * 48, s, 40.0) == pytest.approx(48 * 8 * s / 40e9)
    b = policy_bound("cpu", 1, 48, 1.0, 8.0, 8.0, s, None, None, 40.0)
    assert b is not None and b.step_s == pytest.approx(48 * 8 * s / 40e9)
    assert policy_bound("cpu", 1, 48, None, 8.0, 8.0, s, 60.0, 40.0, None) is None  # no read figure: n/a


def test_misses_without_a_fused_timing_give_the_bandwidth_term() -> None:
    b = policy_bound("misses", 1, 2, None, 10.0, 0.0, 10 * MB, 60.0, 40.0)
    assert b is not None and b.step_s == pytest.approx(2e-3)


def test_a_saved_profile_is_used_at_its_own_thread_count() -> None:
    from freetoken.bench.e2e_bound import from_profile
    from freetoken.hardware.bandwidth import BandwidthResult
    from freetoken.hardware.probe import probe
    from freetoken.hardware.profile import HardwareProfile

    base = BandwidthResult(threads=6, isa="avx512", expert_bytes=9_437_184, host_read=39.0, cpu_kernel=37.0)
    gpu = HardwareProfile(probe(gpus=False), replace(base, fill_concurrent=55.1, cpu_kernel_concurrent=24.0))
    bw = from_profile(gpu, 6, cuda=True)
    assert bw is not None and (bw.copy_c, bw.cpu_c, bw.read, bw.cpu) == (55.1, 24.0, 39.0, 37.0)
    assert "saved profile" in bw.source and from_profile(gpu, None, cuda=True) == bw  # default threads: the profile's
    assert from_profile(gpu, 16, cuda=True) is None  # another thread count: measured instead
    no_gpu = HardwareProfile(probe(gpus=False), base)
    assert from_profile(no_gpu, 6, cuda=True) is None  # measured without the GPU this run has
    assert from_profile(no_gpu, 6, cuda=False) is not None and from_profile(None, 6, cuda=False) is None


def test_per_layer_misses_bound_at_least_the_mean_and_equal_when_uniform() -> None:
    """max is convex: the mean over layers puts every layer at 20 misses (2 ms each, GPU 1 ms) = 8 ms for 4 layers;
    counted per layer (0, 0, 20, 60) the layers take 1, 1, 2 and 6 ms = 10 ms: a tighter floor, a lower tok/s."""
    layers, t_gpu = 4, 1e-3
    mean = policy_bound("misses", 1, layers, t_gpu, 20.0, 0.0, 10 * MB, 60.0, 40.0)
    split = policy_bound("misses", 1, layers, t_gpu, [0.0, 0.0, 20.0, 60.0], 0.0, 10 * MB, 60.0, 40.0)
    assert mean is not None and split is not None
    assert mean.step_s == pytest.approx(8e-3) and split.step_s == pytest.approx(10e-3)
    assert split.tok_s < mean.tok_s and split.of(50.0) > mean.of(50.0)  # e2e / bound was understated
    uniform = policy_bound("misses", 1, layers, t_gpu, [20.0] * layers, 0.0, 10 * MB, 60.0, 40.0)
    assert uniform is not None and uniform.step_s == pytest.approx(mean.step_s)
    with pytest.raises(ValueError, match="3 per-layer figures for 4 MoE layers"):
        policy_bound("misses", 1, layers, t_gpu, [1.0, 2.0, 3.0], 0.0, 10 * MB, 60.0, 40.0)


def test_cpu_per_layer_runs_sum_as_the_mean_does() -> None:
    """The cpu policy's time is linear in the runs: per layer or the mean, the same bound."""
    s = 10 * MB
    a = policy_bound("cpu", 1, 3, None, 0.0, [2.0, 4.0, 9.0], s, None, None, 40.0)
    b = policy_bound("cpu", 1, 3, None, 0.0, 5.0, s, None, None, 40.0)
    assert a is not None and b is not None and a.step_s == pytest.approx(b.step_s) == pytest.approx(15 * s / 40e9)


def test_a_row_with_layer_counts_is_bounded_per_layer() -> None:
    """``e2e_bound.row_bound``: the timed per-layer counts (2 steps of 2 layers) replace the row's mean."""
    from freetoken.bench.e2e_bound import row_bound
    from freetoken.bench.e2e_row import BoundBandwidths, Row

    bw = BoundBandwidths(60.0, 40.0, None, None, "arguments")
    counts = {"layer_steps": 4, "misses": 40, "cpu_runs": 20}
    row = Row("hybrid", 1, 1, 10.0, None, 0, [10.0], moe_layers=2, backend="hybrid", counts=counts,
              expert_bytes=10 * MB, bandwidths=bw)  # fmt: skip
    fused_tok_s = 1 / 2e-3  # 1 ms per layer
    mean = row_bound(row, 2, fused_tok_s)  # 10 misses per layer-step: 1 ms each, 2 ms
    row.layer_counts = {"misses": [0, 40], "cpu_runs": [0, 20]}  # 0 and 20 per step: 1 ms and 2 ms
    split = row_bound(row, 2, fused_tok_s)
    assert mean is not None and split is not None
    assert mean.step_s == pytest.approx(2e-3) and split.step_s == pytest.approx(3e-3)


def test_the_graph_cell_names_each_eager_step_by_its_reason() -> None:
    """A row's eager decode steps (fallbacks off the step graphs) are shown beside its replays, by reason: a model
    whose every 16th step ran eagerly (its state checkpoints, before they were copies) read 0.37x the Qwen3 shape."""
    from freetoken.bench.e2e_row import Row

    plain = Row("fused", 6, 1, 900.0, None, 140, [900.0])
    assert plain.graph_cell() == "140"
    eager = replace(plain, eager_steps={"state_checkpoint": 9, "backend": 2})
    assert eager.graph_cell() == "140; 2 eager (backend), 9 eager (state_checkpoint)"
