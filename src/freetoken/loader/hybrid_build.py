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
    log.info("recurrent state pool: %d request slots + %d checkpoints, %.0f MiB on %s",
             pool.num_slots, checkpoints, pool.bytes / 2**20, device)  # fmt: skip
    return pool


def host_states(states: StatePool, count: int) -> HostStates | None:
    """The host tier of ``count`` checkpoints (the memory plan's) behind the state pool's checkpoint slots (None: 0)."""
    if count == 0:
        return None
    host = HostStates(states, count)
    log.info("state checkpoints: host tier of %d (%.0f MiB%s)", count, host.bytes / 2**20,
             ", pinned" if host.pinned else "")  # fmt: skip
    return host


def state_checkpoints(
    states: StatePool | None, tree: RadixCache | None, setup: ModelSetup, every: int | None = None, host: int = 0,
) -> tuple[StateCheckpoints | None, Anchors | None]:  # fmt: skip
    """The checkpoint pool over the state pool's checkpoint slots, with a host tier of ``host`` checkpoints, and the
    family's anchors (``every``: a fixed grid instead), where both exist."""
    if states is None or tree is None or states.num_checkpoints == 0:
        return None, None
    family = get_family(setup.hf.architecture)
    return StateCheckpoints(states, tree, host_states(states, host)), resolve_anchors(
        setup.tokenizer, family.anchor_starts, family.anchor_ends, every or 0
    )
