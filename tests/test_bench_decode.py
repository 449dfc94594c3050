"""``ft bench decode`` on a tiny shape: its figures are meaningless on the CPU, its plumbing is not."""

from __future__ import annotations

import pytest
import torch


def test_bench_decode_plumbing_and_bound(tmp_path) -> None:
    import argparse

    import numpy as np

    from freetoken.bench.decode import add_arguments, run_policy
    from freetoken.bench.decode_report import Bandwidths, layer_bound_s
    from freetoken.bench.presets import MoEShape
    from freetoken.bench.synthetic import random_banks

    shape = MoEShape("tiny", hidden=64, inter=32, experts=16, top_k=2, layers=2)
    trace = np.sort(np.random.default_rng(0).integers(0, 16, (50, 2, 2)), axis=-1).astype(np.uint8)
    np.save(tmp_path / "t.npy", trace)
    args = add_arguments(argparse.ArgumentParser()).parse_args(
        ["--layers", "2", "--steps", "6", "--warmup-tokens", "4", "--routing-trace", str(tmp_path / "t.npy")]
    )
    banks = random_banks(shape, 2, torch.float32)
    dev = torch.device("cpu")
    r = {p: run_policy(p, banks, shape, args, dev, torch.float32) for p in ("offload", "hybrid", "cpu")}
    assert r["cpu"].miss_rate == 1.0 and r["cpu"].pcie_mb_per_token == 0
    hyb = r["hybrid"]
    full = hyb.fills_per_layer_step * args.layers * banks.expert_bytes / args.batch / 1e6
    assert hyb.pcie_mb_per_token == pytest.approx(full)  # whole fills are all that crosses the link
    ff = run_policy("hybrid+ff60", banks, shape, args, dev, torch.float32)
    assert ff.backend == "hybrid" and ff.stats["share"] == 0.6
    with pytest.raises(SystemExit, match="unknown policy option"):
        run_policy("hybrid+fast", banks, shape, args, dev, torch.float32)
    from freetoken.bench.decode import policy_config

    assert policy_config("hybrid+lag", args).moe_backend == "hybrid"
    assert policy_config("hybrid+ff40", args).fill_fraction == 0.4
    assert policy_config("hybrid", args).fill_fraction is None
    with pytest.raises(SystemExit, match="unknown policy option"):
        policy_config("hybrid+ff140", args)
    assert r["offload"].cpu_mb_per_token == 0 and r["offload"].fills_per_layer_step > 0
    bw = Bandwidths(copy=50.0, cpu=20.0, copy_c=40.0, cpu_c=20.0, source="test")
    gb = banks.expert_bytes / 1e9
    off = r["offload"]
    assert layer_bound_s(off, banks.expert_bytes, bw, 0.0) == pytest.approx(off.misses_per_layer_step * gb / 50.0)
    hyb = r["hybrid"]
    assert layer_bound_s(hyb, banks.expert_bytes, bw, 0.0) == pytest.approx(hyb.misses_per_layer_step * gb / 60.0)
    assert layer_bound_s(hyb, banks.expert_bytes, bw, 1.0) == 1.0  # the GPU term dominates
    # per MoE layer: the backend's own counts, whose mean is the mean count; misses that differ between layers bound
    # each layer by its own max(T_gpu, miss time), above the bound of the mean
    import dataclasses

    assert off.misses_per_layer is not None and len(off.misses_per_layer) == args.layers
    assert sum(off.misses_per_layer) / args.layers == pytest.approx(off.misses_per_layer_step)
    m = off.misses_per_layer_step
    t = m * gb / 50.0  # a GPU term equal to the mean's miss time
    skew = dataclasses.replace(off, misses_per_layer=[0.0, 2 * m])
    assert layer_bound_s(skew, banks.expert_bytes, bw, t) == pytest.approx(1.5 * t)
    mean = dataclasses.replace(off, misses_per_layer=None)
    assert layer_bound_s(mean, banks.expert_bytes, bw, t) == pytest.approx(t)
