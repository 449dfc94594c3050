"""ft bench e2e end to end on the CPU with the embedded model: the table, the MoE-only figure beside it,
and transformers' generate as the peer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freetoken.cli.main import main


def test_bench_e2e_on_the_embedded_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "e2e.json"
    argv = ["bench", "e2e", "--model", "default", "--device", "cpu", "--policies", "fused", "--batch", "1,2"]
    argv += ["--tokens", "6", "--warmup", "2", "--repeats", "1", "--moe-steps", "4", "--transformers"]
    assert main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| default | fused | 1 |" in printed and "transformers generate, batch 1:" in printed
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(r["e2e_tok_s"] > 0 and r["moe_tok_s"] > 0 for r in rows)
