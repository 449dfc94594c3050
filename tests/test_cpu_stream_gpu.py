"""The stream-ordered CPU branch on CUDA: the host never waits for the CPU experts, results stay exact.

The host-blocking test stalls the GPU stream behind a flag only the test sets: a MoE layer whose host
side waited for its CPU branch (or for the GPU at all) could then never return."""

from __future__ import annotations

import threading

import pytest
import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.base import ExpertBanks
from freetoken.experts.cpu.stream_ops import stream_ops
from freetoken.experts.reference import moe_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
D, I, E, L, K = 64, 32, 16, 3, 2


def _banks(seed: int = 5) -> ExpertBanks:
    g = torch.Generator().manual_seed(seed)
    return ExpertBanks(torch.randn(L * E, 2 * I, D, generator=g) / D**0.5,
                       torch.randn(L * E, D, I, generator=g) / I**0.5, L, E)


def _inputs(T: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cuda")
    out = []
    for _ in range(L):
        x = torch.randn(T, D, generator=g)
        ids = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K]
        w = torch.softmax(torch.randn(T, K, generator=g), dim=-1)
        out.append((x.to(dev), ids.to(dev), w.to(dev)))
    return out


def _backend(name: str, banks: ExpertBanks):
    cfg = EngineConfig(moe_backend=name, expert_cache=0.25, fill_fraction=0.5 if name == "hybrid" else None)
    return create_backend(cfg, banks, torch.device("cuda"), torch.float32)


def _check(outs: list[torch.Tensor], inputs, banks: ExpertBanks) -> None:
    gu, dn = banks.gate_up.cuda(), banks.down.cuda()
    for layer, (out, (x, ids, w)) in enumerate(zip(outs, inputs)):
        ref = moe_reference(x, ids + layer * E, w, gu, dn)
        torch.testing.assert_close(out.float(), ref, rtol=1e-5, atol=1e-5)


def test_stream_ops_round_trip() -> None:
    assert stream_ops() is not None, "stream memory operations should work on this GPU box"


@pytest.mark.parametrize("name", ["hybrid", "cpu"])
def test_host_queues_every_layer_while_the_gpu_is_stalled(name: str) -> None:
    ops = stream_ops()
    assert ops is not None
    banks = _banks()
    backend = _backend(name, banks)
    warm = _inputs(4, seed=1)
    backend.begin_step(4, True)
    for layer, (x, ids, w) in enumerate(warm):  # first calls build the streamed branch, compile kernels
        backend.forward(layer, x, ids, w)
    torch.cuda.synchronize()
    runner = backend.cpu
    assert runner.streamed, "decode batches on CUDA should use the stream-ordered CPU branch"

    inputs, outs = _inputs(3, seed=2), []  # on the GPU before the stall: a pageable copy would wait for it
    torch.cuda.synchronize()
    gate = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    ops.wait(ops.device_ptr(gate), 1)  # the GPU stalls here until the test writes 1
    backend.begin_step(3, True)

    def queue_all() -> None:
        for layer, (x, ids, w) in enumerate(inputs):
            outs.append(backend.forward(layer, x, ids, w))

    t = threading.Thread(target=queue_all)
    t.start()
    t.join(timeout=20)
    blocked = t.is_alive()
    gate[0] = 1  # release the GPU (and a blocked host, if any)
    t.join()
    torch.cuda.synchronize()
    assert not blocked, f"{name}: the host waited inside a MoE layer while the GPU was stalled"
    assert len(outs) == L
    _check(outs, inputs, banks)
    backend.begin_step(1, True)  # collects the streamed batches' stats
    assert backend.stats()["expert_cpu_runs"] > 0
    backend.close()


@pytest.mark.parametrize("name", ["hybrid", "cpu"])
def test_decode_steps_never_sync(name: str) -> None:
    banks = _banks(seed=6)
    backend = _backend(name, banks)
    steps = [_inputs(T, seed=10 + T) for T in (1, 2, 5, 1)]
    backend.begin_step(1, True)
    for layer, (x, ids, w) in enumerate(steps[0]):
        backend.forward(layer, x, ids, w)
    torch.cuda.synchronize()
    outs: list[list[torch.Tensor]] = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for inputs in steps[1:]:
            backend.begin_step(inputs[0][0].shape[0], True)
            outs.append([backend.forward(layer, x, ids, w) for layer, (x, ids, w) in enumerate(inputs)])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    for o, inputs in zip(outs, steps[1:]):
        _check(o, inputs, banks)
    if name == "hybrid":
        backend.check_integrity()
    backend.close()
