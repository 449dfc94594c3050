"""Recurrent-state checkpoints at semantic anchors: a request resumed from a checkpoint gives the same next-token
logits as a fresh full prefill (DeltaNet layers, fp32, 1e-4), after each of the three harness edits it re-prefills at
most the new suffix and one page; the pool's contract (take / hang / recycle / drop with the tree's pages)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capture_check import cpu_step_graph_host, fake_step_graphs
from freetoken import LLM, SamplingParams
from freetoken.bench.agent_edits import common_prefix
from freetoken.cache.anchors import Anchors
from freetoken.cache.kv_pool import KVPool
from freetoken.cache.radix import RadixCache
from freetoken.cache.state_checkpoints import StateCheckpoints
from freetoken.cache.state_pool import StatePool, StateShape
from freetoken.config import EngineConfig
from reference import assert_close_logits
from tiny_models import save_checkpoint, save_tokenizer

PAGE = 4
_ANCHOR_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                  "</tool_response>")  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt_hybrid")
    save_checkpoint("qwen3_5_moe", d, seed=2)
    tok = save_tokenizer(d)
    return d, {t: tok.convert_tokens_to_ids(t) for t in _ANCHOR_TOKENS}


def _text(g: torch.Generator, n: int) -> list[int]:
    return torch.randint(20, 400, (n,), generator=g).tolist()


def _turns(sp: dict[str, int]) -> tuple[list[int], dict[str, list[int]]]:
    """A first agent turn (system, user, assistant thinking + a tool call, the tool's output) and the next prompt
    under each harness's edit, all continuing with a new user message."""
    g = torch.Generator().manual_seed(3)
    S, E = sp["<|im_start|>"], sp["<|im_end|>"]
    system = [S, *_text(g, 21), E]
    user = [S, *_text(g, 9), E]
    think = [sp["<think>"], *_text(g, 13), sp["</think>"]]
    call = [sp["<tool_call>"], *_text(g, 6), sp["</tool_call>"]]
    assistant = [S, *_text(g, 2), *think, *call, E]
    output = [S, *_text(g, 3), sp["<tool_response>"], *_text(g, 17), sp["</tool_response>"], E]
    new = [S, *_text(g, 7), E, S, *_text(g, 2)]
    first = system + user + assistant + output
    no_think = [S, *_text(g, 2), *call, E]
    placeholder = [S, *_text(g, 3), sp["<tool_response>"], 99, sp["</tool_response>"], E]
    edits = {
        "openclaw: thinking dropped": system + user + no_think + output + new,
        "opencode: tool output replaced": system + user + assistant + placeholder + new,
        "swe-agent: old observation dropped": system + user + assistant + new,
    }
    return first, edits


@pytest.mark.parametrize("edit", ["openclaw: thinking dropped", "opencode: tool output replaced",
                                  "swe-agent: old observation dropped"])  # fmt: skip
def test_resumed_request_equals_fresh_prefill(ckpt, edit):
    d, sp = ckpt
    first, edits = _turns(sp)
    prompt = edits[edit]
    llm = LLM(model=str(d), device="cpu", dtype="float32", page_size=PAGE)
    fresh = llm.engine.score(prompt)[-1]  # a fresh full prefill (its own slot, no checkpoint)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([first], params)
    assert llm.stats()["state_checkpoints"] >= 3  # the anchors of the first turn, hung on the tree
    seen: list[torch.Tensor] = []
    model = llm.engine.runner.model
    real_logits = model.logits
    model.logits = lambda h: seen.append(real_logits(h)) or seen[-1]  # type: ignore[method-assign]
    before = llm.stats()
    llm.generate([prompt], params)
    after = llm.stats()
    assert after["state_restores"] == before["state_restores"] + 1
    reused = after["prefix_tokens_reused"] - before["prefix_tokens_reused"]
    refilled = after["prefill_tokens"] - before["prefill_tokens"]
    suffix = len(prompt) - common_prefix(first, prompt)  # the minimum: what the edit changed or added
    assert refilled == len(prompt) - reused and refilled <= suffix + PAGE, (edit, refilled, suffix)
    assert_close_logits(seen[-1][0].cpu(), fresh)
    llm.check_integrity()


def test_no_checkpoints_no_reuse(ckpt):
    d, sp = ckpt
    first, edits = _turns(sp)
    llm = LLM(model=str(d), device="cpu", dtype="float32", page_size=PAGE, state_checkpoints=0)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([first], params)
    llm.generate([edits["swe-agent: old observation dropped"]], params)
    assert llm.stats()["prefix_tokens_reused"] == 0


def test_anchor_positions():
    a = Anchors(starts=frozenset({7}), ends=frozenset({8}))
    tokens = [1, 1, 1, 7, 1, 1, 1, 1, 8, 1, 1, 1, 1, 1]
    # 7 at 3 -> the states before it (3 -> page 0: dropped, not > lo) and after it (4); 8 at 8 -> after it (9 -> 8);
    # the end 14 -> 12
    assert a.positions(tokens, 0, 14, 4) == [4, 8, 12]
    assert a.positions(tokens, 8, 14, 4) == [12]  # past the resume point only


def _pools(checkpoints: int) -> tuple[KVPool, RadixCache, StatePool, StateCheckpoints]:
    kv = KVPool(1, 16, 2, 1, 1, torch.float32, torch.device("cpu"))
    tree = RadixCache(kv)
    states = StatePool(StateShape(1, 2, 1, 1, 1, 1), 2, torch.float32, torch.device("cpu"), checkpoints)
    return kv, tree, states, StateCheckpoints(states, tree)


def _cache(kv: KVPool, tree: RadixCache, tokens: list[int], owner: str):
    pages = kv.allocate(len(tokens) // 2, owner)
    assert tree.insert(tokens, pages, owner) == 0
    return tree.lookup(tokens).node


def test_checkpoint_pool_contract():
    kv, tree, states, ck = _pools(2)
    a, b = _cache(kv, tree, [1, 2, 3, 4], "r1"), _cache(kv, tree, [5, 6], "r2")
    states.ssm[:, 0] = 3.0
    s1 = ck.take()
    assert s1 is not None
    states.copy(0, s1)
    ck.hang(s1, a)
    s2 = ck.take()
    assert s2 is not None
    ck.hang(s2, b)
    ck.check_integrity()
    assert ck.deepest(a) is a and ck.size == 2
    ck.restore(a, 1)  # a used last: b's checkpoint is the least recently used one
    assert float(states.ssm[0, 1].max()) == 3.0
    s3 = ck.take()  # full: recycles b's
    assert s3 == s2 and b.checkpoint is None and ck.num_recycled == 1
    assert ck.take() == s1 and a.checkpoint is None  # then a's
    assert ck.take() is None  # both pending: nothing to recycle
    ck.give(s1)
    ck.check_integrity()


def test_checkpoint_dropped_with_its_pages():
    kv, tree, states, ck = _pools(1)
    node = _cache(kv, tree, [1, 2, 3, 4], "r1")
    slot = ck.take()
    assert slot is not None
    ck.hang(slot, node)
    tree.evict(1)  # the leaf shrinks by a page: its end moved, the checkpoint no longer matches
    assert node.checkpoint is None and ck.size == 0
    ck.check_integrity()
    tree.check_integrity()


def test_an_empty_checkpoint_pool_is_refused():
    with pytest.raises(ValueError, match="at least one checkpoint slot"):
        _pools(0)
    with pytest.raises(ValueError, match="state_checkpoints must be >= 0"):
        EngineConfig(state_checkpoints=-1)


@pytest.mark.parametrize("graphed", [False, True])
def test_next_turn_resumes_after_the_reply(ckpt, graphed: bool, monkeypatch: pytest.MonkeyPatch):
    """The state after the request's own reply (to its last whole page) is checkpointed when it finishes: the next
    turn, which sends the reply back, re-prefills only its new suffix (and less than a page), with the logits of a
    fresh full prefill. ``graphed``: the reply's decode steps run from the step graphs (under the capture checker),
    its checkpoints as copies behind the replays, none eagerly."""
    d, sp = ckpt
    first, _ = _turns(sp)
    if graphed:
        cpu_step_graph_host(monkeypatch)
    llm = LLM(model=str(d), device="cpu", dtype="float32", page_size=PAGE, overlap_steps=True)
    if graphed:
        fake_step_graphs(llm, monkeypatch, recurrent=True)
    reply = llm.generate([first], SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True))[0].token_ids
    g = torch.Generator().manual_seed(5)
    S, E = sp["<|im_start|>"], sp["<|im_end|>"]
    prompt = first + reply + [E, S, *_text(g, 9), E, S]
    fresh = llm.engine.score(prompt)[-1]
    seen: list[torch.Tensor] = []
    model = llm.engine.runner.model
    real_logits = model.logits
    model.logits = lambda h: seen.append(real_logits(h)) or seen[-1]  # type: ignore[method-assign]
    before = llm.stats()
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    stats = llm.stats()
    refilled = stats["prefill_tokens"] - before["prefill_tokens"]
    if graphed:  # the 23 steps crossed 5 page boundaries
        assert stats["step_graph_replays"] >= 20 and stats["step_graph_eager_fallbacks"] == 0, stats
    suffix = len(prompt) - len(first) - len(reply)
    assert refilled <= suffix + PAGE, (refilled, suffix)
    assert_close_logits(seen[-1][0].cpu(), fresh)
    llm.check_integrity()


def test_the_default_pool_is_what_fits_the_budget(tmp_path: Path) -> None:
    """Without a number, as many checkpoints as fit ``state_checkpoint_gib`` (at least 16, at most 256); a number given
    is kept; a model without recurrent state gets none."""
    from freetoken.memory.planner import MAX_CHECKPOINTS, MIN_CHECKPOINTS, checkpoint_count

    d = tmp_path / "m"
    save_checkpoint("qwen3_5_moe", d, seed=0)
    llm = LLM(model=str(d), device="cpu", dtype="float32")
    loaded = llm.engine.setup.loaded
    assert loaded.states is not None
    one = loaded.states.slot_bytes(torch.float32)
    assert llm.engine.states is not None and llm.engine.states.num_checkpoints == MAX_CHECKPOINTS  # tiny states
    assert checkpoint_count(one, None, 40 * one) == 40
    assert checkpoint_count(one, None, 0) == MIN_CHECKPOINTS
    assert checkpoint_count(one, 3, 1 << 30) == 3
    assert checkpoint_count(0, None, 1 << 30) == 0  # no recurrent state: none
    with pytest.raises(ValueError, match="state_checkpoint_gib"):
        EngineConfig(state_checkpoint_gib=-1.0)
