"""``ft chat``: an interactive terminal chat that streams tokens, using the model's chat template."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from freetoken.cli.common import load_engine, run_guarded
from freetoken.cli.flags import add_engine_args
from freetoken.cli.reply import ReplyPrinter
from freetoken.config import EngineConfig, config_from_args
from freetoken.runner.sampling_params import SamplingParams

HELP = "Type a message; /reset clears the conversation, /help shows this, /exit (or Ctrl-D) quits."


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("chat", help="chat in the terminal", description="Chat with a model in the terminal.")
    add_engine_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-thinking", action="store_true", help="ask the template to skip thinking")
    return p


def run(args: argparse.Namespace) -> int:
    return run_guarded("chat", lambda: _chat(args))


def _turn(engine: Any, ids: list[int], params: SamplingParams, turn: int) -> str:
    """Streams one reply (its reasoning set apart); returns the answer."""
    engine.add_request(f"chat-{turn}", ids, params)
    printer = ReplyPrinter(engine.tokenizer, engine.hf.model_type, ids)
    while engine.has_unfinished():
        for out in engine.step():
            printer.feed(out.new_text)
    return printer.finish()


def _chat(args: argparse.Namespace) -> int:

    engine = load_engine(config_from_args(EngineConfig, args))
    tok = engine.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError("the checkpoint has no tokenizer with a chat template")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, skip_special_tokens=False)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages: list[dict[str, str]] = list(system)
    print(HELP, file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input("> ")
        except EOFError:
            return 0
        command = line.strip()
        if command == "/exit":
            return 0
        if command == "/reset":
            messages = list(system)
            print("(conversation cleared)", file=sys.stderr)
            continue
        if command.startswith("/") and " " not in command:  # a command, never a message to the model
            print(HELP if command == "/help" else f"unknown command {command}; {HELP}", file=sys.stderr)
            continue
        if not command:
            continue
        messages.append({"role": "user", "content": line})
        kwargs = {"enable_thinking": False} if args.no_thinking else {}
        ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=False, **kwargs))
        if len(ids) >= engine.max_model_len:
            print(f"(conversation too long: {len(ids)} tokens >= {engine.max_model_len}; /reset)", file=sys.stderr)
            messages.pop()
            continue
        reply = _turn(engine, ids, params, turn)
        turn += 1
        messages.append({"role": "assistant", "content": reply})
