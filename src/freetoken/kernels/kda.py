"""Kimi Delta Attention (KDA, Kimi-Linear) in torch: the gated delta rule with a decay per key channel instead of per
head. The reference every faster kernel is to be checked against, and the path on every device for now (fla's
``chunk_kda`` / ``fused_recurrent_kda`` on CUDA are a follow-up).

Per head, with a state S [dk, dv] (float32): ``S <- diag(exp(g)) S`` (g [dk], the log decay of each key channel);
``S <- S + k ⊗ beta * (v - S^T k)``; ``o = S^T q``. ``chunk_kda`` computes a sequence chunk by chunk: inside a chunk
of c tokens, with G the decay's running sum from the chunk's start, ``u = (I + M)^-1 (beta v - beta (e^G ⊙ k) S0)``
where ``M[i, j] = beta_i <k_i, k_j ⊙ e^(G_i - G_j)>`` (j < i), then ``o = (e^G ⊙ q) S0 + Q u`` with
``Q[i, j] = <q_i, k_j ⊙ e^(G_i - G_j)>`` (j <= i), and the state ``e^G_last ⊙ S0 + sum_j (k_j ⊙ e^(G_last - G_j)) u_j``.
Every exponent is a decay over a span, never a growth, so no chunk overflows whatever the decays (the pairwise
[c, c, dk] factors are why chunks are small). Shapes: n tokens, B sequences, H heads, dk / dv key / value head dims;
q and k L2-normalised, q scaled by dk^-0.5 (``gated_delta.heads``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.kernels.gated_delta import causal_conv_step, heads

CHUNK = 16


def kda_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The forget gate's logits f [n, H*dk] -> the log decay ``-exp(A_log) * softplus(f + dt_bias)`` [n, H, dk]
    float32 (A_log [H], dt_bias [H*dk] float32)."""
    g = F.softplus(f.float() + dt_bias)  # threshold 20: x above it, as the reference's ``where(g > 20, g, ...)``
    return -A_log.exp()[:, None] * g.view(f.shape[0], num_heads, -1)


def chunk_kda(
    q: torch.Tensor,  # [n, H, dk] float32
    k: torch.Tensor,  # [n, H, dk]
    v: torch.Tensor,  # [n, H, dv]
    g: torch.Tensor,  # [n, H, dk] log decay (<= 0)
    beta: torch.Tensor,  # [n, H]
    state: torch.Tensor,  # [H, dk, dv] the state before the first token
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [n, H, dv], the state after the last token
    n = q.shape[0]
    out = torch.empty((n, q.shape[1], v.shape[-1]), dtype=torch.float32, device=q.device)
    s = state.float()
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        qc, kc, vc, gc, bc = (t[a:b].transpose(0, 1).float() for t in (q, k, v, g, beta))  # heads first
        out[a:b], s = _chunk(qc, kc, vc, gc, bc, s)
    return out, s


def _chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, s: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk, heads first: q, k, g [H, c, dk], v [H, c, dv], beta [H, c], s [H, dk, dv] -> (out [c, H, dv], the
    state after it)."""
    c = q.shape[1]
    G = g.cumsum(dim=1)  # [H, c, dk]
    later = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)  # j > i
    diff = (G[:, :, None, :] - G[:, None, :, :]).masked_fill(later[None, :, :, None], float("-inf"))
    pair = diff.exp()  # [H, c(i), c(j), dk]: e^(G_i - G_j) for j <= i, else 0
    kk = (k[:, :, None, :] * k[:, None, :, :] * pair).sum(-1)  # [H, c, c] <k_i, k_j ⊙ e^(G_i - G_j)>
    qk = (q[:, :, None, :] * k[:, None, :, :] * pair).sum(-1)
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    lower = eye + beta[..., None] * kk.tril(-1)  # I + M
    decayed_k = k * G.exp()  # [H, c, dk]
    rhs = beta[..., None] * (v - decayed_k @ s)  # [H, c, dv]
    u = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    o = (q * G.exp()) @ s + qk @ u  # [H, c, dv]
    last = G[:, -1:, :]  # [H, 1, dk]
    s = last.exp().transpose(1, 2) * s + (k * (last - G).exp()).transpose(1, 2) @ u
    return o.transpose(0, 1), s


def recurrent_kda(
    q: torch.Tensor,  # [B, H, dk] float32
    k: torch.Tensor,  # [B, H, dk]
    v: torch.Tensor,  # [B, H, dv]
    g: torch.Tensor,  # [B, H, dk]
    beta: torch.Tensor,  # [B, H]
    state: torch.Tensor,  # [B, H, dk, dv]
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, H, dv], the new state
    s = state * g.exp()[..., None]
    kv = (s * k[..., None]).sum(dim=-2)  # [B, H, dv]
    delta = (v - kv) * beta[..., None]
    s = s + k[..., None] * delta[..., None, :]
    return (s * q[..., None]).sum(dim=-2), s


def kda_step(
    mixed: torch.Tensor,  # [B, C] the q/k/v projections (the conv's channels, C = 3*H*dk)
    g: torch.Tensor,  # [B, H, dk] log decay float32
    b: torch.Tensor,  # [B, H] beta logits
    conv_pool: torch.Tensor,  # [S, C, K-1] one layer's conv windows, written in place
    ssm_pool: torch.Tensor,  # [S, H, dk, dk] float32, written in place
    slots: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B]; 0: the sequence starts from zero states
    conv_w: torch.Tensor,  # [C, K]
) -> torch.Tensor:  # [B, H, dk] float32 the core output
    """One KDA decode step of B sequences from their state slots (gathered, masked to zeros at position 0, written
    back with ``index_copy_``): no host read, fixed shapes (a CUDA graph captures it). Torch on every device."""
    keep = (positions > 0)[:, None, None]  # [B, 1, 1]
    out, last = causal_conv_step(mixed, conv_pool[slots] * keep.to(conv_pool.dtype), conv_w)
    conv_pool.index_copy_(0, slots, last.to(conv_pool.dtype))
    H = ssm_pool.shape[1]
    q, k, v = heads(out, H, ssm_pool.shape[2], H)
    core, state = recurrent_kda(q, k, v, g, torch.sigmoid(b).float(), ssm_pool[slots] * keep[..., None])
    ssm_pool.index_copy_(0, slots, state)
    return core


def sigmoid_gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """KDA's output norm per head: ``rms_norm(x) * weight * sigmoid(z)`` in float32 (the weight not rounded first),
    rounded once to z's dtype; x rounded to it before (the reference's core output is in the model dtype).
    x, z [T, H, n] -> [T, H, n]."""
    h = x.to(z.dtype).float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * h * torch.sigmoid(z.float())).to(z.dtype)
