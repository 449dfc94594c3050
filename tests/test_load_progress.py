"""Loading says what it is doing: a safetensors checkpoint's experts are read under a byte counter (a bar on a
terminal; the spinner's line under ``ft``), and the spinner names the stage before, during and after that read."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

import freetoken.loader.model_build as model_build
from freetoken import LLM
from freetoken.checkpoint import ftw_progress
from freetoken.cli.common import loading_stage
from tiny_models import save_checkpoint


def test_the_experts_read_counts_every_byte(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint("qwen3_moe", tmp_path, seed=3)
    reads: list[ftw_progress.LoadProgress] = []

    @contextmanager
    def kept(total: int, label: str):  # the real counter, kept for a look after the load
        with ftw_progress.tracked(total, label) as p:
            reads.append(p)
            yield p

    monkeypatch.setattr(model_build, "tracked", kept)
    llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", moe_backend="cpu")
    (p,) = reads
    banks = llm.engine.setup.loaded.banks
    assert p.label == "reading the experts" and p.total == p.done == banks.gate_up.nbytes + banks.down.nbytes > 0
    assert ftw_progress.current() is None  # over once the experts are in


def test_the_spinner_names_the_stage() -> None:
    assert loading_stage("m", False) == "loading m: reading the weights …"
    with ftw_progress.tracked(3 * 10**9, "reading the experts") as p:
        p.advance(10**9)
        assert loading_stage("m", True) == "loading m: reading the experts: 1.0 / 3.0 GB"
    assert "setting up the caches and the CPU expert kernel" in loading_stage("m", True)
