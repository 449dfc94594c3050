"""``ft generate``: complete one prompt, streaming the text to stdout."""

from __future__ import annotations

import argparse
import sys

from freetoken.cli.common import load_engine, run_guarded
from freetoken.cli.flags import add_engine_args
from freetoken.cli.reply import ReplyPrinter
from freetoken.config import EngineConfig, config_from_args
from freetoken.runner.sampling_params import SamplingParams


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="complete a prompt", description="Complete one prompt and stream it.")
    add_engine_args(p, skip={"seed"})  # --seed: this prompt's sampling seed
    p.add_argument("--prompt", required=True, help="the text to complete")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's mass (default: %(default)s: off)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest (default: %(default)s: off)")
    p.add_argument("--seed", type=int, default=None, help="this prompt's sampling seed (default: none)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    return p


def run(args: argparse.Namespace) -> int:
    return run_guarded("generate", lambda: _generate(args))


def _generate(args: argparse.Namespace) -> int:

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        skip_special_tokens=not args.chat,  # --chat: the reasoning's markup reaches the reply's parser
    )
    engine = load_engine(config_from_args(EngineConfig, args))
    tok = engine.tokenizer
    if tok is None:
        raise ValueError(f"{args.model}: the checkpoint has no tokenizer; text prompts need one")
    if args.chat:
        ids = list(tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False))
    else:
        ids = tok.encode(args.prompt, add_special_tokens=False)
    engine.add_request("cli", ids, params)
    printer = ReplyPrinter(tok, engine.hf.model_type, ids) if args.chat else None  # the reasoning set apart
    while engine.has_unfinished():
        for out in engine.step():
            if printer is not None:
                printer.feed(out.new_text)
            else:
                sys.stdout.write(out.new_text)
                sys.stdout.flush()
    if printer is not None:
        printer.finish()
    else:
        sys.stdout.write("\n")
    return 0
