"""``ft convert SRC DST``: write a checkpoint in FTW, the pre-banked weight format (the expert banks in the host
pool's own layout, read straight into place at start: ``LLM(DST)``, ``ft serve --model DST``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from freetoken.cli.common import run_guarded


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser("convert", help="convert a checkpoint to FTW (fast start)",
                                                description=__doc__)  # fmt: skip
    p.add_argument("src", help="a Hugging Face checkpoint directory")
    p.add_argument("dst", help="the FTW directory to write (new or empty)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="dtype of unquantised expert banks (default: as stored); serving in another dtype converts "
                        "them while loading")  # fmt: skip
    p.add_argument("--layers-per-file", type=int, default=8,
                   help="MoE layers per bank file (0: one file per bank)")  # fmt: skip
    return p


def run(args: argparse.Namespace) -> int:
    return run_guarded("convert", lambda: _convert(args))


def _convert(args: argparse.Namespace) -> int:
    from rich.console import Console

    from freetoken.loader.ftw_convert import convert

    console = Console(stderr=True)
    with console.status(f"converting {args.src} to FTW …"):
        m = convert(args.src, args.dst, args.dtype, args.layers_per_file)
    files = sum(len(b.parts) for b in m.banks) + len(m.files)
    kind = m.expert_format if m.expert_format != "bf16" else f"unquantised ({m.banks[0].dtype})"
    print(f"wrote {args.dst}: {m.bank_bytes / 1e9:.2f} GB of {kind} expert banks in {files} files "
          f"(serve it with: ft serve --model {args.dst})", file=sys.stderr)  # fmt: skip
    return 0
