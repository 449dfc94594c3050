"""Model runner: turns a scheduled batch into tensors, runs the model and samples where a request reaches its
last token: decode steps from one CUDA graph per batch bucket where it can (``step_graph.py``), else eagerly.
``launch`` queues a decode step without reading its samples back (``engine/overlap.py``), its rows' input ids
optionally gathered from the previous launch's samples on the device."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from freetoken.cache.anchors import captures_in, end_checkpoints
from freetoken.cache.kv_pool import KVPool
from freetoken.experts.base import ExpertBackend
from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.layers.attention import AttnBatch, SeqAttn
from freetoken.models.decoder import DecoderModel
from freetoken.runner.batch import R
from freetoken.runner.inflight import Launch, launched
from freetoken.runner.step_graph import StepGraphs
from freetoken.runner.step_sampler import Choice, StepSampler, pack

SMALL_STEP_TOKENS = 16


class ModelRunner:
    def __init__(
        self,
        model: DecoderModel,
        kv: KVPool,
        device: torch.device,
        backend: ExpertBackend | None,
        sliding_window: int | None,
        sampler: StepSampler,
        graphs: StepGraphs | None = None,
    ) -> None:
        self.model, self.kv, self.device, self.backend = model, kv, device, backend
        self.window = sliding_window
        self.sampler = sampler
        self.graphs = graphs
        self._default_threads = torch.get_num_threads()

    def build_batch(
        self, items: Sequence[tuple[R, int]], starts: list[int] | None = None
    ) -> tuple[torch.Tensor, AttnBatch, list[int]]:
        """``starts``: the first token of each item (None: its ``num_computed_tokens``; a layer-major
        prefill's later chunks start further on; a decode row launched ahead, one past its ``token_ids``: its
        input id is a placeholder the caller replaces)."""
        starts = starts if starts is not None else [req.num_computed_tokens for req, _ in items]
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_rows: list[int] = []
        seqs: list[SeqAttn] = []
        # a decode step's state checkpoints are copies behind it (``take_end_checkpoints``); a longer step's, per
        # sequence by its layers (``SeqAttn.captures``)
        decode = all(n == 1 for _, n in items)
        for (req, n), start in zip(items, starts):
            end = start + n
            q_start = len(ids)
            ids += req.token_ids[start:end] if end <= req.num_tokens else [0] * n
            positions += range(start, end)
            slots += self.kv.slots(req.pages, start, end)
            if not decode:
                seqs.append(SeqAttn(q_start, n, start, req.state_slot or 0, captures_in(req.captures, start, end)))
            last_rows.append(len(ids) - 1)
        dev = self.device
        batch = AttnBatch(
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            decode=self.decode_meta(items, starts) if decode else None,
            prefill=None if decode else self.prefill_meta(items, starts),
            seqs=seqs,
            state_slots=_state_slots(items, dev),
        )
        return torch.tensor(ids, dtype=torch.int64, device=dev), batch, last_rows

    def prefill_meta(self, items: Sequence[tuple[R, int]], starts: list[int]) -> PrefillMeta:
        """Per sequence: its rows of new tokens, its context after the step, its page table."""
        width = max(len(req.pages) for req, _ in items)
        table = torch.zeros((len(items), width), dtype=torch.int32)
        q_starts, lens, ctx, at = [], [], [], 0
        for b, ((req, n), start) in enumerate(zip(items, starts)):
            table[b, : len(req.pages)] = torch.tensor(req.pages, dtype=torch.int32)
            q_starts.append(at)
            lens.append(n)
            ctx.append(start + n)
            at += n
        meta = torch.tensor([q_starts, lens, ctx], dtype=torch.int32).to(self.device)
        return PrefillMeta(meta[0], meta[1], meta[2], table.to(self.device), self.kv.page_size, max(lens))

    def decode_meta(self, items: Sequence[tuple[R, int]], starts: list[int] | None = None) -> DecodeMeta:
        """Page tables and context lengths of a decode step (the new token counted)."""
        width = max(len(req.pages) for req, _ in items)
        table = torch.zeros((len(items), width), dtype=torch.int32)
        for b, (req, _) in enumerate(items):
            table[b, : len(req.pages)] = torch.tensor(req.pages, dtype=torch.int32)
        starts = starts if starts is not None else [req.num_computed_tokens for req, _ in items]
        lens = torch.tensor([start + 1 for start in starts], dtype=torch.int32)
        return DecodeMeta(table.to(self.device), lens.to(self.device), self.kv.page_size)

    def step(self, items: Sequence[tuple[R, int]], graphs: bool = True) -> list[tuple[R, Choice]]:
        """Computes the scheduled tokens and samples one for each request that reaches its last token.
        ``graphs=False``: eagerly, whatever the step (a decode step then counts as a step-graph fallback)."""
        if self.graphs is not None and self.graphs.admit(items, None, graphs):
            return self.graphs.run(items)
        if self.device.type == "cpu":
            self._cpu_threads(sum(n for _, n in items))
        reqs, logits = self.run(items)
        return list(zip(reqs, self.sampler.sample(reqs, logits))) if reqs else []

    def can_run_ahead(self) -> bool:
        """Whether decode steps may be launched before the previous one is read: the MoE backend's per-step
        host work does not need the previous step's outcome (``ExpertBackend.runs_ahead``)."""
        return self.backend is None or self.backend.runs_ahead

    def launch(
        self,
        items: Sequence[tuple[R, int]],
        starts: list[int] | None = None,
        prev: Launch[R] | None = None,
        src_rows: list[int] | None = None,
    ) -> Launch[R]:
        """Queues a decode step (one token per row) and returns it unread. ``starts``: each row's position
        (None: its ``num_computed_tokens``); with ``prev``, every row is one token ahead of its ``token_ids``,
        its input id ``prev``'s sample at row ``src_rows[i]``, gathered on the device. On a CPU device the step
        is computed here; the rows' outputs are read by ``Launch.read``."""
        assert all(n == 1 for _, n in items), "launch: decode rows only"
        starts = starts if starts is not None else [req.num_computed_tokens for req, _ in items]
        if self.graphs is not None and self.graphs.admit(items, starts):
            return self.graphs.launch(items, starts, prev, src_rows)
        if self.device.type == "cpu":
            self._cpu_threads(len(items))
        input_ids, batch, _ = self.build_batch(items, starts)
        if prev is not None:
            assert src_rows is not None
            rows = torch.tensor(src_rows, dtype=torch.int64, device=self.device)
            input_ids = prev.ids.index_select(0, rows).long()
        if self.backend is not None:
            self.backend.begin_step(len(items), True)
        logits = self.model.logits(self.model.forward(input_ids, batch, self.kv))
        self.take_end_checkpoints(items, starts)
        reqs = [req for req, _ in items]
        ahead = 0 if prev is None else 1
        sampled = self.sampler.sample_on_device(reqs, logits, ahead)
        blocking = self.backend is not None and self.backend.cpu_busy_in_step
        return launched(items, starts, pack(sampled, sampled.logprob is not None), blocking=blocking)

    def take_end_checkpoints(self, items: Sequence[tuple[R, int]], starts: list[int]) -> None:
        """A decode step's due state checkpoints (``anchors.end_checkpoints``), queued behind the step it follows."""
        states = self.model.states
        if states is not None:
            for src, dst in end_checkpoints(items, starts):
                states.copy(src, dst)

    def _cpu_threads(self, tokens: int) -> None:
        """On a CPU device, steps of a few tokens use one intra-op thread: their ops are too small to
        share, and waking torch's other threads costs more than the ops (far more when the machine is
        busy; docs/benchmarks.md). Larger steps use torch's default."""
        want = 1 if tokens <= SMALL_STEP_TOKENS else self._default_threads
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def run(self, items: Sequence[tuple[R, int]]) -> tuple[list[R], torch.Tensor]:
        """Computes the scheduled tokens; returns the requests that reach their last token this step (the
        ones that sample) and their float32 logits [n, V], on the compute device."""
        input_ids, batch, last_rows = self.build_batch(items)
        if self.backend is not None:
            is_decode = all(n == 1 for _, n in items)
            self.backend.begin_step(int(input_ids.shape[0]), is_decode)
        hidden = self.model.forward(input_ids, batch, self.kv)
        if batch.decode is not None:
            self.take_end_checkpoints(items, [req.num_computed_tokens for req, _ in items])
        sampling = [
            (req, row) for (req, n), row in zip(items, last_rows) if req.num_computed_tokens + n == req.num_tokens
        ]
        if not sampling:
            return [], hidden.new_empty((0, 0), dtype=torch.float32)
        rows = torch.tensor([row for _, row in sampling], dtype=torch.int64, device=self.device)
        return [req for req, _ in sampling], self.model.logits(hidden[rows])


def _state_slots(items: Sequence[tuple[R, int]], device: torch.device) -> torch.Tensor | None:
    """The requests' recurrent-state slots [B] (models with linear-attention layers), else None."""
    if items[0][0].state_slot is None:
        return None
    return torch.tensor([req.state_slot for req, _ in items], dtype=torch.int64, device=device)
