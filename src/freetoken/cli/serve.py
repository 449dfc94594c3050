"""``ft serve``: the OpenAI- and Anthropic-compatible HTTP server (FastAPI + uvicorn, one process)."""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import shlex
import sys
from typing import TYPE_CHECKING, Any

from freetoken.config import MOE_BACKENDS, EngineConfig
from freetoken.server.settings import ServerConfig

if TYPE_CHECKING:
    from freetoken.server.state import ServerState


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (they become ``--help`` text)."""
    docs: dict[str, str] = {}
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        doc = nxt.value if isinstance(nxt, ast.Expr) else None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(doc, ast.Constant):
            docs[node.target.id] = str(doc.value)
    return docs


def cache_size(text: str) -> int | float:
    """``--expert-cache``: a slot count (``64``) or a fraction of the pool (``0.25``)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    e, s = field_docs(EngineConfig), field_docs(ServerConfig)
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="serve a model over the OpenAI and Anthropic APIs", description=__doc__
    )
    p.add_argument("--model", default=None, help=e["model"])
    p.add_argument("--host", default="127.0.0.1", help=s["host"])
    p.add_argument("--port", type=int, default=1919, help=s["port"])
    p.add_argument("--device", default=None, help=e["device"])
    p.add_argument("--dtype", default=None, help=e["dtype"])
    p.add_argument("--moe-backend", default="auto", choices=MOE_BACKENDS, help=e["moe_backend"])
    p.add_argument("--expert-cache", type=cache_size, default=None, metavar="N|F", help=e["expert_cache"])
    p.add_argument("--max-model-len", type=int, default=None, help=e["max_model_len"])
    p.add_argument("--max-running-requests", type=int, default=4, help=e["max_running_requests"])
    p.add_argument("--api-key", default=None, help=s["api_key"])
    p.add_argument("--served-model-name", nargs="+", default=None, help=s["served_model_names"])
    p.add_argument("--tool-parser", default=None, help=s["tool_parser"])
    p.add_argument("--reasoning-parser", default=None, help=s["reasoning_parser"])
    p.add_argument("--log-level", default="warning", help="uvicorn log level")
    return p


def configs(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    engine = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        moe_backend=args.moe_backend,
        expert_cache=args.expert_cache,
        max_model_len=args.max_model_len,
        max_running_requests=args.max_running_requests,
    )
    server = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        served_model_names=tuple(args.served_model_name or ()),
        tool_parser=args.tool_parser,
        reasoning_parser=args.reasoning_parser,
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
    import uvicorn

    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.server.app import build_app

    engine_cfg, server_cfg = configs(args)
    app = build_app(lambda: AsyncLLM.start(engine_cfg), server_cfg, on_ready=announce)
    print(f"FreeToken: loading {engine_cfg.model or 'the default model'} …", file=sys.stderr, flush=True)
    # On Ctrl-C uvicorn stops accepting, lets running requests finish for up to 15 s, then cancels
    # them (which aborts their engine requests); the lifespan then shuts the engine down.
    config = uvicorn.Config(
        app,
        host=server_cfg.host,
        port=server_cfg.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=15,
    )
    try:
        uvicorn.Server(config).run()
    except KeyboardInterrupt:  # uvicorn re-raises the signal after its graceful shutdown
        pass
    return 0
