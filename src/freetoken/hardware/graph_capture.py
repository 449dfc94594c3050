"""Capturing a CUDA graph with Python's cyclic garbage collector held off.

A collection inside a capture can free an engine's CUDA graphs that only a reference cycle still held (an ``LLM``
dropped earlier, its graphs still alive): their destructor (``cudaGraphExecDestroy``) is an operation the capturing
thread may not issue, and the capture fails. The H100 showed it now and then, in tests that build a second engine
after a first: three "operation not permitted when stream is capturing (function reset)" warnings, then "operation
failed due to a previous error during capture", and that bucket's decode steps ran eagerly from then on. torch's own
``torch.cuda.graph`` no longer collects before a capture (unless ``force_cudagraph_gc``), so nothing else prevents
it. The collector runs again once the capture ends; the garbage waits for it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def capture_graph(graph: torch.cuda.CUDAGraph, pool: Any) -> Iterator[None]:
    """``torch.cuda.graph(graph, pool, capture_error_mode="thread_local")`` (other threads' CUDA calls do not void
    it) with the cyclic collector off for its duration."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            yield
    finally:
        if was_enabled:
            gc.enable()
