"""Request field types both protocols share: strict (as OpenAI and Anthropic validate: a bool is no
integer, a string is no integer or bool; a number field still takes an integer) and every integer bounded,
so none past what the sampler's int64 tensors hold ever reaches a kernel (a 400 naming the field instead)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from freetoken.runner.sampling_params import SEED_MAX, SEED_MIN

INT32_MAX = 2**31 - 1


class Strict(BaseModel):
    """The base of every request schema: unknown fields accepted and ignored, scalar types strict,
    NaN and infinities refused (JSON has no such numbers; Python's parser takes them)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)


Int32 = Annotated[int, Field(ge=-(2**31), le=INT32_MAX)]
"""A count or size (max_tokens, top_k, n, …): its meaning is checked later, its magnitude here."""
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
"""What a torch generator takes: 64 bits, signed or not."""
