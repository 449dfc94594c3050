"""The gated delta rule in torch (the reference every faster kernel is checked against), and the short causal conv.

Per value head, with a state S [dk, dv] (float32): ``S <- exp(g) * S``; ``S <- S + k ⊗ beta * (v - S^T k)``;
``o = S^T q``. ``chunk_gated_delta`` computes a whole sequence in chunks of ``chunk`` tokens (a UT transform
inside a chunk, a scan over chunks); ``recurrent_gated_delta`` advances a batch of sequences by one token each.
Shapes: n tokens, B sequences, H value heads, dk / dv key / value head dims; q and k already repeated to H heads,
L2-normalised, q scaled by dk^-0.5. ``deltanet_step`` is the decode step's one dispatch point: one Triton launch on
CUDA (``deltanet_triton.py``), ``deltanet_step_reference`` elsewhere; the chunked rule's CUDA kernels are fla's
(``gated_delta_fla.py``, chosen per layer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.kernels.triton_support import use_triton


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta(
    q: torch.Tensor,  # [n, H, dk] float32
    k: torch.Tensor,  # [n, H, dk]
    v: torch.Tensor,  # [n, H, dv]
    g: torch.Tensor,  # [n, H] log decay (<= 0)
    beta: torch.Tensor,  # [n, H]
    state: torch.Tensor,  # [H, dk, dv] the state before the first token
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [n, H, dv], the state after the last token
    n = q.shape[0]
    pad = (-n) % chunk
    q, k, v = (F.pad(t.transpose(0, 1), (0, 0, 0, pad)) for t in (q, k, v))  # [H, n+pad, d]
    g, beta = (F.pad(t.transpose(0, 1), (0, pad)) for t in (g, beta))  # [H, n+pad]
    H, dv = q.shape[0], v.shape[-1]
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    q, k, k_beta, v_beta = (t.reshape(H, -1, chunk, t.shape[-1]) for t in (q, k, k_beta, v_beta))  # [H, C, c, d]
    cum = g.reshape(H, -1, chunk).cumsum(dim=-1)  # [H, C, c] log decay from the chunk's start
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    pair = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()  # [H, C, c, c]
    ut = (k_beta @ k.transpose(-1, -2)) * pair
    intra = (q @ k.transpose(-1, -2)) * pair
    new_v = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(ut, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    q = q * cum.exp()[..., None]
    k = k * (cum[..., -1:] - cum).exp()[..., None]
    decay = cum[..., -1].exp()[..., None, None]  # [H, C, 1, 1]
    out = torch.empty_like(new_v)
    s = state
    for i in range(new_v.shape[1]):
        u = new_v[:, i] - k_cum[:, i] @ s
        out[:, i] = q[:, i] @ s + intra[:, i] @ u
        s = s * decay[:, i] + k[:, i].transpose(-1, -2) @ u
    return out.reshape(H, -1, dv)[:, :n].transpose(0, 1), s


def recurrent_gated_delta(
    q: torch.Tensor,  # [B, H, dk] float32
    k: torch.Tensor,  # [B, H, dk]
    v: torch.Tensor,  # [B, H, dv]
    g: torch.Tensor,  # [B, H]
    beta: torch.Tensor,  # [B, H]
    state: torch.Tensor,  # [B, H, dk, dv]
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, H, dv], the new state
    s = state * g.exp()[..., None, None]
    kv = (s * k[..., None]).sum(dim=-2)  # [B, H, dv]
    delta = (v - kv) * beta[..., None]
    s = s + k[..., None] * delta[..., None, :]
    return (s * q[..., None]).sum(dim=-2), s


def causal_conv(x: torch.Tensor, prev: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv of one sequence, SiLU after: x [n, C] new inputs, prev [C, K-1] the inputs before them,
    weight [C, K] -> (out [n, C], the last K-1 inputs [C, K-1])."""
    xs = torch.cat([prev.to(x.dtype), x.transpose(0, 1)], dim=1)  # [C, K-1+n]
    n, K = x.shape[0], weight.shape[1]
    # K shifted products summed in float32, rounded once (as a convolution accumulates), not F.conv1d: cuDNN runs
    # float32 convolutions in TF32 unless torch.backends.cudnn.allow_tf32 is turned off (on by default).
    acc = torch.zeros((xs.shape[0], n), dtype=torch.float32, device=x.device)
    for j in range(K):
        acc += weight[:, j : j + 1].float() * xs[:, j : j + n].float()
    return F.silu(acc.to(x.dtype)).transpose(0, 1), xs[:, xs.shape[1] - prev.shape[1] :]


def causal_conv_step(x: torch.Tensor, prev: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x [B, C], prev [B, C, K-1], weight [C, K] -> (out [B, C], new prev [B, C, K-1])."""
    window = torch.cat([prev.to(x.dtype), x[:, :, None]], dim=-1)  # [B, C, K]
    acc = (window.float() * weight.float()).sum(dim=-1)  # summed in float32, rounded once (as ``causal_conv``)
    return F.silu(acc.to(x.dtype)), window[:, :, 1:]


def gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[n, H] logits a, b -> the log decay ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``,
    float32."""
    return -A_log.exp() * F.softplus(a.float() + dt_bias), torch.sigmoid(b).float()


def heads(qkv: torch.Tensor, k_heads: int, k_dim: int, v_heads: int) -> tuple[torch.Tensor, ...]:
    """Conv output [n, C] -> q, k [n, H, dk] (L2-normalised, repeated from the Hk key heads, q scaled by dk^-0.5)
    and v [n, H, dv], float32."""
    n, dv = qkv.shape[0], (qkv.shape[1] - 2 * k_heads * k_dim) // v_heads
    q, k, v = qkv.float().split([k_heads * k_dim, k_heads * k_dim, v_heads * dv], dim=-1)
    rep = v_heads // k_heads
    q, k = (l2norm(t.view(n, k_heads, k_dim)).repeat_interleave(rep, dim=1) for t in (q, k))
    return q * k_dim**-0.5, k, v.view(n, v_heads, dv)


def deltanet_step_reference(
    mixed: torch.Tensor,  # [B, C] the in_proj output's conv channels
    b: torch.Tensor,  # [B, H] beta logits
    a: torch.Tensor,  # [B, H] decay logits
    conv_pool: torch.Tensor,  # [S, C, K-1] one layer's conv windows, written in place
    ssm_pool: torch.Tensor,  # [S, H, dk, dv] float32, written in place
    slots: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B]; 0: the sequence starts from zero states
    conv_w: torch.Tensor,  # [C, K]
    A_log: torch.Tensor,  # [H]
    dt_bias: torch.Tensor,  # [H]
    k_heads: int,
    k_dim: int,
) -> torch.Tensor:  # [B, H, dv] float32 the core output
    """One gated DeltaNet decode step of B sequences from their state slots (gathered, masked to zeros at position 0,
    written back with ``index_copy_``): conv step, gates, the recurrent rule. ``deltanet_triton`` fuses it."""
    keep = (positions > 0)[:, None, None]  # [B, 1, 1]
    out, last = causal_conv_step(mixed, conv_pool[slots] * keep.to(conv_pool.dtype), conv_w)
    conv_pool.index_copy_(0, slots, last.to(conv_pool.dtype))
    g, beta = gates(a, b, A_log, dt_bias)
    q, k, v = heads(out, k_heads, k_dim, ssm_pool.shape[1])
    core, state = recurrent_gated_delta(q, k, v, g, beta, ssm_pool[slots] * keep[..., None])
    ssm_pool.index_copy_(0, slots, state)
    return core


def deltanet_step(
    mixed: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    conv_pool: torch.Tensor,
    ssm_pool: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    conv_w: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    k_heads: int,
    k_dim: int,
) -> torch.Tensor:  # [B, H, dv]: mixed's dtype from Triton, float32 from the reference
    """``deltanet_step_reference``'s step (same arguments), by Triton on CUDA."""
    args = (mixed, b, a, conv_pool, ssm_pool, slots, positions, conv_w, A_log, dt_bias, k_heads, k_dim)
    if use_triton(mixed):
        from freetoken.kernels.deltanet_triton import deltanet_step_triton

        return deltanet_step_triton(*args, out_dtype=mixed.dtype)
    return deltanet_step_reference(*args)
