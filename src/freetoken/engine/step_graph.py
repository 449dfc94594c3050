"""The whole decode step as one CUDA graph per batch-size bucket (DESIGN §9).

embeddings → every layer (attention over the page table, router, the MoE backend with its fills and the
CPU branch's flags) → final norm → logits → sampling, replayed from static buffers. Per step the host
packs the step's metadata (ids, positions, KV slots, page table, lengths, sampling settings) into two
pinned tensors, copies them over in two transfers, does the MoE backend's host share of every layer
(``before_step_replay``: queue the CPU branch's batches), replays, and queues the copy of the sampled ids (and
logprobs) back, with an event after it (``launch``; ``inflight.Launch.read`` waits for it). A step launched
before the previous one was read (``engine/overlap.py``) gathers its input ids from that step's sampled ids on
the device, stream-ordered before its replay; the host buffers are double-buffered so that filling the next
step never overwrites a copy still queued.

A batch of n rows runs in the smallest bucket B ≥ n; rows n..B-1 repeat row 0 (same token, position and
KV slot: they write the same K/V, and their samples are dropped). Each bucket has a graph per set of
sampler stages its rows need (``Features``: an all-greedy step without penalties or logprobs is an
argmax, not a sort, a noise draw and two softmaxes over the vocabulary; a step with a grammar-constrained row
adds the allowed-token bitmask, a third host→device copy of the rows' masks). A (bucket, stages) graph is
captured on its second use: that step runs eagerly on the static buffers first (its result is the
step's), then the capture records it. Batches past the largest bucket, and steps the backend cannot capture, run eagerly
(``ModelRunner``), said once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.engine import noise
from freetoken.engine.anchors import due_captures
from freetoken.engine.constraint import new_bitmask
from freetoken.engine.inflight import Launch, launched
from freetoken.engine.request import Request
from freetoken.engine.sampler import MAX_TOP_LOGPROBS, Features, SamplingBatch, sample_batch
from freetoken.engine.step_sampler import Choice, StepSampler, features_of, pack
from freetoken.experts.base import ExpertBackend
from freetoken.layers.attention import AttnBatch
from freetoken.layers.paged_attention import DecodeMeta
from freetoken.models.decoder import DecoderModel

log = logging.getLogger(__name__)
RETRY_AFTER = 32  # steps before a capture that ran out of device memory is tried again (elastic memory)

_INTS = 5  # ids, positions, KV slots, lengths, state slots; then the page table; then the sampler's 5 integer rows
_FLOATS = 6  # temperature, top_p, min_p, presence, frequency, repetition


def buckets(max_batch: int) -> list[int]:
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


@dataclass
class _Host:
    """One of a bucket's two sets of pinned host buffers, and the event after the last step that used it."""

    ints: torch.Tensor  # the device ``ints``' twin
    floats: torch.Tensor
    out: torch.Tensor  # [B * (2 + 2*MAX_TOP_LOGPROBS)] float64: the step's [B, w] rows (id, logprob, top ids,
    # top logprobs), contiguous: a strided destination would make the copy back a synchronous one
    done: torch.cuda.Event | None = None


@dataclass
class _Static:
    """One bucket's input and output buffers (device), their pinned host twins (two sets, used in turn), and
    its graphs."""

    ints: torch.Tensor  # [_INTS*B + B*P + 5*B] int64
    floats: torch.Tensor  # [_FLOATS, B] float32
    hosts: list[_Host]
    batch: AttnBatch
    sampling: SamplingBatch
    ids: torch.Tensor  # [B] the model's input tokens
    mask: torch.Tensor  # [B, ceil(V/32)] int32 the allowed-token bitmask of grammar-constrained rows
    host_mask: torch.Tensor  # (a constrained step is never launched ahead: one is enough)
    graphs: dict[Features, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = field(default_factory=dict)  # graph, out
    uses: dict[Features, int] = field(default_factory=dict)
    turn: int = 0  # which of ``hosts`` the next step fills


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
    ) -> None:
        self.model, self.kv, self.backend, self.sampler = model, kv, backend, sampler
        self.max_pages, self.top_k = max_pages, top_k
        self.buckets = buckets(max_batch)
        self.vocab = int(model.lm_head.shape[0])  # the logits' width (the allowed-token bitmask's)
        self.device = kv.device
        self._static: dict[int, _Static] = {}
        self._pool: Any = None
        self.enabled = True
        self.captures = self.replays = 0
        self._said: set[str] = set()

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def can_run(self, items: list[tuple[Request, int]], starts: list[int] | None = None) -> bool:
        """A decode-only step whose size has a bucket and that the MoE backend can capture (``starts``: as
        ``launch``'s)."""
        if not self.enabled or not items or any(n != 1 for _, n in items):
            return False
        if due_captures(items, starts):  # a state checkpoint is taken per sequence, eagerly
            return False
        b = self.bucket(len(items))
        if b is None:
            self._once("past", f"decode batches past {self.buckets[-1]} rows run eagerly")
            return False
        if self.backend is not None and not self.backend.step_capturable(b, self.top_k):
            self._once("backend", f"the {self.backend.name} backend cannot capture a step: decode runs eagerly")
            return False
        return True

    def run(self, items: list[tuple[Request, int]]) -> list[tuple[Request, Choice]]:
        return list(zip([req for req, _ in items], self.launch(items).read()))

    def launch(
        self,
        items: list[tuple[Request, int]],
        starts: list[int] | None = None,
        prev: Launch | None = None,
        src_rows: list[int] | None = None,
    ) -> Launch:
        """Queues the step (nothing waits for the device). ``starts``: each row's position (None: its
        ``num_computed_tokens``); a row further on is a token ahead of its ``token_ids``, whose input id is
        ``prev``'s sampled id at row ``src_rows[i]``."""
        reqs = [req for req, _ in items]
        starts = starts if starts is not None else [req.num_computed_tokens for req in reqs]
        B = self.bucket(len(reqs))
        assert B is not None
        st = self._static.get(B) or self._make(B)
        f = features_of(reqs)
        host = st.hosts[st.turn]
        st.turn ^= 1
        if host.done is not None:  # the last step that used these buffers has copied them (it was read already)
            host.done.synchronize()
        self._fill(st, host, reqs, starts, src_rows or [0] * len(reqs))
        if prev is not None:  # the rows' input ids: the previous step's samples, gathered on the device
            st.ids.copy_(prev.ids.index_select(0, st.ids))
        st.uses[f] = st.uses.get(f, 0) + 1
        if self.backend is not None:
            self.backend.begin_step(B, True)
        captured = st.graphs.get(f)
        if captured is None:
            out = self._body(st, f)  # this step's result; a second use captures the graph
            if st.uses[f] >= 2:
                self._capture(st, B, f)
        else:
            if self.backend is not None:
                self.backend.before_step_replay(B)
            captured[0].replay()
            self.replays += 1
            out = captured[1]
        blocking = self.backend is not None and self.backend.cpu_busy_in_step
        step = launched(items, starts, out, host.out[: out.numel()].view(out.shape), blocking)
        host.done = step.done
        return step

    # -- buffers ---------------------------------------------------------------------------------------
    def _make(self, B: int) -> _Static:
        P, dev = self.max_pages, self.device
        n_ints = _INTS * B + B * P + 5 * B
        ints = torch.zeros(n_ints, dtype=torch.int64, device=dev)
        floats = torch.ones((_FLOATS, B), dtype=torch.float32, device=dev)
        ids, pos, slots, lens, states = (ints[i * B : (i + 1) * B] for i in range(_INTS))
        table = ints[_INTS * B : _INTS * B + B * P].view(B, P)
        srows = ints[_INTS * B + B * P :].view(5, B)
        if dev.type == "cuda":  # the decode kernel reads the int64 rows in place
            meta = DecodeMeta(table, lens, self.kv.page_size)
        else:  # the CPU step's C++ attention takes int32 (copied in each step, ``_body``)
            meta = DecodeMeta(table.to(torch.int32), lens.to(torch.int32), self.kv.page_size)
        batch = AttnBatch(pos, slots, meta, state_slots=states if self.model.states is not None else None)
        sampling = SamplingBatch(
            temperature=floats[0], top_p=floats[1], min_p=floats[2], presence=floats[3], frequency=floats[4],
            repetition=floats[5], top_k=srows[0], seed_lo=srows[1], seed_hi=srows[2], step=srows[3], rows=srows[4],
        )  # fmt: skip
        hosts = [
            _Host(torch.zeros(n_ints, dtype=torch.int64).pin_memory(),
                  torch.ones((_FLOATS, B), dtype=torch.float32).pin_memory(),
                  torch.zeros(B * (2 + 2 * MAX_TOP_LOGPROBS), dtype=torch.float64).pin_memory())
            for _ in range(2)
        ]  # fmt: skip
        st = _Static(
            ints, floats, hosts, batch, sampling, ids,
            new_bitmask(B, self.vocab).to(dev), new_bitmask(B, self.vocab).pin_memory(),  # mask, host_mask
        )  # fmt: skip
        self._static[B] = st
        return st

    def _fill(self, st: _Static, host: _Host, reqs: list[Request], starts: list[int], src_rows: list[int]) -> None:
        """The step's metadata into the pinned twins, then two copies to the device buffers (on CUDA the page table
        and lengths are read in place; on a CPU converted to int32 inside the step). A row ahead of its request's
        ``token_ids`` gets ``src_rows``' entry as its id: the row of the previous step that ``launch`` gathers."""
        B, P = st.floats.shape[1], self.max_pages
        pad = B - len(reqs)
        rows, starts, src_rows = reqs + [reqs[0]] * pad, starts + [starts[0]] * pad, src_rows + [src_rows[0]] * pad
        hi, hf = host.ints.numpy(), host.floats.numpy()
        for b, req in enumerate(rows):
            pos = starts[b]
            ahead = pos - req.num_computed_tokens  # sampled tokens not in token_ids yet (0 or 1)
            hi[b] = req.token_ids[pos] if ahead == 0 else src_rows[b]
            hi[B + b] = pos
            hi[2 * B + b] = self.kv.slots(req.pages, pos, pos + 1)[0]
            hi[3 * B + b] = pos + 1
            hi[4 * B + b] = req.state_slot or 0
            base = _INTS * B + b * P
            hi[base : base + P] = 0
            hi[base : base + len(req.pages)] = req.pages
            s = _INTS * B + B * P
            p = req.params
            lo, h = noise.split_seed(req.seed)
            hi[s + b] = max(p.top_k, 0)
            hi[s + B + b], hi[s + 2 * B + b] = lo, h
            hi[s + 3 * B + b] = req.num_output_tokens + ahead
            hi[s + 4 * B + b] = self.sampler.shared_row if b >= len(reqs) else self.sampler.row_of(req)
            hf[:, b] = (p.temperature, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
        st.ints.copy_(host.ints, non_blocking=True)
        st.floats.copy_(host.floats, non_blocking=True)
        if any(r.constraint is not None for r in reqs):  # the next token's allowed set, row by row (pads: all)
            st.host_mask.fill_(-1)
            for b, req in enumerate(reqs):
                if req.constraint is not None:
                    req.constraint.fill_bitmask(st.host_mask[b])
            st.mask.copy_(st.host_mask, non_blocking=True)

    # -- the step itself -------------------------------------------------------------------------------
    def _body(self, st: _Static, f: Features) -> torch.Tensor:
        """The step; returns [B, 1] float64 sampled ids, or with logprobs [B, 2 + 2*MAX_TOP_LOGPROBS]."""
        meta = st.batch.decode
        assert meta is not None
        B = st.ids.shape[0]
        P = self.max_pages
        if meta.block_table.dtype != torch.int64:
            meta.block_table.copy_(st.ints[_INTS * B : _INTS * B + B * P].view(B, P))
            meta.seq_lens.copy_(st.ints[3 * B : 4 * B])
        hidden = self.model.forward(st.ids, st.batch, self.kv)
        logits = self.model.logits(hidden)
        s = sample_batch(logits, st.sampling, self.sampler.state, f, st.mask if f.mask else None)
        if f.penalties:  # without, every row is the shared row, whose counts nothing reads
            self.sampler.state.update(st.sampling.rows, s.ids)
        return pack(s, f.logprobs)

    def _capture(self, st: _Static, B: int, f: Features) -> None:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream()
        if self.backend is not None:
            self.backend.begin_step_capture()
        try:
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = self._body(st, f)
        except Exception as exc:  # noqa: BLE001 - any capture failure: decode runs eagerly from now on
            torch.cuda.set_stream(stream)
            if isinstance(exc, torch.OutOfMemoryError):  # another program holds the memory now: try again later
                st.uses[f] = -RETRY_AFTER
                log.warning("CUDA graph capture of the %d-row decode step ran out of memory; eager for the next "
                            "%d steps", B, RETRY_AFTER)  # fmt: skip
                return
            self.enabled = False
            log.warning("CUDA graph capture of the %d-row decode step failed, running eagerly: %s: %s",
                        B, type(exc).__name__, exc)  # fmt: skip
            return
        finally:
            if self.backend is not None:
                self.backend.end_step_capture(B)
        st.graphs[f] = (graph, out)
        self.captures += 1

    def _once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.info(message)

    def clear(self) -> None:
        """Drop every graph (the caches' tensors moved)."""
        torch.cuda.synchronize()
        self._static.clear()

    def stats(self) -> dict[str, int]:
        return {"step_graphs": sum(len(s.graphs) for s in self._static.values()),
                "step_graph_replays": self.replays}  # fmt: skip
