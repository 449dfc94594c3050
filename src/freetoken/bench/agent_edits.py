"""Re-prefilled tokens per turn of a scripted agent session under three harnesses' edits, through the HTTP server.

A coding-agent session (``agent_session.py``: a long system prompt with tool definitions, thinking, tool calls and
tool outputs) is replayed request by request through ``ft serve``'s app on loopback (OpenAI chat completions with
tools, one token per reply: its latency is the TTFT) as OpenClaw, OpenCode and SWE-agent edit it. Per turn: the
prompt, the new suffix (the minimum: the prompt past its longest common prefix with any earlier prompt of the
session), the tokens prefilled (``usage``: prompt minus cached tokens), with state checkpoints at the model's
anchors and on a fixed grid (``--grid`` tokens, like llama.cpp's ``--checkpoint-every-nb``). Default model: a tiny
random Qwen3.5-MoE (``tiny_hybrid.py``) on the CPU. Exits 1 when a turn with anchors re-prefilled more than its new
suffix and one page."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from freetoken.bench import agent_session as sessions
from freetoken.config import EngineConfig, add_config_args, config_from_args

if TYPE_CHECKING:  # the server's packages are imported only when a session runs (not on the GPU box's tests)
    from freetoken.bench.loopback import Running

MODES = ("anchors", "grid")


@dataclass(frozen=True)
class TurnRow:
    policy: str
    mode: str
    turn: int
    prompt: int  # tokens
    suffix: int  # the minimum to prefill: past the longest common prefix with an earlier prompt
    prefilled: int  # prompt - cached (usage), the tokens the engine computed
    ttft_s: float


# the engine's settings this command passes on as they are (both modes; 16 state checkpoints recycle the one
# OpenCode's deep prunes need: docs/benchmarks.md)
ENGINE_FLAGS = ("device", "dtype", "page_size", "state_checkpoints", "state_checkpoint_host_gib")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint directory (default: a tiny random Qwen3.5-MoE)")
    p.add_argument("--turns", type=int, default=14, help="requests in the session (>= 12 for the report)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies the lengths of thinking and tool outputs")
    p.add_argument("--policies", default=",".join(sessions.POLICIES), help="comma-separated harness edits")
    p.add_argument("--grid", type=int, default=512, help="the fixed grid's spacing in tokens (mode grid)")
    add_config_args(p, EngineConfig, only=ENGINE_FLAGS, defaults={"device": "cpu", "dtype": "float32"})
    p.add_argument("--json", default=None, help="also write every row to this file")


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def prompt_ids(running: Running, body: dict[str, Any]) -> list[int]:
    """The prompt the server makes of ``body`` (its own rendering, in process)."""
    from freetoken.server.openai.chat_completions import to_internal
    from freetoken.server.openai.protocol import ChatCompletionRequest

    gen = running.state.generation()
    return list(gen.prepare(to_internal(ChatCompletionRequest.model_validate(body))).prompt_ids)


def replay(
    running: Running, session: sessions.Session, messages: Callable[[int], list[dict[str, Any]]], policy: str,
    mode: str, turns: int,
) -> list[TurnRow]:  # fmt: skip
    from freetoken.bench.loopback import MODEL

    rows: list[TurnRow] = []
    earlier: list[list[int]] = []
    with httpx.Client(base_url=running.url, timeout=600) as client:
        for k in range(turns):
            body = {"model": MODEL, "messages": messages(k), "tools": session.tools, "max_tokens": 1,
                    "temperature": 0.0}  # fmt: skip
            ids = prompt_ids(running, body)
            t0 = time.perf_counter()
            r = client.post("/v1/chat/completions", json=body)
            ttft = time.perf_counter() - t0
            r.raise_for_status()
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] == len(ids), "the server rendered another prompt"
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            suffix = len(ids) - max((common_prefix(ids, e) for e in earlier), default=0)
            rows.append(TurnRow(policy, mode, k, len(ids), max(1, suffix), len(ids) - cached, ttft))
            earlier.append(ids)
    return rows


def engine_factory(model: str, mode: str, args: argparse.Namespace) -> Callable[[], Any]:
    from freetoken.engine.async_llm import AsyncLLM

    cfg = config_from_args(EngineConfig, args, model=model, max_model_len=16384, max_running_requests=1,
                           state_checkpoint_every=args.grid if mode == "grid" else None)  # fmt: skip
    return lambda: AsyncLLM.start(cfg)


def measure(model: str, session: sessions.Session, args: argparse.Namespace) -> list[TurnRow]:
    from freetoken.bench.loopback import serve

    rows: list[TurnRow] = []
    for policy in args.policies.split(","):
        for mode in MODES:
            with serve(engine_factory(model, mode, args)) as running:
                messages = sessions.POLICIES[policy](session)
                rows += replay(running, session, messages, policy, mode, args.turns)
    return rows


def over_bound(rows: list[TurnRow], page_size: int) -> list[TurnRow]:
    """Turns with anchors that re-prefilled more than their new suffix and one page."""
    return [r for r in rows if r.mode == "anchors" and r.prefilled > r.suffix + page_size]


def table(rows: list[TurnRow], policy: str) -> str:
    by = {(r.mode, r.turn): r for r in rows if r.policy == policy}
    turns = sorted({t for _, t in by})
    out = [f"**{policy}**", "",
           "| turn | prompt | new suffix (minimum) | prefilled, anchors | TTFT anchors (ms) | prefilled, grid "
           "| TTFT grid (ms) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in turns:
        a, g = by[("anchors", t)], by[("grid", t)]
        out.append(f"| {t + 1} | {a.prompt} | {a.suffix} | {a.prefilled} | {a.ttft_s * 1e3:.0f} | {g.prefilled} "
                   f"| {g.ttft_s * 1e3:.0f} |")  # fmt: skip
    tot = {m: sum(by[(m, t)].prefilled for t in turns[1:]) for m in MODES}
    out.append(f"| turns 2+ | | {sum(by[('anchors', t)].suffix for t in turns[1:])} | {tot['anchors']} | "
               f"| {tot['grid']} | |")  # fmt: skip
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    for p in args.policies.split(","):
        if p not in sessions.POLICIES:
            raise SystemExit(f"unknown policy {p!r}: one of {', '.join(sessions.POLICIES)}")
    session = sessions.build_session(args.turns, scale=args.scale)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from freetoken.bench.tiny_hybrid import save_checkpoint

            model = str(save_checkpoint(Path(tmp) / "tiny-qwen3.5-moe", session.texts()))
        rows = measure(model, session, args)
    for policy in args.policies.split(","):
        print(table(rows, policy), end="\n\n")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    bad = over_bound(rows, args.page_size)
    for r in bad:
        print(f"over the bound: {r.policy} turn {r.turn + 1}: prefilled {r.prefilled} > suffix {r.suffix} + page")
    return 1 if bad else 0
