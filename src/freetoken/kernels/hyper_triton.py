"""DeepSeek-V4's hyper-connection weights (``layers/hyper_connections.py``) in one Triton launch per call, for CUDA.

From the projection ``mix`` [T, (2 + n) n] of the flattened streams, per token: ``pre = sigmoid(pre_w s_pre + pre_b)
+ eps``, ``post = 2 sigmoid(post_w s_post + post_b)`` and ``comb``: a softmax over each row of ``comb_w s_comb +
comb_b`` [n, n], plus eps, made doubly stochastic by Sinkhorn-Knopp (columns, then ``iters - 1`` times rows and
columns). The torch version (``hc_weights_reference``) is 6 launches per iteration (a sum, an add, a division per
direction), 20 iterations: ~130 launches per call, two calls per layer, each a few microseconds of GPU time in a
replayed step graph for a [T, 4, 4] tensor. Here a program holds one token's n x n matrix in registers. Same
float32 arithmetic; sums of n terms may round in another order (last bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _hc_weights_kernel(MIX, BASE, SCALE, PRE, POST, COMB, n, stride, iters, eps, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    vec = i < n
    row = MIX + t * stride
    s_pre, s_post, s_comb = tl.load(SCALE), tl.load(SCALE + 1), tl.load(SCALE + 2)
    pre = tl.load(row + i, mask=vec, other=0.0) * s_pre + tl.load(BASE + i, mask=vec, other=0.0)
    tl.store(PRE + t * n + i, tl.sigmoid(pre) + eps, mask=vec)
    post = tl.load(row + n + i, mask=vec, other=0.0) * s_post + tl.load(BASE + n + i, mask=vec, other=0.0)
    tl.store(POST + t * n + i, 2 * tl.sigmoid(post), mask=vec)
    r, c = i[:, None], i[None, :]
    m = (r < n) & (c < n)
    at = 2 * n + r * n + c
    x = tl.load(row + at, mask=m, other=0.0) * s_comb + tl.load(BASE + at, mask=m, other=0.0)
    x = tl.where(m, x, -1e30)  # not -inf: a row past n would make inf - inf (its values are dropped anyway)
    e = tl.where(m, tl.exp(x - tl.max(x, axis=1)[:, None]), 0.0)
    den = tl.sum(e, axis=1)  # >= 1 on the rows below n; 0 past them, which divide by 1 instead
    comb = tl.where(m, e / tl.where(den > 0, den, 1.0)[:, None] + eps, 0.0)
    comb = comb / (tl.sum(comb, axis=0)[None, :] + eps)
    for _ in range(iters - 1):
        comb = comb / (tl.sum(comb, axis=1)[:, None] + eps)
        comb = comb / (tl.sum(comb, axis=0)[None, :] + eps)
    tl.store(COMB + t * n * n + r * n + c, comb, mask=m)


def hc_weights_triton(
    mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [T, n], post [T, n], comb [T, n, n]) float32 from ``mix`` [T, (2 + n) n] float32 (rows contiguous),
    ``base`` [(2 + n) n] and ``scale`` [3] (pre, post, comb)."""
    T, width = mix.shape
    if width != (2 + n) * n or mix.stride(1) != 1 or base.numel() != width or scale.numel() != 3 or iters < 1:
        raise ValueError(f"hyper-connection weights: mix {tuple(mix.shape)} for n={n}, iters={iters}")
    pre = torch.empty((T, n), dtype=torch.float32, device=mix.device)
    post = torch.empty_like(pre)
    comb = torch.empty((T, n, n), dtype=torch.float32, device=mix.device)
    if T:
        _hc_weights_kernel[(T,)](
            mix, base.float().contiguous(), scale.float().contiguous(), pre, post, comb, n, mix.stride(0), iters, eps,
            BLOCK=triton.next_power_of_2(n),
        )  # fmt: skip
    return pre, post, comb
