"""A synthetic MoE stack of exact per-layer shape with random weights built in memory.

Only what the expert path needs: per MoE layer a router ``[E, D]`` and routed experts (the host pool).
Hidden states go ``x <- rms_norm(x + moe(x))`` through the layers, so with routing from the model each
layer routes its own input. Weights are filled by tiling one random block (memcpy speed, not RNG speed):
values do not matter for bandwidth, small normals keep activations finite.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from freetoken.bench.presets import MoEShape
from freetoken.experts.base import ExpertBanks, raw

_BLOCK_EXPERTS = 8


def random_banks(shape: MoEShape, layers: int, dtype: torch.dtype, seed: int = 0) -> ExpertBanks:
    """Banks in the preset's format (``dtype``: an unquantised one's; a quantised block is rounded by the format's
    reference quantiser, scales and all)."""
    fmt = shape.fmt
    banks = ExpertBanks.empty(layers, shape.experts, shape.hidden, shape.inter, dtype, fmt)
    g = torch.Generator().manual_seed(seed)
    n = banks.gate_up.shape[0]
    D, I = shape.hidden, shape.inter
    gu = (banks.gate_up, banks.gate_up_scale, (2 * I, D), D**-0.5)
    for bank, scale, dims, std in (gu, (banks.down, banks.down_scale, (D, I), I**-0.5)):
        block = torch.randn((_BLOCK_EXPERTS, *dims), generator=g) * std  # unpacked: FP4 banks hold D/2 bytes
        packed, block_scale = fmt.quantize(block) if fmt.quantized else (block.to(dtype), None)
        for start in range(0, n, _BLOCK_EXPERTS):
            stop = min(n, start + _BLOCK_EXPERTS)
            raw(bank)[start:stop].copy_(raw(packed)[: stop - start])
            if scale is not None and block_scale is not None:
                scale[start:stop].copy_(block_scale[: stop - start])
    return banks


class SyntheticRouter:
    """Routers of every layer on the compute device; ``route`` gives a layer's (ids, weights)."""

    def __init__(self, shape: MoEShape, layers: int, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed + 1)
        self.shape = shape
        self.router = (torch.randn(layers, shape.experts, shape.hidden, generator=g)).to(device, dtype)  # [L,E,D]
        self.device, self.dtype = device, dtype

    def route(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = F.softmax(F.linear(x, self.router[layer]), dim=-1, dtype=torch.float32)  # [T, E]
        w, ids = torch.topk(probs, self.shape.top_k, dim=-1)
        return ids, w / w.sum(dim=-1, keepdim=True)


class TraceRouter:
    """Replays a routing trace ``[tokens, layers, k]`` (uint8 expert ids); request b of a batch reads the
    trace from offset ``b * tokens // B`` on, so concurrent requests route differently. The trace, the
    replay order and the routing weights live on the compute device: replay copies nothing per step."""

    def __init__(self, path: str, shape: MoEShape, layers: int, batch: int, device: torch.device) -> None:
        trace = np.load(path)
        if trace.ndim != 3 or trace.shape[2] != shape.top_k:
            raise ValueError(f"{path}: expected [tokens, layers, {shape.top_k}], got {list(trace.shape)}")
        if int(trace.max()) >= shape.experts:
            raise ValueError(f"{path}: expert ids up to {int(trace.max())} exceed {shape.experts} experts")
        n, trace_layers = trace.shape[0], trace.shape[1]
        layer_idx = torch.arange(layers) % trace_layers  # more layers than the trace: wrap around
        ids = torch.from_numpy(trace.astype(np.int64))[:, layer_idx]  # [n, layers, k]
        g = torch.Generator().manual_seed(7)
        w = torch.softmax(torch.randn(ids.shape, generator=g), dim=-1)
        self.ids, self.w = ids.to(device), w.to(device)
        offsets = torch.arange(batch) * (n // batch)
        self.rows = ((offsets[None, :] + torch.arange(n)[:, None]) % n).to(device)  # [n, B] per step
        self.n = n
        self.step = 0

    def advance(self) -> None:
        self.step = (self.step + 1) % self.n

    def route(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows[self.step]  # [B] device view
        return self.ids[rows, layer], self.w[rows, layer]  # [B, k] each


def rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
