"""Recovering template text and untrusted text from a render where a sentinel could not be put
back verbatim (the template transformed the value in a way the sentinel did not follow)."""

from __future__ import annotations

from collections.abc import Iterator

_MAX_ALIGN_STEPS = 200_000

# A piece of the final prompt: (text, is_untrusted).
Piece = tuple[str, bool]


def pieces_from(texts: list[str], values: list[str], plain: str) -> list[Piece] | None:
    """Template/untrusted pieces whose concatenation is exactly `plain`, or None.

    `texts` t0..tn are the template texts around n sentinels, `values` the n texts the sentinels
    stand for. Direct substitution usually reproduces `plain`; otherwise the gaps are found by
    aligning the template texts on `plain`.
    """
    direct = interleave(texts, values)
    if "".join(t for t, _ in direct) == plain:
        return direct
    gaps = _align(texts, values, plain)
    return interleave(texts, gaps) if gaps is not None else None


def interleave(texts: list[str], gaps: list[str]) -> list[Piece]:
    out: list[Piece] = []
    for i, t in enumerate(texts):
        if t:
            out.append((t, False))
        if i < len(gaps) and gaps[i]:
            if out and out[-1][1]:  # adjacent untrusted values: one piece
                out[-1] = (out[-1][0] + gaps[i], True)
            else:
                out.append((gaps[i], True))
    return out


def _align(texts: list[str], preferred: list[str], plain: str) -> list[str] | None:
    """Find gaps g with plain == t0 g0 t1 g1 ... tn, preferring g_i == preferred[i].

    Depth-first over the occurrences of the next template text (backtracking, step-bounded).
    Neighbouring gaps with empty template text between them are merged first.
    """
    ts: list[str] = [texts[0]]
    merged: list[str] = []
    for t, p in zip(texts[1:], preferred):
        if merged and not ts[-1]:
            merged[-1] += p
            ts[-1] = t
        else:
            merged.append(p)
            ts.append(t)
    n = len(merged)
    if n == 0 or not plain.startswith(ts[0]):
        return None
    gaps: list[str] = []
    stack = [_candidates(ts, merged, plain, 0, len(ts[0]))]
    starts = [len(ts[0])]
    steps = 0
    while stack:
        steps += 1
        if steps > _MAX_ALIGN_STEPS:
            return None
        end = next(stack[-1], None)
        if end is None:
            stack.pop()
            starts.pop()
            if gaps:
                gaps.pop()
            continue
        k = len(stack) - 1
        gaps.append(plain[starts[-1] : end])
        nxt = end + len(ts[k + 1])
        if k + 1 == n:
            if nxt == len(plain):
                return _unmerge(texts, preferred, gaps)
            gaps.pop()
            continue
        stack.append(_candidates(ts, merged, plain, k + 1, nxt))
        starts.append(nxt)
    return None


def _candidates(ts: list[str], merged: list[str], plain: str, k: int, start: int) -> Iterator[int]:
    """Possible ends of gap k (which starts at `start`): the preferred value first."""
    nxt = ts[k + 1]
    if plain.startswith(merged[k], start) and plain.startswith(nxt, start + len(merged[k])):
        yield start + len(merged[k])
    if not nxt:  # the last template text is empty: the gap runs to the end
        yield len(plain)
        return
    i = plain.find(nxt, start)
    while i >= 0:
        yield i
        i = plain.find(nxt, i + 1)


def _unmerge(texts: list[str], preferred: list[str], gaps: list[str]) -> list[str]:
    """Gaps per original slot: a merged gap goes to the first slot of its run."""
    out: list[str] = []
    it = iter(gaps)
    for i in range(len(preferred)):
        out.append(next(it) if i == 0 or texts[i] else "")
    return out
