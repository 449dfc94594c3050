"""Where a queued CPU batch's time goes: a summary of the feeder's batch trace (``CpuExpertKernel.trace``).

Each traced batch holds steady-clock ns: when the feeder began waiting for the batch's ready flag, when
it saw it, when the pool opened steps 0-3 of the job (the bf16 split of x, phases 1-3; 0 for a step
without units) and finished it, when the done flag was set; then the batch's distinct pool rows (its
experts). ``summarize`` turns them into per-batch µs: ``idle`` (waiting for the GPU),
``start`` (the ready flag to the job's first step: decoding the codes, the plan), ``phase1`` (gate/up),
``phase2`` (down), ``phase3`` (the weighted sum), ``done`` (finish to the done flag), ``busy`` (ready to
done), grouped by the batch's size in experts, with the GB/s its busy time gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FIELDS = ("wait", "ready", "step0", "step1", "step2", "step3", "finish", "done", "distinct")


@dataclass
class BatchTraceRow:
    experts: int  # the group's batch size in experts
    batches: int
    us: dict[str, float]  # median µs per part
    gb_s: float  # expert bytes over the median busy time


def _parts(t: torch.Tensor) -> dict[str, torch.Tensor]:
    f = {name: t[:, i].double() for i, name in enumerate(FIELDS)}
    first = torch.where(f["step0"] > 0, f["step0"], f["step1"])  # no bf16 split step: phase 1 opens first
    p1_end = torch.where(f["step2"] > 0, f["step2"], f["finish"])
    p2_end = torch.where(f["step3"] > 0, f["step3"], f["finish"])
    return {
        "idle": f["ready"] - f["wait"],
        "start": first - f["ready"],
        "split": torch.where(f["step0"] > 0, f["step1"] - f["step0"], torch.zeros_like(first)),
        "phase1": p1_end - f["step1"],
        "phase2": p2_end - f["step2"],
        "phase3": f["finish"] - f["step3"],
        "done": f["done"] - f["finish"],
        "busy": f["done"] - f["ready"],
    }


def summarize(trace: torch.Tensor, expert_bytes: int) -> list[BatchTraceRow]:
    """Medians per batch size (experts) of the batches that ran one chunk of work (steps 1-3 opened; empty
    batches and multi-chunk ones are left out)."""
    if trace.numel() == 0:
        return []
    t = trace[(trace[:, 3] > 0) & (trace[:, 4] > 0) & (trace[:, 5] > 0) & (trace[:, 8] > 0)]
    if t.shape[0] == 0:
        return []
    parts = _parts(t)
    experts = t[:, 8]
    rows = []
    for e in torch.unique(experts).tolist():
        sel = experts == e
        us = {k: float(v[sel].median()) / 1e3 for k, v in parts.items()}
        gb_s = e * expert_bytes / (us["busy"] * 1e3) if us["busy"] > 0 else 0.0
        rows.append(BatchTraceRow(e, int(sel.sum()), us, gb_s))
    return rows


def format_rows(rows: list[BatchTraceRow]) -> list[str]:
    if not rows:
        return ["(no traced batches)"]
    keys = list(rows[0].us)
    out = [f"{'experts':>8}{'batches':>8}" + "".join(f"{k:>8}" for k in keys) + f"{'GB/s':>7}"]
    for r in rows:
        out.append(f"{r.experts:8d}{r.batches:8d}" + "".join(f"{r.us[k]:8.1f}" for k in keys) + f"{r.gb_s:7.1f}")
    return out
