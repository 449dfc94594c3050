"""GPU box: the step graph for every batch bucket (1, 2, 4, 8) x sampler feature set (greedy; temperature with
top-p/top-k/min-p; presence/frequency/repetition penalties; logprobs with top logprobs; seeds; grammar masks; one
row of each mixed), on a tiny Qwen3-MoE checkpoint (or ``--family``'s; written by the script, with its tokenizer) on
CUDA.

Run by `bash bench/gpu/run.sh graphs` (PYTHONPATH=src:tests): `python3 bench/gpu/graph_matrix.py [--backend fused]
[--tokens 8] [--top-k 2]`. One engine with step graphs and one without (the same requests in the same order) run
each case; a table row per case: bucket, feature set, decode steps, captures, replays, eager fallbacks (and their
reasons), whether replays == decode steps - captures, whether the tokens equal the eager engine's. Exit status 1
when any case has an eager fallback but a state checkpoint's (or a replay count or tokens that differ), else 0. About a
minute on an H200 (the kernels' compilation dominates)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from freetoken import LLM
from graph_cases import BUCKETS, FEATURES, HEADER, run_case
from tiny_models import _random_model, make_config, save_tokenizer


def write_checkpoint(d: Path, top_k: int, family: str = "qwen3_moe") -> None:
    """The tests' tiny ``family`` (Qwen3-MoE: 8 experts, top-2) or, for another top-k, one with 4 x top-k experts."""
    cfg = make_config(family)
    if top_k != cfg.num_experts_per_tok:
        cfg.num_experts, cfg.num_experts_per_tok = 4 * top_k, top_k
    _random_model(cfg, 1).save_pretrained(d)
    save_tokenizer(d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="fused", help="MoE backend (fused, offload, hybrid)")
    ap.add_argument("--tokens", type=int, default=8, help="tokens per request (the first comes from the prefill)")
    ap.add_argument("--top-k", type=int, default=2, help="routed experts per token (8: real models' top-k; 4x experts)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (no step graphs there)")
    ap.add_argument("--family", default="qwen3_moe", help="a tests/tiny_models.py family (qwen3_5_moe: state slots, a "
                    "graph per batch size; its state-checkpoint steps run eagerly by design)")  # fmt: skip
    args = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(Path(tmp), args.top_k, args.family)
        kw = dict(device=args.device, dtype="float32", moe_backend=args.backend, max_running_requests=max(BUCKETS),
                  expert_cache=None if args.backend == "fused" else 0.5)  # fmt: skip
        graphed, eager = LLM(tmp, cuda_graphs=True, **kw), LLM(tmp, cuda_graphs=False, **kw)
        cases = [run_case(graphed, eager, b, f, args.tokens) for b in BUCKETS for f in FEATURES]
        layer_failures = graphed.stats().get("moe_graph_failures", 0)  # the backend's own layer graphs
        for llm in (graphed, eager):
            close = getattr(llm.engine.setup.loaded.backend, "close", None)
            if close is not None:
                close()
    print(HEADER)
    for c in cases:
        print(c.row())
    bad = [c for c in cases if not c.ok]
    fallbacks = sum(c.fallbacks - c.by_design for c in cases)
    by_design = sum(c.by_design for c in cases)
    print(f"{args.family} {args.backend} top-{args.top_k}: {len(cases) - len(bad)}/{len(cases)} cases ok, {fallbacks} "
          f"eager fallbacks (+{by_design} state-checkpoint steps, eager by design), {layer_failures} failed MoE "
          f"layer-graph captures, {time.monotonic() - t0:.0f} s")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
