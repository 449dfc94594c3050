"""The benchmark-only routing trace (``bench/routing_trace.py``, installed on a built model as each MoE layer's
``router_override``): MoE layers route as the trace says, one trace token further per step, the router's weights at
the trace's experts; bad traces are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.bench import routing_trace
from tiny_models import save_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("trace")
    save_checkpoint("qwen3_moe", d, seed=2)
    return d


def _trace(ckpt: Path, path: Path, n: int = 40) -> np.ndarray:
    cfg = json.loads((ckpt / "config.json").read_text())
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    layers, k = cfg["num_hidden_layers"], cfg["num_experts_per_tok"]
    rng = np.random.default_rng(1)
    trace = np.sort(np.stack([[rng.choice(E, k, replace=False) for _ in range(layers)] for _ in range(n)]), -1)
    np.save(path, trace.astype(np.uint8))
    return trace


def test_layers_route_by_the_trace(ckpt: Path, tmp_path: Path) -> None:
    trace = _trace(ckpt, tmp_path / "t.npy")
    llm = LLM(str(ckpt), device="cpu", dtype="float32")
    routing_trace.install(llm, str(tmp_path / "t.npy"))
    backend = llm.engine.setup.loaded.backend
    seen: list[tuple[int, torch.Tensor]] = []
    real = backend.forward

    def forward(layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> Any:
        seen.append((layer, ids.clone()))
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[0]), atol=1e-5)  # renormalised router weights
        return real(layer, x, ids, w)

    backend.forward = forward
    llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    L = len(llm.engine.hf.moe_layer_ids)
    steps = [seen[i : i + L] for i in range(0, len(seen), L)]
    assert len(steps) == 5  # the prefill and 4 decode steps
    for s, step in enumerate(steps[1:], start=1):  # decode: one row, trace token s
        for layer, ids in step:
            assert ids.tolist() == [trace[s, layer].tolist()]


def test_bad_traces_are_refused(ckpt: Path, tmp_path: Path) -> None:
    llm = LLM(str(ckpt), device="cpu")
    np.save(tmp_path / "flat.npy", np.zeros((10, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="a routing trace is"):
        routing_trace.install(llm, str(tmp_path / "flat.npy"))
    np.save(tmp_path / "wide.npy", np.full((10, 2, 2), 250, dtype=np.uint8))
    with pytest.raises(ValueError, match="expert ids up to 250"):
        routing_trace.install(llm, str(tmp_path / "wide.npy"))
    assert all(layer.router_override is None for layer in routing_trace.moe_layers(llm.engine.setup.loaded.model))


def test_production_code_routes_by_its_router(ckpt: Path) -> None:
    """No override unless a benchmark installs one: the config has no trace field and the built layers none set."""
    from freetoken.config import EngineConfig

    assert "routing_trace" not in EngineConfig.field_names()
    llm = LLM(str(ckpt), device="cpu", dtype="float32")
    layers = routing_trace.moe_layers(llm.engine.setup.loaded.model)
    assert layers and all(layer.router_override is None for layer in layers)
