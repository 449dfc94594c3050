"""A request is a few named counters: computed tokens catch up with total tokens (no phases)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from freetoken.engine.detokenizer import IncrementalDetokenizer
from freetoken.runner.sampling_params import SamplingParams

if TYPE_CHECKING:
    from freetoken.cache.radix import RadixNode
    from freetoken.runner.constraint import TokenConstraint


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_total_tokens: int  # prompt + output may not exceed this (context length)
    detok: IncrementalDetokenizer
    seed: int = 0  # its sampler's seed (the request's own, or one the engine drew)
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    num_computed_tokens: int = 0  # tokens whose K/V are in this request's pages
    pages: list[int] = field(default_factory=list)  # page table: shared prefix pages, then private ones
    num_shared_pages: int = 0  # leading pages read from the radix tree (owned by it, locked via prefix_node)
    prefix_node: RadixNode | None = None  # the locked radix node whose path is pages[:num_shared_pages]
    state_slot: int | None = None  # its recurrent-state slot while it holds KV (models with linear attention)
    captures: list[tuple[int, int]] = field(default_factory=list)  # (position, checkpoint slot) planned this admission
    capture_wait: list[int] = field(default_factory=list)  # anchors still without a slot (host tier), ascending
    rolling: tuple[int, int] | None = None  # (slot, position written) of its decode checkpoint (0: none yet)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at first admission
    sampling_row: int | None = None  # its row of the sampler's penalty state (step_sampler.py)
    constraint: TokenConstraint | None = None  # structured output: which tokens may come next
    busy: bool = False  # a layer-major prefill spanning steps computes its tokens: the scheduler leaves it be

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
