"""A graphed decode step's static buffers (``step_graph.py``): per (batch bucket, page-table width), the device
tensors a captured step reads and the pinned host twins a step's metadata is packed into, then copied over in one
transfer.

Layout of ``ints`` (int64), B rows, P page-table columns: ids, positions, KV slots, lengths, state slots (``INTS``
rows of B); the page table [B, P]; the sampler's integer rows (top-k, seed halves, step, penalty row: 5 of B); then
the float32 settings (temperature, top-p, min-p, presence, frequency, repetition: ``FLOATS`` of B), two to a word,
so the whole step's metadata is one copy. Two host sets are used in turn, so that packing the next step never
overwrites a copy still queued (``turn``; each set's ``done`` event marks its last copy back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.kernels.attention import DecodeMeta
from freetoken.layers.attention import AttnBatch
from freetoken.runner import noise
from freetoken.runner.batch import StepRequest
from freetoken.runner.constraint import new_bitmask
from freetoken.runner.sampler import MAX_TOP_LOGPROBS, SamplingBatch
from freetoken.runner.step_sampler import StepSampler

INTS = 5  # ids, positions, KV slots, lengths, state slots; then the page table; then the sampler's 5 integer rows
FLOATS = 6  # temperature, top_p, min_p, presence, frequency, repetition


@dataclass
class HostBuffers:
    """One of a bucket's two sets of pinned host buffers, and the event after the last step that used it."""

    ints: torch.Tensor  # the device ``ints``' twin
    floats: torch.Tensor  # a view of its tail (``float_view``)
    out: torch.Tensor  # [B * (2 + 2*MAX_TOP_LOGPROBS)] float64: the step's [B, w] rows (id, logprob, top ids,
    # top logprobs), contiguous: a strided destination would make the copy back a synchronous one
    done: torch.cuda.Event | None = None


def float_view(ints: torch.Tensor, at: int, B: int) -> torch.Tensor:
    """The [FLOATS, B] float32 settings stored in ``ints``' int64 words from ``at`` on."""
    return ints[at:].view(torch.float32)[: FLOATS * B].view(FLOATS, B)


@dataclass
class StepBuffers:
    """One (bucket, width)'s input and output buffers (device) and their pinned host twins (two sets, used in turn)."""

    ints: torch.Tensor  # [INTS*B + B*P + 5*B + ceil(FLOATS*B/2)] int64, the floats' words last: one copy a step
    floats: torch.Tensor  # [FLOATS, B] float32, a view of ``ints``' tail
    hosts: list[HostBuffers]
    batch: AttnBatch
    sampling: SamplingBatch
    ids: torch.Tensor  # [B] the model's input tokens
    mask: torch.Tensor  # [B, ceil(V/32)] int32 the allowed-token bitmask of grammar-constrained rows
    host_mask: torch.Tensor  # (a constrained step is never launched ahead: one is enough)
    width: int  # P, the page table's columns
    turn: int = 0  # which of ``hosts`` the next step fills

    @classmethod
    def make(cls, B: int, P: int, kv: KVPool, states: bool, vocab: int) -> StepBuffers:
        """Zeroed buffers for B rows and P page-table columns (``states``: the model has state slots; ``vocab``:
        the logits' width, the bitmask's)."""
        dev = kv.device
        n_ints = INTS * B + B * P + 5 * B
        n = n_ints + (FLOATS * B + 1) // 2  # the float32 settings, two to an int64 word
        ints = torch.zeros(n, dtype=torch.int64, device=dev)
        floats = float_view(ints, n_ints, B).fill_(1.0)
        ids, pos, slots, lens, state_slots = (ints[i * B : (i + 1) * B] for i in range(INTS))
        table = ints[INTS * B : INTS * B + B * P].view(B, P)
        srows = ints[INTS * B + B * P : n_ints].view(5, B)
        if dev.type == "cuda":  # the decode kernel reads the int64 rows in place
            meta = DecodeMeta(table, lens, kv.page_size)
        else:  # the CPU step's C++ attention takes int32 (copied in each step: ``cpu_tables``)
            meta = DecodeMeta(table.to(torch.int32), lens.to(torch.int32), kv.page_size)
        batch = AttnBatch(pos, slots, meta, state_slots=state_slots if states else None)
        sampling = SamplingBatch(
            temperature=floats[0], top_p=floats[1], min_p=floats[2], presence=floats[3], frequency=floats[4],
            repetition=floats[5], top_k=srows[0], seed_lo=srows[1], seed_hi=srows[2], step=srows[3], rows=srows[4],
        )  # fmt: skip
        pinned = [torch.zeros(n, dtype=torch.int64).pin_memory() for _ in range(2)]
        hosts = [
            HostBuffers(h, float_view(h, n_ints, B).fill_(1.0),
                        torch.zeros(B * (2 + 2 * MAX_TOP_LOGPROBS), dtype=torch.float64).pin_memory())
            for h in pinned
        ]  # fmt: skip
        return cls(ints, floats, hosts, batch, sampling, ids, new_bitmask(B, vocab).to(dev),
                   new_bitmask(B, vocab).pin_memory(), P)  # fmt: skip

    def fill(
        self, host: HostBuffers, reqs: Sequence[StepRequest], starts: list[int], src_rows: list[int], kv: KVPool,
        sampler: StepSampler,
    ) -> None:  # fmt: skip
        """The step's metadata into the pinned twin ``host``, then one copy to the device buffers (on CUDA the page
        table and lengths are read in place; on a CPU converted to int32 inside the step). A row ahead of its
        request's ``token_ids`` gets ``src_rows``' entry as its id: the row of the previous step that the launch
        gathers."""
        B, P = self.floats.shape[1], self.width
        pad = B - len(reqs)
        assert not (pad and self.batch.state_slots is not None), "a pad row would share row 0's state slot"
        rows, starts, src_rows = [*reqs] + [reqs[0]] * pad, starts + [starts[0]] * pad, src_rows + [src_rows[0]] * pad
        hi, hf = host.ints.numpy(), host.floats.numpy()
        for b, req in enumerate(rows):
            pos = starts[b]
            ahead = pos - req.num_computed_tokens  # sampled tokens not in token_ids yet (0 or 1)
            hi[b] = req.token_ids[pos] if ahead == 0 else src_rows[b]
            hi[B + b] = pos
            hi[2 * B + b] = kv.slots(req.pages, pos, pos + 1)[0]
            hi[3 * B + b] = pos + 1
            hi[4 * B + b] = req.state_slot or 0
            base = INTS * B + b * P
            hi[base : base + P] = 0
            hi[base : base + len(req.pages)] = req.pages
            s = INTS * B + B * P
            p = req.params
            lo, h = noise.split_seed(req.seed)
            hi[s + b] = max(p.top_k, 0)
            hi[s + B + b], hi[s + 2 * B + b] = lo, h
            hi[s + 3 * B + b] = req.num_output_tokens + ahead
            hi[s + 4 * B + b] = sampler.shared_row if b >= len(reqs) else sampler.row_of(req)
            hf[:, b] = (p.temperature, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
        self.ints.copy_(host.ints, non_blocking=True)  # the float settings with them
        if any(r.constraint is not None for r in reqs):  # the next token's allowed set, row by row (pads: all)
            self.host_mask.fill_(-1)
            for b, req in enumerate(reqs):
                if req.constraint is not None:
                    req.constraint.fill_bitmask(self.host_mask[b])
            self.mask.copy_(self.host_mask, non_blocking=True)

    def cpu_tables(self) -> None:
        """On a CPU: the int32 page table and lengths the step's attention reads, from ``ints`` (inside the step)."""
        meta = self.batch.decode
        assert meta is not None
        if meta.block_table.dtype != torch.int64:
            B, P = self.ids.shape[0], self.width
            meta.block_table.copy_(self.ints[INTS * B : INTS * B + B * P].view(B, P))
            meta.seq_lens.copy_(self.ints[3 * B : 4 * B])
