"""The step graph's matrix: every batch bucket x sampler feature set, run through a graphed engine and an eager one
(the same requests in the same order, so the engine-drawn seeds agree), with the graphs' counters of each case.
Used by the CPU test (``test_step_graph_cpu.py``, a fake capture), the GPU test (``test_step_graph_gpu.py``) and
the GPU box's table (``bench/gpu/graph_matrix.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freetoken import LLM, SamplingParams

BUCKETS = (1, 2, 4, 8)  # max_running_requests=8
# a grammar that never has to end: its rows run to max_tokens (the bitmask applies at every step)
GRAMMAR = "start: /[a-z ]+/"
PROMPTS = [[5 + i, 40 + 3 * i, 77, 100 + i, 9, 30 + i] for i in range(8)]


def _params(feature: str, row: int, max_tokens: int) -> SamplingParams:
    base: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True}
    if feature == "greedy":
        return SamplingParams(temperature=0.0, **base)
    if feature == "sample":  # temperature with every cut; the engine draws the seeds
        return SamplingParams(temperature=0.8, top_p=0.9, top_k=40, min_p=0.02, **base)
    if feature == "penalties":
        return SamplingParams(temperature=0.7, seed=100 + row, presence_penalty=0.5, frequency_penalty=0.3,
                              repetition_penalty=1.2, **base)  # fmt: skip
    if feature == "logprobs":  # the sampled token's logprob and the top 5
        return SamplingParams(temperature=0.0, logprobs=5, **base)
    if feature == "seeds":
        return SamplingParams(temperature=1.0, seed=7 * row + 1, **base)
    if feature == "grammar":
        return SamplingParams(temperature=0.6, seed=row, grammar=GRAMMAR, max_tokens=max_tokens)
    if feature == "mixed":  # one row of each (what a coding agent's sub-agents make)
        return _params(FEATURES[row % (len(FEATURES) - 1)], row, max_tokens)
    raise ValueError(feature)


FEATURES = ("greedy", "sample", "penalties", "logprobs", "seeds", "grammar", "mixed")


def params(feature: str, n: int, max_tokens: int) -> list[SamplingParams]:
    return [_params(feature, row, max_tokens) for row in range(n)]


@dataclass
class Case:
    bucket: int
    feature: str
    decode_steps: int
    captures: int
    replays: int
    fallbacks: int
    reasons: dict[str, int]
    same_as_eager: bool

    @property
    def replays_match(self) -> bool:
        return self.replays == self.decode_steps - self.captures

    @property
    def ok(self) -> bool:
        return self.decode_steps > 0 and self.fallbacks == 0 and self.replays_match and self.same_as_eager

    def row(self) -> str:
        cells = (self.bucket, self.feature, self.decode_steps, self.captures, self.replays, self.fallbacks,
                 "yes" if self.replays_match else "NO", "yes" if self.same_as_eager else "NO")  # fmt: skip
        why = " " + ",".join(f"{k}={v}" for k, v in sorted(self.reasons.items())) if self.reasons else ""
        return "| " + " | ".join(str(c) for c in cells) + " |" + why


HEADER = (
    "| bucket | features | decode steps | captures | replays | eager fallbacks | replays == steps - captures "
    "| tokens == eager |"
)


def _graph_counts(llm: LLM) -> dict[str, Any]:
    s = llm.stats()
    keys = ("step_graph_decode_steps", "step_graph_captures", "step_graph_replays", "step_graph_eager_fallbacks")
    return {**{k: s.get(k, 0) for k in keys}, "reasons": dict(s.get("step_graph_eager_fallback_reasons", {}))}


def run_case(graphed: LLM, eager: LLM, bucket: int, feature: str, max_tokens: int = 8) -> Case:
    """``bucket`` requests of ``feature`` on both engines; the graphed engine's counters of this case."""
    ps = params(feature, bucket, max_tokens)
    before = _graph_counts(graphed)
    got = [r.token_ids for r in graphed.generate(PROMPTS[:bucket], ps)]
    after = _graph_counts(graphed)
    want = [r.token_ids for r in eager.generate(PROMPTS[:bucket], ps)]
    d = {k: after[k] - before[k] for k in after if k != "reasons"}
    reasons = {k: v - before["reasons"].get(k, 0) for k, v in after["reasons"].items()}
    return Case(bucket, feature, d["step_graph_decode_steps"], d["step_graph_captures"], d["step_graph_replays"],
                d["step_graph_eager_fallbacks"], {k: v for k, v in reasons.items() if v}, got == want)  # fmt: skip


GRAPH_PROMPTS = [[5, 40, 77, 100, 9, 30], [7, 44, 70, 102, 9, 31, 8, 300]]


def cuda_tokens_eager_and_graphed(d: Any, backend: str, steps: int = 12) -> tuple[list[list[int]], list[list[int]]]:
    """``GRAPH_PROMPTS``' greedy tokens on CUDA (float32, ``backend``; half the experts cached unless fused), eager and
    then through the step graphs (asserted to have replayed)."""
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    outs = []
    for graphs in (False, True):
        cache = None if backend == "fused" else 0.5
        llm = LLM(str(d), device="cuda", dtype="float32", moe_backend=backend, expert_cache=cache,
                  max_running_requests=4, cuda_graphs=graphs)  # fmt: skip
        outs.append([r.token_ids for r in llm.generate(GRAPH_PROMPTS, params)])
        assert not graphs or llm.stats()["step_graph_replays"] > 0
        close = getattr(llm.engine.setup.loaded.backend, "close", None)
        if close is not None:
            close()
    return outs[0], outs[1]
