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


def test_bench_e2e_prefill_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TTFT cold and warm with bytes copied, and ITL beside a long prefill: the bookkeeping (figures mean nothing on
    the CPU). 64-token chunks: the 300-token prompts prefill layer-major, streaming the pool once when cold."""
    out = tmp_path / "e2e.json"
    argv = ["bench", "e2e", "--model", "default", "--device", "cpu", "--policies", "offload", "--no-decode"]
    argv += ["--expert-cache", "0.4", "--max-batched-tokens", "64", "--prefill", "100,300", "--repeats", "1"]
    argv += ["--itl-prompt", "300", "--itl-streams", "2", "--itl-solo-tokens", "3"]
    assert main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| offload | 300 |" in printed and "ITL during prefill" in printed
    res = json.loads(out.read_text())
    assert res["rows"] == []
    cold = {r["tokens"]: r for r in res["ttft"]}
    big = cold[300]
    assert big["layer_major"] == 1 and 0 < big["cold_bytes"] <= big["pool_bytes"]  # the pool crossed once at most
    assert big["warm_bytes"] <= big["pool_bytes"] and big["b_p_gbps"] > 0  # 64 new tokens route every expert too
    (itl,) = res["itl"]
    assert itl["streams"] == 2 and itl["during_tokens"] >= 2 and itl["solo_p50_ms"] > 0
