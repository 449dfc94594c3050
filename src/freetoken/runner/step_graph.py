"""The whole decode step as one CUDA graph per batch-size bucket (DESIGN §9).

embeddings → every layer (attention over the page table, router, the MoE backend with its fills and the
CPU branch's flags) → final norm → logits → sampling, replayed from static buffers. Per step the host
packs the step's metadata (ids, positions, KV slots, page table, lengths, sampling settings) into a pinned
tensor, copies it over in one transfer (``step_buffers.py``: the layout), does the MoE backend's host share of
every layer (``before_step_replay``: queue the CPU branch's batches), replays, and queues the copy of the sampled
ids (and logprobs) back, with an event after it (``launch``; ``inflight.Launch.read`` waits for it). A step launched
before the previous one was read (``engine/overlap.py``) gathers its input ids from that step's sampled ids on
the device, stream-ordered before its replay; the host buffers are double-buffered so that filling the next
step never overwrites a copy still queued.

A batch of n rows runs in the smallest bucket B ≥ n; rows n..B-1 repeat row 0 (same token, position and
KV slot: they write the same K/V, and their samples are dropped). A model with recurrent-state slots has a bucket
for every batch size, no pad rows: a pad would share row 0's state slot, which the in-place state kernels (the fused
DeltaNet step, fla's) update while the pad reads it; the pad then computes other K/V than row 0 and the two writes
race for row 0's KV slot (measured on an H100: 103 of 3,753 tiny-hybrid requests took another greedy token, always
the padded row's; none with a bucket per size: ``bench/gpu/repeat_greedy.py``). Each bucket has a graph per set of
sampler stages its rows need (``Features``: an all-greedy step without penalties or logprobs is an
argmax, not a sort, a noise draw and two softmaxes over the vocabulary; a step with a grammar-constrained row
adds the allowed-token bitmask, a third host→device copy of the rows' masks). Every per-request sampling setting
(temperature, top-k/p, min-p, penalties, seed halves and step, penalty row) is a column of the static buffers, and
every sampler stage is fixed-shape device work (``sampler.py``: counter-based noise from (seed, step, token), no
generator state; penalties by gathers and scatters): no stage reads a device value on the host. A (bucket, stages)
graph is captured on its first use: that step runs eagerly on the static buffers (its result is the step's; it
compiles the kernels), then the capture records it; later steps replay it. So with no fallback,
``replays == decode_steps - captures``. Which (bucket, page-table width) a step runs in: ``graph_shapes.py``. A
step whose rows reach a state checkpoint runs from its graph too: each checkpoint is the state after its row's token,
copied into the checkpoint's slot behind the replay (``anchors.end_checkpoints``).

A decode step that runs eagerly although graphs are on is a fallback, counted by reason (``FALLBACKS``; ``stats()``:
``step_graph_eager_fallbacks`` and per reason) and logged once per reason: a batch past the largest bucket, a backend
that cannot capture it, a (bucket, stages) whose capture failed (its steps stay eager; other graphs go on), a capture
out of memory (retried after ``RETRY_AFTER`` steps), a step retried alone after a batched step failed, graphs turned
off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from freetoken.cache.anchors import end_checkpoints
from freetoken.cache.kv_pool import KVPool
from freetoken.experts.base import ExpertBackend
from freetoken.hardware.device_memory import release_deferred
from freetoken.hardware.graph_capture import capture_graph
from freetoken.models.decoder import DecoderModel
from freetoken.runner.batch import R, StepRequest
from freetoken.runner.graph_shapes import buckets, widths
from freetoken.runner.inflight import Launch, launched
from freetoken.runner.sampler import Features, sample_batch
from freetoken.runner.step_buffers import StepBuffers
from freetoken.runner.step_sampler import Choice, StepSampler, features_of, pack

log = logging.getLogger(__name__)
RETRY_AFTER = 32  # steps before a capture that ran out of device memory is tried again (elastic memory)

# why a decode step ran eagerly although step graphs are on (``StepGraphs.fallbacks``' keys)
FALLBACKS = {
    "disabled": "step graphs are turned off",
    "past_buckets": "the batch is past the largest bucket",
    "backend": "the MoE backend cannot capture this step",
    "capture_failed": "the capture of this bucket and sampler stages failed",
    "capture_oom": "the capture ran out of device memory (tried again later)",
    "retried_alone": "a batched step failed; its rows are retried one by one",
}


class Graph(Protocol):
    def replay(self) -> None: ...


# records ``body`` (a step on the static buffers) as a graph; returns it and the output it rewrites at each replay
Capture = Callable[[Callable[[], torch.Tensor]], tuple[Graph, torch.Tensor]]
@dataclass
class _Static(StepBuffers):
    """One (bucket, width)'s buffers (``step_buffers.py``) and its graphs."""

    graphs: dict[Features, tuple[Graph, torch.Tensor]] = field(default_factory=dict)  # graph, out
    failed: dict[Features, str] = field(default_factory=dict)  # stages whose capture failed: why
    oom_wait: dict[Features, int] = field(default_factory=dict)  # eager steps left before a capture is retried


class StepGraphs:
    def __init__(
        self,
        model: DecoderModel,
        kv: KVPool,
        backend: ExpertBackend | None,
        sampler: StepSampler,
        max_batch: int,
        max_pages: int,
        top_k: int,
        capture: Capture | None = None,
    ) -> None:
        """``capture``: records a step as a graph (None: a CUDA graph; tests on a CPU pass their own)."""
        self.model, self.kv, self.backend, self.sampler = model, kv, backend, sampler
        self.max_pages, self.top_k = max_pages, top_k
        self.buckets = buckets(max_batch, every_size=model.states is not None)  # no pad shares a state slot
        self.widths = widths(max_pages, kv.page_size, model.scans_table)
        self.vocab = int(model.lm_head.shape[0])  # the logits' width (the allowed-token bitmask's)
        self.device = kv.device
        self.capture = capture or self._cuda_capture
        self._static: dict[int, dict[int, _Static]] = {}  # bucket -> page-table width -> its buffers and graphs
        self._pool: Any = None
        self.enabled = True
        self.decode_steps = self.captures = self.replays = 0
        self.fallbacks: dict[str, int] = {}  # eager decode steps by reason (``FALLBACKS``)

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def width(self, reqs: Sequence[StepRequest]) -> int:
        """The narrowest page-table width holding every row's pages."""
        most = max(len(req.pages) for req in reqs)
        return next((w for w in self.widths if w >= most), self.max_pages)

    def refusal(self, items: Sequence[tuple[R, int]], starts: list[int] | None = None) -> tuple[str, str] | None:
        """Why a decode-only step (``starts``: as ``launch``'s) cannot run from the graphs: (reason, detail), or
        None when it can."""
        b = self.bucket(len(items))
        if not self.enabled:
            return "disabled", ""
        if b is None:
            return "past_buckets", f"{len(items)} rows, largest bucket {self.buckets[-1]}"
        if self.backend is not None and not self.backend.step_capturable(b, self.top_k):
            return "backend", f"the {self.backend.name} backend, {b} rows"
        reqs = [req for req, _ in items]
        st = self._static.get(b, {}).get(self.width(reqs))
        why = st.failed.get(features_of(reqs)) if st is not None else None
        return ("capture_failed", why) if why is not None else None

    def admit(self, items: Sequence[tuple[R, int]], starts: list[int] | None = None, graphs: bool = True) -> bool:
        """Whether a step runs from the graphs (then the caller calls ``launch`` or ``run``). A decode-only step (one
        token per row) that cannot, or whose caller asks for an eager one (``graphs=False``: a row retried alone),
        is counted as a fallback by reason."""
        if not _decode_only(items, starts):
            return False  # prefill and mixed steps run eagerly by design
        self.decode_steps += 1
        why = self.refusal(items, starts) if graphs else ("retried_alone", "")
        if why is not None:
            self._fallback(*why)
        return why is None

    def can_run(self, items: Sequence[tuple[R, int]], starts: list[int] | None = None) -> bool:
        """``admit`` without counting anything."""
        return _decode_only(items, starts) and self.refusal(items, starts) is None

    def run(self, items: Sequence[tuple[R, int]]) -> list[tuple[R, Choice]]:
        return list(zip([req for req, _ in items], self.launch(items).read()))

    def launch(
        self,
        items: Sequence[tuple[R, int]],
        starts: list[int] | None = None,
        prev: Launch[R] | None = None,
        src_rows: list[int] | None = None,
    ) -> Launch[R]:
        """Queues the step (nothing waits for the device). ``starts``: each row's position (None: its
        ``num_computed_tokens``); a row further on is a token ahead of its ``token_ids``, whose input id is
        ``prev``'s sampled id at row ``src_rows[i]``."""
        reqs = [req for req, _ in items]
        starts = starts if starts is not None else [req.num_computed_tokens for req in reqs]
        B = self.bucket(len(reqs))
        assert B is not None
        P = self.width(reqs)
        st = self._static.get(B, {}).get(P) or self._make(B, P)
        f = features_of(reqs)
        host = st.hosts[st.turn]
        st.turn ^= 1
        if host.done is not None:  # the last step that used these buffers has copied them (it was read already)
            host.done.synchronize()
        st.fill(host, reqs, starts, src_rows or [0] * len(reqs), self.kv, self.sampler)
        if prev is not None:  # the rows' input ids: the previous step's samples, gathered on the device
            st.ids.copy_(prev.ids.index_select(0, st.ids))
        if self.backend is not None:
            self.backend.begin_step(B, True)
        captured = st.graphs.get(f)
        if captured is None:
            out = self._body(st, f)  # this step's result (and the kernels' warm-up); the capture records it
            self._capture(st, B, f)
        else:
            if self.backend is not None:
                self.backend.before_step_replay(B)
            captured[0].replay()
            self.replays += 1
            out = captured[1]
        if self.model.states is not None:
            for src, dst in end_checkpoints(items, starts):
                self.model.states.copy(src, dst)
        blocking = self.backend is not None and self.backend.cpu_busy_in_step
        back = host.out[: out.numel()].view(out.shape)
        if out.device.type != "cuda":  # (tests on a CPU) the copy back that ``launched`` queues on CUDA: the graph's
            out = back.copy_(out)  # output is rewritten by the next replay, maybe before this step is read
        step = launched(items, starts, out, back, blocking)
        host.done = step.done
        return step

    # -- buffers ---------------------------------------------------------------------------------------
    def _make(self, B: int, P: int) -> _Static:
        st = _Static.make(B, P, self.kv, self.model.states is not None, self.vocab)
        assert isinstance(st, _Static)
        self._static.setdefault(B, {})[P] = st
        return st

    # -- the step itself -------------------------------------------------------------------------------
    def _body(self, st: _Static, f: Features) -> torch.Tensor:
        """The step; returns [B, 1] float64 sampled ids, or with logprobs [B, 2 + 2*MAX_TOP_LOGPROBS]."""
        st.cpu_tables()
        hidden = self.model.forward(st.ids, st.batch, self.kv)
        logits = self.model.logits(hidden)
        s = sample_batch(logits, st.sampling, self.sampler.state, f, st.mask if f.mask else None)
        if f.penalties:  # without, every row is the shared row, whose counts nothing reads
            self.sampler.state.update(st.sampling.rows, s.ids)
        return pack(s, f.logprobs)

    def _capture(self, st: _Static, B: int, f: Features) -> None:
        """After the eager step of a (bucket, stages) without a graph: capture it, or count an eager step while a
        capture that ran out of memory waits to be tried again."""
        wait = st.oom_wait.get(f, 0)
        if wait > 0:
            st.oom_wait[f] = wait - 1
            self._fallback("capture_oom", f"{B} rows")
            return
        if self.backend is not None:
            self.backend.begin_step_capture()
        try:
            st.graphs[f] = self.capture(lambda: self._body(st, f))
        except Exception as exc:  # noqa: BLE001 - any capture failure: this (bucket, stages) runs eagerly
            what = f"{B} rows, {_stages(f)}: {type(exc).__name__}: {exc}"
            if isinstance(exc, torch.OutOfMemoryError):  # another program holds the memory now: try again later
                st.oom_wait[f] = RETRY_AFTER
                self._fallback("capture_oom", what)
                return
            st.failed[f] = what
            self._fallback("capture_failed", what)
            return
        finally:
            if self.backend is not None:
                self.backend.end_step_capture(B)
        self.captures += 1

    def _cuda_capture(self, body: Callable[[], torch.Tensor]) -> tuple[Graph, torch.Tensor]:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream()
        try:
            with capture_graph(graph, self._pool):
                out = body()
        except BaseException:
            torch.cuda.set_stream(stream)  # a failed capture can leave the capture stream current
            raise
        finally:
            release_deferred()  # cache memory whose last tensor went during the capture
        return graph, out

    def _fallback(self, reason: str, detail: str) -> None:
        """Counts an eager decode step; the first of each reason is logged, with its detail."""
        first = reason not in self.fallbacks
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        if first and reason == "backend" and self.backend is not None:  # its layer graphs' failed captures, if any
            failed = self.backend.stats().get("moe_graph_failures")
            detail += f"; its layer graphs failed {failed} captures (logged above)" if failed else ""
        if first:
            log.warning("decode steps run eagerly: %s%s (step graphs: %s)", FALLBACKS[reason],
                        f" ({detail})" if detail else "", reason)  # fmt: skip

    def clear(self) -> None:
        """Drop every graph (the caches' tensors moved)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self._static.clear()

    def stats(self) -> dict[str, Any]:
        return {
            "step_graphs": sum(len(s.graphs) for per in self._static.values() for s in per.values()),
            "step_graph_decode_steps": self.decode_steps,
            "step_graph_captures": self.captures,
            "step_graph_replays": self.replays,
            "step_graph_eager_fallbacks": sum(self.fallbacks.values()),
            "step_graph_eager_fallback_reasons": dict(self.fallbacks),
        }


def _decode_only(items: Sequence[tuple[R, int]], starts: list[int] | None) -> bool:
    """Every row computes one token and samples after it: a prompt's one-token chunk that its prompt goes on
    after (a tiny token budget) is a prefill row (the graphs sample every row)."""
    firsts = starts if starts is not None else [req.num_computed_tokens for req, _ in items]
    return bool(items) and all(n == 1 and s + 1 >= req.num_tokens for (req, n), s in zip(items, firsts, strict=True))


def _stages(f: Features) -> str:
    """The sampler stages of ``f`` in words (a capture failure's log line)."""
    on = [name for name in ("draw", "cuts", "penalties", "logprobs", "mask") if getattr(f, name)]
    cut = f" (top-k <= {f.top_k})" if f.top_k else " (sort-free)" if f.nucleus else ""
    cut = f" (mixed: top-k <= {f.mixed_top_k} or sort-free)" if f.mixed_top_k else cut
    return "stages " + ("+".join(on) if on else "greedy") + cut
