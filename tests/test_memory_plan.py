"""``memory.planner.plan`` (pure): the shares of a device's free memory without a budget (slots first up to the pool,
then the KV pages up to a context per running request, what is left stays free), with one (``split_budget``'s rule,
the other shares on top), the recurrent states and checkpoints, the activations, the CPU's rules; a plan that cannot
fit names its largest share and what it would need in GiB; a resize plans again with the same function."""

from __future__ import annotations

import json

import pytest

from freetoken.memory.budget import GIB, MIB, BudgetError
from freetoken.memory.planner import MAX_CHECKPOINTS, CacheSizes, Free, Wants, plan, resize_plan

SIZES = CacheSizes(weights_bytes=2 * GIB, slot_bytes=10 * MIB, min_slots=8, max_slots=1000, page_bytes=MIB,
                   page_size=16, state_bytes=0, activation_bytes=8 * 1024)  # fmt: skip
HYBRID = CacheSizes(weights_bytes=GIB, slot_bytes=10 * MIB, min_slots=8, max_slots=1000, page_bytes=MIB, page_size=16,
                    state_bytes=4 * MIB, activation_bytes=8 * 1024)  # fmt: skip
CTX = 1024  # 64 pages
GPU = Free(device_bytes=20 * GIB, host_bytes=64 * GIB, where="device memory of cuda:0")


def _device_sum(p) -> int:  # type: ignore[no-untyped-def]
    return sum(b for name, _, b in p.lines() if "host RAM" not in name)


def test_without_a_budget_the_slots_come_first_then_the_kv_pages_and_the_rest_stays_free() -> None:
    p = plan(GPU, SIZES, Wants(context=CTX, max_running=4, reserve_bytes=GIB))
    assert p.activation_tokens == CTX  # one whole context
    left = 20 * GIB - GIB - CTX * 8 * 1024 - 64 * MIB  # reserve, activations, the fewest KV pages
    assert p.slots == 1000  # the whole pool fits
    assert p.kv_pages == 4 * 64  # a context per running request, no more
    assert p.held_bytes == 2 * GIB + 1001 * 10 * MIB + 256 * MIB
    assert p.planned_bytes == p.held_bytes + GIB + CTX * 8 * 1024 == _device_sum(p)
    assert left - 1001 * 10 * MIB - 192 * MIB > 0  # left free beyond the plan
    small = plan(Free(3 * GIB, 64 * GIB), SIZES, Wants(context=CTX, max_running=4, reserve_bytes=GIB))
    room = 3 * GIB - GIB - CTX * 8 * 1024 - 9 * 10 * MIB - 64 * MIB
    assert small.slots == 8 + room // (10 * MIB) and small.kv_pages == 64 + room % (10 * MIB) // MIB
    assert "expert slots" in small.table() and "KV pages" in small.table()


def test_given_counts_are_kept_and_cut_shares_say_so() -> None:
    p = plan(GPU, SIZES, Wants(context=CTX, slots=100, kv_pages=500, layer_major_tokens=0, reserve_bytes=0))
    assert (p.slots, p.kv_pages, p.activation_tokens) == (100, 500, 0)
    # the fewest slots (8 + the scratch slot) and pages take 154 MiB of the 120 MiB beside the reserve: refused
    with pytest.raises(BudgetError, match=r"need 1.053 GiB .* the largest share is reserve, which would need 0.902"):
        plan(Free(GIB + 20 * MIB, 0), SIZES, Wants(context=CTX, reserve_bytes=GIB - 100 * MIB))


def test_a_plan_that_cannot_fit_names_its_largest_share_and_what_it_needs() -> None:
    with pytest.raises(BudgetError) as e:
        free = Free(GIB, 8 * GIB, where="device memory of cuda:0")
        plan(free, SIZES, Wants(context=64 * 1024, reserve_bytes=GIB // 2))
    msg = str(e.value)
    assert "device memory of cuda:0 has 1.000 GiB free beside the weights (2.000 GiB)" in msg
    assert "the largest share is KV pages, which would need 4.000 GiB" in msg  # 4096 pages of a 64k context
    assert "expert slots 0.088 GiB" in msg and "reserve 0.500 GiB" in msg


def test_a_budget_splits_as_split_budget_does_with_the_other_shares_on_top() -> None:
    w = Wants(context=CTX, max_running=4, budget_bytes=GIB + 80 * MIB + 500 * MIB, reserve_bytes=GIB, kv_wanted=100)
    p = plan(GPU, SIZES, w)
    assert (p.slots, p.kv_pages) == (48, 100)  # tests/test_memory_planner.py's split
    assert p.split.budget_bytes == w.budget_bytes and p.activation_tokens == CTX
    with pytest.raises(BudgetError, match="below the minimum this model needs: .* the largest share is reserve, which "
                       "needs 1.000 GiB"):  # fmt: skip
        plan(GPU, SIZES, Wants(context=CTX, budget_bytes=GIB, reserve_bytes=GIB))
    with pytest.raises(BudgetError, match=r"a VRAM budget of 30.000 GiB exceeds what device memory of cuda:0 has"):
        plan(GPU, SIZES, Wants(context=CTX, budget_bytes=30 * GIB, reserve_bytes=GIB))


def test_states_and_checkpoints_on_the_device_and_in_host_ram() -> None:
    p = plan(GPU, HYBRID, Wants(context=CTX, max_running=4, reserve_bytes=GIB, checkpoint_bytes=GIB))
    assert p.state_slots == 5 and p.state_checkpoints == MAX_CHECKPOINTS  # 1 GiB holds 256 of 4 MiB
    assert p.states_bytes == (5 + 256) * 4 * MIB
    assert p.host_checkpoints == 8 * GIB // (4 * MIB) // 2  # an eighth of 64 GiB: 8 GiB, at most 1024 of them
    assert p.host_checkpoints_bytes == p.host_checkpoints * 4 * MIB
    none = plan(GPU, HYBRID, Wants(context=CTX, prefix_cache=False, host_checkpoint_bytes=0))
    assert (none.state_checkpoints, none.host_checkpoints, none.state_slots) == (0, 0, 5)
    # little room: the checkpoints are cut to what is left after the fewest slots, pages and the reserve
    tight = plan(Free(GIB + 300 * MIB, 0), HYBRID, Wants(context=CTX, reserve_bytes=GIB, layer_major_tokens=0))
    room = 300 * MIB - 5 * 4 * MIB - 9 * 10 * MIB - 64 * MIB
    assert tight.state_checkpoints == room // (4 * MIB) and tight.slots == 8


def test_the_cpu_keeps_its_shares_of_the_pool_and_the_ram() -> None:
    cpu = Free(16 * GIB, 16 * GIB, on_host=True, where="host RAM")
    p = plan(cpu, SIZES, Wants(context=CTX, max_running=4, reserve_bytes=0))
    assert (p.slots, p.kv_pages) == (250, 256)  # a quarter of the pool; a context per running request
    assert plan(cpu, SIZES, Wants(context=CTX, slots=3, kv_pages=7)).slots == 3  # given: kept, even below top-k
    capped = plan(Free(200 * MIB, 0, on_host=True), SIZES, Wants(context=CTX, reserve_bytes=0))
    assert capped.kv_pages == 50  # a quarter of the free RAM


def test_a_resize_plans_again_with_the_same_function_keeping_the_other_shares() -> None:
    p = plan(GPU, HYBRID, Wants(context=CTX, max_running=2, budget_bytes=4 * GIB, reserve_bytes=GIB))
    r = resize_plan(p, 2 * GIB, kv_wanted=100)
    assert (r.state_slots, r.state_checkpoints, r.host_checkpoints, r.activation_tokens) == (
        p.state_slots,
        p.state_checkpoints,
        p.host_checkpoints,
        p.activation_tokens,
    )
    assert (r.slots, r.kv_pages, r.budget_bytes) == (92, 104, 2 * GIB)  # the slots' leftover 4 MiB: 4 more pages
    shares = json.loads(json.dumps(r.as_dict()))["shares"]  # JSON as it is
    assert {x["share"]: x["bytes"] for x in shares}["expert slots"] == 93 * 10 * MIB


def test_the_checkpoints_own_context_is_cut_to_what_fits_a_given_one_is_refused() -> None:
    free = Free(GIB + 200 * MIB, 0, where="device memory of cuda:0")
    own = Wants(context=64 * 1024, context_fixed=False, reserve_bytes=GIB, layer_major_tokens=0)
    p = plan(free, SIZES, own)
    room = 200 * MIB - 9 * 10 * MIB  # beside the reserve and the fewest slots: 110 pages of 16 tokens
    assert (p.context, p.context_cut_from, p.kv_pages, p.slots) == (110 * 16, 64 * 1024, 110, 8)
    assert p.held_bytes + p.reserve_bytes == SIZES.weights_bytes + free.device_bytes - room % MIB
    assert "context 1760 tokens, cut from 65536 to fit" in p.table()
    with pytest.raises(BudgetError, match="the largest share is KV pages, which would need 4.000 GiB"):
        plan(free, SIZES, Wants(context=64 * 1024, reserve_bytes=GIB))  # --max-model-len given: refused


def test_pages_that_cost_nothing_plan_and_split_without_dividing_by_them() -> None:
    """DeepSeek-V4 without compressed layers keeps nothing in KV pages (its rows live in state rings): a page of 0
    bytes. The plan gives a context per running request of them, and a budget split the slots the rest."""
    from dataclasses import replace

    from freetoken.memory.budget import split_budget

    free = replace(HYBRID, page_bytes=0)
    p = plan(GPU, free, Wants(context=CTX, max_running=4, reserve_bytes=GIB))
    assert p.kv_pages == 4 * 64 and p.kv_bytes == 0
    s = split_budget(GIB + 200 * MIB, p.facts(64), kv_wanted=100)
    assert (s.slots, s.kv_pages) == (20, 100)
