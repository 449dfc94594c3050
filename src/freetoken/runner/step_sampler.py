"""The engine's side of sampling: per-request rows of the penalty state, the step's ``SamplingBatch``
built in two host-to-device copies, the sampler run once for every row that samples, and one
device-to-host copy of what it chose."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from freetoken.runner import noise
from freetoken.runner.batch import StepRequest
from freetoken.runner.constraint import new_bitmask
from freetoken.runner.sampler import MAX_TOP_LOGPROBS, Features, PenaltyState, Sampled, SamplingBatch, sample_batch


@dataclass
class Choice:
    """What the sampler chose for one request."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None  # (token, logprob), best first, as many as asked


class StepSampler:
    def __init__(self, max_rows: int, vocab: int, device: torch.device) -> None:
        # rows 0 .. max_rows-1 for requests with penalties; the last row is everyone else's (its counts
        # are never read: without penalties they change nothing)
        self.state = PenaltyState(max_rows + 1, vocab, device)
        self.shared_row = max_rows
        self._free = list(range(max_rows - 1, -1, -1))
        self.device = device

    def row_of(self, req: StepRequest) -> int:
        if req.sampling_row is None:
            p = req.params
            if not p.has_penalties:
                req.sampling_row = self.shared_row
            elif not self._free:
                raise RuntimeError("no free penalty row: more requests with penalties than running slots")
            else:
                req.sampling_row = self._free.pop()
                self.state.reset(req.sampling_row, req.token_ids)
        return req.sampling_row

    def release(self, req: StepRequest) -> None:
        if req.sampling_row is not None and req.sampling_row != self.shared_row:
            self._free.append(req.sampling_row)
        req.sampling_row = None

    def batch(self, reqs: Sequence[StepRequest], ahead: int = 0) -> SamplingBatch:
        """``ahead``: tokens each request has sampled that its ``token_ids`` do not hold yet (a step launched
        before the previous one's outputs were read: ``engine/overlap.py``); the noise's step counts them."""
        ints = torch.tensor(
            [
                [r.params.top_k if r.params.top_k > 0 else 0 for r in reqs],
                *zip(*[noise.split_seed(r.seed) for r in reqs]),
                [r.num_output_tokens + ahead for r in reqs],
                [self.row_of(r) for r in reqs],
            ],
            dtype=torch.int64,
        ).to(self.device, non_blocking=True)
        p = [r.params for r in reqs]
        floats = torch.tensor(
            [
                [x.temperature for x in p],
                [x.top_p for x in p],
                [x.min_p for x in p],
                [x.presence_penalty for x in p],
                [x.frequency_penalty for x in p],
                [x.repetition_penalty for x in p],
            ],
            dtype=torch.float32,
        ).to(self.device, non_blocking=True)
        return SamplingBatch(
            temperature=floats[0], top_p=floats[1], min_p=floats[2], presence=floats[3], frequency=floats[4],
            repetition=floats[5], top_k=ints[0], seed_lo=ints[1], seed_hi=ints[2], step=ints[3], rows=ints[4],
        )  # fmt: skip

    def bitmask(self, reqs: Sequence[StepRequest], vocab: int) -> torch.Tensor | None:
        """The next token's allowed set of each constrained request ([B, words] int32; unconstrained rows
        allow all), or None when no request is constrained."""
        if all(r.constraint is None for r in reqs):
            return None
        mask = new_bitmask(len(reqs), vocab)
        for i, r in enumerate(reqs):
            if r.constraint is not None:
                r.constraint.fill_bitmask(mask[i])
        return mask.to(self.device, non_blocking=True)

    def sample(self, reqs: Sequence[StepRequest], logits: torch.Tensor) -> list[Choice]:
        """logits [len(reqs), V] float32 on the device -> one choice per request."""
        return _choices(reqs, self.sample_on_device(reqs, logits))

    def sample_on_device(self, reqs: Sequence[StepRequest], logits: torch.Tensor, ahead: int = 0) -> Sampled:
        """The sampler's outputs, left on the device (nothing read back; ``ahead``: ``batch``)."""
        features = features_of(reqs)
        b = self.batch(reqs, ahead)
        out = sample_batch(logits, b, self.state, features, self.bitmask(reqs, logits.shape[1]))
        self.state.update(b.rows, out.ids)
        return out


def features_of(reqs: Sequence[StepRequest]) -> Features:
    """The sampler's stages some row of the step needs."""
    p = [r.params for r in reqs]
    cuts = any(not x.greedy and (x.top_k > 0 or x.top_p < 1 or x.min_p > 0) for x in p)
    drawn_k = [x.top_k for x in p if not x.greedy]
    mixed = cuts and any(k > 0 for k in drawn_k) and any(k <= 0 for k in drawn_k)
    return Features(
        draw=any(not x.greedy for x in p),
        cuts=cuts,
        penalties=any(x.has_penalties for x in p),
        logprobs=any(x.logprobs is not None for x in p),
        mask=any(r.constraint is not None for r in reqs),
        top_k=top_k_bound([x.top_k for x in p if not x.greedy]),
        nucleus=cuts and all(x.greedy or x.top_k <= 0 for x in p),
        mixed_top_k=top_k_bound([k for k in drawn_k if k > 0]) if mixed else 0,
    )


TOP_K_MAX = 1024  # beyond: the full sort (topk's own cost grows with k; and one step graph per bound)


def top_k_bound(top_ks: Sequence[int]) -> int:
    """The drawn rows' top_k as a power of two from 16 (few step graphs), or 0 where a row has none (or one above
    TOP_K_MAX): the cut then sorts every row."""
    if not top_ks or min(top_ks) <= 0 or max(top_ks) > TOP_K_MAX:
        return 0
    return max(16, 1 << (max(top_ks) - 1).bit_length())


def _choices(reqs: Sequence[StepRequest], out: Sampled) -> list[Choice]:
    return choices(reqs, out.ids, out.logprob, out.top_ids, out.top_logprobs)


def pack(s: Sampled, logprobs: bool) -> torch.Tensor:
    """One step's samples as one tensor, read back in one copy: [B, 1] float64 ids, or with ``logprobs``
    [B, 2 + 2*MAX_TOP_LOGPROBS] (id, logprob, top ids, top logprobs). Column 0 feeds a step launched ahead."""
    if not logprobs:
        return s.ids[:, None].double()
    assert s.logprob is not None and s.top_ids is not None and s.top_logprobs is not None
    return torch.cat(
        [s.ids[:, None].double(), s.logprob[:, None].double(), s.top_ids.double(), s.top_logprobs.double()], dim=1
    )


def unpack(reqs: Sequence[StepRequest], host_out: torch.Tensor) -> list[Choice]:
    """``pack``'s rows (on the host; padded rows past ``len(reqs)`` ignored) as the requests' choices."""
    rows = host_out[: len(reqs)]
    n = MAX_TOP_LOGPROBS
    ids = rows[:, 0].long()
    if rows.shape[1] == 1:  # no row asked for logprobs
        return choices(reqs, ids, None, None, None)
    return choices(reqs, ids, rows[:, 1].float(), rows[:, 2 : 2 + n].long(), rows[:, 2 + n :].float())


def choices(
    reqs: Sequence[StepRequest],
    ids: torch.Tensor,
    logprob: torch.Tensor | None,
    top_ids: torch.Tensor | None,
    top_logprobs: torch.Tensor | None,
) -> list[Choice]:
    """The sampler's outputs (one row per request; read back to the host here) as choices."""
    tokens = ids.tolist()
    if logprob is None or top_ids is None or top_logprobs is None:
        return [Choice(t) for t in tokens]
    lp, tid, tlp = logprob.tolist(), top_ids.tolist(), top_logprobs.tolist()
    out = []
    for i, r in enumerate(reqs):
        n = r.params.logprobs
        out.append(Choice(tokens[i]) if n is None else Choice(tokens[i], lp[i], list(zip(tid[i][:n], tlp[i][:n]))))
    return out
