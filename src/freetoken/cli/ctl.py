"""``ft ctl``: talk to a running ``ft serve`` (health, models, engine stats)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

_ROUTES = {"health": "/health", "models": "/v1/models", "stats": "/v1/engine/stats", "metrics": "/metrics"}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser("ctl", help="query a running server", description=__doc__)
    p.add_argument("what", choices=sorted(_ROUTES), help="what to ask for")
    p.add_argument("--server", default="http://127.0.0.1:1919", help="server URL")
    p.add_argument("--api-key", default=None, help="API key, if the server wants one")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an answer")
    return p


def run(args: argparse.Namespace) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.server.rstrip("/") + _ROUTES[args.what]
    try:
        resp = httpx.get(url, headers=headers, timeout=args.timeout)
    except httpx.HTTPError as exc:
        print(f"ft ctl: cannot reach {url}: {exc}", file=sys.stderr)
        return 2
    if args.what == "metrics":
        print(resp.text, end="")
    else:
        try:
            print(json.dumps(resp.json(), indent=2))
        except ValueError:
            print(resp.text)
    return 0 if resp.status_code < 400 else 1
