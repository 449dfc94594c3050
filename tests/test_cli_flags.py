"""The CLI's flags come from the config dataclasses (``config.add_config_args``): every flag the subcommands had
before that, with its default, is still there; every ``EngineConfig`` and ``ServerConfig`` field has a flag whose
help is the field's docstring; and what is parsed builds the configs back."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from freetoken.cli.main import build_parser
from freetoken.cli.serve import configs
from freetoken.config import OFF_HELP, EngineConfig, config_from_args, field_docs, flag_name
from freetoken.server.settings import ServerConfig

# (flag, default) of the engine's flags as the subcommands wired them by hand (before the flags were generated)
ENGINE_BEFORE = [
    ("--model", None), ("--device", None), ("--dtype", None), ("--moe-backend", "auto"), ("--expert-cache", None),
    ("--max-model-len", None), ("--max-running-requests", 4), ("--cpu-threads", None), ("--vram-budget", None),
    ("--vram-reserve", 1.0), ("--no-vram-watch", True), ("--pinned-budget", None), ("--state-checkpoints", None),
    ("--state-checkpoint-host-gib", None), ("--state-checkpoint-every", None), ("--verify", "background"),
    ("--no-verify", None),
]  # fmt: skip
BEFORE: dict[str, list[tuple[str, Any]]] = {
    "serve": ENGINE_BEFORE + [
        ("--host", "127.0.0.1"), ("--port", 1919), ("--api-key", None), ("--served-model-name", None),
        ("--tool-parser", None), ("--reasoning-parser", None), ("--max-body-bytes", 16777216),
        ("--responses-store", 64), ("--shutdown-timeout", 15.0), ("--allowed-hosts", ()), ("--cors-origins", ()),
        ("--log-level", "info"),
    ],
    "chat": ENGINE_BEFORE + [
        ("--system", None), ("--max-tokens", 512), ("--temperature", 0.0), ("--no-thinking", False),
    ],
    "generate": ENGINE_BEFORE + [
        ("--prompt", None), ("--max-tokens", 64), ("--temperature", 0.0), ("--top-p", 1.0), ("--top-k", 0),
        ("--seed", None), ("--chat", False),
    ],
    "bench e2e": [
        ("--preset", "qwen3-30b-a3b"), ("--layers", None), ("--model", None), ("--dir", None),
        ("--policies", "fused,offload,hybrid"), ("--expert-cache", 0.25), ("--cpu-threads", None), ("--batch", "1,4"),
        ("--tokens", 64), ("--warmup", 16), ("--prompt-tokens", 32), ("--temperature", 0.0), ("--repeats", 3),
        ("--routing-trace", None), ("--moe-only", True), ("--no-moe-only", True), ("--moe-steps", 128),
        ("--transformers", False), ("--cuda-graphs", True), ("--no-cuda-graphs", True), ("--overlap", None),
        ("--no-overlap", None), ("--device", None), ("--dtype", None), ("--json", None),
        ("--max-batched-tokens", 8192), ("--prefill-order", "auto"), ("--decode", True), ("--no-decode", True),
        ("--prefill-interleave-ms", None), ("--prefill", None), ("--itl-prompt", 0), ("--itl-streams", 3),
        ("--itl-solo-tokens", 16),
    ],
}  # fmt: skip


def _parser(command: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = build_parser()
    for word in command.split():
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices[word]
    return p


def _flags(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in p._actions for o in a.option_strings if not isinstance(a, argparse._HelpAction)}


@pytest.mark.parametrize("command", sorted(BEFORE))
def test_every_flag_stays_with_its_default(command: str) -> None:
    p = _parser(command)
    flags, shown = _flags(p), p.format_help()
    for flag, default in BEFORE[command]:
        assert flag in flags, f"ft {command}: {flag} is gone"
        assert flags[flag].default == default, (command, flag, flags[flag].default)
        assert flag in shown, f"ft {command} --help does not list {flag}"


@pytest.mark.parametrize("cls,command", [(EngineConfig, "serve"), (EngineConfig, "chat"), (ServerConfig, "serve")])
def test_every_config_field_has_a_flag_with_its_doc(cls: type, command: str) -> None:
    flags, docs = _flags(_parser(command)), field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name == "verify_weights":  # two flags, --verify and --no-verify, one dest
            assert flags["--verify"].dest == flags["--no-verify"].dest == f.name
            continue
        name = flag_name(f.name)
        flag = name if name in flags else "--no-" + name.removeprefix("--")  # a bool that defaults to True
        assert flag in flags, f"{cls.__name__}.{f.name} has no flag on ft {command}"
        doc = docs[f.name].replace("%", "%%")
        assert flags[flag].dest == f.name and flags[flag].help in (doc, OFF_HELP + doc), f.name


def test_generate_keeps_its_sampling_seed() -> None:
    """``ft generate --seed``: this prompt's sampling seed, not ``EngineConfig.seed``."""
    args = _parser("generate").parse_args(["--prompt", "hi", "--seed", "7"])
    assert args.seed == 7 and config_from_args(EngineConfig, args).seed == EngineConfig().seed


def test_parsed_flags_build_the_configs() -> None:
    argv = ["serve", "--expert-cache", "0.5", "--no-vram-watch", "--no-prefix-cache", "--page-size", "32",
            "--prefill-order", "layer", "--overlap-steps", "--no-verify", "--state-checkpoint-gib", "2",
            "--fill-fraction", "0.25", "--served-model-name", "a", "b", "--keepalive", "3", "--shutdown-timeout", "1",
            "--allowed-hosts", "x.example,y.example"]  # fmt: skip
    engine, server = configs(build_parser().parse_args(argv))
    assert engine == EngineConfig(expert_cache=0.5, vram_watch=False, prefix_cache=False, page_size=32,
                                  prefill_order="layer", overlap_steps=True, verify_weights="off",
                                  state_checkpoint_gib=2.0, fill_fraction=0.25)  # fmt: skip
    assert server == ServerConfig(served_model_names=("a", "b"), keepalive_s=3.0, shutdown_timeout_s=1.0,
                                  allowed_hosts=("x.example", "y.example"))  # fmt: skip
    assert configs(build_parser().parse_args(["serve"])) == (EngineConfig(), ServerConfig())
    assert isinstance(configs(build_parser().parse_args(["serve", "--expert-cache", "64"]))[0].expert_cache, int)


def test_bench_e2e_passes_its_engine_flags_on() -> None:
    from freetoken.config import config_kwargs

    args = build_parser().parse_args(["bench", "e2e", "--no-overlap", "--max-batched-tokens", "64"])
    assert config_kwargs(EngineConfig, args) == {
        "device": None, "dtype": None, "expert_cache": 0.25, "max_batched_tokens": 64, "prefill_order": "auto",
        "overlap_steps": False,
    }  # fmt: skip  (no prefill_interleave_ms: None there means the engine's)
