"""Argument marshalling for the C++ expert kernel: the ctypes mirrors of its C structs, weight formats,
error codes, and the checks ``CpuExpertKernel`` runs before handing raw pointers across (``kernel.py``
has the shapes)."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from freetoken.experts.cpu.reference import ACTIVATIONS, bank_format

# bank dtype -> the kernel's format code (FMT_FP8_BLOCK: with 128x128 block scales; uint8: FP4, FMT_MXFP4 = 3 or
# FMT_NVFP4 = 4 by the scale rows: ``kernel_format``)
FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float8_e4m3fn: 2, torch.uint8: 3}
_FP4_CODES = {"mxfp4": 3, "nvfp4": 4}
FP8_BLOCK = 128
FP4_COLS = 32  # FP4 banks: D and I multiples of this
# fp8: (gate_up_scale [N, 2I/128, D/128], down_scale [N, D/128, I/128]) fp32; FP4: uint8 scale rows
# ([N, 2I, S(D)], [N, D, S(I)], S(K) = K/32 for MXFP4, K/16 + 4 for NVFP4: quant/mxfp4.py, quant/nvfp4.py)
Scales = tuple[torch.Tensor, torch.Tensor]
ERRORS = {
    -1: "the previous batch is still running: call wait() first",
    -2: "bad dimensions or null pointers",
    -3: "tok entries must be token indices in [0, T)",
    -4: "row entries must be pool rows in [0, N)",
    -5: "unknown weight format or activation",
    -6: "out of memory for the kernel's scratch buffers",
}


_P, _I64, _I32, _U32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32
# The field runs both C structs share, in their order: the activations and shapes; the banks and output.
_SHAPES: list[Any] = [("x", _P), ("T", _I64), ("D", _I64), ("I", _I64)]
_BANKS: list[Any] = [("gate_up", _P), ("down", _P), ("N", _I64), ("fmt", _I32), ("act", _I32), ("out", _P),
                     ("gate_up_scale", _P), ("down_scale", _P), ("gate_up_bias", _P)]


class MoeArgs(ctypes.Structure):  # mirrors FtMoeArgs in plan.h
    _fields_ = [
        *_SHAPES,
        ("tok", _P),
        ("row", _P),
        ("w", _P),
        ("R", _I64),
        *_BANKS,
    ]


class QueuedArgs(ctypes.Structure):  # mirrors FtQueuedArgs in feeder.h
    _fields_ = [
        *_SHAPES,
        ("codes", _P),
        ("w", _P),
        ("k", _I64),
        *_BANKS,
        ("ready_flag", _P),
        ("ready_value", _U32),
        ("done_flag", _P),
        ("done_value", _U32),
        ("stats", _P),
        ("mode", _I32),
    ]


def check_tensor(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...], ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_args(
    x: torch.Tensor,
    tok: torch.Tensor,
    row: torch.Tensor,
    weight: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    activation: str,
    out: torch.Tensor | None,
    bounds: bool = True,
    scales: Scales | None = None,
) -> None:
    """Raise ValueError unless the arguments match the kernel's contract (see the module docstring).

    ``bounds=False`` skips the route index range checks (the C++ side checks them, cheaper).
    """
    check_tensor("x", x, (torch.float32,), 2)
    check_tensor("tok", tok, (torch.int32,), 1)
    check_tensor("row", row, (torch.int64,), 1)
    check_tensor("weight", weight, (torch.float32,), 1)
    check_tensor("gate_up", gate_up, tuple(FORMATS), 3)
    check_tensor("down", down, tuple(FORMATS), 3)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    T, D = x.shape
    N, two_i, _ = gate_up.shape
    if gate_up.dtype != down.dtype:
        raise ValueError(f"gate_up and down must share a dtype, got {gate_up.dtype} and {down.dtype}")
    per = 2 if gate_up.dtype == torch.uint8 else 1  # FP4: two weights a byte
    if two_i % 2 or two_i == 0 or gate_up.shape[2] * per != D:
        raise ValueError(f"gate_up must be [N, 2I, D={D} / {per}], got {tuple(gate_up.shape)}")
    if tuple(down.shape) != (N, D, two_i // 2 // per):
        raise ValueError(f"down must be [N={N}, D={D}, I={two_i // 2} / {per}], got {tuple(down.shape)}")
    R = row.shape[0]
    if tok.shape[0] != R or weight.shape[0] != R:
        raise ValueError(
            f"tok, row and weight must have one entry per route, got {tok.shape[0]}, {R}, {weight.shape[0]}"
        )
    if bounds and R and (int(row.min()) < 0 or int(row.max()) >= N):
        raise ValueError(
            f"row entries must be pool rows in [0, {N}), got [{int(row.min())}, {int(row.max())}]"
        )
    check_scales(gate_up, down, scales)
    if bounds and R and (int(tok.min()) < 0 or int(tok.max()) >= T):
        raise ValueError(
            f"tok entries must be token indices in [0, {T}), got [{int(tok.min())}, {int(tok.max())}]"
        )
    if out is not None:
        check_tensor("out", out, (torch.float32,), 2)
        if tuple(out.shape) != (T, D):
            raise ValueError(f"out must be [T={T}, D={D}], got {tuple(out.shape)}")



def kernel_format(gate_up: torch.Tensor, scales: Scales | None) -> int:
    """The kernel's format code of these banks (``FORMATS``; FP4 told apart by its scale rows)."""
    fmt = bank_format(gate_up, scales)
    return _FP4_CODES[fmt.name] if fmt is not None and fmt.name in _FP4_CODES else FORMATS[gate_up.dtype]


def check_scales(gate_up: torch.Tensor, down: torch.Tensor, scales: Scales | None) -> None:
    """fp8 banks come with their 128x128 block scales (and D, I whole blocks), FP4 banks with their scale rows (and
    D, I multiples of 32); other banks with none."""
    if gate_up.dtype == torch.uint8:
        _check_fp4_scales(gate_up, scales)
        return
    fp8 = gate_up.dtype == torch.float8_e4m3fn
    if not fp8:
        if scales is not None:
            raise ValueError(f"{gate_up.dtype} banks take no scales")
        return
    if scales is None:
        raise ValueError("float8_e4m3fn banks need their block scales")
    N, two_i, D = gate_up.shape
    I = two_i // 2
    if D % FP8_BLOCK or I % FP8_BLOCK:
        raise ValueError(f"fp8 banks need D and I in whole {FP8_BLOCK}-blocks, got D={D}, I={I}")
    want = ((N, two_i // FP8_BLOCK, D // FP8_BLOCK), (N, D // FP8_BLOCK, I // FP8_BLOCK))
    for name, t, shape in zip(("gate_up_scale", "down_scale"), scales, want):
        check_tensor(name, t, (torch.float32,), 3)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")


def _check_fp4_scales(gate_up: torch.Tensor, scales: Scales | None) -> None:
    fmt = bank_format(gate_up, scales)
    assert fmt is not None and scales is not None  # bank_format refuses uint8 banks without their scales
    N, two_i, half_d = gate_up.shape
    D, I = 2 * half_d, two_i // 2
    if D % FP4_COLS or I % FP4_COLS:
        raise ValueError(f"{fmt.name} banks need D and I multiples of {FP4_COLS}, got D={D}, I={I}")
    want = ((N, *fmt.scale_shape(two_i, D)), (N, *fmt.scale_shape(D, I)))
    for name, t, shape in zip(("gate_up_scale", "down_scale"), scales, want):
        check_tensor(name, t, (torch.uint8,), 3)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)} ({fmt.name}), got {list(t.shape)}")


def scale_ptrs(scales: Scales | None) -> tuple[int | None, int | None]:
    return (None, None) if scales is None else (scales[0].data_ptr(), scales[1].data_ptr())


def check_bias(gate_up: torch.Tensor, bias: torch.Tensor | None) -> int | None:
    """The gate/up biases' pointer (gpt-oss: float32 [N, 2I], gate half then up half); None without them."""
    if bias is None:
        return None
    check_tensor("gate_up_bias", bias, (torch.float32,), 2)
    if tuple(bias.shape) != tuple(gate_up.shape[:2]):
        raise ValueError(f"gate_up_bias must be [N, 2I] = {list(gate_up.shape[:2])}, got {list(bias.shape)}")
    return bias.data_ptr()
