"""Which CUDA graph of the whole decode step (``step_graph.py``) a step runs in: its batch-size bucket and, for a
model whose decode step scans its page table, its page-table width.

Batch buckets: powers of two up to the most running requests, or every size for a model with recurrent-state slots
(a pad row would share row 0's state slot: ``step_graph.py``). Widths: a model whose decode step reads every position
its page table reaches in torch ops (``DecoderModel.scans_table``: DeepSeek sparse attention's indexer scores each
position, DeepSeek-V4 each compressed entry) would pay for the longest context at every step in a graph of
``max_pages`` columns; its graphs come per width too (powers of two from ``FIRST_WIDTH_TOKENS`` up to ``max_pages``;
a step runs in the narrowest holding its longest page table, the columns past a row's pages 0 and masked by its
length), so a step costs at most twice its longest context. Other models' kernels stop at each row's length: one
width, ``max_pages``."""

from __future__ import annotations

FIRST_WIDTH_TOKENS = 4096  # the narrowest page table (in tokens) of a model whose graphs come per width


def buckets(max_batch: int, every_size: bool = False) -> list[int]:
    """The batch sizes with a graph: powers of two up to ``max_batch`` and it, or (``every_size``) 1..max_batch."""
    if every_size:
        return list(range(1, max_batch + 1))
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def widths(max_pages: int, page_size: int, per_width: bool) -> list[int]:
    """The page-table widths with a graph: ``max_pages`` alone, or (``per_width``) powers of two from
    ``FIRST_WIDTH_TOKENS`` tokens' pages up to ``max_pages`` and it."""
    out, w = [], max(1, -(-FIRST_WIDTH_TOKENS // page_size))
    while per_width and w < max_pages:
        out.append(w)
        w *= 2
    return [*out, max_pages]
