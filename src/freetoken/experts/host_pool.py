"""The host expert pool: every routed expert of every MoE layer, in host RAM, the source of truth.

The pool owns the banks of ``ExpertBanks`` (``gate_up [N, 2I, D]``, ``down [N, D, I]``, row = eid, and the scale
banks of a quantised format: ``tensors``), opaque here: it pins and maps every one alike.
With CUDA present the banks are page-locked *in place* after they are filled (``cudaHostRegister``, no
second copy, so no 2x peak); pinned host memory is mapped into the GPU's address space (UVA), so a
GPU kernel can gather pool rows by device-side indices without the host reading them. When pinning
fails the pool stays pageable and the caller falls back to the ``cpu`` backend (logged once).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import torch

from freetoken.experts.base import ExpertBanks

log = logging.getLogger(__name__)

# cudaHostRegister flags: portable (all contexts) | mapped (device-addressable through UVA).
_REGISTER_FLAGS = 0x01 | 0x02
_GIB = 1 << 30
_warned_pageable = False


def host_ram_bytes() -> int:
    """Physical host RAM in bytes."""
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def ram_reserve_bytes(total: int) -> int:
    """What the pool must leave to the OS and the user's other programs: 10% of RAM, at least 2 GiB."""
    return max(2 * _GIB, total // 10)


def check_pool_fits(pool_bytes: int, total_ram: int | None = None) -> None:
    """Refuse a pool larger than host RAM minus the reserve (checked before anything is pinned)."""
    total = host_ram_bytes() if total_ram is None else total_ram
    limit = total - ram_reserve_bytes(total)
    if pool_bytes > limit:
        raise MemoryError(
            f"expert pool needs {pool_bytes / _GIB:.1f} GiB of host RAM but only {limit / _GIB:.1f} GiB "
            f"may be used ({total / _GIB:.1f} GiB installed, {ram_reserve_bytes(total) / _GIB:.1f} GiB "
            "reserved); use a smaller or more quantised model"
        )


# Host ranges this process registered, by start pointer -> number of pools using them. Several pools may
# wrap the same banks (backends built one after another); the range stays registered until the last goes.
_REGISTERED: dict[int, int] = {}


def _register(t: torch.Tensor) -> str:
    """Page-lock ``t``'s memory in place (mapped, portable).

    Returns "registered" (counted: undo with ``_unregister``), "pinned" (pinned by its allocator:
    nothing to undo) or "failed".
    """
    ptr = t.data_ptr()
    if ptr in _REGISTERED:
        _REGISTERED[ptr] += 1
        return "registered"
    if t.is_pinned():
        return "pinned"
    err = torch.cuda.cudart().cudaHostRegister(ptr, t.numel() * t.element_size(), _REGISTER_FLAGS)
    if int(getattr(err, "value", err)) != 0:
        log.debug("cudaHostRegister failed with %s", err)
        _clear_cuda_error()
        return "failed"
    _REGISTERED[ptr] = 1
    return "registered"


def _clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error after a refused cudaHostRegister (e.g. a small bank sharing a page
    with memory already registered: registration is per page). Left set, torch's check after the next kernel
    launch reads it and raises it there, far from here. A tiny launch consumes it: that check reads and resets."""
    try:
        torch.empty(1, device="cuda").fill_(0)
    except RuntimeError as e:
        log.debug("cleared the CUDA error %s", e)


def _unregister(ptr: int) -> None:
    n = _REGISTERED.get(ptr, 0) - 1
    if n > 0:
        _REGISTERED[ptr] = n
        return
    _REGISTERED.pop(ptr, None)
    torch.cuda.cudart().cudaHostUnregister(ptr)


class _CudaArrayView:
    """Exposes a mapped host allocation through ``__cuda_array_interface__`` (bytes, shape [N, row])."""

    def __init__(self, ptr: int, rows: int, row_bytes: int, owner: torch.Tensor) -> None:
        self._owner = owner  # keeps the host memory alive as long as the view
        self.__cuda_array_interface__: dict[str, Any] = {
            "shape": (rows, row_bytes),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def mapped_device_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor aliasing pinned (registered) host memory: kernels read it over PCIe (UVA).

    ``host`` must be contiguous and registered/pinned. Same shape and dtype as ``host``.
    """
    rows = int(host.shape[0])
    row_bytes = host[0].numel() * host.element_size() if rows else 0
    with torch.cuda.device(device):
        raw = torch.as_tensor(_CudaArrayView(host.data_ptr(), rows, row_bytes, host), device=device)
    return raw.view(host.dtype).view(host.shape)


class HostExpertPool:
    """Owns the host banks; pins them when CUDA is present; serves row gathers to the CPU and GPU."""

    def __init__(
        self, banks: ExpertBanks, dtype: torch.dtype | None = None, pin: bool = True, pin_limit: int | None = None
    ) -> None:
        """``pin_limit``: bytes of the pool that may be page-locked (systems that cap pinned memory, e.g. WSL):
        the first ``pinned_rows`` experts (eid order) are pinned and may be copied to the GPU, the rest stay
        pageable and only the CPU reads them. None: the whole pool."""
        if dtype is not None and not banks.fmt.quantized and banks.gate_up.dtype != dtype:
            # The slots hold the compute dtype and fills are raw copies, so the pool must match (a quantised
            # pool stays packed: kernels dequantise).
            banks = dataclasses.replace(banks, gate_up=banks.gate_up.to(dtype), down=banks.down.to(dtype))
        self.banks = banks
        self.fmt = banks.fmt
        self.gate_up = banks.gate_up.contiguous()  # [N, 2I, D']
        self.down = banks.down.contiguous()  # [N, D, I']
        self.gate_up_scale = None if banks.gate_up_scale is None else banks.gate_up_scale.contiguous()
        self.down_scale = None if banks.down_scale is None else banks.down_scale.contiguous()
        self.num_layers = banks.num_layers
        self.num_experts = banks.num_experts
        self.activation = banks.activation  # the CPU kernel's activation (``experts/reference.py`` ``ACTIVATIONS``)
        bias = banks.gate_up_bias  # gpt-oss's gate/up biases [N, 2I] float32, as the CPU kernel takes them
        self.gate_up_bias = None if bias is None else bias.to(torch.float32).contiguous()
        self._registered: list[int] = []
        self.pinned = False
        rows = self.num_rows
        self.pinned_rows = rows if pin_limit is None else max(0, min(rows, pin_limit // max(1, self.expert_bytes)))
        if pin and torch.cuda.is_available() and self.pinned_rows > 0:  # nothing pinned: the caller runs 'cpu'
            check_pool_fits(banks.pool_bytes)
            self.pinned = self._pin()
            if not self.pinned:
                self._warn_pageable()

    # -- sizes ---------------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return int(self.gate_up.shape[0])

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every bank (``ExpertBanks.tensors`` order): what slots hold and fills copy."""
        scales = tuple(t for t in (self.gate_up_scale, self.down_scale) if t is not None)
        return (self.gate_up, self.down, *scales)

    @property
    def scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(gate_up_scale, down_scale) of a block-scaled pool, as the CPU kernel takes them; None otherwise."""
        if self.gate_up_scale is None or self.down_scale is None:
            return None
        return self.gate_up_scale, self.down_scale

    @property
    def inter(self) -> int:  # I
        return self.banks.intermediate_size

    @property
    def expert_bytes(self) -> int:
        return self.banks.expert_bytes

    # -- pinning -------------------------------------------------------------------------------------
    @property
    def partly_pinned(self) -> bool:
        """Only the first ``pinned_rows`` experts are pinned (``pin_limit``)."""
        return self.pinned_rows < self.num_rows

    def _pin(self) -> bool:
        """Register every bank in place (its first ``pinned_rows`` rows under a pin limit); else copy into pinned
        storage if 2x fits and there is no limit; else give up."""
        for t in self.tensors:
            part = t[: self.pinned_rows]
            if part.numel() == 0:
                continue
            how = _register(part)
            if how == "failed":
                self._unregister()
                return False if self.partly_pinned else self._pin_by_copy()
            if how == "registered":
                self._registered.append(t.data_ptr())
        return True

    def _pin_by_copy(self) -> bool:
        try:
            check_pool_fits(2 * self.banks.pool_bytes)
            self.gate_up = self.gate_up.pin_memory()
            self.down = self.down.pin_memory()
            if self.gate_up_scale is not None and self.down_scale is not None:
                self.gate_up_scale = self.gate_up_scale.pin_memory()
                self.down_scale = self.down_scale.pin_memory()
        except (MemoryError, RuntimeError) as exc:
            log.debug("pinning the expert pool by copy failed: %s", exc)
            return False
        return True

    def _unregister(self) -> None:
        for ptr in self._registered:
            _unregister(ptr)
        self._registered = []

    @staticmethod
    def _warn_pageable() -> None:
        global _warned_pageable
        if not _warned_pageable:
            _warned_pageable = True
            log.warning(
                "could not pin the expert pool in host memory: it stays pageable and routed experts "
                "run on the CPU (the 'cpu' backend); host-to-GPU expert copies would be too slow"
            )

    def close(self) -> None:
        self._unregister()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self._unregister()
        except Exception:
            pass

    # -- access --------------------------------------------------------------------------------------
    def device_views(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Every bank (``tensors``) as a tensor a kernel on ``device`` can index with device-side row ids.

        CPU: the banks themselves. CUDA: zero-copy views of the pinned banks (requires ``pinned``).
        """
        if device.type != "cuda":
            return self.tensors
        if not self.pinned:
            raise RuntimeError("the expert pool is not pinned; GPU kernels cannot read it")
        return tuple(mapped_device_view(t[: self.pinned_rows], device) for t in self.tensors)
