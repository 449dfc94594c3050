"""llama-bench as ft bench e2e's peer (bench/llama_peer.py): its -o json output parsed, the placement that matches a
row's expert share, and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from freetoken.bench.llama_peer import command, gpu_share, n_cpu_moe_for, parse_llama_bench_json, try_peer

# llama-bench -o json: one object per test, the fields llama-bench documents (tools/llama-bench/README.md); a decode
# test (-p 0 -n 64 -r 3) and a prompt test that the parser leaves out.
_COMMON = {
    "build_commit": "0123abc", "build_number": 6500, "cpu_info": "Intel(R) Xeon(R) Platinum 8592+",
    "gpu_info": "NVIDIA H200", "backends": "CUDA", "model_filename": "/tmp/m.gguf",
    "model_type": "qwen3moe 30B.A3B BF16", "model_size": 15_000_000_000, "model_n_params": 7_500_000_000,
    "n_batch": 2048, "n_ubatch": 512, "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": "f16",
    "type_v": "f16", "n_gpu_layers": 99, "n_cpu_moe": 9, "split_mode": "layer", "main_gpu": 0,
    "no_kv_offload": False, "flash_attn": False, "tensor_split": "0.00", "use_mmap": True, "embeddings": False,
    "n_depth": 0, "test_time": "2026-12-05T10:00:00Z",
}  # fmt: skip
SAMPLE = json.dumps([
    _COMMON | {"n_threads": 6, "n_prompt": 0, "n_gen": 64, "avg_ns": 1_237_000_000, "stddev_ns": 9_000_000,
               "avg_ts": 51.74, "stddev_ts": 0.38, "samples_ns": [1_230_000_000, 1_240_000_000, 1_241_000_000],
               "samples_ts": [52.03, 51.61, 51.57]},
    _COMMON | {"n_threads": 16, "n_prompt": 8192, "n_gen": 0, "avg_ns": 10_570_000_000, "stddev_ns": 0,
               "avg_ts": 775.0, "stddev_ts": 0.0, "samples_ns": [10_570_000_000], "samples_ts": [775.0]},
], indent=2)  # fmt: skip


def test_parse_keeps_the_decode_tests() -> None:
    (r,) = parse_llama_bench_json("ggml_cuda_init: found 1 CUDA devices\n" + SAMPLE)  # a log line before it
    assert (r.model, r.threads, r.n_gen, r.n_cpu_moe) == ("/tmp/m.gguf", 6, 64, 9)
    assert r.avg_ts == 51.74 and r.stddev_ts == 0.38 and r.samples_ts == (52.03, 51.61, 51.57)


def test_parse_refuses_other_output() -> None:
    with pytest.raises(ValueError, match="-o json"):
        parse_llama_bench_json("| model | size | params | backend | ngl | test | t/s |")
    with pytest.raises(ValueError, match="not JSON"):
        parse_llama_bench_json("[{")


def test_an_older_llama_bench_without_n_cpu_moe() -> None:
    older = json.loads(SAMPLE)
    del older[0]["n_cpu_moe"]
    (r,) = parse_llama_bench_json(json.dumps(older))
    assert r.n_cpu_moe is None and r.avg_ts == 51.74


def test_placement_follows_the_expert_share() -> None:
    assert n_cpu_moe_for(1.0, 12) == 0  # every expert on the GPU
    assert n_cpu_moe_for(0.0, 12) == 12  # none
    assert n_cpu_moe_for(0.25, 12) == 9  # BENCH.md's 25% row
    assert n_cpu_moe_for(0.5, 12) == 6
    assert gpu_share({"expert_slots": 384}, "hybrid", 12, 128) == 0.25
    assert gpu_share({}, "fused", 12, 128) == 1.0 and gpu_share({"expert_slots": 0}, "cpu", 12, 128) == 0.0


def test_command_line() -> None:
    cmd = command("llama-bench", "m.gguf", 9, 6, 64)
    assert cmd == ["llama-bench", "-m", "m.gguf", "-ngl", "99", "--n-cpu-moe", "9", "-p", "0", "-n", "64", "-r", "1",
                   "-t", "6", "-o", "json"]  # fmt: skip
    assert "-t" not in command("llama-bench", "m.gguf", 0, None, 64)  # threads left to llama-bench's default


def test_a_failing_peer_costs_no_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert try_peer(str(tmp_path / "no-such-llama-bench"), "m.gguf", 0, 1, 4) is None
    failing = tmp_path / "llama-bench"
    failing.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    failing.chmod(0o755)
    assert try_peer(str(failing), "m.gguf", 0, 1, 4) is None
    assert "failed to load model" in capsys.readouterr().err
