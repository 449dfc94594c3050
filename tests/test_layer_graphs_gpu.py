"""CUDA-graph replay of MoE decode layers (``moe_cuda_graphs``): the same outputs and counters as eager
steps, for fused, offload and hybrid (whose CPU branch runs inside the graph on toggle flags)."""

from __future__ import annotations

import time

import pytest
import torch

from freetoken.bench.placements import register
from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.base import ExpertBanks
from freetoken.experts.cpu.stream_ops import stream_ops
from freetoken.experts.reference import moe_reference

register()  # the static-layers and static-freq backends

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
D, I, E, L, K = 64, 32, 16, 3, 2
COUNTERS = ("expert_hits", "expert_misses", "expert_fills", "expert_cpu_runs", "layer_steps")


def test_flag_operations_capture_and_replay() -> None:
    """The smallest form of what the graphed CPU branch relies on: stream writes and an equality wait on
    pinned flags, captured once, replayed twice while the host plays the feeder."""
    ops = stream_ops()
    assert ops is not None
    ready, done = (torch.zeros(1, dtype=torch.int32, pin_memory=True) for _ in range(2))
    rp, dp = ops.device_ptr(ready), ops.device_ptr(done)
    x = torch.zeros(4, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
        ops.write(rp, 1)
        ops.wait(dp, 1, equal=True)
        ops.write(dp, 0)
        x.mul_(2)
    for _ in range(2):
        graph.replay()
        t0 = time.monotonic()
        while int(ready[0]) != 1:
            assert time.monotonic() - t0 < 10, "the replayed graph never wrote its ready flag"
            time.sleep(0.001)
        ready[0], done[0] = 0, 1
        torch.cuda.synchronize()
        assert int(done[0]) == 0
    assert x.tolist() == [6.0] * 4  # ((0 + 1) * 2 + 1) * 2


def _banks() -> ExpertBanks:
    g = torch.Generator().manual_seed(21)
    return ExpertBanks(torch.randn(L * E, 2 * I, D, generator=g) / D**0.5,
                       torch.randn(L * E, D, I, generator=g) / I**0.5, L, E)


def _steps(sizes: list[int], seed: int) -> list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for T in sizes:
        layers = []
        for _ in range(L):
            ids = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K]
            w = torch.softmax(torch.randn(T, K, generator=g), dim=-1)
            layers.append((torch.randn(T, D, generator=g).cuda(), ids.cuda(), w.cuda()))
        out.append(layers)
    return out


def _run(name: str, graphs: bool, steps, banks: ExpertBanks):
    cfg = EngineConfig(moe_backend=name, expert_cache=0.25, moe_cuda_graphs=graphs,
                       fill_fraction=0.5 if name == "hybrid" else None)  # fmt: skip
    backend = create_backend(cfg, banks, torch.device("cuda"), torch.float32)
    outs = []
    for step in steps:
        backend.begin_step(step[0][0].shape[0], True)
        outs.append([backend.forward(layer, x, ids, w).clone() for layer, (x, ids, w) in enumerate(step)])
    torch.cuda.synchronize()
    backend.begin_step(1, True)
    stats: dict = {**backend.stats(), "per_layer": backend.layer_counts()}
    backend.check_integrity()
    getattr(backend, "close", lambda: None)()  # fused has nothing to release
    return outs, stats


@pytest.mark.parametrize("name", ["fused", "offload", "hybrid", "static-layers", "cpu"])
def test_graphed_decode_equals_eager(name: str) -> None:
    banks = _banks()
    steps = _steps([1, 1, 2, 1, 2, 1, 1, 3, 1, 2], seed=4)  # sizes repeat: captured, then replayed
    eager, s_eager = _run(name, False, steps, banks)
    graphed, s_graph = _run(name, True, steps, banks)
    assert s_graph["moe_graph_replays"] > 0 and s_graph["moe_graphs"] > 0 and s_graph["moe_graph_failures"] == 0
    gu, dn = banks.gate_up.cuda(), banks.down.cuda()
    for step, out_e, out_g in zip(steps, eager, graphed):
        for layer, ((x, ids, w), e, g) in enumerate(zip(step, out_e, out_g)):
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
            ref = moe_reference(x, ids + layer * E, w, gu, dn)
            torch.testing.assert_close(g.float(), ref, rtol=1e-5, atol=1e-5)
    for key in COUNTERS:
        assert s_graph.get(key) == s_eager.get(key), key  # fused keeps no expert counters
    assert s_graph["per_layer"] == s_eager["per_layer"]  # replayed layers add to their own rows too
    if name != "fused":
        assert sum(s_graph["per_layer"]["misses"]) == s_graph["expert_misses"] > 0
    if name == "hybrid":
        assert s_graph["expert_cpu_runs"] > 0 and s_graph["expert_fills"] > 0
    if name in ("static-layers", "cpu"):  # whole layers resident (or none), the rest on the CPU inside the graphs
        assert s_graph["expert_cpu_runs"] > 0 and s_graph["expert_fills"] == 0


def test_resize_drops_graphs_and_stays_exact() -> None:
    banks = _banks()
    cfg = EngineConfig(moe_backend="offload", expert_cache=0.25, moe_cuda_graphs=True)
    backend = create_backend(cfg, banks, torch.device("cuda"), torch.float32)
    gu, dn = banks.gate_up.cuda(), banks.down.cuda()
    for i, step in enumerate(_steps([1] * 6, seed=5)):
        if i == 3:
            backend.resize_expert_cache(backend.cache.num_slots + 4)
            assert backend.stats()["moe_graphs"] == 0
        backend.begin_step(1, True)
        for layer, (x, ids, w) in enumerate(step):
            out = backend.forward(layer, x, ids, w)
            torch.testing.assert_close(out, moe_reference(x, ids + layer * E, w, gu, dn), rtol=1e-5, atol=1e-5)
    assert backend.stats()["moe_graph_replays"] > 0
    backend.close()
