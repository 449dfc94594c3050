"""The copy-engine fill thread (``experts/cpu/copier``) on the host: jobs wait for their ready flag, read
the fill list, copy each listed pool row of every bank into its slot (memcpy here; cuMemcpyHtoDAsync on a
GPU), and set the done flag; bad lists fail cleanly and still release the waiter."""

from __future__ import annotations

import time

import pytest
import torch

from flags import wait_flag
from freetoken.experts.cpu import kernel as kmod


def _copier():
    if kmod.load_library() is None:
        pytest.skip("no C++ compiler: the native library cannot be built here")
    from freetoken.experts.cpu.copier import HostCopier

    return HostCopier(spin_us=0)


def _banks(n_rows: int, slots: int):
    g = torch.Generator().manual_seed(3)
    pool = [torch.randn(n_rows, 6, 8, generator=g), torch.randn(n_rows, 8, 3, generator=g).to(torch.bfloat16)]
    slot = [torch.zeros(slots + 1, 6, 8), torch.zeros(slots + 1, 8, 3, dtype=torch.bfloat16)]
    return pool, slot


def _list(rows: list[int], slots: list[int], kv: int) -> torch.Tensor:
    lst = torch.full((1 + 2 * kv,), -99, dtype=torch.int64)  # padding past the count must be ignored
    lst[0] = len(rows)
    lst[1 : 1 + len(rows)] = torch.tensor(rows)
    lst[1 + kv : 1 + kv + len(slots)] = torch.tensor(slots)
    return lst


def test_jobs_wait_for_ready_then_copy_listed_rows_in_order() -> None:
    c = _copier()
    pool, slot = _banks(10, 4)
    c.configure(pool, slot)
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    lists = [_list([7, 2], [0, 3], kv=3), _list([5], [1], kv=3)]
    for i, lst in enumerate(lists):
        c.push(c.job(ready, i + 1, lst, done, i + 1))
    time.sleep(0.02)
    assert int(done[0]) == 0 and c.pending() == 2 and torch.count_nonzero(slot[0]) == 0  # waits for its flag
    ready[0] = 1
    wait_flag(done, 1)
    for b in range(2):
        assert torch.equal(slot[b][0], pool[b][7]) and torch.equal(slot[b][3], pool[b][2])
    assert torch.count_nonzero(slot[0][1]) == 0  # the second job still waits
    ready[0] = 2
    wait_flag(done, 2)
    c.drain()
    assert all(torch.equal(slot[b][1], pool[b][5]) for b in range(2))
    assert c.copies() == 6 and c.error() is None  # 3 fills x 2 banks


def test_toggle_mode_rearms_the_ready_flag() -> None:
    c = _copier()
    pool, slot = _banks(6, 2)
    c.configure(pool, slot)
    ready, done = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    job = c.job(ready, 1, _list([4], [2], kv=1), done, 1, toggle=True)  # slot 2 = the scratch row: allowed
    for _ in range(2):  # a replayed graph writes the same values each time
        c.push(job)
        ready[0] = 1
        wait_flag(done, 1)
        c.drain()
        assert int(ready[0]) == 0  # re-armed by the copier
        done[0] = 0  # the waiting side resets done
    assert torch.equal(slot[0][2], pool[0][4])


def test_a_bad_list_fails_cleanly_and_releases_the_waiter() -> None:
    c = _copier()
    pool, slot = _banks(6, 2)
    c.configure(pool, slot)
    ready, done = torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    c.push(c.job(ready, 1, _list([6], [0], kv=1), done, 1))  # row 6 of 6: out of range
    wait_flag(done, 1)
    c.drain()
    assert "out of range" in (c.error() or "") and torch.count_nonzero(slot[0]) == 0
    assert c.error() is None  # reported once
    c.push(c.job(ready, 2, _list([1], [0], kv=1), done, 2))  # the copier keeps working
    ready[0] = 2
    wait_flag(done, 2)
    assert torch.equal(slot[0][0], pool[0][1])


def test_bad_arguments_are_refused() -> None:
    c = _copier()
    pool, slot = _banks(6, 2)
    with pytest.raises(ValueError, match="same pool rows"):
        c.configure(pool, [slot[0], torch.zeros(4, 8, 3, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match="differ"):
        c.configure(pool, [slot[0], torch.zeros(3, 8, 3)])
    flag = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="1 \\+ 2"):
        c.job(flag, 1, torch.zeros(2, dtype=torch.int64), flag, 1)
    with pytest.raises(ValueError, match="int32"):
        c.job(torch.zeros(1, dtype=torch.int64), 1, torch.zeros(3, dtype=torch.int64), flag, 1)
    c.close()
    c.close()  # idempotent


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_copies_are_ordered_by_the_stream_flags() -> None:
    """On CUDA: the stream's ready write starts the job, the copies run on the copier's stream, and work the
    compute stream queues after its wait on the done flag sees every copied row."""
    from freetoken.experts.cpu.copier import cuda_entry_points
    from freetoken.experts.stream_ops import stream_ops

    ops = stream_ops()
    assert ops is not None
    c = _copier()
    pool, _ = _banks(10, 4)
    pool = [b.pin_memory() for b in pool]
    slot = [torch.zeros(5, *b.shape[1:], dtype=b.dtype, device="cuda") for b in pool]
    copy_stream = torch.cuda.Stream()
    c.configure(pool, slot, copy_stream.cuda_stream, cuda_entry_points())
    ready = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    done = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    lst = _list([7, 2, 9], [0, 3, 4], kv=4).pin_memory()
    c.push(c.job(ready, 1, lst, done, 1, done_dev=ops.device_ptr(done)))
    torch.cuda._sleep(20_000_000)  # the stream is busy: the job must wait for the ready write behind it
    ops.write(ops.device_ptr(ready), 1)
    ops.wait(ops.device_ptr(done), 1)
    got = [s.clone() for s in slot]  # queued after the wait
    torch.cuda.synchronize()
    c.drain()
    assert c.error() is None and c.copies() == 6
    for b in range(2):
        for row, s in ((7, 0), (2, 3), (9, 4)):
            assert torch.equal(got[b][s].cpu(), pool[b][row])
    c.close()


def test_hits_and_fills_gemms_add_up() -> None:
    """With copy-engine fills the GEMM runs in two parts, the hits' groups beside the copies and the filled
    ones after (``SlotBackend._gpu``): the parts add up to the one-call result."""
    from freetoken.experts.grouped_gemm import grouped_experts_gather, grouped_experts_loop
    from freetoken.experts.slot_plan import group_routes

    g = torch.Generator().manual_seed(5)
    T, k, D, inter, S = 3, 2, 16, 8, 6
    x = torch.randn(T, D, generator=g)
    ids = torch.tensor([[0, 3], [3, 5], [1, 0]])
    w = torch.rand(T, k, generator=g)
    groups = group_routes(ids.reshape(-1), 8)
    slot = torch.tensor([2, 0, -1, 4, -1, -1])[: groups.eid.numel()]  # groups on slots, one on the CPU (-1)
    fill = torch.tensor([True, False, False, True, False, False])[: groups.eid.numel()]
    gu, dn = torch.randn(S + 1, 2 * inter, D, generator=g), torch.randn(S + 1, D, inter, generator=g)
    none = torch.full_like(slot, -1)
    for fn in (grouped_experts_gather, grouped_experts_loop):
        whole = fn(x, groups, slot, w, gu, dn)
        hits, fills = torch.where(fill, none, slot), torch.where(fill, slot, none)
        parts = fn(x, groups, hits, w, gu, dn) + fn(x, groups, fills, w, gu, dn)
        torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-5)
        assert float(whole.abs().sum()) > 0
