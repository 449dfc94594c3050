"""DeepSeek-V4's residual streams (manifold-constrained hyper-connections, mHC): the residual is ``n`` streams
[T, n, D] instead of one [T, D]. Before a block (attention or MoE) a small projection of the normed, flattened streams
gives three weights: ``pre`` [T, n] collapses the streams into the block's input, ``post`` [T, n] spreads the block's
output back over them, and ``comb`` [T, n, n] (made doubly stochastic by Sinkhorn-Knopp) mixes the old streams into
the new: ``new[k] = post[k] * out + sum_j comb[j, k] * streams[j]``. The head collapses them once more (``pre``
only) before the final norm. All weights are computed in float32 (transformers keeps these modules in float32)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from freetoken.kernels.triton_support import use_triton


def unweighted_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):  # one launch for ~5
        from freetoken.kernels.norm_triton import v4_rms_norm_triton

        return v4_rms_norm_triton(x, None, eps)
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


def v4_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """DeepSeek-V4's RMSNorm: float32 weights multiplied in float32, cast to x's dtype once at the end."""
    if use_triton(x):  # one launch for ~6
        from freetoken.kernels.norm_triton import v4_rms_norm_triton

        return v4_rms_norm_triton(x, weight, eps)
    h = x.float()
    return (weight.float() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def hc_weights_reference(
    mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int, hc_eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [T, n], post [T, n], comb [T, n, n]) from the streams' projection ``mix`` [T, (2 + n) n]: the sigmoids of
    the pre and post parts, and the comb part's row softmax made doubly stochastic by Sinkhorn-Knopp."""
    T = mix.shape[0]
    pre_w, post_w, comb_w = mix.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.split([n, n, n * n])
    s_pre, s_post, s_comb = scale.unbind(0)
    pre = torch.sigmoid(pre_w * s_pre + pre_b) + hc_eps
    post = 2 * torch.sigmoid(post_w * s_post + post_b)
    comb = torch.softmax(comb_w.view(T, n, n) * s_comb + comb_b.view(n, n), dim=-1) + hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_eps)
    return pre, post, comb


@dataclass
class HyperConnection:
    fn: torch.Tensor  # [(2 + n) * n, n * D] float32
    base: torch.Tensor  # [(2 + n) * n] float32
    scale: torch.Tensor  # [3] float32: pre, post, comb
    n: int
    iters: int  # Sinkhorn-Knopp iterations
    hc_eps: float
    eps: float  # the flattened streams' RMS norm

    def weights(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [T, n, D] -> (post [T, n], comb [T, n, n], collapsed [T, D]) (weights float32)."""
        T = streams.shape[0]
        mix = F.linear(unweighted_rms(streams.reshape(T, -1).float(), self.eps), self.fn)
        if use_triton(mix):  # one launch for the ~130 of the Sinkhorn loop's small ops
            from freetoken.kernels.hyper_triton import hc_weights_triton

            pre, post, comb = hc_weights_triton(mix, self.base, self.scale, self.n, self.iters, self.hc_eps)
        else:
            pre, post, comb = hc_weights_reference(mix, self.base, self.scale, self.n, self.iters, self.hc_eps)
        collapsed = (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
        return post, comb, collapsed

    @staticmethod
    def merge(streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """The new streams [T, n, D]: the block's output [T, D] spread by ``post``, the old streams mixed by ``comb``
        (its first index summed: comb transposed)."""
        dt = streams.dtype
        return post.to(dt).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dt).transpose(-1, -2), streams)


@dataclass
class HyperHead:
    fn: torch.Tensor  # [n, n * D] float32
    base: torch.Tensor  # [n] float32
    scale: torch.Tensor  # [1] float32
    hc_eps: float
    eps: float

    def collapse(self, streams: torch.Tensor) -> torch.Tensor:
        """streams [T, n, D] -> [T, D]."""
        flat = unweighted_rms(streams.reshape(streams.shape[0], -1).float(), self.eps)
        pre = torch.sigmoid(F.linear(flat, self.fn) * self.scale + self.base) + self.hc_eps
        return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
