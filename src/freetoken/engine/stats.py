"""The engine's counters (``LLMEngine.stats``)."""

from __future__ import annotations

import time
from typing import Any, Protocol

from freetoken.cache.kv_pool import KVPool
from freetoken.cache.radix import RadixCache
from freetoken.checkpoint.ftw_verify import WeightsCheck
from freetoken.engine.elastic import ElasticMemory
from freetoken.engine.kv_manager import KVManager
from freetoken.engine.layer_major import LayerMajorPlanner
from freetoken.engine.overlap import StepOverlap
from freetoken.engine.scheduler import Scheduler
from freetoken.loader.model_setup import ModelSetup
from freetoken.runner.runner import ModelRunner


class Counted(Protocol):
    """The parts of the engine (``LLMEngine``) whose counters the stats read."""

    setup: ModelSetup
    runner: ModelRunner
    overlap: StepOverlap
    counters: dict[str, int]
    pages: KVManager
    tree: RadixCache | None
    scheduler: Scheduler
    layer_major: LayerMajorPlanner
    kv: KVPool
    memory: ElasticMemory
    started_at: float
    weights_check: WeightsCheck | None


def engine_stats(e: Counted) -> dict[str, Any]:
    """``LLMEngine.stats``: the counters of the engine, its caches and its MoE backend."""
    backend = e.setup.loaded.backend
    expert = backend.stats() if backend is not None else {}
    return {
        "expert_hits": 0,
        "expert_fills": 0,
        "expert_cpu_runs": 0,
        **expert,
        "step_graph_eager_fallbacks": 0,  # decode steps run eagerly although step graphs are on (none without)
        **(e.runner.graphs.stats() if e.runner.graphs is not None else {}),
        "steps_launched_ahead": e.overlap.launched_ahead,
        **e.counters,
        "prefix_tokens_reused": e.pages.num_prefix_tokens_reused,
        "radix_pages": e.tree.num_pages if e.tree is not None else 0,
        "radix_evictions": e.tree.num_evictions if e.tree is not None else 0,
        **_checkpoint_stats(e),
        "preemptions": e.scheduler.num_preemptions,
        "layer_major_prefills": e.layer_major.jobs,
        "layer_major_balanced": e.layer_major.balanced_jobs,
        "running": len(e.scheduler.running),
        "waiting": len(e.scheduler.waiting),
        "kv_pages_total": e.kv.num_pages,
        "kv_pages_used": e.pages.num_pinned,  # not reclaimable now: unlocked tree pages do not count
        "moe_backend": backend.name if backend is not None else "none",
        "memory": e.memory.stats(),
        "uptime_s": time.monotonic() - e.started_at,
        **({"weights_check": e.weights_check.status} if e.weights_check is not None else {}),
    }


def _checkpoint_stats(e: Counted) -> dict[str, int]:
    c = e.pages.checkpoints
    return {} if c is None else c.stats()
