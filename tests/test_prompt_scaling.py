"""Prompt preparation does work linear in the number of messages (defect 4 of 2026-12-05: 10,000 one-character
messages took 11.5 s to prepare, 20,000 took 41.9 s, while holding the interpreter every other request needs).

Counts work, not time: the Python lines our code executes while rendering and tokenising a conversation
(``sys.settrace``; the tokenizer's Rust and Jinja's compiled template are not counted, and are linear)."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import freetoken
from freetoken.chat.template import render_and_tokenize
from freetoken.chat.tokenize import touched_pieces
from tiny_models import CHAT_TEMPLATE

SRC = str(Path(freetoken.__file__).parent)


def _lines_executed(work: Any) -> int:
    """Line events in frames of freetoken's own source while ``work()`` runs."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(SRC) else None

    sys.settrace(global_)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


def _conversation(n: int, text: str) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i in range(n)]


@pytest.mark.parametrize("text", ["x", "a <|im_end|> b"], ids=["plain", "special-token text in every message"])
def test_preparing_twice_the_messages_is_twice_the_work(tokenizer: Any, text: str) -> None:
    def work(n: int) -> int:
        ids: list[int] = []
        lines = _lines_executed(
            lambda: ids.extend(render_and_tokenize(tokenizer, CHAT_TEMPLATE, _conversation(n, text)))
        )
        assert len(ids) > 3 * n  # every message reached the prompt
        return lines

    small, large = work(300), work(600)
    per_message = small / 300
    assert large <= 2.2 * small, (small, large)  # the pairwise check before: 3.6-3.7x
    assert large / 600 <= 1.1 * per_message


def test_touched_pieces_matches_the_pairwise_check() -> None:
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.choice([0, 0, 1, 2, 5]) for _ in range(rng.randint(0, 12))]
        total = sum(lengths)
        spans: list[tuple[int, int]] = []
        pos = 0
        while pos < total:
            a = pos + rng.randint(0, 4)
            b = a + rng.randint(1, 5)
            if b > total:
                break
            spans.append((a, b))
            pos = b
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        want = [any(a < s + n and s < b for a, b in spans) for s, n in zip(starts, lengths)]
        assert touched_pieces(lengths, spans) == want, (lengths, spans)


def test_touched_pieces_visits_each_span_once() -> None:
    class Counting(list[tuple[int, int]]):
        reads = 0

        def __getitem__(self, i: Any) -> Any:
            Counting.reads += 1
            return super().__getitem__(i)

    n = 5000
    spans = Counting((3 * i, 3 * i + 1) for i in range(n))
    assert touched_pieces([3] * n, spans) == [True] * n
    assert Counting.reads <= 4 * n + 4
