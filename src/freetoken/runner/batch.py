"""What one device step reads of a request: the runner's view of the engine's ``Request`` (``engine/request.py``
satisfies it structurally). The runner never schedules: it computes the rows it is given."""

from __future__ import annotations

from typing import Protocol, TypeVar

from freetoken.runner.constraint import TokenConstraint
from freetoken.runner.sampling_params import SamplingParams


class StepRequest(Protocol):
    """A row of a step: its tokens, its KV pages and recurrent-state slot, and what its sampler needs."""

    token_ids: list[int]  # prompt + output
    num_computed_tokens: int  # tokens whose K/V are in its pages
    pages: list[int]  # page table
    state_slot: int | None  # recurrent-state slot (models with linear attention)
    captures: list[tuple[int, int]]  # (position, checkpoint slot) planned this admission
    params: SamplingParams
    seed: int
    sampling_row: int | None  # its row of the sampler's penalty state (the sampler sets it)
    constraint: TokenConstraint | None  # structured output

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...


R = TypeVar("R", bound=StepRequest)  # the caller's own request type, handed back with each row's choice
