"""``fused``: every routed expert resident on the compute device (the pool fits in VRAM).

Small steps (decode) gather the routed experts' weights and run batched matmuls: fixed shapes, so on CUDA
each (layer, tokens) is replayed as a CUDA graph (``layer_graphs.py``, ``EngineConfig.moe_cuda_graphs``):
eager, the launches per layer make the host, not the GPU, set the pace (and the bandwidth model's ``T_gpu``,
which ``ft bench decode`` takes from this backend). On a CPU device the same steps run the C++ expert kernel
on the banks in place (``experts/cpu``) instead: gathering the routed experts' weights copies them, and
torch's batched matmuls stream them again; steps with many tokens per expert keep torch's per-expert
matmuls, which are compute-bound there (docs/benchmarks.md, "`fused` on a CPU device").
Quantised banks stay packed on the device (that is what makes them fit): steps the C++ kernel does not take run
the slot backends' grouped GEMM with every expert its own slot (the Triton kernel dequantises in registers on
CUDA; the torch paths dequantise by the format's reference).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from freetoken.config import EngineConfig
from freetoken.experts.backends.layer_graphs import LayerGraphs, StepCapture
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.cpu.defaults import widening_isa
from freetoken.experts.cpu.kernel import CpuExpertKernel
from freetoken.experts.cpu.runner import make_kernel
from freetoken.experts.reference import ExpertAct, moe_reference
from freetoken.experts.slots.gemm import grouped_experts
from freetoken.experts.slots.plan import group_routes
from freetoken.experts.slots.weights import SlotWeights
from freetoken.kernels.triton_support import use_triton

# Up to this many routes per step, gather the routed experts' weights and run one batched matmul
# (fixed shapes, no host synchronisation: the decode path); above it, loop over distinct experts.
_GATHER_MAX_ROUTES = 32
# On a CPU device, steps of up to this many routes per expert of a layer run the C++ kernel, torch's matmuls
# above: where the two cross (docs/benchmarks.md, "`fused` on a CPU device").
_KERNEL_ROUTES_PER_EXPERT = 4
# Up to this many routes (``plan_triton.MAX_ROUTES``), CUDA groups a step's routes in one launch of its own; up to
# _GROUP_IN_GATE_UP (bf16 banks), in the gate_up launch itself (more routes: its pairwise grouping spills registers,
# docs/benchmarks.md, "Fewer kernels per fused decode step").
_ONE_LAUNCH_GROUPING = 64
_GROUP_IN_GATE_UP = 32


def _bf16_valued(*banks: torch.Tensor) -> bool:
    """Whether every value of these banks is a bf16 (a bf16 checkpoint, perhaps loaded in float32); checked one expert
    at a time, so other banks stop at their first expert."""
    if any(b.dtype == torch.bfloat16 for b in banks):
        return all(b.dtype == torch.bfloat16 for b in banks)
    return all(b.dtype == torch.float32 and all(torch.equal(e, e.bfloat16().float()) for e in b) for b in banks)


class FusedBackend(StepCapture, ExpertBackend):
    name = "fused"
    runs_ahead = True  # no per-step host work

    def __init__(
        self,
        banks: ExpertBanks,
        device: torch.device,
        dtype: torch.dtype,
        cuda_graphs: bool = False,
        cpu_threads: int | None = None,
    ) -> None:
        self.num_experts = banks.num_experts
        self.fmt = banks.fmt
        wdtype = None if banks.fmt.quantized else dtype  # packed banks keep their dtype
        self.kernel: CpuExpertKernel | None = None
        # gpt-oss's clamped activation after its gate/up biases (None: SiLU), rows = eids as here; the C++ kernel
        # takes the biases as float32 host rows
        self.act = ExpertAct.of(banks.activation, banks.gate_up_bias, device)
        self._kernel_bias = None if self.act is None or self.act.gate_up_bias is None else (
            self.act.gate_up_bias.contiguous())  # fmt: skip
        if device.type == "cpu":
            # float32 steps on bf16 values keep the banks in bf16 for the kernel's widening path: the bits of
            # float32 banks from half the bytes (its dot-product path splits x, so is not taken)
            keep = dtype == torch.float32 and not banks.fmt.quantized and _bf16_valued(banks.gate_up, banks.down)
            bank_dtype = banks.gate_up.dtype if keep or wdtype is None else dtype
            kern = make_kernel(bank_dtype, cpu_threads, widening_isa() if keep else "auto")
            if kern is not None and kern.backend == "native":
                self.kernel, wdtype = kern, torch.bfloat16 if keep else wdtype
            elif kern is not None:
                kern.close()
        self.gate_up = banks.gate_up.to(device=device, dtype=wdtype)
        self.down = banks.down.to(device=device, dtype=wdtype)
        gs, ds = (None if t is None else t.to(device) for t in (banks.gate_up_scale, banks.down_scale))
        self.weights = SlotWeights(self.gate_up, self.down, banks.fmt, gs, ds, self.act)
        self.scales = None if gs is None or ds is None else (gs, ds)
        self.graphs = LayerGraphs(_GATHER_MAX_ROUTES) if cuda_graphs and device.type == "cuda" else None
        self._tok: dict[tuple[int, int], torch.Tensor] = {}

    def forward(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor
    ) -> torch.Tensor:
        T, k = topk_ids.shape
        if self.kernel is not None and T * k <= _KERNEL_ROUTES_PER_EXPERT * self.num_experts:
            return self._on_kernel(layer, x, topk_ids, topk_w)
        if self.fmt.quantized:
            return self._grouped(layer, x, topk_ids, topk_w)
        if T * k > _GATHER_MAX_ROUTES:
            return moe_reference(x, topk_ids + layer * self.num_experts, topk_w, self.gate_up, self.down, self.act)
        body = self._grouped if use_triton(x) else self._gathered
        if self.graphs is not None and self.graphs.eligible(T):
            return self.graphs.run(layer, x, topk_ids, topk_w, body, self)
        return body(layer, x, topk_ids, topk_w)

    def _gathered(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        """Gather the routed experts' weights, two batched matmuls: fixed shapes, no host sync (capturable)."""
        rows = topk_ids + layer * self.num_experts  # [T, k] pool rows
        T, k = rows.shape
        flat = rows.reshape(-1)
        xs = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # [T*k, D, 1]
        gu = torch.bmm(self.gate_up[flat].to(x.dtype), xs).squeeze(-1)  # [T*k, 2I] (CPU bf16 banks: widened)
        if self.act is not None:
            h = self.act.apply(gu, flat).unsqueeze(-1)
        else:
            gate, up = gu.chunk(2, dim=-1)
            h = (F.silu(gate) * up).unsqueeze(-1)  # [T*k, I, 1]
        y = torch.bmm(self.down[flat].to(x.dtype), h).squeeze(-1).float()  # [T*k, D]
        y = (y * topk_w.reshape(-1, 1).float()).view(T, k, -1).sum(dim=1)
        return y.to(x.dtype)

    def _grouped(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        """The slot backends' grouped GEMM over the banks themselves (slot = eid; every expert is resident): the
        routed experts' weights are read once, in place, where a gather would copy them first (fixed shapes,
        no host sync on CUDA: capturable). Quantised banks always take it (they dequantise in its kernel)."""
        rows, off = int(self.gate_up.shape[0]), layer * self.num_experts
        if use_triton(x) and topk_ids.numel() <= _GROUP_IN_GATE_UP and not self.fmt.quantized:
            from freetoken.experts.slots.gemm_triton import grouped_experts_routed_triton

            # the gate_up launch groups the routes itself: two launches for the layer's experts
            return grouped_experts_routed_triton(
                x, topk_ids, off, topk_w, self.gate_up, self.down, self.num_experts, out_dtype=x.dtype, act=self.act
            )
        if use_triton(x) and topk_ids.numel() <= _ONE_LAUNCH_GROUPING:
            from freetoken.experts.slots.plan_triton import group_routes_triton

            groups = group_routes_triton(topk_ids, off, rows)
            slot = groups.eid  # padding groups (eid = rows) are past n_groups: the kernels skip them
        else:
            groups = group_routes(topk_ids.reshape(-1) + off, rows)
            slot = torch.where(groups.valid, groups.eid, torch.full_like(groups.eid, -1))
        return grouped_experts(x, groups, slot, topk_w, self.weights, self.num_experts, out_dtype=x.dtype)

    def _on_kernel(self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        """The C++ expert kernel on the banks in place (CPU device); float32 accumulation, like the rest."""
        assert self.kernel is not None
        T, k = topk_ids.shape
        rows = (topk_ids + layer * self.num_experts).reshape(-1)
        tok = self._tok.get((T, k))
        if tok is None:  # each route's token: the same for every layer of a step
            tok = self._tok.setdefault((T, k), torch.arange(T, dtype=torch.int32).repeat_interleave(k))
        w = topk_w.reshape(-1).float().contiguous()
        act = "silu" if self.act is None else self.act.name
        out = self.kernel.run(x.float().contiguous(), tok, rows, w, self.gate_up, self.down, act, scales=self.scales,
                              bias=self._kernel_bias)  # fmt: skip
        return out.to(x.dtype)

    def close(self) -> None:
        """Stop the CPU kernel's workers (CPU device)."""
        if self.kernel is not None:
            self.kernel.close()
            self.kernel = None

    def step_capturable(self, tokens: int, top_k: int) -> bool:
        return self.graphs is not None and self.graphs.eligible(tokens) and tokens * top_k <= _GATHER_MAX_ROUTES

    # -- the graphs' host (``layer_graphs.GraphHost``): nothing to queue or count around a replay ----------
    def capture_begin(self) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def before_replay(self, layer: int, tokens: int) -> None:
        pass

    def before_step(self, items: Sequence[tuple[int, int]]) -> None:
        pass

    def replay_failed(self) -> None:
        pass

    def stats(self) -> dict[str, int | float]:
        return {} if self.graphs is None else dict(self.graphs.stats())


def create(config: EngineConfig, banks: ExpertBanks, device: torch.device, dtype: torch.dtype) -> FusedBackend:
    return FusedBackend(banks, device, dtype, cuda_graphs=config.moe_cuda_graphs, cpu_threads=config.cpu_threads)
