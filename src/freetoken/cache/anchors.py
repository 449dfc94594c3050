"""Where a request's recurrent state is checkpointed: semantic anchors, the special-token boundaries where agent
harnesses cut or edit the context (a thinking block, a tool call, a tool output, a turn), read from the model's own
special tokens; the prompt's end as the fallback. ``every`` > 0 replaces the anchors with a fixed grid (a checkpoint
every that many tokens, as llama.cpp's ``--checkpoint-every-nb`` does), for comparison. Positions are rounded down to
whole KV pages (a request resumes from a page boundary of the radix tree), so a resumed request recomputes at most a
page before the edit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_PER_REQUEST = 16  # the deepest anchors of a prompt (the pool is budgeted and LRU-recycled)


@dataclass(frozen=True)
class Anchors:
    starts: frozenset[int]  # token ids that open an editable region: the states before and after them
    ends: frozenset[int]  # token ids that close one: the state after them
    every: int = 0  # > 0: a fixed grid of positions every this many tokens instead of the special tokens

    def positions(self, tokens: Sequence[int], lo: int, hi: int, page_size: int) -> list[int]:
        """Page-aligned positions p with lo < p <= hi to checkpoint (the state after tokens[:p]), deepest
        ``MAX_PER_REQUEST``, ascending; ``hi`` rounded down is always one (the prompt's end)."""
        found = {(hi // page_size) * page_size}
        if self.every > 0:
            found |= {(p // page_size) * page_size for p in range(self.every * (lo // self.every + 1), hi, self.every)}
            return sorted(p for p in found if lo < p <= hi)[-MAX_PER_REQUEST:]
        for i in range(lo, min(hi, len(tokens))):
            t = tokens[i]
            # an opening token: the state before it (the region is dropped whole) and after it (its content is
            # replaced: the token stays); a closing one: after it
            for p in (i, i + 1) if t in self.starts else (i + 1,) if t in self.ends else ():
                if p > 0:
                    found.add((p // page_size) * page_size)
        return sorted(p for p in found if lo < p <= hi)[-MAX_PER_REQUEST:]


def resolve_anchors(tokenizer: Any | None, starts: Sequence[str], ends: Sequence[str], every: int = 0) -> Anchors:
    """The anchor strings a family declares, as this tokenizer's ids (strings it lacks are left out); ``every`` > 0:
    the fixed grid instead."""
    vocab: dict[str, int] = tokenizer.get_vocab() if tokenizer is not None else {}
    return Anchors(
        frozenset(vocab[s] for s in starts if s in vocab), frozenset(vocab[s] for s in ends if s in vocab), every
    )


def due_captures(items: Sequence[tuple[Any, int]], starts: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """The checkpoints a step of (request, new tokens) items takes (a step that takes any runs eagerly, per
    sequence); ``starts``: each item's first position (None: its ``num_computed_tokens``)."""
    firsts = starts if starts is not None else [req.num_computed_tokens for req, _ in items]
    return [c for (req, n), s in zip(items, firsts, strict=True) if req.captures
            for c in captures_in(req.captures, s, s + n)]  # fmt: skip


def end_checkpoints(items: Sequence[tuple[Any, int]], starts: Sequence[int]) -> list[tuple[int, int]]:
    """A decode step's due checkpoints (one new token a row: each is the state after its row's step) as (the row's
    state slot, the checkpoint's slot): taken by copying the one into the other behind the step (``StatePool.copy``),
    so the step itself runs as any decode step (from its CUDA graph)."""
    return [(req.state_slot, slot) for (req, n), s in zip(items, starts, strict=True) if req.captures
            for off, slot in captures_in(req.captures, s, s + n) if off == n == 1]  # fmt: skip


def captures_in(captures: Sequence[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The planned checkpoints (position, slot) a step computing positions [start, end) takes, as (tokens into
    the step, slot)."""
    return [(p - start, slot) for p, slot in captures if start < p <= end]
