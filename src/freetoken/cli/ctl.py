"""``ft ctl``: talk to a running ``ft serve`` (health, models, engine stats, metrics; ``memory``: the live VRAM
split, or with ``--vram-budget GiB`` a new budget for the expert slots, KV pages and reserve)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

_ROUTES = {
    "health": "/health",
    "models": "/v1/models",
    "stats": "/v1/engine/stats",
    "metrics": "/metrics",
    "memory": "/v1/engine/stats",
}


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser("ctl", help="query a running server", description=__doc__)
    p.add_argument("what", choices=sorted(_ROUTES), help="what to ask for")
    p.add_argument("--server", default="http://127.0.0.1:1919", help="server URL")
    p.add_argument("--api-key", default=None, help="API key, if the server wants one")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer")
    p.add_argument("--vram-budget", type=float, default=None, metavar="GIB",
                   help="with 'memory': resize the engine to this VRAM budget (slots + KV pages + reserve)")
    p.add_argument("--reason", default="ft ctl memory", help="with --vram-budget: why (shown in the stats)")
    return p


def run(args: argparse.Namespace) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.server.rstrip("/") + _ROUTES[args.what]
    if args.vram_budget is not None and args.what != "memory":
        print("ft ctl: --vram-budget goes with 'memory'", file=sys.stderr)
        return 2
    try:
        if args.vram_budget is not None:
            body = {"vram_budget": args.vram_budget, "reason": args.reason}
            resp = httpx.post(args.server.rstrip("/") + "/v1/engine/memory", json=body, headers=headers,
                              timeout=args.timeout)  # fmt: skip
        else:
            resp = httpx.get(url, headers=headers, timeout=args.timeout)
    except httpx.HTTPError as exc:
        print(f"ft ctl: cannot reach {url}: {exc}", file=sys.stderr)
        return 2
    if args.what == "memory" and resp.status_code < 400:
        data = resp.json()
        print(json.dumps(data.get("memory", data.get("engine", {}).get("memory")), indent=2))
    elif args.what == "metrics":
        print(resp.text, end="")
    else:
        try:
            print(json.dumps(resp.json(), indent=2))
        except ValueError:
            print(resp.text)
    return 0 if resp.status_code < 400 else 1
