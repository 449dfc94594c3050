"""The stream-ordered CPU branch's hand-off (``experts/cpu/streamed.py``): one staging kernel writes the inputs
into mapped pinned memory, the final add reads the partial from it (zero-copy)."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER
from freetoken.bench.placements import register
from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from random_experts import HAS_CUDA, make_banks, run_steps

register()  # the static-layers and static-freq backends


@TRITON_INTERPRETER
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stage_kernel_in_interpreter(dtype: torch.dtype) -> None:
    """The staging kernel on the CPU through Triton's interpreter (TRITON_INTERPRET=1)."""
    from freetoken.experts.cpu.stage_triton import stage_inputs_triton

    g = torch.Generator().manual_seed(1)
    for T, D, k in ((1, 64, 8), (3, 2048, 8), (40, 32, 4)):  # codes longer than x, and shorter
        x = torch.randn(T, D, generator=g).to(dtype)
        codes = torch.randint(-100, 100, (T * k,), generator=g)
        w = torch.rand(T * k, generator=g).to(dtype)
        xd, cd, wd = torch.full((T, D), 7.0), torch.zeros(T * k, dtype=torch.long), torch.zeros(T * k)
        stage_inputs_triton(x, codes, w, xd, cd, wd)
        assert torch.equal(xd, x.float()) and torch.equal(cd, codes) and torch.equal(wd, w.float())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("name", ["hybrid", "cpu", "static-layers"])
def test_streamed_backends_equal_reference_cuda(name: str, graphs: bool) -> None:
    """Decode-sized steps (the streamed branch) over many steps: a stale read of a reused pinned buffer
    (a cached partial, inputs not yet visible to the CPU) would break the equality."""
    banks = make_banks(3, 12, seed=1)
    cfg = EngineConfig(moe_backend=name, expert_cache=0.25, fill_fraction=0.5 if name == "hybrid" else None,
                       moe_cuda_graphs=graphs)  # fmt: skip
    dev = torch.device("cuda")
    backend = create_backend(cfg, banks, dev, torch.float32)
    assert run_steps(backend, banks, steps=30, seed=3, device=dev, max_t=4) < 1e-5
    assert backend.stats()["expert_cpu_runs"] > 0
    runner = backend.cpu  # type: ignore[attr-defined]
    assert runner.streamed  # the streamed branch served the steps
