"""The engine's counters (``LLMEngine.stats``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from freetoken.engine.engine import LLMEngine


def engine_stats(e: LLMEngine) -> dict[str, Any]:
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
        **e._counters,
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


def _checkpoint_stats(e: LLMEngine) -> dict[str, int]:
    c = e.pages.checkpoints
    return {} if c is None else c.stats()
