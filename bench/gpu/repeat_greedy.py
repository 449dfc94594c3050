"""GPU box: wrong tokens that come only now and then (races between the device, the CPU branch and the host).

The hybrid reference test's batched case, over and over: a tiny random checkpoint of FAMILY (tests/tiny_models.py,
seed SEED), its three prompts (1, 9 and 30 tokens, decoded 16 greedy tokens each under a 16-token step budget: prefill
chunks beside decode rows, then 3 decode rows), a fresh engine per round, for SECONDS; every request whose tokens
differ from transformers' greedy tokens is printed (round, request, first wrong step, tokens), then a last line
``RESULT variant: wrong of requests``. Variants: fused, offload (cache 0.5), hybrid (cache 1.0, fill 0.5),
hybrid-eager (no step or layer graphs); ``--family qwen3_moe --seed 2``: a model without state slots, whose 3 rows
run in the 4-row graph with a pad repeating row 0. Run by ``bash bench/gpu/run.sh repeat`` (PYTHONPATH=src:tests),
one process per variant side by side: ``python3 bench/gpu/repeat_greedy.py VARIANT [--family F] [--seed S]
[--seconds N]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from freetoken import LLM, SamplingParams
from reference import LOGIT_MARGIN, ROUTER_MARGIN, reference_greedy
from tiny_models import save_checkpoint

VARIANTS = {
    "fused": dict(moe_backend="fused"),
    "offload": dict(moe_backend="offload", expert_cache=0.5),
    "hybrid": dict(moe_backend="hybrid", expert_cache=1.0, fill_fraction=0.5),
    "hybrid-eager": dict(moe_backend="hybrid", expert_cache=1.0, fill_fraction=0.5, cuda_graphs=False,
                         moe_cuda_graphs=False),
}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant", choices=sorted(VARIANTS))
    ap.add_argument("--family", default="qwen3_5_moe_vl", help="a tests/tiny_models.py family")
    ap.add_argument("--seed", type=int, default=12, help="the hybrid reference test's seed for qwen3_5_moe_vl")
    ap.add_argument("--seconds", type=float, default=240.0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads; the CPU branch gets one more")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = save_checkpoint(args.family, Path(tmp), seed=args.seed)
        g = torch.Generator().manual_seed(1000 + args.seed)
        prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (1, 9, 30)]
        refs = [reference_greedy(model, p, 16, 2) for p in prompts]
        margins = min(r.min_logit_margin for r in refs), min(r.min_router_margin for r in refs)
        if margins[0] <= LOGIT_MARGIN or margins[1] <= ROUTER_MARGIN:  # the near-tie rule (DESIGN §8)
            raise SystemExit(f"{args.family} seed {args.seed} has a near tie (logit, router margins {margins}): "
                             "pick another seed")  # fmt: skip
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        kw = dict(model=tmp, device="cuda", dtype="float32", max_batched_tokens=16, **VARIANTS[args.variant])
        if args.variant != "fused":
            kw["cpu_threads"] = args.threads + 1
        wrong = rounds = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            llm = LLM(**kw)
            outs = llm.generate([r.prompt for r in refs], params)
            rounds += 1
            for j, (o, r) in enumerate(zip(outs, refs)):
                if o.token_ids != r.tokens:
                    k = next(t for t in range(16) if o.token_ids[t] != r.tokens[t])
                    wrong += 1
                    print(json.dumps(dict(round=rounds, request=j, step=k, want=r.tokens[k], got=o.token_ids[k])))
            close = getattr(llm.engine.setup.loaded.backend, "close", None)
            if close is not None:
                close()
            del llm
    print(f"RESULT {args.variant}: {wrong} wrong of {3 * rounds} requests ({rounds} rounds, {args.family})")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
