"""``ft serve``: the OpenAI- and Anthropic-compatible HTTP server (FastAPI + uvicorn, one process)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import TYPE_CHECKING, Any

from freetoken.cli.common import add_engine_args, engine_config, run_guarded
from freetoken.config import EngineConfig, field_docs
from freetoken.server.settings import ServerConfig

if TYPE_CHECKING:
    from freetoken.server.state import ServerState


def add_parser(sub: Any) -> argparse.ArgumentParser:
    s, d = field_docs(ServerConfig), ServerConfig()  # help and defaults come from the dataclass
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="serve a model over the OpenAI and Anthropic APIs", description=__doc__
    )
    add_engine_args(p)
    p.add_argument("--host", default=d.host, help=s["host"])
    p.add_argument("--port", type=int, default=d.port, help=s["port"])
    p.add_argument("--api-key", default=None, help=s["api_key"])
    p.add_argument("--served-model-name", nargs="+", default=None, help=s["served_model_names"])
    p.add_argument("--tool-parser", default=None, help=s["tool_parser"])
    p.add_argument("--reasoning-parser", default=None, help=s["reasoning_parser"])
    p.add_argument("--max-body-bytes", type=int, default=ServerConfig.max_body_bytes, help=s["max_body_bytes"])
    p.add_argument(
        "--shutdown-timeout", type=float, default=ServerConfig.shutdown_timeout_s, help=s["shutdown_timeout_s"]
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level")
    return p


def configs(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    engine = engine_config(args)
    server = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        served_model_names=tuple(args.served_model_name or ()),
        tool_parser=args.tool_parser,
        reasoning_parser=args.reasoning_parser,
        max_body_bytes=args.max_body_bytes,
        shutdown_timeout_s=args.shutdown_timeout,
    )
    return engine, server


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
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    return run_guarded("serve", lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.server import runner
    from freetoken.server.app import build_app

    engine_cfg, server_cfg = configs(args)
    app = build_app(lambda: AsyncLLM.start(engine_cfg), server_cfg, on_ready=announce)
    print(f"FreeToken: loading {engine_cfg.model or 'the default model'} …", file=sys.stderr, flush=True)
    runner.run(app, app.state.freetoken, log_level=args.log_level)
    return 0
