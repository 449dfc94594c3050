"""Bad checkpoints and prompts: one clear line naming the file or tensor, non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from subproc import child_env
from tiny_models import save_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def ft(*args: str) -> subprocess.CompletedProcess[str]:
    env = child_env()
    return subprocess.run(
        [sys.executable, "-m", "freetoken.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    save_checkpoint("qwen3_moe", d, seed=1, tokenizer=True, max_shard_size="200KB")
    return d


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("ft generate: error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_generate_works(ckpt):
    r = ft("generate", "--model", str(ckpt), "--prompt", "Hello world", "--max-tokens", "5", "--device", "cpu")
    assert r.returncode == 0, r.stderr


def test_missing_directory(tmp_path):
    assert "does not exist" in _error_line(ft("generate", "--model", str(tmp_path / "nope"), "--prompt", "x"))


def test_unsupported_architecture(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["FancyNewForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    line = _error_line(ft("generate", "--model", str(d), "--prompt", "x"))
    assert "FancyNewForCausalLM" in line and "Qwen3MoeForCausalLM" in line and "MixtralForCausalLM" in line


def test_missing_shard(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path / "m")
    shard = sorted(d.glob("model-*.safetensors"))[-1]
    shard.unlink()
    line = _error_line(ft("generate", "--model", str(d), "--prompt", "x"))
    assert shard.name in line and "missing" in line


def test_wrong_tensor_shape(ckpt, tmp_path):
    d = _copy(ckpt, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["moe_intermediate_size"] = 40
    (d / "config.json").write_text(json.dumps(cfg))
    line = _error_line(ft("generate", "--model", str(d), "--prompt", "x"))
    assert "experts.0.gate_proj.weight" in line and "[32, 64]" in line and "[40, 64]" in line


def test_prompt_longer_than_context(ckpt):
    r = ft("generate", "--model", str(ckpt), "--prompt", "hello " * 40, "--max-model-len", "16")
    line = _error_line(r)
    assert "prompt is too long" in line and "16" in line


def test_a_vram_budget_below_the_minimum(ckpt):
    r = ft("generate", "--model", str(ckpt), "--prompt", "hi", "--device", "cpu", "--moe-backend", "hybrid",
           "--max-model-len", "64", "--vram-budget", "0.00001", "--vram-reserve", "0")  # fmt: skip
    line = _error_line(r)
    assert "below the minimum this model needs" in line and "expert slots x" in line
    assert "KV pages x" in line and "one 64-token context" in line


def test_chat_streams_replies_and_exits(ckpt):
    env = child_env()
    r = subprocess.run(
        [sys.executable, "-m", "freetoken.cli", "chat", "--model", str(ckpt), "--max-tokens", "6", "--device", "cpu"],
        input="Hello there\n/reset\nHow are you?\n/exit\n", capture_output=True, text=True, env=env, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("> ") == 4  # a prompt for each of the four input lines
    assert "/reset" in r.stderr  # the help line
