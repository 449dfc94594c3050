"""The CPU decode step's small float32 ops in C++ (``step_ops.cpp``, ctypes): the residual add + RMSNorm, the
router's softmax + top-k, and a decode layer's attention after its QKV projection (q/k norms, rotary, the KV
write, paged attention) in one call each, where the torch references (``kernels/norm.py``, ``kernels/route.py``,
``layers/rope.py``, ``kernels/attention``) take dozens of tiny ops whose dispatch, not their arithmetic, sets
a CPU decode step's pace. ``available(t)`` says whether a tensor's step may take them: contiguous CPU float32, the
library built (else the torch paths run, warned once).
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

_SRC = Path(__file__).resolve().parent / "step_ops.cpp"
_FLAGS = ("-ffp-contract=off",)  # no FMA the torch references do not have
_P, _F, _I64 = ctypes.c_void_p, ctypes.c_float, ctypes.c_int64


class DecodeAttnArgs(ctypes.Structure):
    _fields_ = [
        ("qkv", _P), ("B", _I64), ("H", _I64), ("Hkv", _I64), ("hd", _I64), ("rot", _I64),
        ("q_norm", _P), ("k_norm", _P), ("eps", _F), ("positions", _P), ("cos", _P), ("sin", _P),
        ("max_pos", _I64), ("slot_mapping", _P), ("k_cache", _P), ("v_cache", _P), ("n_slots", _I64),
        ("block_table", _P), ("P", _I64), ("seq_lens", _P), ("page_size", _I64), ("window", _I64),
        ("scale", _F), ("out", _P),
    ]  # fmt: skip


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL | None:
    from freetoken.kernels.build import BuildError, single_source_library

    try:
        lib = ctypes.CDLL(str(single_source_library(_SRC, "libft_cpu_step.so", _FLAGS)))
    except (BuildError, OSError) as exc:
        warnings.warn(f"CPU step ops unavailable, using the torch paths: {exc}", stacklevel=3)
        return None
    lib.ft_add_rms_norm.argtypes = [_P, _P, _P, _P, _P, _I64, _I64, _F]
    lib.ft_add_rms_norm.restype = None
    lib.ft_linear_bf16.argtypes = [_P, _I64, _I64, _P, _I64, _P]
    lib.ft_linear_bf16.restype = None
    lib.ft_route.argtypes = [_P, _I64, _I64, _I64, ctypes.c_int, _P, _P]
    lib.ft_route.restype = None
    lib.ft_decode_attention.argtypes = [ctypes.POINTER(DecodeAttnArgs)]
    lib.ft_decode_attention.restype = ctypes.c_int
    return lib


def available(t: torch.Tensor) -> bool:
    """Whether ``t``'s step may take these ops: a contiguous CPU float32 tensor and the library built."""
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() and _lib() is not None


def norm_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``add_rms_norm`` takes rows ``x`` [T, D] with ``weight`` [D] (else the torch reference runs)."""
    return x.dim() == 2 and available(x) and weight.shape == x.shape[1:] and available(weight)


def add_rms_norm(
    h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """h, delta [T, D] float32 contiguous -> (h + delta, rms_norm(h + delta)); delta None: (h, rms_norm(h))."""
    lib = _lib()
    assert lib is not None, "call available() first"
    T, D = h.shape
    if weight.shape != (D,) or weight.dtype != torch.float32 or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous float32 [{D}], got {weight.dtype} {tuple(weight.shape)}")
    y = torch.empty_like(h)
    if delta is None:
        lib.ft_add_rms_norm(h.data_ptr(), None, weight.data_ptr(), None, y.data_ptr(), T, D, eps)
        return h, y
    if delta.shape != h.shape or not available(delta):
        raise ValueError(f"delta must be contiguous float32 {tuple(h.shape)}, got {delta.dtype} {tuple(delta.shape)}")
    s = torch.empty_like(h)
    lib.ft_add_rms_norm(h.data_ptr(), delta.data_ptr(), weight.data_ptr(), s.data_ptr(), y.data_ptr(), T, D, eps)
    return s, y


# Steps of up to this many rows take the bf16 weight copies (each row reads the weights again); larger ones F.linear.
LINEAR_ROWS = 8


def bf16_copy(w: torch.Tensor) -> torch.Tensor | None:
    """A bf16 copy of a contiguous CPU float32 weight every value of which is a bf16 (a bf16 checkpoint under float32
    steps), for ``linear``; None otherwise (CUDA, other dtypes, other values, no library)."""
    if w.dim() != 2 or not available(w):
        return None
    half = w.bfloat16()
    return half if torch.equal(w, half.float()) else None


def linear(
    x: torch.Tensor, w: torch.Tensor, w16: torch.Tensor | None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, w, bias)``; decode-sized float32 CPU steps read ``w16`` (``bf16_copy(w)``) instead, half the
    bytes of ``w`` and the same values (the products exact, the sums in another order)."""
    if w16 is None or x.dim() != 2 or x.shape[0] > LINEAR_ROWS or not available(x) or x.shape[1] != w16.shape[1]:
        return F.linear(x, w, bias)
    lib = _lib()
    assert lib is not None
    T, I = x.shape
    y = torch.empty((T, w16.shape[0]), dtype=torch.float32)
    lib.ft_linear_bf16(x.data_ptr(), T, I, w16.data_ptr(), w16.shape[0], y.data_ptr())
    return y if bias is None else y.add_(bias)


def route(logits: torch.Tensor, top_k: int, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] float32 (``available``) -> (ids [T, k] int64, weights [T, k] float32): softmax, top k
    (descending), renormalised when asked; ``kernels/route.route_reference`` in one call."""
    lib = _lib()
    assert lib is not None, "call available() first"
    T, E = logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"top_k must be in [1, {E}], got {top_k}")
    ids = torch.empty((T, top_k), dtype=torch.int64)
    w = torch.empty((T, top_k), dtype=torch.float32)
    lib.ft_route(logits.data_ptr(), T, E, top_k, int(norm_topk), ids.data_ptr(), w.data_ptr())
    return ids, w


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def decode_attention(
    qkv: torch.Tensor,  # [B, (H + 2 Hkv) hd] float32, rewritten in place
    heads: tuple[int, int, int],  # H, Hkv, hd
    norms: tuple[torch.Tensor | None, torch.Tensor | None, float],  # q_norm, k_norm ([hd] or None), eps
    tables: tuple[torch.Tensor, torch.Tensor],  # rotary cos, sin [max_pos, rot] float32
    positions: torch.Tensor,  # [B] int64
    slot_mapping: torch.Tensor,  # [B] int64
    caches: tuple[torch.Tensor, torch.Tensor],  # k, v [slots, Hkv, hd] float32
    block_table: torch.Tensor,  # [B, P] int32
    seq_lens: torch.Tensor,  # [B] int32, the new token included
    page_size: int,
    scale: float,
    window: int | None,
    step_checked: bool = False,
) -> torch.Tensor:
    """One decode layer's attention after its QKV projection: per-head q/k RMSNorm, rotary, the new K/V rows into
    the pool, each sequence's new token over its pages (GQA, optional window) -> [B, H hd] float32.
    ``step_checked``: the step's metadata (tables, positions, slots, page table, lengths) passed these checks in an
    earlier layer of the same step (the C++ side checks every range anyway)."""
    lib = _lib()
    assert lib is not None, "call available() first"
    H, Hkv, hd = heads
    q_norm, k_norm, eps = norms
    cos, sin = tables
    k_cache, v_cache = caches
    B = qkv.shape[0]
    _check(qkv, (B, (H + 2 * Hkv) * hd), torch.float32, "qkv")
    for name, t in (("q_norm", q_norm), ("k_norm", k_norm)):
        if t is not None:
            _check(t, (hd,), torch.float32, name)
    _check(k_cache, (k_cache.shape[0], Hkv, hd), torch.float32, "k_cache")
    _check(v_cache, tuple(k_cache.shape), torch.float32, "v_cache")
    if not step_checked:
        _check(cos, (cos.shape[0], cos.shape[1]), torch.float32, "cos")
        _check(sin, tuple(cos.shape), torch.float32, "sin")
        if cos.shape[1] > hd or cos.shape[1] % 2:
            raise ValueError(f"the rotary tables must rotate an even number of dims <= {hd}, got {cos.shape[1]}")
        _check(positions, (B,), torch.int64, "positions")
        _check(slot_mapping, (B,), torch.int64, "slot_mapping")
        _check(block_table, (B, block_table.shape[1]), torch.int32, "block_table")
        _check(seq_lens, (B,), torch.int32, "seq_lens")
    out = torch.empty((B, H * hd), dtype=torch.float32)
    args = DecodeAttnArgs(
        qkv.data_ptr(), B, H, Hkv, hd, cos.shape[1], _ptr(q_norm), _ptr(k_norm), eps,
        positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), cos.shape[0], slot_mapping.data_ptr(),
        k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0], block_table.data_ptr(), block_table.shape[1],
        seq_lens.data_ptr(), page_size, window or 0, scale, out.data_ptr(),
    )  # fmt: skip
    if lib.ft_decode_attention(ctypes.byref(args)) != 0:
        raise ValueError("decode attention: a position, KV slot, context length or page is out of range")
    return out


def _check(t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, name: str) -> None:
    if t.device.type != "cpu" or t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous CPU {dtype} {shape}, got {t.device} {t.dtype} {tuple(t.shape)}")
