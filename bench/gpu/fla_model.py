"""Where do fla and the torch path part on the tiny bf16 hybrids (test_fla_gpu's model-level failures)? One model, fla
on; every DeltaNet prefill call runs fla's kernel and the torch reference (``_chunks``) on the same inputs and the same
initial states, both against a float64 token-by-token recurrence (the truth): each call's relative l2 errors with
its gates' magnitude. Last, the teacher-forced logits of fla's model vs the torch path's (the test's figure).
    PYTHONPATH=src:tests:/tmp/site python3 bench/gpu/fla_model.py [--family qwen3_next] [--seed 16]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict

import torch

from freetoken import LLM
from freetoken.config import env
from freetoken.kernels.gated_delta import heads, recurrent_gated_delta
from freetoken.layers.deltanet import GatedDeltaNet


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def truth(layer: GatedDeltaNet, convolved: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, seqs, init) -> tuple:
    """float64, token by token, every sequence from its initial state: core [T, H, dv] and the final states."""
    q, k, v = (t.double() for t in heads(convolved, layer.hk, layer.dk, layer.h))
    core, finals = torch.zeros(q.shape[0], layer.h, layer.dv, dtype=torch.float64, device=q.device), []
    for s, st in zip(seqs, init):
        st = st.double()[None]
        for t in range(s.q_start, s.q_start + s.q_len):
            o, st = recurrent_gated_delta(q[t][None], k[t][None], v[t][None], g[t][None].double(),
                                          beta[t][None].double(), st)  # fmt: skip
            core[t] = o[0]
        finals.append(st[0])
    return core, finals


ROWS: dict[int, list[tuple]] = defaultdict(list)


def patch() -> None:
    fla_chunks, torch_chunks = GatedDeltaNet._chunks_fla, GatedDeltaNet._chunks

    def both(self, fla, convolved, g, beta, seqs, states):
        ssm = states.ssm[self.layer]
        before = ssm.clone()
        slots = [s.state_slot for s in seqs]
        init = [torch.zeros_like(ssm[s.state_slot]) if s.start == 0 else ssm[s.state_slot].clone() for s in seqs]
        core_f = fla_chunks(self, fla, convolved, g, beta, seqs, states)
        after_f = ssm.clone()
        ssm.copy_(before)
        core_t = torch_chunks(self, convolved, g, beta, seqs, states)
        after_t = ssm.clone()
        ssm.copy_(after_f)  # the model goes on with fla's states
        core_x, finals = truth(self, convolved, g, beta, seqs, init)
        st_f = torch.stack([after_f[i] for i in slots]).double()
        st_t = torch.stack([after_t[i] for i in slots]).double()
        st_x = torch.stack(finals)
        cum = min(float(g[s.q_start : s.q_start + s.q_len].cumsum(0).min()) for s in seqs)
        ROWS[self.layer].append((
            [s.q_len for s in seqs], [s.start for s in seqs], float(g.min()), cum, float(beta.mean()),
            rel(core_f, core_x), rel(core_t, core_x), rel(core_f, core_t), rel(st_f, st_x), rel(st_t, st_x),
        ))
        return core_f

    GatedDeltaNet._chunks_fla = both  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="qwen3_next")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--lengths", default="1,9,30,200")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    from tiny_models import save_checkpoint

    d = tempfile.mkdtemp()
    save_checkpoint(args.family, d, seed=args.seed)
    g = torch.Generator().manual_seed(1000 + args.seed)
    prompts = [torch.randint(3, 512, (int(n),), generator=g).tolist() for n in args.lengths.split(",")]
    import os

    logits = {}
    for use_fla in (False, True):
        os.environ["FREETOKEN_FLA"] = "1" if use_fla else "0"
        env.cache_clear()  # read once per process: again for this model
        llm = LLM(model=d, device=args.device, dtype="bfloat16", moe_backend="fused", max_batched_tokens=64)
        mixers = [m.attn for m in llm.engine.runner.model.layers if isinstance(m.attn, GatedDeltaNet)]
        assert mixers and all((m.fla is not None) == use_fla for m in mixers), "fla-core not importable here?"
        if use_fla:
            patch()
        logits[use_fla] = [llm.engine.score(pr + pr[:16], chunk=64).float() for pr in prompts]
        del llm
        torch.cuda.empty_cache()
    print("| layer | lengths | starts | min g | min cum g | mean beta | fla core | torch core | fla-torch | fla state |"
          " torch state |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for layer, rows in sorted(ROWS.items()):
        for r in rows:
            print(f"| {layer} | {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.1f} | {r[4]:.2f} | "
                  + " | ".join(f"{x:.2e}" for x in r[5:]) + " |")
    print("| prompt tokens | teacher-forced logits, fla vs torch path (relative l2) |\n|---|---|")
    for pr, lt, lf in zip(prompts, logits[False], logits[True]):
        print(f"| {len(pr)} | {rel(lf, lt):.3e} |")


if __name__ == "__main__":
    main()
