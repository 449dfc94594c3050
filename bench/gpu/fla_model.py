"""Why fla's tiny bf16 hybrids' logits sat 0.02-0.46 from the torch path's (test_fla_gpu's model level, 2026-12-05).
Default (CUDA, fla-core importable): one model with fla; every DeltaNet prefill call runs fla's kernel and the torch
reference (``_chunks``) on the same inputs and initial states, both against the float64 recurrence of
``tests/test_fla_gpu.py``: each call's relative l2 errors with its gates' magnitude; last, the teacher-forced logits
of fla's model vs the torch path's. ``--noise R`` (any device, the torch path only): how far the logits move when
the DeltaNet output gets R of row-wise relative Gaussian noise, with the routing pinned to the clean run's experts
and without (the model's conditioning, which the kernel's bf16 error meets).
    PYTHONPATH=src:tests:/tmp/site python3 bench/gpu/fla_model.py [--family qwen3_next --seed 16] [--noise 4e-3]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from freetoken import LLM
from freetoken.bench.routing_trace import moe_layers
from freetoken.config import env
from freetoken.layers.deltanet import GatedDeltaNet
from test_fla_gpu import float64_recurrence

ROWS: list[tuple] = []


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


class Routes:
    """Records each MoE call's top-k experts, or takes another run's call by call (weights from this run's router)."""

    def __init__(self, top_k: int, pinned: Routes | None = None) -> None:
        self.top_k, self.pinned, self.calls = top_k, pinned, []

    def route(self, layer: int, probs: torch.Tensor, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]:
        ids = probs.topk(self.top_k, dim=-1).indices if self.pinned is None else self.pinned.calls[len(self.calls)]
        self.calls.append(ids)
        w = probs.gather(-1, ids)
        return ids, w / w.sum(dim=-1, keepdim=True) if norm_topk else w


def score(llm: LLM, seq: list[int], routes: Routes | None = None) -> torch.Tensor:
    for layer in moe_layers(llm.engine.setup.loaded.model):
        layer.router_override = routes
    return llm.engine.score(seq, chunk=64).float()


def both_paths() -> None:
    """From now on fla's calls also run the torch reference, both against the float64 recurrence (into ROWS)."""
    fla_chunks, torch_chunks = GatedDeltaNet._chunks_fla, GatedDeltaNet._chunks

    def both(self, fla, convolved, g, beta, seqs, states):
        ssm = states.ssm[self.layer]
        before, slots = ssm.clone(), [s.state_slot for s in seqs]
        init = [torch.zeros_like(ssm[s.state_slot]) if s.start == 0 else ssm[s.state_slot].clone() for s in seqs]
        core_f = fla_chunks(self, fla, convolved, g, beta, seqs, states)
        after_f = ssm.clone()
        ssm.copy_(before)
        core_t = torch_chunks(self, convolved, g, beta, seqs, states)
        st_t = ssm[slots].clone()
        ssm.copy_(after_f)  # the model goes on with fla's states
        core_x, st_x = float64_recurrence(self, convolved, g, beta, seqs, init)
        cum = min(float(g[s.q_start : s.q_start + s.q_len].cumsum(0).min()) for s in seqs)
        ROWS.append((self.layer, [s.q_len for s in seqs], [s.start for s in seqs], float(g.min()), cum,
                     rel(core_f, core_x), rel(core_t, core_x), rel(after_f[slots], st_x), rel(st_t, st_x)))  # fmt: skip
        return core_f

    GatedDeltaNet._chunks_fla = both  # type: ignore[method-assign]


def load(d: str, device: str, use_fla: bool) -> LLM:
    os.environ["FREETOKEN_FLA"] = "1" if use_fla else "0"
    env.cache_clear()  # read once per process: again for this model
    llm = LLM(model=d, device=device, dtype="bfloat16", moe_backend="fused", max_batched_tokens=64)
    mixers = [m.attn for m in llm.engine.runner.model.layers if isinstance(m.attn, GatedDeltaNet)]
    assert mixers and all((m.fla is not None) == use_fla for m in mixers), "fla-core not importable here?"
    return llm


def fla_vs_torch(d: str, device: str, prompts: list[list[int]]) -> None:
    logits = {}
    for use_fla in (False, True):
        llm = load(d, device, use_fla)
        if use_fla:
            both_paths()
        logits[use_fla] = [score(llm, pr + pr[:16]) for pr in prompts]
        del llm
    print("| layer | lengths | starts | min g | min cum g | fla out | torch out | fla state | torch state |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in sorted(ROWS, key=lambda r: r[0]):
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2f} | {r[4]:.1f} | " + " | ".join(f"{x:.2e}" for x in r[5:]) + " |")
    print("| prompt tokens | teacher-forced logits, fla vs torch path (relative l2) |\n|---|---|")
    for pr, lt, lf in zip(prompts, logits[False], logits[True]):
        print(f"| {len(pr)} | {rel(lf, lt):.3e} |")


def noise(d: str, device: str, prompts: list[list[int]], r: float) -> None:
    llm, clean = load(d, device, False), GatedDeltaNet._chunks
    gen = torch.Generator().manual_seed(5)

    def noisy(self, *a):
        c = clean(self, *a)
        scale = c.norm(dim=-1, keepdim=True) * c.shape[-1] ** -0.5 * r  # r of each row's RMS
        return c + torch.randn(c.shape, generator=gen).to(c.device) * scale

    print(f"| prompt tokens | logits moved by {r:g} row-wise noise: routing pinned | routing free |\n|---|---|---|")
    for pr in prompts:
        seq, ref = pr + pr[:16], Routes(llm.engine.hf.top_k)
        GatedDeltaNet._chunks = clean  # type: ignore[method-assign]
        want = score(llm, seq, ref)
        GatedDeltaNet._chunks = noisy  # type: ignore[method-assign]
        pinned, free = score(llm, seq, Routes(ref.top_k, pinned=ref)), score(llm, seq)
        print(f"| {len(pr)} | {rel(pinned, want):.3e} | {rel(free, want):.3e} |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="qwen3_next")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--lengths", default="1,9,30,200")
    p.add_argument("--device", default="cuda")
    p.add_argument("--noise", type=float, default=None)
    args = p.parse_args()
    from tiny_models import save_checkpoint

    d = tempfile.mkdtemp()
    save_checkpoint(args.family, d, seed=args.seed)
    g = torch.Generator().manual_seed(1000 + args.seed)
    prompts = [torch.randint(3, 512, (int(n),), generator=g).tolist() for n in args.lengths.split(",")]
    if args.noise is not None:
        noise(d, args.device, prompts, args.noise)
    else:
        fla_vs_torch(d, args.device, prompts)


if __name__ == "__main__":
    main()
