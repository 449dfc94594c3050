"""Devices tests are parametrised over: the CPU always, CUDA (marked ``gpu``) where present; and Triton's
interpreter (kernels on the CPU), where asked for."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
import torch

# Triton kernels run on the CPU through Triton's interpreter: only with triton installed and
# TRITON_INTERPRET=1 set before the kernels' modules are imported (the decorator reads it). Marked
# ``interp``: CI runs them in a second pass, `TRITON_INTERPRET=1 pytest -m interp`.
_NO_INTERPRETER = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton and TRITON_INTERPRET=1 (the Triton kernels on the CPU)",
)


def TRITON_INTERPRETER(fn: Any) -> Any:  # noqa: N802 - used as a marker
    return pytest.mark.interp(_NO_INTERPRETER(fn))

# The shared bf16 tolerance of a GPU kernel on bf16 inputs against its float32 reference (the fast-step issue's rule):
# relative l2 error at most BF16_REL and the largest error at most BF16_MAX of max|ref|.
BF16_REL, BF16_MAX = 8e-3, 2**-6


def assert_bf16_close(got: torch.Tensor, ref: torch.Tensor, what: object = "") -> None:
    err, r = got.float() - ref.float(), ref.float()
    rel, worst = float(err.norm() / r.norm()), float(err.abs().max() / r.abs().max())
    assert rel <= BF16_REL and worst <= BF16_MAX, f"{what}: relative l2 {rel:.3g}, max {worst:.3g} of max|ref|"


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
    ),
]


_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
# A Triton kernel's cases as (device, dtype): Triton's interpreter on the CPU in float32 (marked ``interp``: CI's
# interp stage), CUDA in float32 and bf16 (marked ``gpu``). Use with ``@pytest.mark.parametrize("device,dtype", ...)``.
TRITON_CASES = [
    pytest.param("cpu", torch.float32, marks=[pytest.mark.interp, _NO_INTERPRETER], id="interpreter"),
    pytest.param("cuda", torch.float32, marks=_CUDA, id="cuda-float32"),
    pytest.param("cuda", torch.bfloat16, marks=_CUDA, id="cuda-bfloat16"),
]
