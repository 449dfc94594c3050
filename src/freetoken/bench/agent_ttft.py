"""A coding agent's first request and its next turn, through ``ft serve``'s Anthropic Messages API (issue #37's
"37k-token Claude-Code-shaped first request: TTFT, then the next turn with its prefix reused").

``python -m freetoken.bench.agent_ttft``. Starts ``ft serve`` on loopback (``http_ttft``'s helpers), then sends what
Claude Code's first request looks like: a system prompt as text blocks, tool definitions with long descriptions and
JSON schemas, and one user message holding a ``<system-reminder>`` (the project's memory file) and the task, sized
to ``--prompt-tokens`` by the server's own ``/v1/messages/count_tokens`` (random vocabulary text fills the memory
file). The next turn appends the model's reply (as an assistant turn: the text it streamed, or a fixed tool call when
it streamed none) and a ``tool_result`` of about ``--next-tokens`` tokens: everything before it is the first
request's prompt, which the engine's prefix cache holds. TTFT: from sending a request to its first content event
(``content_block_start``; ``message_start`` and ``ping`` do not count). Streaming, greedy.

    python -m freetoken.bench.agent_ttft --model /tmp/v2full --device cpu --prompt-tokens 37000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from freetoken.bench.http_ttft import add_server_arguments, free_port, prompt_text, start_server, wait_ready

TOOLS = 16  # Claude Code's first request declares 15-20 tools
TOOL_DESCRIPTION_TOKENS = 600  # each with a long description (its instructions for the tool)


@dataclass
class AgentTTFT:
    first_prompt_tokens: int  # the server's count (usage.input_tokens + cache_read_input_tokens)
    first_ttft_s: float
    next_prompt_tokens: int
    next_cached_tokens: int  # the prefix the engine reused (usage.cache_read_input_tokens)
    next_ttft_s: float


def first_request(tok_json: Path, filler_tokens: int, seed: int = 0) -> dict[str, Any]:
    """Claude Code's first request, shaped: system blocks, TOOLS tools, a reminder with ``filler_tokens`` of memory.
    Requests of different seeds share no prefix (the warm-up leaves nothing in the prefix cache for the timed one)."""
    tools = [
        {
            "name": f"tool_{i}",
            "description": prompt_text(tok_json, TOOL_DESCRIPTION_TOKENS, 1000 * seed + 100 + i),
            "input_schema": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The absolute path of the file"},
                    "pattern": {"type": "string", "description": "A regular expression"},
                    "limit": {"type": "integer", "description": "At most this many lines"},
                },
                "required": ["path"],
            },
        }
        for i in range(TOOLS)
    ]
    system = [
        {"type": "text", "text": f"Session {seed}. You are an interactive command line tool for software tasks."},
        {"type": "text", "text": prompt_text(tok_json, 2000, 1000 * seed + 1)},
    ]
    memory = prompt_text(tok_json, filler_tokens, 1000 * seed + 2) if filler_tokens > 0 else ""
    user = [
        {"type": "text", "text": f"<system-reminder>\nContents of CLAUDE.md:\n{memory}\n</system-reminder>"},
        {"type": "text", "text": "Create hello.py that prints hi, then run it."},
    ]
    return {"model": "bench", "max_tokens": 16, "temperature": 0.0, "system": system, "tools": tools,
            "messages": [{"role": "user", "content": user}]}  # fmt: skip


def count_tokens(url: str, body: dict[str, Any]) -> int:
    import httpx

    keys = ("model", "system", "tools", "messages")
    r = httpx.post(url + "/v1/messages/count_tokens", json={k: body[k] for k in keys}, timeout=600)
    r.raise_for_status()
    return int(r.json()["input_tokens"])


def stream(url: str, body: dict[str, Any]) -> tuple[float, str, dict[str, int]]:
    """One streamed request: seconds to its first content event, the text it streamed, its final usage."""
    import httpx

    t0, ttft, text, usage = time.perf_counter(), float("nan"), "", {}
    with httpx.stream("POST", url + "/v1/messages", json={**body, "stream": True}, timeout=900) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            kind = ev.get("type")
            if kind == "content_block_start" and ttft != ttft:  # NaN: the first one
                ttft = time.perf_counter() - t0
            elif kind == "content_block_delta" and ev["delta"].get("type") == "text_delta":
                text += ev["delta"]["text"]
            elif kind == "message_start":
                usage = dict(ev["message"]["usage"])
            elif kind == "message_delta":
                usage.update(ev.get("usage", {}))
            elif kind == "error":
                raise RuntimeError(f"stream error: {ev}")
    return ttft, text, usage


def next_turn(body: dict[str, Any], reply: str, tok_json: Path, tokens: int) -> dict[str, Any]:
    """The first request, the model's reply as the assistant turn, and a tool result of about ``tokens`` tokens."""
    call = {"type": "tool_use", "id": "toolu_bench_1", "name": "tool_0", "input": {"path": "/repo/hello.py"}}
    assistant = ([{"type": "text", "text": reply}] if reply.strip() else []) + [call]
    result = {"type": "tool_result", "tool_use_id": "toolu_bench_1", "content": prompt_text(tok_json, tokens, 3)}
    messages = [*body["messages"], {"role": "assistant", "content": assistant}, {"role": "user", "content": [result]}]
    return {**body, "messages": messages}


def measure(args: argparse.Namespace) -> AgentTTFT:
    from freetoken.loader.model_setup import default_model_path

    path = default_model_path() if args.model == "default" else Path(args.model)
    tok_json = path / "tokenizer.json"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    opts = ("policy", "expert_cache", "device", "dtype", "cpu_threads", "max_model_len")
    serve = argparse.Namespace(clients=1, **{k: getattr(args, k) for k in opts})  # start_server's options
    with Path(args.server_log).open("wb") as log:
        proc = start_server(path, serve, port, log)
        try:
            wait_ready(url, proc, args.start_timeout)
            stream(url, first_request(tok_json, 0, seed=1))  # warm-up (first runs of the shapes), untimed
            fixed = count_tokens(url, first_request(tok_json, 0))  # counted, not run
            body = first_request(tok_json, max(0, args.prompt_tokens - fixed))
            ttft1, reply, u1 = stream(url, body)
            nxt = next_turn(body, reply, tok_json, args.next_tokens)
            ttft2, _, u2 = stream(url, nxt)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except Exception:
                proc.kill()
    total = lambda u: int(u.get("input_tokens", 0)) + int(u.get("cache_read_input_tokens", 0))  # noqa: E731
    return AgentTTFT(total(u1), ttft1, total(u2), int(u2.get("cache_read_input_tokens", 0)), ttft2)


def run(args: argparse.Namespace) -> int:
    row = measure(args)
    print("| first request tokens | TTFT s | next turn tokens (reused) | next turn TTFT s |")
    print("|---|---|---|---|")
    print(f"| {row.first_prompt_tokens} | {row.first_ttft_s:.2f} | {row.next_prompt_tokens} "
          f"({row.next_cached_tokens}) | {row.next_ttft_s:.2f} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(row), indent=1))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model", default="default", help="a checkpoint directory with a tokenizer ('default': embedded)")
    p.add_argument("--prompt-tokens", type=int, default=37000, help="the first request's size (server's count)")
    p.add_argument("--next-tokens", type=int, default=300, help="the next turn's tool result, about")
    return add_server_arguments(p, "auto", "/tmp/ft-agent-ttft-server.log")


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="ft bench agent-ttft", description=__doc__.split("\n")[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
