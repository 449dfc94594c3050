"""``ft bench e2e --prefill``: time to first token of long prompts through the engine, and running streams'
inter-token latency while a long prompt prefills (issue 20).

Per policy: B_P,layer (one whole layer of experts copied pinned pool -> slots, ``bench/prefill.py``), then per
prompt length a cold prompt (random tokens never seen: no prefix to reuse) and the same prompt again with 64
new tokens at its end (warm: its prefix reused from the radix tree); each through ``LLM``'s engine, one token
generated, timed from ``add_request`` to the first token. Bytes copied per prompt: the backend's
``expert_bytes_copied`` (on-demand fills plus streamed layers); the PCIe bound: pool bytes / B_P,layer (the
pool crossing the link once). Then ``streams`` requests decode (solo inter-token latency), a prompt of
``itl_prompt`` tokens joins, and their inter-token latencies while it prefills give p50 / p99.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

WARM_SUFFIX = 64


@dataclass
class TTFTRow:
    policy: str
    tokens: int
    cold_s: float
    warm_s: float
    cold_bytes: int
    warm_bytes: int
    pool_bytes: int
    b_p_gbps: float | None
    layer_major: int  # layer-major prefills the cold prompt ran in

    @property
    def pcie_bound_s(self) -> float | None:
        return self.pool_bytes / (self.b_p_gbps * 1e9) if self.b_p_gbps else None


@dataclass
class ITLRow:
    policy: str
    prompt: int
    streams: int
    solo_p50_ms: float
    solo_p99_ms: float
    during_p50_ms: float
    during_p99_ms: float
    during_tokens: int
    prefill_s: float
    gaps_ms: list[float] = field(default_factory=list)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _copied(llm: Any) -> int:
    return int(llm.stats().get("expert_bytes_copied", 0))


def first_token_s(llm: Any, rid: str, ids: list[int]) -> float:
    """Seconds from ``add_request`` to its first token (the engine otherwise idle)."""
    from freetoken.runner.sampling_params import SamplingParams

    eng = llm.engine
    _sync(eng.device)
    t0 = time.perf_counter()
    eng.add_request(rid, ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while rid in eng.requests:
        eng.step()
    _sync(eng.device)
    return time.perf_counter() - t0


def layer_bandwidth(llm: Any) -> float | None:
    """B_P,layer on this backend's slots (GB/s), or None for a backend without a slot cache."""
    from freetoken.bench.prefill import layer_copy_gbps
    from freetoken.experts.backends.slot_backend import SlotBackend

    backend = llm.engine.setup.loaded.backend
    if not isinstance(backend, SlotBackend):
        return None
    backend.streamer.finish()
    return layer_copy_gbps(backend)


def ttft_rows(llm: Any, policy: str, lengths: list[int], seed: int) -> list[TTFTRow]:
    eng = llm.engine
    backend = eng.setup.loaded.backend
    pool = backend.pool.num_rows * backend.pool.expert_bytes if hasattr(backend, "pool") else 0
    bw = layer_bandwidth(llm)
    g = torch.Generator().manual_seed(seed)
    vocab = eng.hf.vocab_size
    first_token_s(llm, f"warmup-{policy}", torch.randint(3, vocab, (min(lengths),), generator=g).tolist())
    rows = []
    for n in lengths:
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        b0, j0 = _copied(llm), eng.layer_major.jobs
        cold = first_token_s(llm, f"cold-{policy}-{n}", ids)
        b1, j1 = _copied(llm), eng.layer_major.jobs
        suffix = torch.randint(3, vocab, (WARM_SUFFIX,), generator=g).tolist()
        warm = first_token_s(llm, f"warm-{policy}-{n}", ids + suffix)
        b2 = _copied(llm)
        rows.append(TTFTRow(policy, n, cold, warm, b1 - b0, b2 - b1, pool, bw, j1 - j0))
        r = rows[-1]
        print(f"#   {policy} {n} tokens: TTFT cold {cold:.3f} s ({(b1 - b0) / 1e9:.2f} GB copied, PCIe bound "
              f"{r.pcie_bound_s or 0:.3f} s), warm {warm:.3f} s", file=sys.stderr, flush=True)  # fmt: skip
    return rows


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def itl_row(llm: Any, policy: str, prompt: int, streams: int, solo_tokens: int, seed: int) -> ITLRow:
    """``streams`` greedy decodes: their inter-token gaps alone, then while a ``prompt``-token prompt prefills."""
    from freetoken.runner.sampling_params import SamplingParams

    eng = llm.engine
    vocab = eng.hf.vocab_size
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)
    ids = [f"itl-{policy}-{s}" for s in range(streams)]
    for rid in ids:
        eng.add_request(rid, torch.randint(3, vocab, (32,), generator=g).tolist(), params)
    last: dict[str, float] = {}
    solo: list[float] = []
    during: list[float] = []
    big = f"itl-{policy}-prompt"
    produced, t_start, t_end = 0, 0.0, 0.0
    while True:
        outs = eng.step()
        now = time.perf_counter()
        for out in outs:
            if out.request_id == big:
                t_end = now
                continue
            if out.new_token_ids and out.request_id in last:
                gap = (now - last[out.request_id]) * 1e3
                (during if t_start and not t_end else solo).append(gap)
            last[out.request_id] = now
        produced += sum(1 for o in outs if o.request_id in ids)
        if not t_start and produced >= streams * (solo_tokens + 2):
            t_start = time.perf_counter()
            eng.add_request(big, torch.randint(3, vocab, (prompt,), generator=g).tolist(),
                            SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))  # fmt: skip
        if t_end:
            break
    for rid in ids:
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    solo = solo[streams:]  # the first gap of each stream spans its prefill
    return ITLRow(policy, prompt, streams, _pct(solo, 0.5), _pct(solo, 0.99), _pct(during, 0.5), _pct(during, 0.99),
                  len(during), t_end - t_start, during)  # fmt: skip


def print_tables(ttft: list[TTFTRow], itl: list[ITLRow]) -> None:
    if ttft:
        print("| policy | prompt tokens | TTFT cold s | GB copied (cold) | pool GB | B_P,layer GB/s | PCIe bound s "
              "| cold / bound | layer-major prefills | TTFT warm s (+64 tokens) | GB copied (warm) |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in ttft:
            bound = r.pcie_bound_s
            print(f"| {r.policy} | {r.tokens} | {r.cold_s:.3f} | {r.cold_bytes / 1e9:.2f} | {r.pool_bytes / 1e9:.2f} "
                  f"| {r.b_p_gbps or 0:.1f} | {bound or 0:.3f} | {r.cold_s / bound if bound else 0:.2f} "
                  f"| {r.layer_major} | {r.warm_s:.3f} | {r.warm_bytes / 1e9:.2f} |")  # fmt: skip
    if itl:
        print("| policy | streams | prompt | solo ITL p50 / p99 ms | ITL during prefill p50 / p99 ms | p99 / solo p50 "
              "| tokens during | prefill s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for i in itl:
            print(f"| {i.policy} | {i.streams} | {i.prompt} | {i.solo_p50_ms:.1f} / {i.solo_p99_ms:.1f} "
                  f"| {i.during_p50_ms:.1f} / {i.during_p99_ms:.1f} | {i.during_p99_ms / i.solo_p50_ms:.2f} "
                  f"| {i.during_tokens} | {i.prefill_s:.2f} |")  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefill", default=None, help="TTFT at these prompt lengths (comma list), cold and warm")
    p.add_argument("--itl-prompt", type=int, default=0, help="ITL of running streams while this prompt prefills")
    p.add_argument("--itl-streams", type=int, default=3)
    p.add_argument("--itl-solo-tokens", type=int, default=16, help="tokens per stream timed alone first")
