"""The CPU kernel's stream-ordered queue: batches wait for their ready flag, run in order, and set their
done flag. Here the test thread writes the ready flags (on CUDA the stream does) and polls the done flag
(on CUDA the stream waits on it)."""

from __future__ import annotations

import time

import pytest
import torch

from flags import wait_flag
from freetoken.experts.cpu import kernel as kmod
from freetoken.experts.cpu.kernel import CpuExpertKernel, cpu_experts_reference


def _native() -> CpuExpertKernel:
    if kmod.load_library() is None:
        pytest.skip("no C++ compiler: the native kernel cannot be built here")
    return CpuExpertKernel(num_threads=2)


def _case(T: int, k: int, D: int, inter: int, N: int, dtype: torch.dtype, seed: int):
    """x [T, D], codes [T*k] (about half run here: c = -1 - row; others >= 0), weights, banks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    gate_up = (torch.randn(N, 2 * inter, D, generator=g) / D**0.5).to(dtype)
    down = (torch.randn(N, D, inter, generator=g) / inter**0.5).to(dtype)
    rows = torch.randint(0, N, (T * k,), generator=g)
    here = torch.rand(T * k, generator=g) < 0.5
    codes = torch.where(here, -1 - rows, torch.randint(0, 50, (T * k,), generator=g))
    w = torch.rand(T * k, generator=g)
    return x, codes, w, gate_up, down


def _reference(x, codes, w, gate_up, down, k: int) -> torch.Tensor:
    here = codes < 0
    tok = (torch.arange(codes.numel()) // k)[here].to(torch.int32)
    return cpu_experts_reference(x, tok, (-1 - codes)[here], w[here], gate_up, down)


def _assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float = 2e-6) -> None:
    torch.testing.assert_close(out, ref, rtol=0, atol=tol * max(1.0, float(ref.abs().max())))


def _run_first(kern: CpuExpertKernel, T: int, k: int, D: int, inter: int, N: int, seed: int):
    """Queue one float32 batch on fresh sequence flags, release it, check it; returns its case, out, the
    checked arguments (for re-queueing: they point at out and the flags, so keep those alive) and the flags."""
    case = _case(T, k, D, inter, N, torch.float32, seed=seed)
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    out = torch.empty(T, D)
    args = kern.enqueue(*case, out=out, ready=(ready, 1), done=(done, 1))
    ready[0] = 1
    wait_flag(done, 1)
    _assert_close(out, _reference(*case, k=k))
    return case, out, args, (ready, done)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batches_wait_for_ready_then_run_in_order(dtype: torch.dtype) -> None:
    kern = _native()
    k = 4
    cases = [_case(T, k, 96, 40, 6, dtype, seed=T) for T in (1, 3, 2)]
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    outs = [torch.full((c[0].shape[0], 96), float("nan")) for c in cases]
    stats = [torch.zeros(4, dtype=torch.int64) for _ in cases]
    for i, (c, out, st) in enumerate(zip(cases, outs, stats)):
        kern.enqueue(*c, out=out, ready=(ready, i + 1), done=(done, i + 1), stats=st)
    assert kern.queued() == 3
    time.sleep(0.05)
    assert int(done[0]) == 0 and torch.isnan(outs[0]).all()  # nothing starts before its ready flag
    with pytest.raises(RuntimeError, match="queued"):
        kern.submit(cases[0][0], torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int64),
                    torch.zeros(0), cases[0][3], cases[0][4])  # direct batches wait for the queue
    ready[0] = 1
    wait_flag(done, 1)
    time.sleep(0.02)
    assert int(done[0]) == 1 and torch.isnan(outs[1]).all()  # batch 2 still waits for its flag
    ready[0] = 3  # one write releases both: the compare is "reached", not "equal"
    wait_flag(done, 3)
    kern.drain()
    assert kern.queued() == 0 and kern.queue_error() is None
    tol = 2e-6 if dtype == torch.float32 else 5e-5
    for c, out, st in zip(cases, outs, stats):
        ref = _reference(*c, k=k)
        torch.testing.assert_close(out, ref, rtol=0, atol=tol * max(1.0, float(ref.abs().max())))
        here = c[1] < 0
        assert int(st[0]) == int(torch.unique(c[1][here]).numel()) and int(st[1]) == int(here.sum())
        assert int(st[2]) > 0 and int(st[3]) == 0


def test_flags_wrap_around() -> None:
    """Values are compared cyclically (int32 difference), so the sequence can wrap past 2**32."""
    kern = _native()
    c = _case(2, 2, 32, 16, 3, torch.float32, seed=5)
    ready = torch.tensor([-2], dtype=torch.int32)  # 0xFFFFFFFE
    done = torch.zeros(1, dtype=torch.int32)
    out = torch.empty(2, 32)
    kern.enqueue(*c, out=out, ready=(ready, 1), done=(done, 1))  # 1 is "after" 0xFFFFFFFE
    time.sleep(0.02)
    assert int(done[0]) == 0
    ready[0] = 1
    wait_flag(done, 1)
    ref = _reference(*c, k=2)
    _assert_close(out, ref)


def test_bad_batch_still_sets_done_and_reports() -> None:
    """A code past the pool (row 99 of 3): out is zeros, the done flag is set (a waiting stream would otherwise
    hang), the error is reported once, and the next batch runs normally."""
    kern = _native()
    x, codes, w, gate_up, down = _case(2, 2, 32, 16, 3, torch.float32, seed=6)
    bad = codes.clone()
    bad[0] = -1 - 99  # row 99 of 3
    ready, done = torch.ones(1, dtype=torch.int32) * 2, torch.zeros(1, dtype=torch.int32)
    out_bad, out_ok = torch.full((2, 32), 5.0), torch.empty(2, 32)
    kern.enqueue(x, bad, w, gate_up, down, out=out_bad, ready=(ready, 1), done=(done, 1))
    kern.enqueue(x, codes, w, gate_up, down, out=out_ok, ready=(ready, 2), done=(done, 2))
    kern.drain()
    assert int(done[0]) == 2
    assert torch.equal(out_bad, torch.zeros(2, 32))
    err = kern.queue_error()
    assert err is not None and "pool rows in [0, N)" in err
    assert kern.queue_error() is None  # reported once
    ref = _reference(x, codes, w, gate_up, down, k=2)
    _assert_close(out_ok, ref)


def test_close_releases_waiting_batches() -> None:
    """Closing with batches whose ready flag never came sets their done flags: nothing waits forever."""
    kern = _native()
    c = _case(1, 2, 32, 16, 3, torch.float32, seed=7)
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    outs = [torch.empty(1, 32) for _ in range(2)]
    for i, out in enumerate(outs):
        kern.enqueue(*c, out=out, ready=(ready, i + 1), done=(done, i + 1))
    kern.close()
    assert int(done[0]) == 2


def test_enqueue_checks_its_arguments() -> None:
    kern = _native()
    x, codes, w, gate_up, down = _case(2, 2, 32, 16, 3, torch.float32, seed=8)
    flag = torch.zeros(1, dtype=torch.int32)
    out = torch.empty(2, 32)
    with pytest.raises(ValueError, match="codes"):
        kern.enqueue(x, codes.to(torch.int32), w, gate_up, down, out=out, ready=(flag, 1), done=(flag, 1))
    with pytest.raises(ValueError, match="T\\*k"):
        kern.enqueue(x, codes[:3], w[:3], gate_up, down, out=out, ready=(flag, 1), done=(flag, 1))
    with pytest.raises(ValueError, match="out"):
        kern.enqueue(x, codes, w, gate_up, down, out=torch.empty(3, 32), ready=(flag, 1), done=(flag, 1))
    with pytest.raises(ValueError, match="ready flag"):
        kern.enqueue(x, codes, w, gate_up, down, out=out, ready=(flag.long(), 1), done=(flag, 1))
    assert kern.queued() == 0


def test_prepared_batches_requeue_with_new_sizes_and_flags() -> None:
    """The hot path: arguments checked once, then re-queued with another token count and flag values."""
    kern = _native()
    k = 2
    (x, codes, w, gate_up, down), out, args, (ready, done) = _run_first(kern, 4, k, 48, 24, 5, seed=9)
    x[:2] = torch.randn(2, 48)  # new inputs in the same buffers, two tokens this time
    kern.enqueue_prepared(args, 2, ready_value=2, done_value=2)
    ready[0] = 2
    wait_flag(done, 2)
    ref2 = _reference(x[:2], codes[: 2 * k], w[: 2 * k], gate_up, down, k=k)
    _assert_close(out[:2], ref2)


def test_toggle_flags_for_replayed_graphs() -> None:
    """Toggle mode: a batch starts when ready == 1 and re-arms it to 0; the waiter resets done. The same
    flag pair serves every layer, as a CUDA graph replaying fixed values needs."""
    kern = _native()
    k = 2
    (x, codes, w, gate_up, down), out, args, (_, seq_done) = _run_first(kern, 3, k, 40, 20, 4, seed=10)
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    stats = torch.zeros(4, dtype=torch.int64)
    toggled = kern.toggle_flags(args, ready, done, stats)
    ref = _reference(x, codes, w, gate_up, down, k=k)
    for _ in range(3):  # the "graph" replays: write ready = 1, wait done == 1, reset done = 0
        out.fill_(float("nan"))
        kern.enqueue_prepared(toggled, 3, 1, 1)
        time.sleep(0.01)
        assert int(done[0]) == 0  # not before its ready flag
        ready[0] = 1
        wait_flag(done, 1)
        assert int(ready[0]) == 0  # re-armed by the feeder
        done[0] = 0
        _assert_close(out, ref)
    assert int(seq_done[0]) == 1  # the sequence flags were not touched
    here = codes < 0
    assert int(stats[1]) == int(here.sum()) and int(stats[2]) > 0  # the toggled batches' own stats row


def test_a_steps_layers_queue_in_one_call() -> None:
    """``enqueue_many``: a replayed step's layers (toggle batches, each its own sizes) queued in one call, in
    order: each waits for the graph's ready write and gives the result ``enqueue_prepared`` gives, layer by layer."""
    kern = _native()
    k = 2
    layers = [_run_first(kern, T, k, 40, 20, 4, seed=20 + T) for T in (3, 1, 2)]
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    toggled = [kern.toggle_flags(args, ready, done) for _, _, args, _ in layers]
    for t in toggled:
        t.ready_value = t.done_value = 1
    tokens = [1, 1, 2]  # this step's token counts, not the first calls'
    refs = [_reference(x[:T], codes[: T * k], w[: T * k], gu, dn, k=k)
            for ((x, codes, w, gu, dn), _, _, _), T in zip(layers, tokens)]  # fmt: skip
    batch = kmod.PreparedBatches(toggled, tokens)
    for _ in range(2):  # two replays of the same step
        for _, out, _, _ in layers:
            out.fill_(float("nan"))
        kern.enqueue_many(batch)
        assert kern.queued() == 3
        for (_, out, _, _), T, ref in zip(layers, tokens, refs):  # the graph: write ready, wait done, reset done
            time.sleep(0.005)
            assert int(done[0]) == 0
            ready[0] = 1
            wait_flag(done, 1)
            done[0] = 0
            _assert_close(out[:T], ref)
            assert torch.isnan(out[T:]).all()  # rows past the step's tokens are not written
    with pytest.raises(ValueError, match="2 batches but 1"):
        kmod.PreparedBatches(toggled[:2], [1])
    bad = kern.toggle_flags(layers[0][2], ready, done)
    bad.k = 0  # what enqueue would refuse: the whole call is refused, nothing queued
    with pytest.raises(ValueError):
        kern.enqueue_many(kmod.PreparedBatches([toggled[0], bad], [1, 1]))
    assert kern.queued() == 0


def test_batch_trace_records_each_batch_in_order() -> None:
    from freetoken.experts.cpu.batch_trace import FIELDS, format_rows, summarize

    kern = _native()
    k, D, inter, N = 4, 96, 64, 6
    kern.trace(2)  # the last two batches are kept
    cases = [_case(T, k, D, inter, N, torch.float32, seed=10 + T) for T in (1, 2, 3)]
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    outs = [torch.empty(c[0].shape[0], D) for c in cases]
    for i, (c, out) in enumerate(zip(cases, outs)):
        kern.enqueue(*c, out=out, ready=(ready, i + 1), done=(done, i + 1))
    time.sleep(0.01)  # the first batch waits this long for its flag: its idle time
    ready[0] = 3
    wait_flag(done, 3)
    kern.drain()
    t = kern.take_trace()
    assert t.shape == (2, len(FIELDS))  # the ring kept the last two
    assert kern.take_trace().shape[0] == 0  # taken: forgotten
    f = {name: t[:, i] for i, name in enumerate(FIELDS)}
    assert bool((f["wait"] <= f["ready"]).all() and (f["ready"] <= f["step1"]).all())
    assert bool((f["step1"] <= f["step2"]).all() and (f["step2"] <= f["step3"]).all())
    assert bool((f["step3"] <= f["finish"]).all() and (f["finish"] <= f["done"]).all())
    assert bool(f["done"][0] <= f["wait"][1])  # in order
    for row, c in zip(t, cases[1:]):
        distinct = torch.unique((-1 - c[1])[c[1] < 0]).numel()
        assert int(row[FIELDS.index("distinct")]) == distinct
    rows = summarize(t, 3 * D * inter * 4)
    assert sum(r.batches for r in rows) == 2 and all(r.us["busy"] > 0 for r in rows)
    assert len(format_rows(rows)) == len(rows) + 1
    kern.trace(0)
    c = cases[0]
    kern.enqueue(*c, out=outs[0], ready=(ready, 4), done=(done, 4))
    ready[0] = 4
    wait_flag(done, 4)
    kern.drain()
    assert kern.take_trace().shape[0] == 0  # off: nothing recorded
