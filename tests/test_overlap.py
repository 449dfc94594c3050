"""Overlapped decode steps (engine/overlap.py) give the serial engine's outputs exactly: greedy and seeded tokens,
logprobs, finish reasons and text, with different max_tokens, stop tokens and strings, penalties, aborts mid-stream,
requests joining and leaving, prefix reuse after a request finished under overlap, and the hybrid (DeltaNet) family
with its state checkpoints. On a CPU device a launch computes at once, but the bookkeeping is the same: each launched
row's input id comes from the previous step's sampled tensor, rows of finished requests are discarded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.engine.outputs import RequestOutput
from tiny_models import save_checkpoint

PROMPTS = [[5 + i, 40 + 3 * i, 77, 100 + i, 9, 30 + i] for i in range(5)]


@pytest.fixture(autouse=True)
def _check_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FREETOKEN_DEBUG", "1")  # the caches' integrity after every step


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_5_moe"])  # qwen3_5_moe: recurrent states, checkpoints
def ckpt(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    d = tmp_path_factory.mktemp(f"overlap_{request.param}")
    save_checkpoint(request.param, d, seed=3, tokenizer=True)
    return d


def _llm(d: Path, overlap: bool, **kw: Any) -> LLM:
    kw = {"device": "cpu", "dtype": "float32", "max_running_requests": 4, "page_size": 4, **kw}
    return LLM(model=str(d), overlap_steps=overlap, **kw)


def _summary(out: RequestOutput) -> tuple[Any, ...]:
    """An output's fields; logprobs as ids (their values are compared with ``_same_logprobs``)."""
    lp = [(t, [a for a, _ in top]) for t, _, top in out.logprobs or []]
    return out.request_id, out.new_token_ids, out.new_text, out.finished, out.finish_reason, out.error, lp


def _values(steps: list[list[RequestOutput]]) -> list[float]:
    """Every logprob of the outputs (sampled and top), request by request."""
    outs = sorted((o for s in steps for o in s), key=lambda o: o.request_id)
    return [v for o in outs for _, p, top in o.logprobs or [] for v in (p, *(b for _, b in top))]


def _stream(llm: LLM, requests: list[tuple[list[int], SamplingParams]], abort_at: dict[int, str] | None = None):
    """Every request added at once, stepped to the end; ``abort_at``: step index -> request id aborted before it.
    Returns each step's outputs (``_summary``), their logprobs (``_values``) and the engine's stats."""
    eng = llm.engine
    for i, (p, sp) in enumerate(requests):
        eng.add_request(f"r{i}", p, sp)
    steps, k = [], 0
    while eng.has_unfinished():
        if abort_at and k in abort_at:
            eng.abort(abort_at[k])
        steps.append(eng.step())
        k += 1
    llm.check_integrity()
    return [[_summary(o) for o in s] for s in steps if s], _values(steps), eng.stats()


def _mixed(stop: int, stop_str: str) -> list[tuple[list[int], SamplingParams]]:
    return [
        (PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)),
        (PROMPTS[1], SamplingParams(temperature=0.9, top_p=0.9, max_tokens=14, seed=7, ignore_eos=True, logprobs=2)),
        (PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop])),
        (PROMPTS[3], SamplingParams(temperature=1.0, max_tokens=12, seed=3, presence_penalty=0.8,
                                    frequency_penalty=0.4, repetition_penalty=1.2, ignore_eos=True)),  # fmt: skip
        (PROMPTS[4], SamplingParams(temperature=0.0, max_tokens=24, stop=[stop_str], ignore_eos=True)),
    ]


def _stops(d: Path, **kw: Any) -> tuple[int, str]:
    """A stop token that request 2 reaches mid-stream, a stop string that request 4 reaches mid-stream (serial)."""
    free = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = _llm(d, False, **kw).generate([PROMPTS[2], PROMPTS[4]], free)
    text = outs[1].text
    assert len(text) > 12, text
    return outs[0].token_ids[6], text[len(text) // 2 : len(text) // 2 + 3]


def test_overlap_gives_the_serial_steps(ckpt: Path) -> None:
    """Five requests at once (more than run together: one joins when another leaves), each step's outputs equal."""
    check_mixed(ckpt)


def check_mixed(ckpt: Path, **kw: Any) -> dict[str, Any]:
    """``test_overlap_gives_the_serial_steps`` on ``_llm(**kw)``; the overlapped engine's stats."""
    stop, stop_str = _stops(ckpt, **kw)
    serial, s_lp, s_stats = _stream(_llm(ckpt, False, **kw), _mixed(stop, stop_str))
    overlapped, o_lp, o_stats = _stream(_llm(ckpt, True, **kw), _mixed(stop, stop_str))
    assert sorted(x for s in overlapped for x in s) == sorted(x for s in serial for x in s)
    assert o_lp == pytest.approx(s_lp, abs=1e-4) and len(s_lp) == 14 * 3  # batches differ: fp32 rounding only
    ends = {o[0]: o[4] for s in serial for o in s if o[3]}
    assert ends == {"r0": "length", "r1": "length", "r2": "stop", "r3": "length", "r4": "stop"}
    assert s_stats["steps_launched_ahead"] == 0 and o_stats["steps_launched_ahead"] > 10
    assert o_stats["decode_tokens"] == s_stats["decode_tokens"]
    return o_stats


@pytest.mark.parametrize("abort_step", [3, 6])
def test_aborts_mid_stream(ckpt: Path, abort_step: int) -> None:
    """An abort between steps (a launched row of it in flight) drops its row; the others' steps are the serial ones,
    step by step (no request joins here)."""
    check_aborts(ckpt, abort_step)


def check_aborts(ckpt: Path, abort_step: int, **kw: Any) -> None:
    reqs = [(p, SamplingParams(temperature=0.7, max_tokens=10, seed=i, ignore_eos=True)) for i, p in
            enumerate(PROMPTS[:3])]  # fmt: skip
    serial, _, _ = _stream(_llm(ckpt, False, **kw), reqs, {abort_step: "r1"})
    overlapped, _, stats = _stream(_llm(ckpt, True, **kw), reqs, {abort_step: "r1"})
    assert overlapped == serial
    assert stats["steps_launched_ahead"] > 0
    assert sum(len(o[1]) for s in serial for o in s if o[0] == "r1") < 10


def test_requests_join_and_leave_one_by_one(ckpt: Path) -> None:
    """Requests added while others decode (each a serial boundary), with different lengths."""

    def run(overlap: bool) -> tuple[dict[str, list[int]], dict[str, Any]]:
        llm = _llm(ckpt, overlap, max_running_requests=2)
        eng = llm.engine
        tokens: dict[str, list[int]] = {}
        for k in range(40):
            if k % 5 == 0 and k // 5 < len(PROMPTS):
                i = k // 5
                eng.add_request(f"r{i}", PROMPTS[i], SamplingParams(temperature=0.0, max_tokens=4 + 3 * i,
                                                                    ignore_eos=True))  # fmt: skip
            for o in eng.step():
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        while eng.has_unfinished():
            for o in eng.step():
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        llm.check_integrity()
        return tokens, eng.stats()

    serial, _ = run(False)
    overlapped, stats = run(True)
    assert overlapped == serial and len(serial) == len(PROMPTS)
    assert stats["steps_launched_ahead"] > 0


def _one(llm: LLM, rid: str, prompt: list[int], params: SamplingParams) -> dict[str, Any]:
    """One request stepped to its end: its tokens, logprobs, finish reason and cached prompt tokens."""
    eng = llm.engine
    eng.add_request(rid, prompt, params)
    got: dict[str, Any] = {"tokens": [], "logprobs": []}
    while eng.has_unfinished():
        for o in eng.step():
            got["tokens"] += o.new_token_ids
            got["logprobs"] += o.logprobs or []
            got["reason"], got["cached"] = o.finish_reason, o.cached_tokens
    return got


@pytest.mark.parametrize("stop_at", [5, 6, 7, 8])  # the stop's position against the 4-token pages varies
def test_prefix_reuse_after_a_request_finished_under_overlap(ckpt: Path, stop_at: int) -> None:
    """A request stops on a token with its next row launched; the next turn reuses its pages (and state checkpoint):
    its logprobs equal a fresh engine's. The discarded row's K/V (and state) never reach the prefix cache."""
    check_prefix_reuse(ckpt, stop_at)


def check_prefix_reuse(ckpt: Path, stop_at: int, **kw: Any) -> None:
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    first = _llm(ckpt, False, **kw).generate([PROMPTS[0]], free)[0].token_ids
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[first[stop_at]])
    probe = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    llm = _llm(ckpt, True, **kw)
    a = _one(llm, "a", PROMPTS[0], params)
    assert a["reason"] == "stop" and a["tokens"] == first[: first.index(first[stop_at]) + 1]
    assert llm.engine.stats()["steps_launched_ahead"] > 0
    turn = PROMPTS[0] + a["tokens"] + [11, 12, 13, 14, 15]
    b = _one(llm, "b", turn, probe)
    fresh = _one(_llm(ckpt, False, prefix_cache=False, **kw), "b", turn, probe)
    assert b["cached"] > 0
    assert b["tokens"] == fresh["tokens"]
    for (t, p, top), (tf, pf, topf) in zip(b["logprobs"], fresh["logprobs"], strict=True):
        assert t == tf and abs(p - pf) < 1e-4
        assert [x for x, _ in top] == [x for x, _ in topf]
    llm.check_integrity()


def test_grammar_rows_force_serial_steps(ckpt: Path) -> None:
    """A grammar-constrained row needs each token before its next mask: its steps are serial; outputs unchanged."""
    grammar = 'start: "ID-" /[0-9]{3}/ ("-" ("ok" | "no"))?'
    constrained = (PROMPTS[0], SamplingParams(max_tokens=30, temperature=0.0, grammar=grammar))
    reqs = [constrained, (PROMPTS[1], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))]
    serial, _, _ = _stream(_llm(ckpt, False), reqs)
    overlapped, _, _ = _stream(_llm(ckpt, True), reqs)
    assert overlapped == serial
    text = "".join(o[2] for s in serial for o in s if o[0] == "r0")
    assert text.startswith("ID-"), text
    _, _, alone = _stream(_llm(ckpt, True), [constrained])
    assert alone["steps_launched_ahead"] == 0 and alone["decode_tokens"] > 3


def test_scoring_mid_stream_reads_the_step_in_flight(ckpt: Path) -> None:
    """``score`` between steps first reads the launched step (its outputs come with the next ``step``, and
    ``has_unfinished`` stays true until they do); the streams are the serial ones."""

    def run(overlap: bool) -> dict[str, list[int]]:
        llm = _llm(ckpt, overlap)
        eng = llm.engine
        for i in range(2):
            eng.add_request(f"r{i}", PROMPTS[i], SamplingParams(temperature=0.0, max_tokens=5 + i, ignore_eos=True))
        tokens: dict[str, list[int]] = {"r0": [], "r1": []}
        k = 0
        while eng.has_unfinished():
            if k in (3, 5):
                eng.score(PROMPTS[3])
            for o in eng.step():
                tokens[o.request_id] += o.new_token_ids
            k += 1
        llm.check_integrity()
        return tokens

    serial = run(False)
    assert run(True) == serial and [len(t) for t in serial.values()] == [5, 6]


def test_step_graphs_host_side_on_cpu(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step graphs' host side on a CPU device (every step runs the graph's body eagerly on the static buffers;
    no capture): the padded buckets, the double-buffered metadata, rows one token ahead whose ids are gathered from
    the previous step's samples, rows dropping to a smaller bucket. Outputs equal the serial eager engine's (the
    CPU attention and rope keep per-step lookups keyed on the step's tensors: dropped here, as CUDA does)."""
    from freetoken.layers.rope import Rotary
    from freetoken.runner.step_graph import StepGraphs

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(StepGraphs, "_capture", lambda self, *a: None)
    body = StepGraphs._body

    def fresh_body(self: StepGraphs, st: Any, f: Any) -> torch.Tensor:
        st.batch.decode.gathered.clear()  # the CPU attention's per-step gather, made once per (eager) step
        return body(self, st, f)

    monkeypatch.setattr(StepGraphs, "_body", fresh_body)
    tables = Rotary._tables

    def fresh_tables(self: Rotary, positions: torch.Tensor, dtype: torch.dtype) -> Any:
        self._last = None  # its per-step cache too (keyed on the positions tensor: the graphs' is static)
        return tables(self, positions, dtype)

    monkeypatch.setattr(Rotary, "_tables", fresh_tables)

    def graphed(overlap: bool) -> tuple[LLM, StepGraphs]:
        llm = _llm(ckpt, overlap)
        eng = llm.engine
        backend = eng.setup.loaded.backend
        monkeypatch.setattr(backend, "step_capturable", lambda tokens, top_k: True)
        eng.runner.graphs = StepGraphs(eng.setup.loaded.model, eng.kv, backend, eng.sampler, 4,
                                       eng.kv.pages_for(eng.max_model_len), eng.hf.top_k)  # fmt: skip
        return llm, eng.runner.graphs

    stop, stop_str = _stops(ckpt)
    serial, s_lp, _ = _stream(_llm(ckpt, False), _mixed(stop, stop_str))
    llm, graphs = graphed(True)
    overlapped, o_lp, stats = _stream(llm, _mixed(stop, stop_str))
    assert sorted(x for s in overlapped for x in s) == sorted(x for s in serial for x in s)
    assert o_lp == pytest.approx(s_lp, abs=1e-4)
    # padded buckets; a model with state slots has a graph per batch size (a pad would share row 0's slot)
    sizes = [1, 2, 3, 4] if llm.engine.states is not None else [1, 2, 4]
    assert stats["steps_launched_ahead"] > 10 and sorted(graphs._static) == sizes


def test_a_failed_launch_ahead_falls_back_to_serial_steps(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch ahead that fails part of the way through the model (its rows' recurrent states may be advanced by
    some layers) turns overlap off; the rows are computed again serially (hybrid: recomputed from their cached
    prefix), and every request's tokens are the serial ones."""
    reqs = [(p, SamplingParams(temperature=0.7, max_tokens=12, seed=i, ignore_eos=True)) for i, p in
            enumerate(PROMPTS[:3])]  # fmt: skip
    serial, _, _ = _stream(_llm(ckpt, False), reqs)
    llm = _llm(ckpt, True)
    runner = llm.engine.runner
    launch, model = runner.launch, runner.model
    calls = {"ahead": 0}

    def failing(items: Any, starts: Any = None, prev: Any = None, src_rows: Any = None) -> Any:
        if prev is not None:
            calls["ahead"] += 1
            if calls["ahead"] == 4:  # half the layers run, then the step fails
                layers = model.layers
                monkeypatch.setattr(model, "layers", layers[: len(layers) // 2])
                try:
                    launch(items, starts, prev, src_rows)
                finally:
                    monkeypatch.setattr(model, "layers", layers)
                raise RuntimeError("injected: the launch ahead failed")
        return launch(items, starts, prev, src_rows)

    monkeypatch.setattr(runner, "launch", failing)
    overlapped, _, stats = _stream(llm, reqs)
    assert sorted(x for s in overlapped for x in s) == sorted(x for s in serial for x in s)
    assert stats["steps_launched_ahead"] == 3 and not llm.engine.overlap.enabled


def test_a_discarded_rows_penalty_counts_do_not_reach_the_next_owner(ckpt: Path) -> None:
    """A request with penalties stops on a token while its next row (counted into its penalty row) is in flight;
    the next request with penalties takes that row over and samples as in the serial engine."""
    pen = {"presence_penalty": 1.5, "frequency_penalty": 1.0, "repetition_penalty": 1.3}
    free = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, **pen)
    first = _llm(ckpt, False).generate([PROMPTS[0]], free)[0].token_ids
    a = SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[first[5]], **pen)
    b = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, **pen)

    def run(overlap: bool) -> tuple[list[list[int]], dict[str, Any]]:
        llm = _llm(ckpt, overlap, max_running_requests=1)
        outs = [_one(llm, "a", PROMPTS[0], a)["tokens"], _one(llm, "b", PROMPTS[0], b)["tokens"]]
        return outs, llm.engine.stats()

    serial, _ = run(False)
    overlapped, stats = run(True)
    assert overlapped == serial and serial[0] == first[: first.index(first[5]) + 1] and serial[1] == first
    assert stats["steps_launched_ahead"] > 0
