"""The peers' placements (``bench/placements/``: static-layers, static-freq) are benchmark policies: they register
with the expert-backend registry when a benchmark calls ``register()``, production code never does, and ``ft serve
--moe-backend static-layers`` says in one line where they went."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

from freetoken.bench.placements import register
from freetoken.cli.main import main
from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import backend_names, create_backend, register_backend
from random_experts import make_banks, run_steps

register()  # the static-layers and static-freq backends


def test_static_backends_hit_once_placed() -> None:
    banks = make_banks(2, 8, seed=3)
    for name in ("static-layers", "static-freq"):
        cfg = EngineConfig(moe_backend=name, expert_cache=0.5)
        backend = create_backend(cfg, banks, torch.device("cpu"), torch.float32)
        assert backend.name == name
        run_steps(backend, banks, steps=12, seed=4, device=torch.device("cpu"))  # > 200 tokens
        assert backend.stats()["expert_hits"] > 0, name
        assert backend.stats()["expert_fills"] == 0, name  # placed and locked: nothing is ever filled
        assert backend.cache.size() == 8  # type: ignore[attr-defined]


def test_registry_takes_registrations_and_refuses_taken_names() -> None:
    assert backend_names()[:5] == ["auto", "fused", "offload", "cpu", "hybrid"]
    assert {"static-layers", "static-freq"} <= set(backend_names())
    from freetoken.bench.placements import StaticLayersBackend

    register_backend("static-layers", StaticLayersBackend.create)  # the same factory again: no change
    for taken in ("auto", "hybrid", "static-layers"):
        with pytest.raises(ValueError, match="is taken"):
            register_backend(taken, lambda *a: None)  # type: ignore[arg-type,return-value]


PRODUCTION = """
import sys, torch
from freetoken import LLM
import freetoken.cli.serve, freetoken.server.app
from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.base import ExpertBanks
banks = ExpertBanks(torch.zeros(16, 8, 4), torch.zeros(16, 4, 4), 2, 8)
assert not [m for m in sys.modules if m.startswith("freetoken.bench")], "production imported bench/"
try:
    create_backend(EngineConfig(moe_backend="static-layers"), banks, torch.device("cpu"), torch.float32)
except ValueError as e:
    print(e)
"""


def test_production_code_knows_no_placement() -> None:
    """A fresh process that loads the engine, the server and ``ft serve``: no ``freetoken.bench`` module, and the
    registry does not know the placements."""
    out = subprocess.run([sys.executable, "-c", PRODUCTION], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "MoE backend 'static-layers' is not available; available: auto, fused, offload, cpu, hybrid"
    )


MOVED = """
import contextlib, io, sys
from freetoken.cli.main import main

for command in ("serve", "chat", "generate"):
    for name in ("static-layers", "static-freq"):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                main([command, "--moe-backend", name] + (["--prompt", "hi"] if command == "generate" else []))
            except SystemExit as e:
                print(e.code, err.getvalue(), end="")
"""


def test_cli_moe_backend_says_where_the_placement_went() -> None:
    """Production ``ft`` (a fresh process: no placement registered) ends each loading command with one line."""
    out = subprocess.run([sys.executable, "-c", MOVED], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    want = [f"2 ft {command}: error: {name} is a benchmark placement now: ft bench decode --policies {name}"
            for command in ("serve", "chat", "generate") for name in ("static-layers", "static-freq")]  # fmt: skip
    assert out.stdout.splitlines() == want


def test_a_process_that_registered_the_placements_takes_them() -> None:
    """Where the placements are registered (here, as in the server ``ft bench http`` starts), the flag takes them."""
    from freetoken.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--moe-backend", "static-layers"])
    assert args.moe_backend == "static-layers"


def test_cli_moe_backend_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--moe-backend", "fastest"])
    names = "auto, fused, offload, cpu, hybrid, static-layers, static-freq"  # this process registered the placements
    assert f"invalid choice: 'fastest' (choose from {names})" in capsys.readouterr().err


def test_bench_decode_runs_the_placements() -> None:
    """``ft bench decode --policies static-layers,static-freq``'s runs, on a tiny shape (its presets are real
    models' layers): the CPU serves the misses, nothing crosses the link."""
    from freetoken.bench.decode import DEFAULT_POLICIES, add_arguments, run_policy
    from freetoken.bench.presets import MoEShape
    from freetoken.bench.synthetic import random_banks

    assert DEFAULT_POLICIES == "fused,offload,hybrid,cpu,static-layers,static-freq"
    argv = ["--policies", "static-layers,static-freq", "--layers", "2", "--steps", "6", "--warmup-tokens", "210"]
    argv += ["--expert-cache", "0.5"]  # 16 slots: one whole layer (static-layers), 8 experts a layer (static-freq)
    args = add_arguments(argparse.ArgumentParser()).parse_args(argv)
    shape = MoEShape("tiny", hidden=64, inter=32, experts=16, top_k=2, layers=2)
    banks = random_banks(shape, 2, torch.float32)
    for policy in args.policies.split(","):
        r = run_policy(policy, banks, shape, args, torch.device("cpu"), torch.float32)
        assert r.backend == policy and r.pcie_mb_per_token == 0 and r.cpu_mb_per_token > 0
        assert 0 < r.miss_rate < 1  # half the pool placed: some routes hit


def test_bench_e2e_runs_a_placement(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "e2e", "--model", "default", "--device", "cpu", "--policies", "static-layers", "--batch", "1"]
    argv += ["--tokens", "4", "--warmup", "2", "--repeats", "1", "--no-moe-only", "--expert-cache", "0.5"]
    assert main(argv) == 0
    assert "| default | static-layers | 1 |" in capsys.readouterr().out
