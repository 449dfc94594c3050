"""``ft serve``: the OpenAI- and Anthropic-compatible HTTP server (FastAPI + uvicorn, one process)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import TYPE_CHECKING, Any

from freetoken.cli.common import current_read, fetch_model, loading_stage, run_guarded
from freetoken.cli.flags import add_engine_args
from freetoken.config import EngineConfig, add_config_args, config_from_args
from freetoken.server.settings import ServerConfig

if TYPE_CHECKING:
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.server.state import ServerState

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="serve a model over the OpenAI and Anthropic APIs", description=__doc__
    )
    add_engine_args(p)
    add_config_args(p, ServerConfig)
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS,
                   help="log level; info and below show one access-log line per request")  # fmt: skip
    return p


def configs(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    return config_from_args(EngineConfig, args), config_from_args(ServerConfig, args)


def announce(state: ServerState) -> None:
    cfg = state.config
    url = f"http://{cfg.host}:{cfg.port}"
    body = {
        "model": state.model_names[0],
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 64,
    }
    auth = f" -H {shlex.quote('Authorization: Bearer ' + cfg.api_key)}" if cfg.api_key else ""
    print(f"FreeToken is serving {state.model_names[0]!r} at {url}  (OpenAI: {url}/v1, Anthropic: {url})")
    print(
        f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
        f"-d {shlex.quote(json.dumps(body))}",
    )
    print(f"  chat in a browser: {url}/", flush=True)


def run(args: argparse.Namespace) -> int:
    return run_guarded("serve", lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    """Settings checked, the port tried, the model loaded, and only then the port opened: a client never
    meets a server that cannot answer, and a model that cannot load ends ``ft serve`` with one line."""
    from freetoken.server import runner
    from freetoken.server.app import build_app
    from freetoken.server.browser import exposure_warning
    from freetoken.server.heap import pin_mmap_threshold

    engine_cfg, server_cfg = configs(args)
    pin_mmap_threshold()
    check_port(server_cfg.host, server_cfg.port)
    warning = exposure_warning(server_cfg.host, server_cfg.port, server_cfg.api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    setup_logging(args.log_level)
    engine = load(engine_cfg)
    app = build_app(engine, server_cfg, on_ready=announce)
    return runner.run(app, app.state.freetoken, log_level=args.log_level)  # 0: the shutdown drain completed


def check_port(host: str, port: int) -> None:
    """Refuses a port this process could not listen on, before minutes of loading."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def setup_logging(level: str) -> None:
    import logging

    name = "DEBUG" if level == "trace" else level.upper()
    logging.basicConfig(level=name, format="%(levelname)s:     %(name)s: %(message)s", stream=sys.stderr)


def load(config: EngineConfig) -> AsyncLLM:
    """The engine, loaded (a spinner on a terminal); a model that cannot load raises ``EngineDeadError``."""
    from rich.console import Console

    from freetoken.checkpoint import ftw_progress
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.engine.errors import EngineDeadError
    from freetoken.errors import FreeTokenError

    fetch_model(config)
    what = config.model or "the default model"
    console = Console(stderr=True)
    with console.status("FreeToken: " + loading_stage(what, False)) as status, ftw_progress.shown_elsewhere():
        engine = AsyncLLM.start(config)  # bank reads show in the spinner
        read = False
        while not engine.wait_loaded(timeout=0.25):
            read = read or current_read() is not None
            status.update("FreeToken: " + loading_stage(what, read))
    if engine.state != "ready":
        why = engine.load_failure
        said = str(why) if isinstance(why, (FreeTokenError, ValueError, OSError)) else engine.error
        raise EngineDeadError(f"cannot load {what}: {said}")
    console.print(f"FreeToken: loaded {what} (context {engine.max_model_len} tokens)", highlight=False)
    if engine.engine is not None:  # every share of the device and host memory, as one table
        console.print(engine.engine.memory.plan.table(), highlight=False, markup=False, soft_wrap=True)
    return engine
