"""Model runner: turns a scheduled batch into tensors, runs the model, returns logits where sampling happens."""

from __future__ import annotations

import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.engine.request import Request
from freetoken.experts.base import ExpertBackend
from freetoken.layers.attention import AttnBatch, SeqAttn, build_mask
from freetoken.layers.paged_attention import DecodeMeta
from freetoken.models.decoder import DecoderModel


class ModelRunner:
    def __init__(
        self,
        model: DecoderModel,
        kv: KVPool,
        device: torch.device,
        backend: ExpertBackend | None,
        sliding_window: int | None,
    ) -> None:
        self.model, self.kv, self.device, self.backend = model, kv, device, backend
        self.window = sliding_window

    def build_batch(self, items: list[tuple[Request, int]]) -> tuple[torch.Tensor, AttnBatch, list[int]]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seqs: list[SeqAttn] = []
        last_rows: list[int] = []
        decode = all(n == 1 for _, n in items)
        for req, n in items:
            start, end = req.num_computed_tokens, req.num_computed_tokens + n
            q_start = len(ids)
            ids += req.token_ids[start:end]
            positions += range(start, end)
            slots += self.kv.slots(req.pages, start, end)
            if not decode:
                ctx_slots = torch.tensor(self.kv.slots(req.pages, 0, end), dtype=torch.int64, device=self.device)
                seqs.append(SeqAttn(q_start, n, ctx_slots, build_mask(n, end, self.window, self.device)))
            last_rows.append(q_start + n - 1)
        dev = self.device
        batch = AttnBatch(
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            seqs=seqs,
            decode=self.decode_meta(items) if decode else None,
        )
        return torch.tensor(ids, dtype=torch.int64, device=dev), batch, last_rows

    def decode_meta(self, items: list[tuple[Request, int]]) -> DecodeMeta:
        """Page tables and context lengths of a decode step (the new token counted)."""
        width = max(len(req.pages) for req, _ in items)
        table = torch.zeros((len(items), width), dtype=torch.int32)
        for b, (req, _) in enumerate(items):
            table[b, : len(req.pages)] = torch.tensor(req.pages, dtype=torch.int32)
        lens = torch.tensor([req.num_computed_tokens + 1 for req, _ in items], dtype=torch.int32)
        return DecodeMeta(table.to(self.device), lens.to(self.device), self.kv.page_size)

    def run(self, items: list[tuple[Request, int]]) -> dict[Request, torch.Tensor]:
        """Computes the scheduled tokens; returns float32 logits [V] (on CPU) for requests that reach
        their last token this step (the ones that sample)."""
        input_ids, batch, last_rows = self.build_batch(items)
        if self.backend is not None:
            is_decode = all(n == 1 for _, n in items)
            self.backend.begin_step(int(input_ids.shape[0]), is_decode)
        hidden = self.model.forward(input_ids, batch, self.kv)
        sampling = [
            (req, row) for (req, n), row in zip(items, last_rows) if req.num_computed_tokens + n == req.num_tokens
        ]
        if not sampling:
            return {}
        rows = torch.tensor([row for _, row in sampling], dtype=torch.int64, device=self.device)
        logits = self.model.logits(hidden[rows]).cpu()
        return {req: logits[i] for i, (req, _) in enumerate(sampling)}
