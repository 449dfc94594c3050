"""The sampler alone on CUDA (issue #39: sampling at ≤ 5% of the greedy step): µs per ``sample_batch`` call at
V = 151,936 (Qwen's vocabulary), batch 1 and 4, replayed from a captured CUDA graph (as the step graph runs it),
greedy vs temperature 1 vs temperature 1 + top-p 0.95 (sorted, and sort-free: ``kernels/nucleus_triton.py``) vs
Qwen's recommended settings (temperature 0.7, top-k 20, top-p 0.8) alone, with a presence penalty over a 2,000-token
history, and with logprobs too, through
the torch ops (``sampler.use_triton`` off: the draw's torch reference, the cut's sort) and through the Triton kernels
(``kernels/draw_triton.py``; top-k steps ``topk_triton.py``, penalties ``penalty_triton.py``, logprobs
``logprobs_triton.py``). Medians of 7 timings of 50 replays (each
replay 10 calls). No grammar mask. Prints a markdown table, then the sort-free cut alone per
launch shape (tokens per program, warps: ``SHAPES``; the first is the default), then the top-k cut alone per
first-launch block (``TOPK_BLOCKS``; the first is the default). Seconds. No arguments.
``PYTHONPATH=src python bench/gpu/sample_time.py``"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from unittest import mock

import torch

from freetoken.runner import sampler
from freetoken.runner.sampler import Features, PenaltyState, SamplingBatch, sample_batch

V = 151_936
MODES = {  # name: (temperature, top_p, top_k, presence penalty, features)
    "greedy": (0.0, 1.0, 0, 0.0, Features(draw=False, cuts=False, penalties=False, logprobs=False)),
    "temperature 1": (1.0, 1.0, 0, 0.0, Features(draw=True, cuts=False, penalties=False, logprobs=False)),
    "temperature 1 + top-p 0.95": (1.0, 0.95, 0, 0.0, Features(draw=True, cuts=True, penalties=False,
                                                               logprobs=False)),
    "the same, sort-free (nucleus)": (1.0, 0.95, 0, 0.0, Features(draw=True, cuts=True, penalties=False,
                                                                  logprobs=False, nucleus=True)),
    # Qwen3's recommended settings (temperature 0.7, top-p 0.8, top-k 20), then with a presence penalty, then logprobs
    "Qwen's: T 0.7, top-k 20, top-p 0.8": (0.7, 0.8, 20, 0.0, Features(draw=True, cuts=True, penalties=False,
                                                                       logprobs=False, top_k=20)),
    "the same + presence penalty 1.5": (0.7, 0.8, 20, 1.5, Features(draw=True, cuts=True, penalties=True,
                                                                    logprobs=False, top_k=20)),
    "the same + logprobs": (0.7, 0.8, 20, 1.5, Features(draw=True, cuts=True, penalties=True, logprobs=True,
                                                        top_k=20)),
}


TOPK_BLOCKS = (4096, 2048, 8192, 1024)  # topk_triton's first-launch tokens per program (the first: its default)
SHAPES = [(1024, 4), (2048, 4), (2048, 8), (1024, 8), (512, 4), (512, 8)]  # nucleus_cut_triton's block, num_warps


def _batch(B: int, temperature: float, top_p: float, top_k: int, presence: float, dev: torch.device) -> SamplingBatch:
    f, i = torch.float32, torch.int64

    def full(v: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.full((B,), v, dtype=dtype, device=dev)

    return SamplingBatch(
        temperature=full(temperature, f), top_k=full(top_k, i), top_p=full(top_p, f), min_p=full(0.0, f),
        seed_lo=torch.arange(B, device=dev) + 7, seed_hi=full(0, i), step=torch.arange(B, device=dev),
        rows=torch.arange(B, device=dev), presence=full(presence, f), frequency=full(0.0, f), repetition=full(1.0, f),
    )  # fmt: skip


def _replay_us(fn: Callable[[], object], calls: int = 10, replays: int = 50, repeats: int = 7) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()  # compiles the Triton kernels, warms the allocator
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / (replays * calls))
    return statistics.median(times)


def _time(B: int, mode: str, kernel: bool, x: torch.Tensor) -> float:
    temperature, top_p, top_k, presence, f = MODES[mode]
    b = _batch(B, temperature, top_p, top_k, presence, x.device)
    state = PenaltyState(B, V, x.device)  # a 2,000-token history per row: the penalties read counts and seen
    state.update(torch.arange(B, device=x.device).repeat_interleave(2000), torch.randint(0, V, (2000 * B,),
                                                                                          device=x.device))
    with mock.patch.object(sampler, "use_triton", lambda where: kernel and where.is_cuda):
        return _replay_us(lambda: sample_batch(x, b, state, f))


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("sample_time.py: needs a CUDA device (run it on the GPU box: bench/gpu/run.sh kernels)")
    from freetoken.kernels.triton_support import triton_available

    if not triton_available():
        sys.exit("sample_time.py: needs Triton (the draw kernel)")
    dev = torch.device("cuda")
    g = torch.Generator(dev).manual_seed(0)
    print(f"V = {V}, {torch.cuda.get_device_name()}; µs per sample_batch call (graph replays, median of 7)")
    print("| batch | mode | torch µs | kernel µs | kernel / torch | torch / greedy | kernel / greedy |")
    print("|---|---|---|---|---|---|---|")
    for B in (1, 4):
        x = torch.randn(B, V, generator=g, device=dev) * 3
        greedy = _time(B, "greedy", False, x)
        for mode in MODES:
            t, k = _time(B, mode, False, x), _time(B, mode, True, x)
            print(f"| {B} | {mode} | {t:.1f} | {k:.1f} | {k / t:.2f} | {t / greedy:.2f} | {k / greedy:.2f} |")
    _shapes(g, dev)


def _shapes(g: torch.Generator, dev: torch.device) -> None:
    """The sort-free cut alone (``nucleus_cut_triton``, top-p 0.95) per launch shape, batch 1 and 4."""
    from freetoken.kernels.nucleus_triton import nucleus_cut_triton

    print("\n| batch | block | warps | cut µs |\n|---|---|---|---|")
    for B in (1, 4):
        x = torch.randn(B, V, generator=g, device=dev) * 3
        z = x - x.max(dim=-1, keepdim=True).values
        tp, mp = torch.full((B,), 0.95, device=dev), torch.zeros(B, device=dev)
        for block, warps in SHAPES:
            us = _replay_us(lambda: nucleus_cut_triton(z, tp, mp, block=block, num_warps=warps))  # noqa: B023
            print(f"| {B} | {block} | {warps} | {us:.1f} |")
    _topk_blocks(g, dev)


def _topk_blocks(g: torch.Generator, dev: torch.device) -> None:
    """The top-k cut alone (``topk_cut_triton``, K 32: Qwen's top-k 20) per first-launch block, batch 1 and 4."""
    from freetoken.kernels.topk_triton import topk_cut_triton

    print("\n| batch | top-k block | K | cut µs |\n|---|---|---|---|")
    for B in (1, 4):
        x = torch.randn(B, V, generator=g, device=dev) * 3
        t, tp, mp = torch.full((B,), 0.7, device=dev), torch.full((B,), 0.8, device=dev), torch.zeros(B, device=dev)
        tk = torch.full((B,), 20, dtype=torch.int64, device=dev)
        for block in TOPK_BLOCKS:
            us = _replay_us(lambda: topk_cut_triton(x, 32, t, tk, tp, mp, block=block))  # noqa: B023
            print(f"| {B} | {block} | 32 | {us:.1f} |")


if __name__ == "__main__":
    main()
