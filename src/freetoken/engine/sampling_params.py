"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_tokens: int = 16
    """Tokens to generate at most (clamped to the context left)."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 or -1: no top-k cut."""
    stop: list[str] | str | None = None
    """Stop strings: generation ends before the first occurrence; the stop string is not returned."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra token ids that end generation (the model's EOS ids are always included unless ignore_eos)."""
    seed: int | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    """Drop special tokens from the returned text."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None:
            self.stop = []
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 or positive, got {self.top_k}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
