"""ft bench e2e end to end on the CPU with the embedded model: the table, the MoE-only figure beside it,
and transformers' generate as the peer."""

from __future__ import annotations

import json
import sys
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


def test_bench_e2e_bound_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each row's bandwidth bound (bench/bound.py) from the misses its timed tokens counted: fused is held to its own
    step, ``cpu`` to its experts' bytes over the streaming read measured in this command, and a miss-serving policy
    prints n/a on the CPU (no PCIe figure)."""
    out = tmp_path / "e2e.json"
    argv = ["bench", "e2e", "--model", "default", "--device", "cpu", "--policies", "fused,cpu,offload"]
    argv += ["--batch", "1", "--tokens", "5", "--warmup", "2", "--repeats", "1", "--no-moe-only", "--measure-bw"]
    argv += ["--bw-seconds", "0.1"]
    assert main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| bound tok/s | e2e / bound |" in printed and "T_gpu per layer from the fused rows" in printed
    assert "B_P' n/a" in printed and "measured in this command" in printed
    rows = {r["policy"]: r for r in json.loads(out.read_text())["rows"]}
    fused, cpu, offload = rows["fused"], rows["cpu"], rows["offload"]
    assert fused["of_bound"] == pytest.approx(1.0) and fused["bound_tok_s"] == pytest.approx(fused["e2e_tok_s"])
    layers = cpu["moe_layers"]
    c = cpu["counts"]
    assert c["layer_steps"] == 5 * layers and c["cpu_runs"] >= c["layer_steps"]  # top-k >= 1 distinct per layer-step
    step_s = c["cpu_runs"] / c["layer_steps"] * layers * cpu["expert_bytes"] / 1e9 / cpu["bandwidths"]["read"]
    assert cpu["bound_tok_s"] == pytest.approx(1 / step_s)
    assert 0 < cpu["of_bound"] == pytest.approx(cpu["e2e_tok_s"] / cpu["bound_tok_s"])
    assert offload["counts"]["misses"] > 0 and offload["bound_tok_s"] is None
    # the timed misses and CPU runs per MoE layer (the bound's m_l) add up to the row's totals
    assert "misses per MoE layer" in printed and fused["layer_counts"] == {}
    for row, key in ((cpu, "cpu_runs"), (offload, "misses")):
        assert len(row["layer_counts"][key]) == layers and sum(row["layer_counts"][key]) == row["counts"][key]
    (line,) = [ln for ln in printed.splitlines() if ln.startswith("| default | offload | 1 |")]
    assert line.endswith("| n/a | n/a |")


def test_bench_e2e_peer_alternates_with_ours(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--peer-llama-cpp: a stand-in llama-bench (llama.cpp does not build here) records its command lines and prints
    a fixed -o json sample; each batch-1 row's repeats alternate with it at the row's placement and threads."""
    log = tmp_path / "calls.txt"
    fake = tmp_path / "llama-bench"
    sample = [{"model_filename": "m.gguf", "n_threads": 1, "n_prompt": 0, "n_gen": 4, "avg_ts": 50.0,
               "stddev_ts": 0.0, "samples_ts": [50.0]}]  # fmt: skip
    fake.write_text(f"#!{sys.executable}\nimport sys\nopen({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                    f"print({json.dumps(json.dumps(sample))})\n")  # fmt: skip
    fake.chmod(0o755)
    out = tmp_path / "e2e.json"
    argv = ["bench", "e2e", "--model", "default", "--device", "cpu", "--policies", "fused,offload", "--batch", "1,2"]
    argv += ["--tokens", "4", "--warmup", "1", "--repeats", "2", "--no-moe-only", "--cpu-threads", "1", "--no-bound"]
    assert main([*argv, "--peer-llama-cpp", str(fake), "m.gguf", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    calls = log.read_text().splitlines()
    rows = json.loads(out.read_text())["rows"]
    by = {(r["policy"], r["batch"]): r for r in rows}
    assert by[("fused", 2)]["peer_runs"] == [] and by[("offload", 2)]["peer_runs"] == []  # llama-bench: one sequence
    fused, offload = by[("fused", 1)], by[("offload", 1)]
    assert fused["peer_runs"] == [50.0, 50.0] and fused["peer_n_cpu_moe"] == 0
    layers = offload["moe_layers"]
    assert 0 < offload["peer_n_cpu_moe"] < layers  # 25% of the experts cached: most layers' experts on the CPU
    expect = [f"-m m.gguf -ngl 99 --n-cpu-moe {n} -p 0 -n 4 -r 1 -t 1 -o json" for n in (0, 0)]
    expect += [f"-m m.gguf -ngl 99 --n-cpu-moe {offload['peer_n_cpu_moe']} -p 0 -n 4 -r 1 -t 1 -o json"] * 2
    assert calls == expect
    assert "| 1 | offload | 1 |" in printed and "ours / llama.cpp" in printed
