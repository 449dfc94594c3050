"""The host-RAM tier of the recurrent-state checkpoints: the device tier's LRU evictions move there (one radix entry
whichever tier holds it), a request resumed from a host-resident checkpoint gives the next-token logits of a fresh
full prefill (DeltaNet layers, fp32, 1e-4), a prefill with more anchors than device slots spills the written ones to
the host as it goes; the eviction order over both tiers; budgets and bad input; the stats of both tiers. On the CPU
the host tier is a second pool in the same memory (plain copies); on CUDA (marked gpu) it is pinned and the copies
are stream-ordered."""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.bench.agent_edits import common_prefix
from freetoken.cache.host_states import HostStates
from freetoken.cache.kv_pool import KVPool
from freetoken.cache.radix import RadixCache
from freetoken.cache.state_checkpoints import StateCheckpoints
from freetoken.cache.state_pool import StatePool, StateShape
from freetoken.config import EngineConfig
from freetoken.memory.planner import HOST_MAX_CHECKPOINTS, host_checkpoint_count
from reference import assert_close_logits
from test_state_checkpoints import PAGE, _turns, ckpt  # noqa: F401  (the module-scoped checkpoint fixture)

CPU = torch.device("cpu")


def _pools(device_slots: int, host_slots: int, device: torch.device = CPU):
    kv = KVPool(1, 32, 2, 1, 1, torch.float32, device)
    tree = RadixCache(kv)
    states = StatePool(StateShape(2, 3, 2, 2, 2, 2), 2, torch.float32, device, device_slots)
    host = HostStates(states, host_slots) if host_slots else None
    return kv, tree, states, StateCheckpoints(states, tree, host)


def _cache(kv: KVPool, tree: RadixCache, tokens: list[int], owner: str):
    pages = kv.allocate(len(tokens) // 2, owner)
    assert tree.insert(tokens, pages, owner) == 0
    return tree.lookup(tokens).node


def _capture(ck: StateCheckpoints, states: StatePool, node, value: float) -> int:
    """A checkpoint of state ``value`` (written into its slot, as the layers do) hung on ``node``."""
    slot = ck.take()
    assert slot is not None
    states.conv[:, slot], states.ssm[:, slot] = value, -value
    ck.hang(slot, node)
    return slot


def _restored(ck: StateCheckpoints, states: StatePool, node) -> tuple[float, float]:
    ck.restore(node, 0)
    conv, ssm = states.conv[:, 0], states.ssm[:, 0]
    assert bool((conv == conv.flatten()[0]).all()) and bool((ssm == ssm.flatten()[0]).all())
    return float(conv.flatten()[0]), float(ssm.flatten()[0])


def test_device_evictions_move_to_the_host_tier_lru_over_both():
    kv, tree, states, ck = _pools(1, 2)
    a, b, c, d = (_cache(kv, tree, [i, i + 1], f"r{i}") for i in (1, 3, 5, 7))
    sa = _capture(ck, states, a, 1.0)
    _capture(ck, states, b, 2.0)  # the device tier is full: a moves to the host, the device slot is b's
    assert a.checkpoint in ck.host_keys and b.checkpoint == sa and ck.num_demoted == 1
    assert ck.deepest(a) is a and ck.size == 2 and ck.size_host == 1
    assert _restored(ck, states, a) == (1.0, -1.0)  # host -> device: a is now the most recently used
    ck.check_integrity()
    _capture(ck, states, c, 3.0)  # b to the host (full now: a, b)
    _capture(ck, states, d, 4.0)  # c to the host: full, its LRU is b (a was restored after b was hung) -> dropped
    assert b.checkpoint is None and ck.num_recycled == 1
    assert a.checkpoint in ck.host_keys and c.checkpoint in ck.host_keys and d.checkpoint == sa
    assert [_restored(ck, states, n) for n in (a, c, d)] == [(1.0, -1.0), (3.0, -3.0), (4.0, -4.0)]
    s = ck.stats()
    assert (s["state_checkpoints"], s["state_checkpoints_device"], s["state_checkpoints_host"]) == (3, 1, 2)
    assert (s["state_restores"], s["state_restores_host"], s["state_demoted"]) == (4, 3, 3)
    ck.check_integrity()


def test_a_host_checkpoint_is_dropped_with_its_pages():
    kv, tree, states, ck = _pools(1, 1)
    a, b = _cache(kv, tree, [1, 2, 3, 4], "r1"), _cache(kv, tree, [5, 6], "r2")
    _capture(ck, states, a, 1.0)
    _capture(ck, states, b, 2.0)
    assert a.checkpoint in ck.host_keys
    tree.evict(1)  # the LRU leaf, a, shrinks by a page: its end moved
    assert a.checkpoint is None and ck.size == 1 and ck.size_host == 0
    _capture(ck, states, _cache(kv, tree, [7, 8], "r3"), 3.0)  # b demoted into the freed host slot
    assert b.checkpoint in ck.host_keys
    ck.check_integrity()
    tree.check_integrity()


def test_spill_frees_the_device_slot_for_the_next_anchor():
    kv, tree, states, ck = _pools(1, 2)
    a, b = _cache(kv, tree, [1, 2], "r1"), _cache(kv, tree, [3, 4], "r2")
    slot = ck.take()
    assert slot is not None and ck.take() is None  # one device slot, pending
    states.ssm[:, slot] = 5.0
    key = ck.spill(slot)  # written: to a host slot, still pending
    assert key in ck.host_keys and ck.pending == {key}
    assert ck.take() == slot
    ck.check_integrity()
    ck.hang(key, a)
    ck.give(slot)
    assert a.checkpoint == key and _restored(ck, states, a) == (0.0, 5.0)
    assert ck.spill(ck.take() or -1) is not None  # a full host tier drops its LRU hung one for a spill
    ck.check_integrity()
    assert b.checkpoint is None


def test_budgets_and_bad_input():
    one = 10 << 20
    assert host_checkpoint_count(one, 0, 1 << 40) == 0  # 0: no host tier
    assert host_checkpoint_count(one, 1 << 30, 1 << 40) == 102
    assert host_checkpoint_count(one, None, 16 << 30) == 204  # an eighth of the free RAM
    assert host_checkpoint_count(one, None, 1 << 40) == 819  # ... at most 8 GiB
    assert host_checkpoint_count(1, None, 1 << 40) == HOST_MAX_CHECKPOINTS
    assert host_checkpoint_count(one, None, 40 << 20) == 0  # too little RAM free: none, said once
    with pytest.raises(ValueError, match=r"state_checkpoint_host_gib=0.001 holds no state checkpoint .* 10.0 MiB"):
        host_checkpoint_count(one, int(0.001 * (1 << 30)), 1 << 40)
    with pytest.raises(ValueError, match="state_checkpoint_host_gib must be >= 0"):
        EngineConfig(state_checkpoint_host_gib=-1.0)
    with pytest.raises(ValueError, match="at least one slot"):
        _pools(1, -1)


def test_a_too_small_host_budget_is_refused_at_start(ckpt):  # noqa: F811
    d, _ = ckpt
    with pytest.raises(ValueError, match="holds no state checkpoint of this model"):
        LLM(model=str(d), device="cpu", dtype="float32", state_checkpoint_host_gib=1e-9)


@pytest.mark.parametrize("edit", ["openclaw: thinking dropped", "opencode: tool output replaced",
                                  "swe-agent: old observation dropped"])  # fmt: skip
def test_resumed_from_the_host_tier_equals_fresh_prefill(ckpt, edit):  # noqa: F811
    """Two device checkpoint slots (fewer than the first turn's anchors: the prefill spills), then an unrelated
    prompt pushes the first turn's checkpoints out of the device tier: the edited prompt resumes from the host."""
    d, sp = ckpt
    first, edits = _turns(sp)
    prompt = edits[edit]
    llm = LLM(model=str(d), device="cpu", dtype="float32", page_size=PAGE, state_checkpoints=2,
              state_checkpoint_host_gib=0.01)  # fmt: skip
    fresh = llm.engine.score(prompt)[-1]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([first], params)
    s = llm.stats()
    assert s["state_checkpoints"] >= 3 and s["state_spilled"] >= 1, s
    llm.generate([[7] * 40], params)  # its checkpoints take the device tier
    seen: list[torch.Tensor] = []
    model = llm.engine.runner.model
    real_logits = model.logits
    model.logits = lambda h: seen.append(real_logits(h)) or seen[-1]  # type: ignore[method-assign]
    before = llm.stats()
    llm.generate([prompt], params)
    after = llm.stats()
    assert after["state_restores_host"] == before["state_restores_host"] + 1, after
    refilled = after["prefill_tokens"] - before["prefill_tokens"]
    suffix = len(prompt) - common_prefix(first, prompt)
    assert refilled <= suffix + PAGE, (edit, refilled, suffix)
    assert_close_logits(seen[-1][0].cpu(), fresh)
    llm.check_integrity()


def test_without_a_host_tier_evictions_are_dropped(ckpt):  # noqa: F811
    d, sp = ckpt
    first, _ = _turns(sp)
    llm = LLM(model=str(d), device="cpu", dtype="float32", page_size=PAGE, state_checkpoints=2,
              state_checkpoint_host_gib=0)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([first], params)
    llm.generate([[7] * 40], params)
    s = llm.stats()
    assert s["state_checkpoint_slots_host"] == 0 and s["state_checkpoints_host"] == 0 and s["state_recycled"] >= 1
    assert s["state_checkpoints"] <= 2
    llm.check_integrity()


@pytest.mark.gpu
def test_pinned_round_trip_equals_the_device_tier():
    """CUDA: a checkpoint saved to the pinned host tier and loaded back is bit-equal to a device-tier copy, with the
    device slot rewritten right after the save (the fence orders it) and the host slot reused after the load."""
    dev = torch.device("cuda")
    kv, tree, states, ck = _pools(1, 1, dev)
    assert ck.host is not None and ck.host.pinned
    a, b = _cache(kv, tree, [1, 2], "r1"), _cache(kv, tree, [3, 4], "r2")
    g = torch.Generator(device=dev).manual_seed(0)
    slot = ck.take()
    assert slot is not None
    states.conv[:, slot] = torch.randn(states.conv[:, slot].shape, generator=g, device=dev)
    states.ssm[:, slot] = torch.randn(states.ssm[:, slot].shape, generator=g, device=dev)
    want = states.conv[:, slot].clone(), states.ssm[:, slot].clone()
    ck.hang(slot, a)
    assert ck.take() == slot and a.checkpoint in ck.host_keys  # demoted: an asynchronous device -> host copy
    states.conv[:, slot], states.ssm[:, slot] = 7.0, 7.0  # the slot rewritten at once, on the compute stream
    ck.hang(slot, b)
    ck.restore(a, 1)  # host -> device, stream-ordered after the save
    torch.cuda.synchronize()
    assert torch.equal(states.conv[:, 1], want[0]) and torch.equal(states.ssm[:, 1], want[1])
    ck.restore(b, 0)
    assert bool((states.ssm[:, 0] == 7.0).all())
    ck.check_integrity()


@pytest.mark.gpu
def test_gpu_host_tier_logits_equal_the_device_tier(ckpt):  # noqa: F811
    """CUDA, fp32: the edited prompt resumed from a pinned host checkpoint gives the logits it gets resumed from a
    device checkpoint (a device tier large enough, no host tier). Eager steps: the logits are read in Python."""
    d, sp = ckpt
    first, edits = _turns(sp)
    prompt = edits["opencode: tool output replaced"]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    out = {}
    for name, kw in {"device": {"state_checkpoints": 64, "state_checkpoint_host_gib": 0},
                     "host": {"state_checkpoints": 2, "state_checkpoint_host_gib": 0.01}}.items():  # fmt: skip
        llm = LLM(model=str(d), device="cuda", dtype="float32", page_size=PAGE, cuda_graphs=False, **kw)
        llm.generate([first], params)
        llm.generate([[7] * 40], params)
        seen: list[torch.Tensor] = []
        model = llm.engine.runner.model
        real_logits = model.logits
        model.logits = lambda h, f=real_logits, s=seen: s.append(f(h)) or s[-1]  # type: ignore[method-assign]
        llm.generate([prompt], params)
        s = llm.stats()
        assert s["state_restores_host" if name == "host" else "state_restores"] >= 1, s
        out[name] = seen[-1][0].cpu()
        llm.check_integrity()
    assert_close_logits(out["host"], out["device"])
