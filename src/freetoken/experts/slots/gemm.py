"""GPU expert compute over slot ids: each route runs the expert in its group's slot.

Routes are grouped by eid (``RouteGroups``: sorted by eid, hence by slot); ``slot[g]`` is the slot
serving group g this round, or -1 when another branch or round serves it (its routes add zero).
Three implementations of one contract, returning the float32 partial ``[T, D]``:
- ``gather``: gather each route's weights and batch-matmul; fixed shapes, no sync (decode, torch).
- ``loop``: one matmul per group, reads the groups on the host (prefill on a GPU without Triton,
  and every step on the CPU, where "host reads" cost nothing).
- Triton grouped GEMM (``gemm_triton``; quantised slots: ``gemm_fp8_triton``, ``gemm_fp4_triton``, which
  dequantise in registers) on CUDA: fixed grid, skips unused groups on the device.
Quantised slots (``SlotWeights.fmt``) reach the torch paths dequantised by the format's reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from freetoken.experts.reference import expert_ffn
from freetoken.experts.slots.plan import RouteGroups
from freetoken.experts.slots.weights import SlotWeights
from freetoken.kernels.triton_support import use_triton

# Above this many routes the torch path on CUDA stops gathering weights per route (prefill).
GATHER_MAX_ROUTES = 64


def _activate(gu: torch.Tensor, sw: SlotWeights, eids: torch.Tensor) -> torch.Tensor:
    """gu [K, 2I] of routes of pool rows ``eids`` -> h [K, I]: SiLU-gated, or the slots' ``act``."""
    if sw.act is not None:
        return sw.act.apply(gu, eids)
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


def grouped_experts_gather(
    x: torch.Tensor,  # [T, D]
    groups: RouteGroups,
    slot: torch.Tensor,  # [K] per group
    topk_w: torch.Tensor,  # [T, k]
    sw: SlotWeights,
) -> torch.Tensor:
    T, k = topk_w.shape
    scratch = sw.gate_up.shape[0] - 1
    rslot = slot[groups.route_group]  # [K] per route
    on = rslot >= 0
    s = torch.where(on, rslot, torch.full_like(rslot, scratch))
    xs = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # [K, D, 1]
    wgu, wdn = sw.rows(s, x.dtype)
    gu = torch.bmm(wgu, xs).squeeze(-1)  # [K, 2I]
    h = _activate(gu, sw, groups.eids).unsqueeze(-1)  # [K, I, 1]
    y = torch.bmm(wdn, h).squeeze(-1).float()  # [K, D]
    w = torch.where(on, topk_w.reshape(-1).float(), torch.zeros_like(topk_w.reshape(-1), dtype=torch.float32))
    y = torch.where(on[:, None], y * w[:, None], torch.zeros_like(y))
    return y.view(T, k, -1).sum(dim=1)


def grouped_experts_loop(
    x: torch.Tensor,
    groups: RouteGroups,
    slot: torch.Tensor,
    topk_w: torch.Tensor,
    sw: SlotWeights,
) -> torch.Tensor:
    T, k = topk_w.shape
    out = torch.zeros((T, x.shape[1]), dtype=torch.float32, device=x.device)
    flat_w = topk_w.reshape(-1).float()
    starts, counts, slots, eids = groups.start.tolist(), groups.count.tolist(), slot.tolist(), groups.eid.tolist()
    order = groups.order
    for g in range(int(groups.n_groups)):
        if slots[g] < 0:
            continue
        routes = order[starts[g] : starts[g] + counts[g]]
        tok = torch.div(routes, k, rounding_mode="floor")
        y = expert_ffn(x[tok], *sw.rows(slots[g], x.dtype), sw.act, eids[g]).float()
        out.index_add_(0, tok, y * flat_w[routes, None])
    return out


def grouped_experts(
    x: torch.Tensor,
    groups: RouteGroups,
    slot: torch.Tensor,
    topk_w: torch.Tensor,
    sw: SlotWeights,
    max_groups: int | None = None,  # a layer's E: at most this many distinct experts per step
    out_dtype: torch.dtype = torch.float32,  # the sum's dtype (the Triton kernels cast in their combine launch)
) -> torch.Tensor:
    """Dispatch: Triton on CUDA, else gather (small steps on CUDA) or loop. Returns [T, D], summed in float32."""
    if use_triton(x) and sw.fmt.name in ("mxfp4", "nvfp4"):  # gpt-oss's biases and activation included
        from freetoken.experts.slots.gemm_fp4_triton import grouped_experts_fp4

        return grouped_experts_fp4(x, groups, slot, topk_w, sw, max_groups, out_dtype=out_dtype)
    if use_triton(x) and not (sw.fmt.quantized and sw.act is not None):  # FP8 gpt-oss: the torch paths
        if sw.fmt.quantized:
            from freetoken.experts.slots.gemm_fp8_triton import grouped_experts_fp8_triton

            return grouped_experts_fp8_triton(x, groups, slot, topk_w, sw, max_groups, out_dtype=out_dtype)
        from freetoken.experts.slots.gemm_triton import grouped_experts_triton

        return grouped_experts_triton(x, groups, slot, topk_w, sw.gate_up, sw.down, max_groups, out_dtype=out_dtype,
                                      act=sw.act)  # fmt: skip
    if x.device.type == "cuda" and groups.order.numel() <= GATHER_MAX_ROUTES:  # CUDA without Triton: small steps
        return grouped_experts_gather(x, groups, slot, topk_w, sw).to(out_dtype)
    return grouped_experts_loop(x, groups, slot, topk_w, sw).to(out_dtype)
