"""The start's memory plan: measures what the machine has once the non-expert weights are on the device, gathers what
each cache kind costs for this model and backend, and asks ``memory.planner.plan`` for the sizes (the loader
decides no share itself). ``StartPlan`` is the ``make_backend`` of ``build_model``: it plans when the expert banks
exist (a dense model: after the build), picks the ``auto`` backend by the plan and creates the backend at the
planned slot count."""

from __future__ import annotations

import logging
from dataclasses import replace

import psutil
import torch

from freetoken.checkpoint.hf_config import HFConfig
from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.slots.sizing import resolve_slots
from freetoken.hardware.device_memory import free_bytes, process_limit_left
from freetoken.memory.budget import GIB, parse_budget_gib
from freetoken.memory.planner import CacheSizes, Free, MemoryPlan, Wants, plan
from freetoken.memory.sizes import model_bytes
from freetoken.models.base import Family

log = logging.getLogger(__name__)
NO_SLOTS = ("cpu", "fused")  # backends without a resizable slot cache


def measure_free(device: torch.device) -> tuple[Free, int]:
    """(what is free for the plan, the bytes torch holds on the device now: the weights loaded so far)."""
    host = int(psutil.virtual_memory().available)
    left = process_limit_left()
    host = host if left is None else min(host, left)
    if device.type != "cuda":
        return Free(free_bytes(device), host, on_host=True, where="host RAM (the CPU engine's caches live there)"), 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # the load's temporaries go back: the caches allocate outside torch's cache
    free, _ = torch.cuda.mem_get_info(device)
    return Free(int(free), host, where=f"device memory of {device}"), int(torch.cuda.memory_allocated(device))


def wants(config: EngineConfig, context: int) -> Wants:
    """``context``: ``max_model_len``, or the checkpoint's limit (which the plan may cut to what the device holds)."""
    host = config.state_checkpoint_host_gib
    return Wants(
        context=context, context_fixed=config.max_model_len is not None, max_running=config.max_running_requests,
        budget_bytes=None if config.vram_budget is None else parse_budget_gib(config.vram_budget),
        reserve_bytes=int(config.vram_reserve * GIB), kv_pages=config.kv_pages,
        state_checkpoints=config.state_checkpoints, checkpoint_bytes=int(config.state_checkpoint_gib * GIB),
        host_checkpoint_bytes=None if host is None else int(host * GIB),
        layer_major_tokens=config.layer_major_tokens, prefix_cache=config.prefix_cache,
    )  # fmt: skip


class StartPlan:
    """``build_model``'s ``make_backend``: the plan, then the backend it sizes."""

    def __init__(self, config: EngineConfig, hf: HFConfig, family: Family, device: torch.device, dtype: torch.dtype,
                 context: int) -> None:  # fmt: skip
        self.config, self.hf, self.device, self.dtype = config, hf, device, dtype
        interval = family.full_attention_interval if family.deltanet_proj is not None else None
        self.bytes = model_bytes(hf, dtype.itemsize, interval, family.window_ring)
        self.wants = wants(config, context)
        self.plan: MemoryPlan | None = None

    def sizes(self, weights: int, banks: ExpertBanks | None, backend: str) -> CacheSizes:
        b, page = self.bytes, self.config.page_size
        slot_bytes = banks.expert_bytes if banks is not None and backend not in NO_SLOTS else 0
        rows = banks.num_layers * banks.num_experts if banks is not None and slot_bytes else 0
        resident = banks.pool_bytes if banks is not None and backend == "fused" and self.device.type == "cuda" else 0
        return CacheSizes(weights, slot_bytes, max(1, self.hf.top_k) if slot_bytes else 0, rows, b.page_bytes(page),
                          page, b.state_per_request, b.activations_per_token, resident)  # fmt: skip

    def make(self, free: Free, weights: int, banks: ExpertBanks | None, backend: str) -> MemoryPlan:
        w = self.wants
        if banks is not None and backend not in NO_SLOTS and self.config.expert_cache is not None:
            rows = banks.num_layers * banks.num_experts
            w = replace(w, slots=resolve_slots(self.config.expert_cache, rows, banks.expert_bytes))
        return plan(free, self.sizes(weights, banks, backend), w)

    def __call__(self, banks: ExpertBanks) -> ExpertBackend:
        free, weights = measure_free(self.device)
        name = self.config.moe_backend
        if name == "auto":
            from freetoken.experts.backends.auto import resolve_auto

            # fused where the plan gives every expert a slot; not under a VRAM budget, which asks for resizable slots
            fits = self.make(free, weights, banks, "offload")
            whole = self.wants.budget_bytes is None and fits.slots == fits.sizes.max_slots
            name = resolve_auto(banks, self.device, whole)
        self.plan = self.make(free, weights, banks, name)
        config = self.config.replace(moe_backend=name)
        if self.plan.sizes.slot_bytes:
            config = config.replace(expert_cache=self.plan.slots)
        return create_backend(config, banks, self.device, self.dtype)

    def finish(self) -> MemoryPlan:
        """The plan: made when the banks were (a MoE model), else now (a dense model, its weights loaded)."""
        if self.plan is None:
            free, weights = measure_free(self.device)
            self.plan = self.make(free, weights, None, "cpu")
        log.info("%s", self.plan.table())
        return self.plan
