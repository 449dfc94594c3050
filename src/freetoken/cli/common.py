"""What the subcommands that load a model share: loading under a spinner; errors as one clear line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from freetoken.config import EngineConfig
from freetoken.errors import FreeTokenError


def load_engine(config: EngineConfig) -> Any:
    """The engine, loaded under a spinner on stderr (weights, then the CPU kernel's build on first use)."""
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from freetoken.checkpoint.ftw_progress import shown_elsewhere
    from freetoken.engine.engine import LLMEngine

    hf_logging.set_verbosity_error()  # a terminal command says its own lines, not the library's warnings
    fetch_model(config)
    with Console(stderr=True).status(f"loading {config.model or 'the default model'} …"), shown_elsewhere():
        return LLMEngine(config)


def fetch_model(config: EngineConfig) -> None:
    """A Hugging Face repo id on ``--model`` downloaded (or found in the cache) before the loading spinner starts,
    so the download's progress bar has the terminal to itself; the engine's own resolve then finds it."""
    if config.model:
        from freetoken.loader.hub import resolve_model

        resolve_model(config.model)


def run_guarded(command: str, body: Callable[[], int]) -> int:
    """Run a subcommand; bad input or a broken checkpoint prints one line and exits non-zero."""
    try:
        return body()
    except (FreeTokenError, ValueError, OSError) as e:
        print(f"ft {command}: error: {e}", file=sys.stderr)
        return 1
