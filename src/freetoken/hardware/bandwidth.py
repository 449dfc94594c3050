"""Measure the bandwidths the hybrid split and the prefill streamer are planned with.

All figures are GB/s (1e9 bytes per second) of expert weight bytes moved:
- ``host_read``: a parallel sum over distinct host memory on the CPU kernel's threads.
- ``cpu_kernel`` (``B_H``): the CPU expert kernel on expert shapes, top-k experts per call taken in
  turn from a pool much larger than L3 (weights stream from DRAM).
- ``fill`` (``B_P,fill``): pinned host -> device copies of one expert each, a layer's misses per batch.
- ``layer`` (``B_P,layer``): one whole layer of experts per copy (what prefill streams).
- ``fill_concurrent`` / ``cpu_kernel_concurrent`` (``B_P'``, ``B_H'``): both running at once in this
  process; they share host memory, and the split ``q* ~ m B_P' / (B_P' + B_H')`` uses these
  (``slots/plan.py: fill_quota``: the whole number of fills whose later branch ends first).
Copy figures are None when the device is CUDA but CUDA is absent; device "cpu" measures memcpy
into a CPU slot pool (the CPU stand-in for fills). The caller hands in the CPU expert kernel to measure
(``ExpertKernel``: ``experts/cpu/kernel.py`` is one); this package imports nothing above it.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import torch

from freetoken.quant import WeightFormat, format_by_name

_GB = 1e9


class ExpertKernel(Protocol):
    """What is measured: a CPU expert kernel (``experts/cpu/kernel.py: CpuExpertKernel``)."""

    num_threads: int
    isa: str

    def run(self, x: torch.Tensor, tok: torch.Tensor, row: torch.Tensor, weight: torch.Tensor,
            gate_up: torch.Tensor, down: torch.Tensor, activation: str = ..., out: torch.Tensor | None = ...,
            scales: tuple[torch.Tensor, torch.Tensor] | None = ...) -> torch.Tensor: ...  # fmt: skip

    def stream_read(self, buf: torch.Tensor) -> int: ...


@dataclass(frozen=True)
class BandwidthConfig:
    read_bytes: int = 4 * 2**30  # distinct data for the host read figure
    pool_bytes: int = 5 * 2**28  # expert pool cycled over (>> L3), also the pinned copy source
    hidden: int = 2048  # expert shape: Qwen3-30B-A3B by default
    inter: int = 768
    top_k: int = 8  # experts per kernel call / per fill batch (a decode layer's misses)
    layer_experts: int = 128  # experts in one layer (B_P,layer copy size)
    seconds: float = 1.0  # measurement window per figure
    device: str = "cuda"
    weights: str = "bf16"  # the experts' format (``quant.format_by_name``): "bf16", "fp8_block", "mxfp4" or "nvfp4"

    @property
    def expert_bytes(self) -> int:
        """One expert as the pool holds it: gate, up, down (packed, with their scales)."""
        f, D, I = format_by_name(self.weights), self.hidden, self.inter
        return f.row_bytes(2 * I, D, 2) + f.row_bytes(D, I, 2)


@dataclass(frozen=True)
class BandwidthResult:
    threads: int
    isa: str
    expert_bytes: int
    host_read: float
    cpu_kernel: float
    fill: float | None = None
    layer: float | None = None
    fill_concurrent: float | None = None
    cpu_kernel_concurrent: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def host_read_gbps(kern: ExpertKernel, nbytes: int, reps: int = 3) -> float:
    buf = torch.ones(max(8, nbytes), dtype=torch.uint8)  # touched: every page is backed
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        kern.stream_read(buf)
        times.append(time.perf_counter() - t0)
    return buf.numel() / statistics.median(times) / _GB


def _packed_bank(fmt: WeightFormat, n: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` experts' ``[rows, cols]`` weights packed in ``fmt``, with scales: a few quantised once and repeated
    (values do not matter for bandwidth; quantising the whole pool would need it in float first)."""
    block = min(n, 8)
    packed, scale = fmt.quantize(torch.empty(block, rows, cols).normal_(0, 0.02))
    assert scale is not None
    reps = -(-n // block)
    bank = packed.view(torch.uint8).repeat(reps, 1, 1)[:n].contiguous().view(packed.dtype)  # fp8 cannot repeat
    return bank, scale.repeat(reps, *([1] * (scale.dim() - 1)))[:n].contiguous()


class KernelLoad:
    """The CPU expert kernel on one token's top-k experts, call after call."""

    def __init__(self, kern: ExpertKernel, cfg: BandwidthConfig) -> None:
        n = max(2 * cfg.top_k, cfg.pool_bytes // cfg.expert_bytes)
        # values do not matter for bandwidth; small normals keep activations finite
        self.scales: tuple[torch.Tensor, torch.Tensor] | None = None
        fmt = format_by_name(cfg.weights)
        if fmt.quantized:  # packed experts: what the pool holds, scales and all
            self.gate_up, gs = _packed_bank(fmt, n, 2 * cfg.inter, cfg.hidden)
            self.down, ds = _packed_bank(fmt, n, cfg.hidden, cfg.inter)
            self.scales = (gs, ds)
        else:
            self.gate_up = torch.empty(n, 2 * cfg.inter, cfg.hidden, dtype=torch.bfloat16).normal_(0, 0.02)
            self.down = torch.empty(n, cfg.hidden, cfg.inter, dtype=torch.bfloat16).normal_(0, 0.02)
        self.kern, self.k, self.n, self.expert_bytes = kern, cfg.top_k, n, cfg.expert_bytes
        self.x = torch.randn(1, cfg.hidden)
        self.tok = torch.zeros(cfg.top_k, dtype=torch.int32)
        self.w = torch.full((cfg.top_k,), 1.0 / cfg.top_k)
        self.out = torch.empty(1, cfg.hidden)
        # walk the pool in order: an expert comes back only after all others (reuse distance >> L3)
        self.route_sets = [(torch.arange(self.k) + i * self.k) % n for i in range(max(1, n // self.k))]

    def run_for(self, seconds: float, start: threading.Barrier | None = None) -> float:
        """Calls until `seconds` have passed; returns GB/s of expert weights read."""
        self.kern.run(self.x, self.tok, self.route_sets[0], self.w, self.gate_up, self.down, out=self.out,
                      scales=self.scales)
        if start is not None:
            start.wait()
        calls, t0 = 0, time.perf_counter()
        while True:
            rows = self.route_sets[calls % len(self.route_sets)]
            self.kern.run(self.x, self.tok, rows, self.w, self.gate_up, self.down, out=self.out, scales=self.scales)
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                return calls * self.k * self.expert_bytes / elapsed / _GB


class CopyLoad:
    """Host -> device copies of `chunk` bytes in batches of `batch` (pinned source, own CUDA stream), two
    batches in flight: the issuing thread may be late by a batch's duration (a busy machine, CPU
    workers on every core) without the link going idle, as in the engine, whose host runs ahead. On a
    "cpu" device the copies are memcpy into a separate CPU pool, as the CPU slot cache does (DESIGN §8)."""

    def __init__(self, src: torch.Tensor, device: torch.device, chunk: int, batch: int) -> None:
        self.src, self.chunk, self.batch = src, chunk, batch
        self.slots = max(1, min(batch, src.numel() // chunk))
        self.dst = torch.empty(self.slots * chunk, dtype=torch.uint8, device=device)
        self.offsets = list(range(0, src.numel() - chunk + 1, chunk))
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._prev: torch.cuda.Event | None = None  # the batch in flight before the last one
        # CPU: one single-threaded memcpy per copy (numpy), like one copy thread; torch's parallel
        # copy would compete with the kernel's workers for the same cores
        self._np = None if self.stream is not None else (src.numpy(), self.dst.numpy())

    def run_for(self, seconds: float, start: threading.Barrier | None = None) -> float:
        self._batch(0)  # warm-up
        self._settle()
        if start is not None:
            start.wait()
        copies, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            copies += self._batch(copies)
        self._settle()  # every counted copy is done
        return copies * self.chunk / (time.perf_counter() - t0) / _GB

    def _settle(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
            self._prev = None

    def _batch(self, first: int) -> int:
        if self._np is not None:
            src, dst = self._np
            for j in range(self.batch):
                off = self.offsets[(first + j) % len(self.offsets)]
                slot = (j % self.slots) * self.chunk
                np.copyto(dst[slot : slot + self.chunk], src[off : off + self.chunk])
            return self.batch
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            for j in range(self.batch):
                off = self.offsets[(first + j) % len(self.offsets)]
                slot = (j % self.slots) * self.chunk
                self.dst[slot : slot + self.chunk].copy_(self.src[off : off + self.chunk], non_blocking=True)
            # blocking: the wait below sleeps instead of spinning, so the copy thread does not take a core from
            # the kernel's workers when they use every core (a spinning wait read B_H' low: docs/benchmarks.md)
            done = torch.cuda.Event(blocking=True)
            done.record(self.stream)
        if self._prev is not None:
            self._prev.synchronize()  # the batch before this one: this one keeps the link busy meanwhile
        self._prev = done
        return self.batch


def concurrent_gbps(kernel: KernelLoad, copies: CopyLoad, seconds: float) -> tuple[float, float]:
    """(B_P', B_H'): the copy loop on a second thread while this thread runs the kernel loop."""
    start = threading.Barrier(2, timeout=max(60.0, 10 * seconds))  # a failing side must not hang the other
    result: dict[str, float] = {}
    copier = threading.Thread(target=lambda: result.__setitem__("p", copies.run_for(seconds, start)))
    copier.start()
    h = kernel.run_for(seconds, start)
    copier.join()
    return result["p"], h


def measure(cfg: BandwidthConfig, kern: ExpertKernel) -> BandwidthResult:
    """Every figure with ``kern`` (for B_H as ``threads`` workers deliver it: one whose caller does not help)."""
    read = host_read_gbps(kern, cfg.read_bytes)
    load = KernelLoad(kern, cfg)
    b_h = load.run_for(cfg.seconds)
    fields: dict[str, float] = {}
    device = torch.device(cfg.device)
    if device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available()):
        layer_bytes = cfg.layer_experts * cfg.expert_bytes
        pinned = device.type == "cuda"  # pinning needs CUDA; CPU "fills" are plain memcpy
        src = torch.empty(max(cfg.pool_bytes, layer_bytes), dtype=torch.uint8, pin_memory=pinned)
        src.fill_(1)
        fill = CopyLoad(src, device, cfg.expert_bytes, cfg.top_k)
        fields["fill"] = fill.run_for(cfg.seconds)
        fields["layer"] = CopyLoad(src, device, layer_bytes, 1).run_for(cfg.seconds)
        b_p2, b_h2 = concurrent_gbps(load, fill, cfg.seconds)
        fields["fill_concurrent"], fields["cpu_kernel_concurrent"] = b_p2, b_h2
    return BandwidthResult(kern.num_threads, kern.isa, cfg.expert_bytes, read, b_h, **fields)
