"""``ft bench http``: real ``ft serve`` process on loopback, concurrent streaming clients, TTFT per request."""

from __future__ import annotations

import json
from pathlib import Path

from freetoken.bench import http_ttft
from server_harness import tiny_checkpoint


def test_http_ttft_through_ft_serve(tmp_path: Path, capsys) -> None:
    model = tiny_checkpoint(str(tmp_path / "m"))
    out = tmp_path / "http.json"
    argv = ["--model", model, "--device", "cpu", "--dtype", "float32", "--policy", "static-layers", "--clients", "3",
            "--prompt-tokens", "96", "--rounds", "2", "--max-tokens", "2", "--json", str(out),
            "--server-log", str(tmp_path / "server.log")]  # fmt: skip
    assert http_ttft.main(argv) == 0
    row = json.loads(out.read_text())
    assert row["errors"] == 0 and len(row["ttft_ms"]) == 3 * 2
    assert 0 < row["p50_ms"] <= row["p99_ms"] == max(row["ttft_ms"])
    assert 96 <= row["prompt_tokens"] <= 96 + 64  # the text's tokens plus the chat template's
    assert "| static-layers | 3 |" in capsys.readouterr().out


def test_prompt_text_length() -> None:
    from tokenizers import Tokenizer

    from freetoken.loader.model_setup import default_model_path

    path = default_model_path() / "tokenizer.json"
    text = http_ttft.prompt_text(path, 300, seed=1)
    n = len(Tokenizer.from_file(str(path)).encode(text).ids)
    assert 270 <= n <= 330, n
    assert http_ttft.prompt_text(path, 300, seed=2) != text
