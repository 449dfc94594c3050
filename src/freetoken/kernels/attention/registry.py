"""The attention backends by name (lazily imported: adding one is a new file plus one line here), and the choice by
device: ``select(device)`` is the in-repo Triton kernels on CUDA where Triton imports, the CPU backend (C++ fused
decode) on a CPU, the torch reference elsewhere. Paged GQA today; MLA, sparse indexers, sinks and windows are further
entries."""

from __future__ import annotations

import functools
import importlib

import torch

from freetoken.errors import FreeTokenError
from freetoken.kernels.attention.backend import AttentionBackend
from freetoken.kernels.triton_support import use_triton

# name -> "module:class"
BACKENDS: dict[str, str] = {
    "torch": "freetoken.kernels.attention.torch_backend:TorchAttention",
    "cpu": "freetoken.kernels.attention.cpu_backend:CpuAttention",
    "triton": "freetoken.kernels.attention.triton_backend:TritonAttention",
}


class UnknownAttentionBackend(FreeTokenError, ValueError):
    pass


@functools.cache
def get(name: str) -> AttentionBackend:
    """The backend registered as ``name`` (one instance per name; backends hold no state)."""
    if name not in BACKENDS:
        raise UnknownAttentionBackend(f"unknown attention backend {name!r}; known: {', '.join(sorted(BACKENDS))}")
    module, cls = BACKENDS[name].split(":")
    backend: AttentionBackend = getattr(importlib.import_module(module), cls)()
    return backend


def auto_name(device: torch.device) -> str:
    if use_triton(device):
        return "triton"
    return "cpu" if device.type == "cpu" else "torch"


def select(device: torch.device, name: str = "auto") -> AttentionBackend:
    """``name``'s backend; "auto": the one ``auto_name`` picks for ``device``."""
    return get(auto_name(device) if name == "auto" else name)
