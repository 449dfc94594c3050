"""CUDA graphs of one MoE layer's decode step, per (layer, tokens), for the slot backends.

Replaying a graph costs the host a few microseconds where the eager layer launches ~40 small operations,
whose Python at batch 1 takes longer than the device work (so the q* split's saving could not show; figures
in docs/benchmarks.md). A key is captured on its second eager call (the first compiles the
Triton kernels for its shape) and replayed after: the inputs are copied into static buffers, the
backend's ``before_replay`` does the host's share (queue the CPU branch's batch, host counters), the
graph replays, and its static output is returned. All graphs share one memory pool (replayed one at a
time on one stream), so an output is valid until the next replay of any of them: enough, as the decoder
adds it to the residual at once, in stream order. The body must be capturable: the device-side plan (no
host sync), fills and GEMMs, and the stream-ordered CPU branch on its toggle flags.

A capture that fails turns graphs off for the backend with one warning (the caller's stream restored), but
one that ran out of device memory (another program took it: elastic memory) is tried again later;
a replay that fails lets the backend release the batch it queued (``replay_failed``) and re-raises.
``clear()`` drops the graphs when the slot cache is resized. Each capture synchronises the device once
(torch does): keys are few in decode (layers x batch sizes seen), and each is captured once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from freetoken.hardware.device_memory import release_deferred
from freetoken.hardware.graph_capture import capture_graph

if TYPE_CHECKING:
    from freetoken.experts.cpu.runner import CpuExpertRunner
    from freetoken.experts.slots.counters import DeviceCounters

log = logging.getLogger(__name__)
RETRY_AFTER = 32  # eager calls before a capture that ran out of device memory is tried again (elastic memory)

Body = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (layer, x, ids, w) -> out


class GraphHost(Protocol):
    def capture_begin(self) -> None: ...
    def capture_end(self) -> None: ...
    def before_replay(self, layer: int, tokens: int) -> None: ...
    def before_step(self, items: Sequence[tuple[int, int]]) -> None: ...
    def replay_failed(self) -> None: ...


@dataclass
class _Entry:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    ids: torch.Tensor
    w: torch.Tensor
    out: torch.Tensor


class LayerGraphs:
    capture_after = 1  # eager calls of a key before it is captured (the first compiles its Triton kernels)

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.enabled = True
        self.captures = 0
        self.replays = 0
        self.failures = 0  # captures that failed (the layers then run eagerly)
        self._entries: dict[tuple[int, int], _Entry] = {}
        self._seen: dict[tuple[int, int], int] = {}
        self._pool: Any = None  # torch.cuda.graph_pool_handle()
        self._recording: list[tuple[int, int]] | None = None  # a step capture's layers (record_begin)
        self._steps: dict[int, list[tuple[int, int]]] = {}  # captured steps' layers, by step tokens

    def eligible(self, tokens: int) -> bool:
        return self.enabled and 0 < tokens <= self.max_tokens

    def run(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, body: Body, host: GraphHost
    ) -> torch.Tensor:
        key = (layer, x.shape[0])
        if self._recording is not None:  # inside the engine's capture of a whole step: no graph of our own
            self._recording.append(key)
            return body(layer, x, ids, w)
        entry = self._entries.get(key)
        if entry is None:
            seen = self._seen.get(key, 0)
            if seen < self.capture_after:
                self._seen[key] = seen + 1
                return body(layer, x, ids, w)
            entry = self._capture(key, x, ids, w, body, host)
            if entry is None:
                return body(layer, x, ids, w)
        entry.x.copy_(x)
        entry.ids.copy_(ids)
        entry.w.copy_(w)
        host.before_replay(layer, x.shape[0])
        try:
            entry.graph.replay()
        except Exception:
            self.enabled = False
            host.replay_failed()
            raise
        self.replays += 1
        return entry.out

    def _capture(
        self, key: tuple[int, int], x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, body: Body, host: GraphHost
    ) -> _Entry | None:
        sx, sids, sw = x.clone(), ids.clone(), w.clone()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream()
        host.capture_begin()
        try:
            # thread_local: CUDA calls of other threads (the CPU branch's fallback worker) do not void it
            with capture_graph(graph, self._pool):
                out = body(key[0], sx, sids, sw)
        except Exception as exc:  # noqa: BLE001 - any capture failure: run eagerly from now on
            torch.cuda.set_stream(stream)  # a failed capture can leave the capture stream current
            self.failures += 1
            if isinstance(exc, torch.OutOfMemoryError):  # another program holds the memory now: try again later
                self._seen[key] = -RETRY_AFTER
                log.warning("CUDA graph capture of MoE layer %d (%d tokens) ran out of memory; eager for the next "
                            "%d calls", key[0], key[1], RETRY_AFTER)  # fmt: skip
                return None
            self.enabled = False
            log.warning("CUDA graph capture of MoE layer %d (%d tokens) failed, running eagerly: %s: %s",
                        key[0], key[1], type(exc).__name__, exc)
            return None
        finally:
            host.capture_end()
            release_deferred()  # cache memory whose last tensor went during the capture
        entry = _Entry(graph, sx, sids, sw, out)
        self._entries[key] = entry
        self.captures += 1
        return entry

    def record_begin(self, host: GraphHost) -> None:
        """The engine captures a whole decode step: layers run as plain bodies, their keys recorded."""
        host.capture_begin()
        self._recording = []

    def record_end(self, host: GraphHost, tokens: int) -> None:
        self._steps[tokens] = self._recording or []
        self._recording = None
        host.capture_end()

    def before_step_replay(self, host: GraphHost, tokens: int) -> None:
        """The host's share of every layer of a captured step, in layer order and in one call, before the step
        replays."""
        host.before_step(self._steps.get(tokens, []))
        self.replays += 1

    def clear(self) -> None:
        """Drop every graph (the slot cache's tensors moved)."""
        torch.cuda.synchronize()  # a graph may still be running
        self._entries.clear()
        self._seen.clear()
        self._steps.clear()

    def stats(self) -> dict[str, int]:
        return {"moe_graphs": len(self._entries), "moe_graph_replays": self.replays,
                "moe_graph_failures": self.failures}


class StepCapture:
    """What a backend with layer graphs does when the engine captures a whole decode step: its layers
    run as plain bodies inside the engine's graph, and their host shares are replayed before each step."""

    graphs: LayerGraphs | None

    def begin_step_capture(self) -> None:
        assert self.graphs is not None
        self.graphs.record_begin(self)  # type: ignore[arg-type]  # the backend is the graphs' host

    def end_step_capture(self, tokens: int) -> None:
        assert self.graphs is not None
        self.graphs.record_end(self, tokens)  # type: ignore[arg-type]

    def before_step_replay(self, tokens: int) -> None:
        assert self.graphs is not None
        self.graphs.before_step_replay(self, tokens)  # type: ignore[arg-type]


class CpuBranchHost(StepCapture):
    """The graphs' host share of a backend whose layers may run a stream-ordered CPU branch (``cpu``): queue the
    branch's batch before a replayed layer (or every layer's before a replayed step) and count the layer steps that
    the device counters see only at replay."""

    cpu: CpuExpertRunner | None
    counters: DeviceCounters
    _saved_layer_steps = 0

    def capture_begin(self) -> None:
        self._saved_layer_steps = self.counters.layer_steps

    def capture_end(self) -> None:
        self.counters.layer_steps = self._saved_layer_steps  # the capture ran no step

    def before_replay(self, layer: int, tokens: int) -> None:
        """The host's share of a replayed layer: queue its CPU batch, count the layer step."""
        if self.cpu is not None:
            self.cpu.push_replay(layer, tokens)
        self.counters.layer_steps += 1

    def before_step(self, items: Sequence[tuple[int, int]]) -> None:
        """The host's share of a replayed step's layers ((layer, tokens)): every CPU batch queued in one call."""
        if self.cpu is not None and items:
            self.cpu.push_replay_many(items)
        self.counters.layer_steps += len(items)

    def replay_failed(self) -> None:
        if self.cpu is not None:
            self.cpu.cancel_replay()
