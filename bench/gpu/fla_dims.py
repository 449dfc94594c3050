"""Which head dims and gate magnitudes does fla-core's gated delta rule get right here? gated_delta_fla.chunk against
the torch reference (float32) for dk, dv in 16..128 and per-token log decays down to -64 (random-init tiny models
draw A_log up to log 16: a chunk's summed decay reaches -1000), one sequence of 100 tokens from a random state.
The tiny hybrid checkpoints' fla-vs-torch model logits sat 0.04-0.33 apart (H100, 2026-12-05) while the kernel tests
at decays in [-0.5, 0] passed: this tells which of the two the kernel's error follows.
    PYTHONPATH=src python3 bench/gpu/fla_dims.py   (fla-core on the path: run.sh fla)"""
import time

import torch

from freetoken.kernels import gated_delta_fla
from freetoken.kernels.gated_delta import chunk_gated_delta, l2norm

fla = gated_delta_fla.kernels(torch.device("cuda"), torch.bfloat16)
assert fla is not None
CASES = [(dk, dv, 0.5) for dk, dv in [(16, 16), (32, 32), (64, 16), (16, 64), (64, 64), (128, 64)]]
CASES += [(dk, dv, scale) for dk, dv in [(16, 16), (128, 128)] for scale in (4.0, 16.0, 64.0)]
for dk, dv, scale in CASES:
    t0 = time.time()
    g = torch.Generator().manual_seed(dk + dv)
    T, hk, h = 100, 2, 4
    q, k = (torch.randn(T, hk, dk, generator=g).cuda().bfloat16() for _ in range(2))
    v = torch.randn(T, h, dv, generator=g).cuda().bfloat16()
    decay = -torch.rand(T, h, generator=g).cuda() * scale
    beta = torch.rand(T, h, generator=g).cuda()
    state = (torch.randn(1, h, dk, dv, generator=g) * 0.5).cuda()
    out, final = gated_delta_fla.chunk(fla, q, k, v, decay, beta, state, [T])
    rq = l2norm(q.float()).repeat_interleave(2, dim=1) * dk**-0.5
    rk = l2norm(k.float()).repeat_interleave(2, dim=1)
    ref, ref_state = chunk_gated_delta(rq, rk, v.float(), decay, beta, state[0])
    e_out = float((out.float() - ref).norm() / ref.norm())
    e_st = float((final[0] - ref_state).norm() / ref_state.norm())
    took = time.time() - t0
    what = f"dk {dk:3d} dv {dv:3d} decay >= -{scale:4.1f}"
    print(f"{what}: chunk out {e_out:.2e} state {e_st:.2e} ({took:.1f} s)", flush=True)
