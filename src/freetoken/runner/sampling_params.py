"""Per-request sampling settings, checked when made: a request the sampler could not honour never
reaches the engine thread."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MIN_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily: dividing float32 logits by them overflows."""
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
"""The seeds a torch generator takes (64 bits, signed or not)."""


@dataclass
class SamplingParams:
    max_tokens: int = 16
    """Tokens to generate at most (clamped to the context left)."""
    temperature: float = 1.0
    """0 (or anything below 1e-5) means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 or -1: no top-k cut."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one (0: off)."""
    presence_penalty: float = 0.0
    """OpenAI's: subtracted from the logit of every token generated at least once, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """OpenAI's: subtracted once per time a token was generated, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """Hugging Face's: logits of tokens in the prompt or output divided by it (positive) or multiplied
    (negative), > 0; 1: off."""
    logprobs: int | None = None
    """Return the sampled token's logprob and this many alternatives (0..20); None: no logprobs."""
    stop: list[str] | str | None = None
    """Stop strings: generation ends before the first occurrence; the stop string is not returned."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra token ids that end generation (the model's EOS ids are always included unless ignore_eos)."""
    seed: int | None = None
    """Seed of this request's generator, in [-2**63, 2**64): the same seed gives the same tokens."""
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    """Drop special tokens from the returned text."""
    grammar: str | None = None
    """Structured output: the text must follow this Lark grammar (llguidance's dialect: ``%json {...}``
    embeds a JSON schema, ``<name>`` names a special token); generation ends where the grammar does."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None:
            self.stop = []
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_real(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 or positive, got {self.top_k!r}")
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {v!r}")
        r = self.repetition_penalty
        if not _is_real(r) or not math.isfinite(r) or not 0.0 < r <= 100.0:
            raise ValueError(f"repetition_penalty must be in (0, 100], got {r!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX):
            raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError("grammar must be a non-empty string")

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
