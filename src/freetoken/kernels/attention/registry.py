"""The attention backends by name (lazily imported: adding one is a new file plus one line here), and the choice by
device: ``select(device)`` is the in-repo Triton kernels on CUDA where Triton imports, the CPU backend (C++ fused
decode) on a CPU, the torch reference elsewhere. Two kinds: paged GQA (``BACKENDS``, ``select``) and multi-head latent
attention over paged latents (``MLA_BACKENDS``, ``select_mla``); sparse indexers and sinks are further entries."""

from __future__ import annotations

import functools
import importlib

import torch

from freetoken.errors import FreeTokenError
from freetoken.kernels.attention.backend import AttentionBackend, MLABackend
from freetoken.kernels.triton_support import use_triton

# name -> "module:class"
BACKENDS: dict[str, str] = {
    "torch": "freetoken.kernels.attention.torch_backend:TorchAttention",
    "cpu": "freetoken.kernels.attention.cpu_backend:CpuAttention",
    "triton": "freetoken.kernels.attention.triton_backend:TritonAttention",
}
# the MLA kind: name -> "module:class"
MLA_BACKENDS: dict[str, str] = {
    "torch": "freetoken.kernels.attention.mla_backend:TorchMLA",
    "triton": "freetoken.kernels.attention.mla_backend:TritonMLA",
}


class UnknownAttentionBackend(FreeTokenError, ValueError):
    pass


@functools.cache
def _load(kind: str, name: str) -> object:
    table = MLA_BACKENDS if kind == "mla" else BACKENDS
    if name not in table:
        what = "MLA backend" if kind == "mla" else "attention backend"
        raise UnknownAttentionBackend(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}")
    module, cls = table[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def get(name: str) -> AttentionBackend:
    """The GQA backend registered as ``name`` (one instance per name; backends hold no state)."""
    backend: AttentionBackend = _load("gqa", name)  # type: ignore[assignment]
    return backend


def get_mla(name: str) -> MLABackend:
    """The MLA backend registered as ``name``."""
    backend: MLABackend = _load("mla", name)  # type: ignore[assignment]
    return backend


def auto_name(device: torch.device) -> str:
    if use_triton(device):
        return "triton"
    return "cpu" if device.type == "cpu" else "torch"


def select(device: torch.device, name: str = "auto") -> AttentionBackend:
    """``name``'s backend; "auto": the one ``auto_name`` picks for ``device``."""
    return get(auto_name(device) if name == "auto" else name)


def select_mla(device: torch.device, name: str = "auto") -> MLABackend:
    """``name``'s MLA backend; "auto": Triton's decode on CUDA where Triton imports, the torch reference elsewhere."""
    return get_mla(("triton" if use_triton(device) else "torch") if name == "auto" else name)
