"""What the subcommands that load a model share: loading under a spinner; errors as one clear line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from freetoken.config import EngineConfig
from freetoken.errors import FreeTokenError


def load_engine(config: EngineConfig) -> Any:
    """The engine, loaded under a spinner on stderr naming its stage (``loading_stage``)."""
    import threading

    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from freetoken.checkpoint.ftw_progress import shown_elsewhere
    from freetoken.engine.engine import LLMEngine

    hf_logging.set_verbosity_error()  # a terminal command says its own lines, not the library's warnings
    fetch_model(config)
    what, done = config.model or "the default model", threading.Event()
    built: list[Any] = []

    def build() -> None:
        try:
            built.append(LLMEngine(config))
        except BaseException as e:  # raised again below, in the caller's thread
            built.append(e)
        finally:
            done.set()

    with Console(stderr=True).status(loading_stage(what, False)) as status, shown_elsewhere():
        threading.Thread(target=build, name="ft-load", daemon=True).start()
        read = False
        while not done.wait(0.25):
            read = read or current_read() is not None
            status.update(loading_stage(what, read))
    if isinstance(built[0], BaseException):
        raise built[0]
    return built[0]


def current_read() -> Any:
    from freetoken.checkpoint.ftw_progress import current

    return current()


def loading_stage(what: str, experts_read: bool) -> str:
    """The loading spinner's line: the experts' read with its bytes while it runs; before it the rest of the
    weights, after it the set-up (caches, the CPU expert kernel, built on its first use on this machine)."""
    p = current_read()
    if p is not None:
        return f"loading {what}: {p.describe()}"
    if experts_read:
        return f"loading {what}: setting up the caches and the CPU expert kernel (built once per machine) …"
    return f"loading {what}: reading the weights …"


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
