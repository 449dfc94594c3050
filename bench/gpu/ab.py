"""Two source trees side by side on the same machine: ``ft bench e2e`` from each in alternating runs (before, after;
after, before; ...), one process a run, and the median of each row's end-to-end tok/s over the rounds with the
ratio after / before. What a refactor must show: no row slower (``--floor``, default 0.97).

    python3 bench/gpu/ab.py --before .before --after . --rounds 3 -- --preset qwen3-30b-a3b --layers 12 \\
        --policies fused,hybrid --cpu-threads 6,16 --batch 1,4

Each tree's ``src`` leads its runs' PYTHONPATH (what else PYTHONPATH holds follows); the e2e arguments after ``--``
go to both, with ``--repeats 1 --json`` added (the rounds are the repeats)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

Key = tuple[str, int | None, int]  # (policy, CPU threads, batch)


def run_once(tree: Path, e2e_args: list[str], log: Path) -> dict[Key, float]:
    """One ``freetoken.bench.e2e`` process from ``tree``: its rows' end-to-end tok/s."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree / "src"), os.environ.get("PYTHONPATH")])))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, "-m", "freetoken.bench.e2e", *e2e_args, "--repeats", "1", "--json", str(out)]
    with log.open("a") as sink:
        sink.write(f"\n$ ({tree}) {' '.join(cmd)}\n")
        sink.flush()
        subprocess.run(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, check=True)
    rows = json.loads(out.read_text())["rows"]
    out.unlink()
    return {(r["policy"], r["threads"], r["batch"]): float(r["e2e_tok_s"]) for r in rows}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--floor", type=float, default=0.97, help="the lowest after/before ratio a row may have")
    p.add_argument("--log", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "ab.log")
    args, e2e_args = p.parse_args(argv[:cut]), argv[cut + 1 :]
    runs: dict[str, dict[Key, list[float]]] = {"before": {}, "after": {}}
    done = 0
    try:  # SIGINT (a time limit): the table of the rounds done so far
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for side in order:
                for key, tok_s in run_once(getattr(args, side), e2e_args, args.log).items():
                    runs[side].setdefault(key, []).append(tok_s)
                print(f"round {r + 1} {side} done", file=sys.stderr, flush=True)
            done = r + 1
    except KeyboardInterrupt:
        print(f"interrupted after {done} whole round(s)", flush=True)
    return _table(runs, done, args.floor)


def _table(runs: dict[str, dict[Key, list[float]]], rounds: int, floor: float) -> int:
    worst = float("inf")
    print(f"{'policy':<10} {'threads':>7} {'batch':>5} {'before tok/s':>12} {'after tok/s':>12} {'after/before':>12}")
    for key in sorted(runs["before"], key=str):
        if not runs["after"].get(key):
            continue
        b, a = statistics.median(runs["before"][key]), statistics.median(runs["after"][key])
        worst = min(worst, a / b)
        policy, threads, batch = key
        print(f"{policy:<10} {threads or '-'!s:>7} {batch:>5} {b:>12.2f} {a:>12.2f} {a / b:>12.3f}")
    print(f"medians of {rounds} whole round(s) a side, alternating; worst row {worst:.3f} (floor {floor})")
    return 0 if worst >= floor else 1


if __name__ == "__main__":
    raise SystemExit(main())
