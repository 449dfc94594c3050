"""Engine options shared by the subcommands that load a model; errors as one clear line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from freetoken.config import MOE_BACKENDS, EngineConfig, field_docs
from freetoken.errors import FreeTokenError


def expert_cache_arg(value: str) -> int | float:
    """``N`` slots or a fraction ``F`` in (0, 1]."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a slot count or a fraction, got {value!r}") from None


def add_engine_args(p: argparse.ArgumentParser, model_required: bool = False) -> None:
    e, d = field_docs(EngineConfig), EngineConfig()  # help and defaults come from the dataclass
    p.add_argument("--model", required=model_required, default=d.model, help=e["model"])
    p.add_argument("--device", default=d.device, help=e["device"])
    p.add_argument("--dtype", default=d.dtype, choices=["float32", "bfloat16", "float16"], help=e["dtype"])
    p.add_argument("--moe-backend", default=d.moe_backend, choices=MOE_BACKENDS, help=e["moe_backend"])
    p.add_argument("--expert-cache", type=expert_cache_arg, default=d.expert_cache, metavar="N|F",
                   help=e["expert_cache"])  # fmt: skip
    p.add_argument("--max-model-len", type=int, default=d.max_model_len, help=e["max_model_len"])
    p.add_argument("--max-running-requests", type=int, default=d.max_running_requests,
                   help=e["max_running_requests"])  # fmt: skip
    p.add_argument("--cpu-threads", type=int, default=d.cpu_threads, help=e["cpu_threads"])
    p.add_argument("--vram-budget", type=float, default=d.vram_budget, metavar="GIB", help=e["vram_budget"])
    p.add_argument("--vram-reserve", type=float, default=d.vram_reserve, metavar="GIB", help=e["vram_reserve"])
    p.add_argument("--no-vram-watch", dest="vram_watch", action="store_false", help=e["vram_watch"])
    p.add_argument("--pinned-budget", type=float, default=d.pinned_budget, metavar="GIB", help=e["pinned_budget"])
    p.add_argument("--state-checkpoints", type=int, default=d.state_checkpoints, help=e["state_checkpoints"])
    p.add_argument("--state-checkpoint-host-gib", type=float, default=d.state_checkpoint_host_gib, metavar="GIB",
                   help=e["state_checkpoint_host_gib"])  # fmt: skip
    p.add_argument("--state-checkpoint-every", type=int, default=d.state_checkpoint_every, metavar="TOKENS",
                   help=e["state_checkpoint_every"])  # fmt: skip
    p.add_argument("--verify", dest="verify_weights", action="store_const", const="load", default=d.verify_weights,
                   help="FTW checkpoints: check every checksum before serving (default: in the background once "
                        "serving starts)")  # fmt: skip
    p.add_argument("--no-verify", dest="verify_weights", action="store_const", const="off",
                   help="FTW checkpoints: do not check the checksums")  # fmt: skip


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        moe_backend=args.moe_backend,
        expert_cache=args.expert_cache,
        max_model_len=args.max_model_len,
        max_running_requests=args.max_running_requests,
        cpu_threads=args.cpu_threads,
        vram_budget=args.vram_budget,
        vram_reserve=args.vram_reserve,
        vram_watch=args.vram_watch,
        pinned_budget=args.pinned_budget,
        verify_weights=args.verify_weights,
        state_checkpoints=args.state_checkpoints,
        state_checkpoint_host_gib=args.state_checkpoint_host_gib,
        state_checkpoint_every=args.state_checkpoint_every,
    )


def load_engine(config: EngineConfig) -> Any:
    """The engine, loaded under a spinner on stderr (weights, then the CPU kernel's build on first use)."""
    from rich.console import Console

    from freetoken.checkpoint.ftw_progress import shown_elsewhere
    from freetoken.engine.engine import LLMEngine

    with Console(stderr=True).status(f"loading {config.model or 'the default model'} …"), shown_elsewhere():
        return LLMEngine(config)


def run_guarded(command: str, body: Callable[[], int]) -> int:
    """Run a subcommand; bad input or a broken checkpoint prints one line and exits non-zero."""
    try:
        return body()
    except (FreeTokenError, ValueError, OSError) as e:
        print(f"ft {command}: error: {e}", file=sys.stderr)
        return 1
