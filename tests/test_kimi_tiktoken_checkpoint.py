"""Kimi-Linear shipping its tokenizer only as ``tiktoken.model``: a tiny checkpoint loads, generates from a chat
prompt and serves chat and structured output over HTTP; the hub download brings the file, never the Python
wrapper; no production module imports ``tiktoken`` (the conversion itself: ``test_tiktoken_tokenizer.py``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from freetoken.checkpoint.tiktoken_tokenizer import RESERVED_SPECIAL_TOKENS
from freetoken.checkpoint.tokenizer import load_tokenizer
from tiktoken_files import (
    reference_encode,
)

# ---- a tiny Kimi-Linear checkpoint shipping only tiktoken.model --------------------------------------------------


@pytest.fixture(scope="module")
def kimi_ckpt(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_kimi import save_kimi_checkpoint

    d = tmp_path_factory.mktemp("kimi_linear")
    n = len(kimi_dir[1])
    save_kimi_checkpoint(d, seed=0, vocab_size=n + RESERVED_SPECIAL_TOKENS, bos_token_id=n, eos_token_id=n + 2,
                         pad_token_id=n + 255)  # fmt: skip
    for name in ("tiktoken.model", "tokenizer_config.json"):
        (d / name).write_bytes((kimi_dir[0] / name).read_bytes())
    (d / "tokenization_kimi.py").write_text(WRAPPER)  # as the release ships it: never to be run
    assert not (d / "tokenizer.json").exists()
    return d


WRAPPER = "raise SystemExit('checkpoint-shipped tokenizer code was imported')\n"


def test_no_production_module_imports_tiktoken() -> None:
    src = Path(__file__).resolve().parents[1] / "src" / "freetoken"
    assert not [p for p in src.rglob("*.py") if re.search(r"^\s*(import|from) tiktoken\b", p.read_text(), re.M)]


def test_llm_loads_and_generates_from_a_chat_prompt(
    kimi_ckpt: Path, kimi_dir: tuple[Path, dict[bytes, int]], kimi_enc: Any, tmp_path: Path, freetoken_env: Any
) -> None:
    from freetoken import LLM, SamplingParams

    freetoken_env("FREETOKEN_CACHE", str(tmp_path))
    llm = LLM(model=str(kimi_ckpt), device="cpu", dtype="float32")
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Say 你好"}], tokenize=False,
                                               add_generation_prompt=True)  # fmt: skip
    out = llm.generate(prompt, SamplingParams(max_tokens=6, temperature=0.0))[0]
    assert out.prompt_token_ids == reference_encode(kimi_enc, prompt)
    assert 1 <= len(out.token_ids) <= 6 and max(out.token_ids) < len(kimi_dir[1]) + RESERVED_SPECIAL_TOKENS
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_chat_and_structured_output_served_over_http(kimi_ckpt: Path, tmp_path: Path, freetoken_env: Any) -> None:
    from server_harness import MODEL, real_engine, serve

    freetoken_env("FREETOKEN_CACHE", str(tmp_path))
    with serve(real_engine(str(kimi_ckpt), max_model_len=256)) as srv:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi 中文"}], "max_tokens": 5,
                "temperature": 0}  # fmt: skip
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        tok = srv.engine.tokenizer
        prompt = tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        assert prompt.startswith("<|im_system|>") and prompt.endswith("<|im_assistant|>assistant<|im_middle|>")
        assert r.json()["usage"]["prompt_tokens"] == len(tok.encode(prompt, add_special_tokens=False))
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                  "additionalProperties": False}  # fmt: skip
        fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
        structured = {**body, "max_tokens": 40, "response_format": fmt, "reasoning_effort": "none"}
        r = httpx.post(srv.url + "/v1/chat/completions", json=structured, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        content = choice["message"]["content"]
        assert choice["finish_reason"] == "stop" and isinstance(json.loads(content)["n"], int)  # greedy: fixed


def test_the_hub_download_brings_tiktoken_model_and_never_the_wrapper(
    kimi_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, freetoken_env: Any
) -> None:
    """Through the real ``huggingface_hub`` client against the loopback Hub (tests/hub_server.py): the snapshot has
    ``tiktoken.model`` and loads; the wrapper's Python (a file that would fail if run) is not fetched."""
    from huggingface_hub import constants

    from freetoken.loader.hub import forget_resolved, resolve_model
    from hub_server import HubServer

    freetoken_env("FREETOKEN_CACHE", str(tmp_path / "ft"))
    home = tmp_path / "hf"
    with HubServer() as hub:
        hub.add("moonshotai/tiny-kimi", kimi_ckpt)  # tokenization_kimi.py included
        for k, v in {"HF_HOME": str(home), "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}.items():
            monkeypatch.setenv(k, v)
        for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            hub.url + "/{repo_id}/resolve/{revision}/{filename}")  # fmt: skip
        for k, v in {
            "HF_HOME": str(home),
            "HF_HUB_CACHE": str(home / "hub"),
            "HF_HUB_OFFLINE": False,
            "HF_TOKEN_PATH": str(home / "token"),
            "HF_STORED_TOKENS_PATH": str(home / "stored"),
        }.items():
            monkeypatch.setattr(constants, k, v)  # fmt: skip
        forget_resolved()
        path = resolve_model("moonshotai/tiny-kimi", lambda _: None)
        forget_resolved()
    names = {p.name for p in path.iterdir()}
    assert {"tiktoken.model", "tokenizer_config.json", "config.json"} <= names and "tokenization_kimi.py" not in names
    tok = load_tokenizer(path)
    assert tok is not None and tok.encode("<|im_end|>", add_special_tokens=False) == [tok.eos_token_id + 1]
