"""The recurrent-state side of a hybrid model (gated DeltaNet layers): the state pool, its checkpoints on the device
and in host RAM, and the anchors they are taken at."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from freetoken.cache.anchors import Anchors, resolve_anchors
from freetoken.cache.host_states import HostStates
from freetoken.cache.radix import RadixCache
from freetoken.cache.state_checkpoints import StateCheckpoints
from freetoken.cache.state_pool import StatePool
from freetoken.models.registry import get_family

if TYPE_CHECKING:
    from freetoken.loader.model_build import LoadedModel
    from freetoken.loader.model_setup import ModelSetup

log = logging.getLogger(__name__)

def make_state_pool(
    loaded: LoadedModel, max_running: int, dtype: torch.dtype, device: torch.device, checkpoints: int = 0
) -> StatePool | None:
    """The state slots of a model with linear-attention layers (None without): one per running request and one for
    ``LLMEngine.score``, then ``checkpoints`` checkpoint slots; handed to the model."""
    if loaded.states is None:
        return None
    pool = StatePool(loaded.states, max_running + 1, dtype, device, checkpoints)
    loaded.model.states = pool
    log.info("recurrent state pool: %d request slots + %d checkpoints, %.0f MiB on %s (not yet in the memory plan)",
             pool.num_slots, checkpoints, pool.bytes / 2**20, device)  # fmt: skip
    return pool


# The default number of checkpoints: what fits in the budget, within these bounds (OpenCode's deep prunes, an edit
# ~2k tokens back, need more than a turn's 16 anchors kept: docs/benchmarks.md, "agent edits").
MIN_CHECKPOINTS, MAX_CHECKPOINTS = 16, 256


def checkpoint_count(loaded: LoadedModel, dtype: torch.dtype, asked: int | None, budget_gib: float) -> int:
    """``asked``, or as many checkpoints as ``budget_gib`` holds (within MIN/MAX_CHECKPOINTS); 0 without states."""
    if loaded.states is None:
        return 0
    if asked is not None:
        return asked
    fit = int(budget_gib * 2**30 // max(1, loaded.states.slot_bytes(dtype)))
    return max(MIN_CHECKPOINTS, min(MAX_CHECKPOINTS, fit))


# The host tier's default: an eighth of the RAM free once the model is loaded, at most this (and this many).
HOST_DEFAULT_GIB, HOST_MAX_CHECKPOINTS = 8.0, 1024


def host_checkpoint_count(slot_bytes: int, budget_gib: float | None, free_bytes: int | None = None) -> int:
    """Host-tier checkpoints: as many as ``budget_gib`` holds; None: the default budget (``free_bytes``: the RAM
    free, read from the machine when None), within HOST_MAX_CHECKPOINTS; 0 GiB: none. A budget given that holds
    not one checkpoint is refused (the default then is none, said once)."""
    if budget_gib == 0:
        return 0
    if budget_gib is None:
        if free_bytes is None:
            import psutil

            free_bytes = int(psutil.virtual_memory().available)
        n = int(min(HOST_DEFAULT_GIB * 2**30, free_bytes / 8) // max(1, slot_bytes))
        if n < 1:
            log.warning("state checkpoints: no host tier (an eighth of the free RAM, %.0f MiB, holds no %.1f MiB "
                        "checkpoint)", free_bytes / 8 / 2**20, slot_bytes / 2**20)  # fmt: skip
        return min(n, HOST_MAX_CHECKPOINTS)
    n = int(budget_gib * 2**30 // max(1, slot_bytes))
    if n < 1:
        raise ValueError(f"state_checkpoint_host_gib={budget_gib:g} holds no state checkpoint of this model (one is "
                         f"{slot_bytes / 2**20:.1f} MiB): give at least {slot_bytes / 2**30:.3f} GiB, or 0 for no "
                         "host tier")  # fmt: skip
    return n


def host_states(states: StatePool, budget_gib: float | None) -> HostStates | None:
    """The host tier behind the state pool's checkpoint slots (None: no budget for one)."""
    n = host_checkpoint_count(states.shape.slot_bytes(states.conv.dtype), budget_gib)
    if n == 0:
        return None
    host = HostStates(states, n)
    log.info("state checkpoints: host tier of %d (%.0f MiB%s)", n, host.bytes / 2**20,
             ", pinned" if host.pinned else "")  # fmt: skip
    return host


def state_checkpoints(
    states: StatePool | None, tree: RadixCache | None, setup: ModelSetup, every: int | None = None,
    host_gib: float | None = 0.0,
) -> tuple[StateCheckpoints | None, Anchors | None]:  # fmt: skip
    """The checkpoint pool over the state pool's checkpoint slots, with a host tier of ``host_gib`` (None: the
    default), and the family's anchors (``every``: a fixed grid instead), where both exist."""
    if states is None or tree is None or states.num_checkpoints == 0:
        return None, None
    family = get_family(setup.hf.architecture)
    return StateCheckpoints(states, tree, host_states(states, host_gib)), resolve_anchors(
        setup.tokenizer, family.anchor_starts, family.anchor_ends, every or 0
    )
