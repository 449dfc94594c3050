"""Can v2 train on fla's gated delta rule here? fla-core 0.6.0 refuses its backward on Hopper with Triton in
[3.4, 3.7.1) (fla issue 640: a Triton codegen bug in `chunk_bwd_kernel_dqkwg`, seen at a key block of 64); the GPU
box has Triton 3.6. With v2's key head dim of 128 the kernel's key block is 128, which that issue's analysis finds
unaffected. This script lifts fla's guard and compares fla's gradients at v2's shapes against a float32 recurrence
with autograd. train.py calls `check` in its own process (the kernels it compiles and autotunes are the ones
training runs): agree, and training runs fla with the guard lifted; else `unbind_fla` puts transformers' torch path
under the DeltaNet layers. Alone: exit 0 when they agree, 1 when not, 2 when fla does not import.

    python3 -m training.default_model_v2.fla_gradcheck [--device cuda]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F


def lift_guard() -> None:
    """Skip fla's Hopper/Triton refusal of the gated backward (for the check, then for training if it passed)."""
    import fla.ops.common.chunk_o as chunk_o

    chunk_o.TRITON_ABOVE_3_7_1 = True  # type: ignore[attr-defined]


def restore_guard() -> None:
    import fla.ops.common.chunk_o as chunk_o
    from fla.utils import TRITON_ABOVE_3_7_1

    chunk_o.TRITON_ABOVE_3_7_1 = TRITON_ABOVE_3_7_1  # type: ignore[attr-defined]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The gated delta rule token by token in float32: S = S*exp(g); S += k (beta (v - k S)); o = scale q S."""
    q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
    v, g, beta = v.float(), g.float(), beta.float()
    b, t, h, dk = q.shape
    s = q.new_zeros(b, h, dk, v.shape[-1])
    out = []
    for i in range(t):
        s = s * g[:, i].exp()[..., None, None]
        kv = torch.einsum("bhk,bhkv->bhv", k[:, i], s)
        s = s + torch.einsum("bhk,bhv->bhkv", k[:, i], beta[:, i][..., None] * (v[:, i] - kv))
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, i] * dk**-0.5, s))
    return torch.stack(out, 1)


def check(device: str, key_dim: int = 128, value_dim: int = 64, heads: int = 4, tokens: int = 300,
          tol: float = 0.05) -> int:
    """0: fla's gradients agree with the float32 recurrence (its guard is left lifted); 1: they do not (or its
    backward fails; the guard is put back); 2: fla does not import."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:  # noqa: BLE001 - any import failure means: no fla
        print(f"[fla-check] fla does not import: {type(exc).__name__}: {exc}", flush=True)
        return 2
    lift_guard()
    t0 = time.time()
    gen = torch.Generator(device).manual_seed(0)
    leaves = {
        "q": torch.randn(1, tokens, heads, key_dim, device=device, generator=gen),
        "k": torch.randn(1, tokens, heads, key_dim, device=device, generator=gen),
        "v": torch.randn(1, tokens, heads, value_dim, device=device, generator=gen),
        "g": -F.softplus(torch.randn(1, tokens, heads, device=device, generator=gen)) * 0.3,
        "beta": torch.rand(1, tokens, heads, device=device, generator=gen).clamp(0.05, 0.95),
    }
    do = torch.randn(1, tokens, heads, value_dim, device=device, generator=gen)
    for n in ("q", "k", "v", "beta"):  # both sides read the same bf16 values: the error left is fla's arithmetic
        leaves[n] = leaves[n].to(torch.bfloat16).float()
    ref = {n: x.clone().requires_grad_() for n, x in leaves.items()}
    (reference(**ref) * do).sum().backward()
    ours = {n: x.to(torch.bfloat16).requires_grad_() for n, x in leaves.items()}
    ours["g"] = leaves["g"].clone().requires_grad_()  # fla keeps the decay in float32
    try:
        o, _ = chunk_gated_delta_rule(ours["q"], ours["k"], ours["v"], ours["g"], ours["beta"],
                                      use_qk_l2norm_in_kernel=True)
        (o.float() * do).sum().backward()
    except Exception as exc:  # noqa: BLE001
        print(f"[fla-check] fla's backward failed: {type(exc).__name__}: {exc}", flush=True)
        restore_guard()
        return 1
    worst = 0.0
    for n in leaves:
        r, x = ref[n].grad, ours[n].grad
        assert r is not None and x is not None
        err = ((x.float() - r).norm() / r.norm().clamp_min(1e-12)).item()
        worst = max(worst, err)
        print(f"[fla-check] d{n}: relative L2 error {err:.2e}", flush=True)
    ok = worst <= tol
    verdict = "PASS" if ok else "FAIL"
    print(f"[fla-check] {verdict}: worst {worst:.2e} (tolerance {tol:.0e}), key dim {key_dim}, "
          f"{time.time() - t0:.0f} s (compiling included)", flush=True)
    if not ok:
        restore_guard()
    return 0 if ok else 1


# transformers binds these to fla's kernels when fla imports at its import; inspect.unwrap gives its own torch ones.
KERNEL_FUNCTIONS = {"chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule",
                    "torch_recurrent_gated_delta_rule"}


CHUNK_SCAN_STEPS = 32  # the torch chunked rule scans chunks one by one: about this many per sequence
MAX_CHUNK = 512


def scan_chunk(tokens: int) -> int:
    """The chunk size for a sequence of ``tokens``: 64 (transformers' default) up to 2k tokens, then the power
    of two that keeps the sequential scan near CHUNK_SCAN_STEPS chunks, at most MAX_CHUNK (whose [chunk, chunk]
    blocks autograd keeps: 0.5 GB a tensor for a 60k-token row of 4 heads; 120 chunks there, not 954).
    The result is the same rule at any chunk size (float32 rounding apart); only the step count changes."""
    chunk = 64
    while chunk < MAX_CHUNK and tokens > chunk * CHUNK_SCAN_STEPS:
        chunk *= 2
    return chunk


def with_scan_chunk(fn: Any) -> Any:
    """transformers' torch chunked rule (``fn``), its chunk size chosen per call by ``scan_chunk``."""

    @functools.wraps(fn)
    def chunked(query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("chunk_size", scan_chunk(query.shape[1]))
        return fn(query, *args, **kwargs)

    return chunked


def unbind_fla(model: Any) -> int:
    """Make ``model``'s DeltaNet layers call transformers' torch functions (fla's gradients disagree here), the
    chunked one with ``scan_chunk``'s chunk size; returns how many bindings were replaced."""
    owners = [sys.modules[type(m).__module__] for m in model.modules()] + list(model.modules())
    n = 0
    for owner in {id(o): o for o in owners}.values():
        for name in KERNEL_FUNCTIONS & set(vars(owner)):
            fn = vars(owner)[name]
            if callable(fn) and inspect.unwrap(fn) is not fn:
                torch_fn = inspect.unwrap(fn)
                setattr(owner, name, with_scan_chunk(torch_fn) if "chunk" in name else torch_fn)
                n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--key-dim", type=int, default=128)
    ap.add_argument("--value-dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--tol", type=float, default=0.05, help="largest relative L2 error of any gradient (bf16 inputs)")
    a = ap.parse_args()
    return check(a.device, a.key_dim, a.value_dim, a.heads, a.tokens, a.tol)


if __name__ == "__main__":
    sys.exit(main())
