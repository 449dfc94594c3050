"""What every slot-cache backend shares: pool, slot cache, device counters, the GPU+CPU split step.

``split_forward`` is one layer step with a GPU branch (hits + q fills, from slots) and a CPU branch
(the other misses, from the pool). The CPU branch is submitted first and runs while the fills copy and
the grouped GEMM run; ``out = gpu_partial + cpu_partial`` (float32 sum, then the compute dtype).
Subclasses choose the share of misses to fill and the residency policy.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from freetoken.config import EngineConfig
from freetoken.experts.backends.cpu import CpuBackend
from freetoken.experts.backends.layer_graphs import Body, CpuBranchHost, LayerGraphs
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.cpu.runner import STREAMED_MAX_TOKENS, CpuExpertRunner
from freetoken.experts.host_pool import HostExpertPool
from freetoken.experts.prefill.streamer import LayerStreamer
from freetoken.experts.slots.cache import SlotCache
from freetoken.experts.slots.counters import DeviceCounters
from freetoken.experts.slots.gemm import grouped_experts
from freetoken.experts.slots.plan import FillRule, RouteGroups, StepPlan
from freetoken.experts.slots.prefetch import Prefetcher
from freetoken.experts.slots.sizing import check_slots_cover_topk, resolve_slots

log = logging.getLogger(__name__)

# offload and hybrid: slots used within the last step (one plan per MoE layer) are evicted last, newest first,
# so when a step's working set exceeds the cache the excess misses stream through a few slots instead of
# flushing it all (0 steps: plain LRU victims).
RECENT_STEPS = 1
FROZEN = FillRule(min_fill=0)  # static placements: the share stays 0, nothing is ever filled


def streaming_rule(num_layers: int, fill_rows: int | None = None) -> FillRule:
    """``fill_rows``: only the pinned part of a partly pinned pool is ever filled."""
    return FillRule(min_fill=1, protect=RECENT_STEPS * num_layers, recent_last=True, fill_rows=fill_rows)


class SlotBackend(CpuBranchHost, ExpertBackend):
    name = "slots"
    partly_pinned_ok = False  # hybrid: the experts past a pinned budget run on its CPU branch

    def __init__(
        self,
        config: EngineConfig,
        pool: HostExpertPool,
        device: torch.device,
        dtype: torch.dtype,
        num_slots: int | None = None,
        with_cpu: bool = True,
    ) -> None:
        self.config = config
        self.pool = pool
        self.device = device
        self.dtype = dtype
        if pool.partly_pinned and not self.partly_pinned_ok:
            raise ValueError(
                f"a pinned budget below the pool ({pool.pinned_rows} of {pool.num_rows} experts) needs the hybrid "
                f"backend: {self.name} would copy unpinned experts"
            )
        if num_slots is None:
            num_slots = resolve_slots(config.expert_cache, pool.num_rows, pool.expert_bytes)
        if pool.banks.top_k:  # refuse a cache too small for one token's experts now, not at the first step
            check_slots_cover_topk(num_slots, pool.banks.top_k)
        self.cache = SlotCache(pool, num_slots, device)
        self.counters = DeviceCounters(device, pool.num_layers)
        self.prefetcher = Prefetcher(self.cache)  # routes known before their layer (hash layers), filled ahead
        self.cpu = CpuExpertRunner(pool, device, config.cpu_threads) if with_cpu else None
        self.share = torch.zeros((), dtype=torch.float32, device=device)  # device scalar read by plans
        self._one = torch.ones((), dtype=torch.float32, device=device)
        self._zero = torch.zeros((), dtype=torch.long, device=device)
        # prefill: whole layers, double-buffered (not from a partly pinned pool: fills take only pinned rows)
        self.streamer = LayerStreamer(self.cache, pool.num_layers, "off" if pool.partly_pinned else "stream")
        cuda_graphs = config.moe_cuda_graphs and device.type == "cuda"
        self.graphs = LayerGraphs(STREAMED_MAX_TOKENS) if cuda_graphs else None
        self._decode = True
        self._saved_layer_steps = 0
        self.rule = FROZEN  # how split_forward's rounds fill and evict (offload and hybrid: streaming_rule)

    @classmethod
    def create(
        cls, config: EngineConfig, banks: ExpertBanks, device: torch.device, dtype: torch.dtype
    ) -> ExpertBackend:
        """The registry's factory: the pool, pinned for a GPU. A GPU backend over an unpinned pool would copy at
        pageable speed: then the ``cpu`` backend serves instead (one warning)."""
        limit = None if config.pinned_budget is None else int(config.pinned_budget * (1 << 30))
        pool = HostExpertPool(banks, dtype=dtype, pin=device.type == "cuda", pin_limit=limit)
        if device.type == "cuda" and not pool.pinned:
            log.warning("moe backend %r needs a pinned expert pool; falling back to 'cpu'", cls.name)
            return CpuBackend(config, pool, device, dtype)
        return cls(config, pool, device, dtype)

    def begin_step(self, num_tokens: int, is_decode: bool) -> None:
        self.prefetcher.release()
        self.streamer.begin_step(num_tokens, is_decode)
        self._decode = is_decode
        if self.cpu is not None:
            experts, seconds = self.cpu.collect()  # the last step's streamed CPU batches
            if experts:
                self._after_cpu(experts, seconds)

    # -- shared step pieces ----------------------------------------------------------------------------
    def _copy(self, plan: StepPlan) -> None:
        """The round's batched fill (subclasses may time it)."""
        self.cache.copy(plan)

    def _gpu(self, x: torch.Tensor, groups: RouteGroups, plan: StepPlan, topk_w: torch.Tensor) -> torch.Tensor:
        """The round's fills, then the grouped GEMM over the slots serving it (float32 [T, D])."""
        self._copy(plan)
        c = self.cache
        return grouped_experts(x, groups, plan.slot, topk_w, c.weights, self.pool.num_experts)

    def streamed_forward(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor
    ) -> torch.Tensor | None:
        """A prefill layer served from the streamer's whole-layer buffer (every route resident: no fills,
        no CPU branch), or None when the streamer does not serve this step (the caller fills on demand).
        Streamed layers count in ``prefill_*`` stats only, not as cache hits or misses."""
        if topk_ids.numel() == 0 or not self.streamer.before_layer(layer, topk_ids):
            return None
        c = self.cache
        plan = c.group_and_plan(layer, topk_ids, self._one)  # all resident: stamps only, q = 0
        E = self.pool.num_experts
        out = grouped_experts(x, plan.groups, plan.slot, topk_w, c.weights, E)
        self.streamer.after_layer(layer)
        return out.to(x.dtype)

    def _count(self, layer: int, plan: StepPlan, first_round: bool, cpu_runs: bool) -> None:
        """The round's counts (``cpu_runs``: its unfilled misses ran on the CPU)."""
        if plan.counted:  # the fused plan added its device counts itself
            self.counters.layer_steps += 1
            return
        cpu = plan.num_misses - plan.copy_count if cpu_runs else self._zero
        self.counters.add_step(layer, plan.num_hits, plan.num_misses, plan.copy_count, cpu, first_round)

    def layer_counts(self) -> dict[str, list[int]]:
        """Cumulative misses, fills and CPU runs per MoE layer (``DeviceCounters.read_layers``; one sync)."""
        return self.counters.read_layers()

    def prefetch(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Decode steps of a filling backend: ``layer``'s routes filled ahead on a side stream and held until the
        layer has planned (``experts/slots/prefetch.py``)."""
        if self._decode and self.rule.min_fill > 0 and self.cache.slots and topk_ids.numel():
            self.prefetcher.issue(layer, topk_ids)

    # -- CUDA graphs of decode layers (``backends/layer_graphs.py``) ---------------------------------------------
    def graphed(self, layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, body: Body) -> torch.Tensor:
        """``body(layer, x, ids, w)``, replayed from a CUDA graph when enabled and this step can be; a prefetched
        layer waits for its copies first and lets its slots go after."""
        self.prefetcher.before(layer)
        out = self._graphed(layer, x, ids, w, body)
        self.prefetcher.after(layer)
        return out

    def _graphed(self, layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, body: Body) -> torch.Tensor:
        g, T = self.graphs, x.shape[0]
        if g is None or not self._decode or not g.eligible(T):
            return body(layer, x, ids, w)
        if self.cpu is not None and not self.cpu.can_capture(T, ids.shape[1]):
            return body(layer, x, ids, w)
        return g.run(layer, x, ids, w, body, self)

    @property
    def cpu_busy_in_step(self) -> bool:
        return self.cpu is not None

    def step_capturable(self, tokens: int, top_k: int) -> bool:
        g = self.graphs
        return g is not None and g.eligible(tokens) and (self.cpu is None or self.cpu.can_capture(tokens, top_k))

    def split_forward(
        self,
        layer: int,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_w: torch.Tensor,
    ) -> torch.Tensor:
        """Hits and q fills (``self.rule``) on the GPU, the other misses on the CPU, concurrently."""

        def body(layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
            assert self.cpu is not None
            if topk_ids.numel() == 0:
                return torch.zeros_like(x)
            check_slots_cover_topk(self.cache.num_slots, topk_ids.shape[1])
            c = self.cache
            # the fused plan counts the step itself (CPU runs: the unfilled misses)
            plan = c.group_and_plan(layer, topk_ids, self.share, self.rule, self.counters, True)
            handle = self.cpu.submit(x, plan.route_code, topk_w, layer)  # CPU branch first
            gpu = self._gpu(x, plan.groups, plan, topk_w)
            cpu, res = self.cpu.wait(handle)
            if res is not None:  # streamed batches report at the next begin_step
                self._after_cpu(res.experts, res.seconds)
            self._count(layer, plan, True, True)
            return (gpu + cpu).to(x.dtype)

        return self.graphed(layer, x, topk_ids, topk_w, body)

    def _after_cpu(self, experts: int, seconds: float) -> None:  # noqa: B027 - optional hook
        """Hook: timing of the CPU branch."""

    @property
    def num_slots(self) -> int:
        """0 while the cache has no banks (a resize the device refused at every size: elastic memory resumes it)."""
        return self.cache.num_slots if self.cache.slots else 0

    @property
    def slot_bytes(self) -> int:
        return self.pool.expert_bytes

    @property
    def slot_range(self) -> tuple[int, int]:
        return (max(1, self.pool.banks.top_k), self.pool.num_rows)

    def resize_expert_cache(self, num_slots: int, fallback: Sequence[int] = ()) -> None:
        """Elastic memory, at a safe point between steps: see ``SlotCache.resize`` (locked, then the most
        recently used experts stay; ``fallback``: the sizes to fall to when the device refuses). The layer
        graphs read the old slot banks: they are dropped and captured again on later steps (the engine drops its
        step graphs too)."""
        lo, hi = self.slot_range
        if not lo <= num_slots <= hi:
            raise ValueError(f"{num_slots} expert slots: the {self.name} backend takes {lo} to {hi}")
        self.streamer.finish()
        self.prefetcher.release()
        if self.graphs is not None:
            self.graphs.clear()
        self.cache.resize(num_slots, fallback)

    # -- reporting -------------------------------------------------------------------------------------
    def stats(self) -> dict[str, int | float]:
        out = {
            **self.counters.expert_stats(self.pool.expert_bytes, self.cache.num_slots),
            "pinned_experts": self.pool.pinned_rows,
            **self.streamer.stats(),
            **(self.graphs.stats() if self.graphs is not None else {}),
            **self.prefetcher.stats(),
        }
        ahead = out["expert_prefetches"] * self.pool.expert_bytes
        out["expert_bytes_copied"] = out["pcie_bytes"] + out["prefill_stream_bytes"] + ahead  # fills, streams, ahead
        return out

    def check_integrity(self) -> None:
        self.cache.check_integrity()

    def close(self) -> None:
        """Stop the CPU workers and release the pool's pinning (the backend is unusable after)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # graph fills may still read the pinned pool
        if self.cpu is not None:
            self.cpu.close()
        self.pool.close()
