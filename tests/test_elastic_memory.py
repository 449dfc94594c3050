"""Elastic memory on the CPU: the KV pool and the expert-slot cache resize between steps.

Unit level (exact pages): a shrink evicts LRU prefix-cache pages first and moves the surviving pages with
their K/V, renamed in the radix tree and every page table; running requests keep theirs and are preempted
only when nothing else is left; a grow adds free pages. Engine level (fp32, a tiny random qwen3_moe, greedy):
shrinking and growing the slots and the KV pool mid-generation keeps every token, with ``check_integrity``
clean after every step (FREETOKEN_DEBUG) and after every resize."""

from __future__ import annotations

import pytest
import torch

from devices import DEVICES
from freetoken import LLM, SamplingParams
from freetoken.bench.placements import register
from freetoken.cache.kv_pool import KVPool
from freetoken.cache.radix import RadixCache
from freetoken.config import EngineConfig
from freetoken.engine.detokenizer import IncrementalDetokenizer
from freetoken.engine.kv_manager import KVManager
from freetoken.engine.request import Request
from freetoken.engine.scheduler import Scheduler
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.base import ExpertBanks
from freetoken.experts.reference import moe_reference
from freetoken.memory.budget import MemorySplit
from reference import LOGIT_MARGIN, ROUTER_MARGIN, reference_greedy
from tiny_models import save_checkpoint

register()  # the static-layers and static-freq backends

S = 2  # page size of the unit tests
PAGE = 8  # page size of the engine tests
STEPS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)


def _pool(pages: int) -> tuple[KVPool, RadixCache, KVManager, Scheduler]:
    kv = KVPool(2, pages, S, 1, 2, torch.float32, torch.device("cpu"))
    tree = RadixCache(kv)
    mgr = KVManager(kv, tree)
    return kv, tree, mgr, Scheduler(mgr, max_running=4, max_batched_tokens=64)


def _write(kv: KVPool, req: Request) -> None:
    """Stands in for the model: the K/V of token t at position i is (t, i) in every layer."""
    for i in range(req.num_computed_tokens):
        slot = req.pages[i // S] * S + i % S
        for layer in range(kv.num_layers):
            kv.k[layer][slot] = torch.tensor([[req.token_ids[i], i]], dtype=torch.float32)
            kv.v[layer][slot] = -kv.k[layer][slot]


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), len(tokens) + 8, IncrementalDetokenizer(None, [], [], True))


def _run_prefill(sched: Scheduler, kv: KVPool) -> None:
    batch = sched.schedule()
    for req, n in batch.items:
        req.num_computed_tokens += n
        _write(kv, req)


def _kv_of(kv: KVPool, req: Request) -> list[list[float]]:
    rows = kv.slots(req.pages, 0, req.num_computed_tokens)
    return [kv.k[layer][rows].flatten().tolist() + kv.v[layer][rows].flatten().tolist() for layer in range(2)]


def _tree_content(tree: RadixCache, kv: KVPool) -> dict[tuple[int, ...], list[float]]:
    """Every cached page, keyed by the whole token prefix it ends, with its K/V."""
    out: dict[tuple[int, ...], list[float]] = {}
    stack = [(tree.root, ())]
    while stack:
        node, prefix = stack.pop()
        for i, page in enumerate(node.pages):
            key = prefix + tuple(node.key[: (i + 1) * S])
            rows = list(range(page * S, (page + 1) * S))
            out[key] = [x for layer in range(2) for x in kv.k[layer][rows].flatten().tolist()]
        for child in node.children.values():
            stack.append((child, prefix + tuple(node.key)))
    return out


def _check(sched: Scheduler) -> None:
    sched.check_integrity()


def test_kv_shrink_evicts_lru_prefix_pages_first_and_moves_the_survivors() -> None:
    kv, tree, mgr, sched = _pool(16)
    old, new = _req("old", [1, 2, 3, 4, 5, 6]), _req("new", [7, 8, 9, 10])
    for r in (old, new):  # two finished requests: their 3 + 2 pages enter the tree (old is the LRU one)
        sched.add(r)
        _run_prefill(sched, kv)
        sched.finish(r)
    running = _req("run", [20, 21, 22, 23, 24, 25, 26])
    sched.add(running)
    _run_prefill(sched, kv)  # 4 private pages
    assert (kv.num_used, tree.num_pages, running.pages) == (9, 5, [5, 6, 7, 8])
    before, mine = _tree_content(tree, kv), _kv_of(kv, running)
    assert sched.resize_kv(7) == 0  # 2 pages over: the LRU leaf's deepest pages go, nobody is preempted
    assert kv.num_pages == 7 and tree.num_pages == 3 and tree.num_evictions == 2
    after = _tree_content(tree, kv)
    assert set(after) == {(7, 8), (7, 8, 9, 10), (1, 2)}  # "new" whole, "old" cut to its first page
    assert all(after[k] == before[k] for k in after)  # the surviving pages kept their K/V
    assert max(p for p in kv._owner) < 7 and _kv_of(kv, running) == mine
    _check(sched)
    assert sched.resize_kv(12) == 0  # grow: 5 free pages more, nothing moves
    assert (kv.num_pages, kv.num_free, _tree_content(tree, kv)) == (12, 5, after)
    assert _kv_of(kv, running) == mine
    _check(sched)


def test_kv_shrink_preempts_only_when_no_prefix_page_is_left() -> None:
    kv, tree, mgr, sched = _pool(16)
    a, b = _req("a", [1, 2, 3, 4, 5]), _req("b", [6, 7, 8, 9, 10, 11, 12])
    sched.add(a)
    sched.add(b)
    _run_prefill(sched, kv)  # a: 3 pages, b: 4 pages, the tree is empty
    mine = _kv_of(kv, a)
    assert sched.resize_kv(4) == 1  # only b (the newest) goes: its 3 full pages enter the tree, 2 of them go
    assert sched.running == [a] and list(sched.waiting) == [b] and b.num_computed_tokens == 0
    assert (kv.num_pages, kv.num_used, tree.num_pages) == (4, 4, 1) and _kv_of(kv, a) == mine
    assert tree.lookup([6, 7, 8]).num_pages == 1  # b's first page stays cached: it resumes from there
    _check(sched)
    with pytest.raises(ValueError, match="4 KV pages are in use"):
        kv.resize(3)  # the pool itself refuses a shrink below what is used


def test_kv_shrink_renames_locked_shared_pages_in_the_request_and_the_tree() -> None:
    kv, tree, mgr, sched = _pool(16)
    first = _req("first", [1, 2, 3, 4, 5])
    sched.add(first)
    _run_prefill(sched, kv)
    sched.finish(first)  # pages 0, 1 enter the tree
    kv.allocate(8, "filler")  # pages 2..9 taken: what comes next lands high
    second = _req("second", [1, 2, 3, 4, 9, 9, 9, 9, 9])
    sched.add(second)
    _run_prefill(sched, kv)  # shares pages 0, 1 (locked), its own pages at 10..12
    assert second.pages[:2] == [0, 1] and second.num_shared_pages == 2 and min(second.pages[2:]) >= 10
    kv.free(list(range(2, 10)), "filler")
    mine = _kv_of(kv, second)
    sched.resize_kv(6)
    assert max(second.pages) < 6 and _kv_of(kv, second) == mine
    assert tree.path_pages(second.prefix_node) == second.pages[:2]
    _check(sched)


# ---- the engine ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("elastic")
    model = save_checkpoint("qwen3_moe", d, seed=1)  # 2 MoE layers x 8 experts, top-2: 16 pool rows
    for p in _prompts():  # the near-tie rule (DESIGN §8): these prompts have none, so tokens must match exactly
        r = reference_greedy(model, p, STEPS, top_k=model.config.num_experts_per_tok)
        assert r.min_logit_margin > LOGIT_MARGIN and r.min_router_margin > ROUTER_MARGIN, "near tie: change seed"
    return str(d)


@pytest.fixture(autouse=True)
def _check_every_step(freetoken_env):
    freetoken_env("FREETOKEN_DEBUG", "1")


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(8)  # free of near ties (asserted in ckpt)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in (40, 70, 33)]


def _generate(llm: LLM, resizes: dict[int, tuple[int, int]]) -> tuple[dict[str, list[int]], int]:
    """Greedy tokens of the three prompts, resizing (slots, KV pages) after the given steps."""
    eng = llm.engine
    prompts = _prompts()
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, GREEDY)
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    step = 0
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
        step += 1
        if step in resizes:
            slots, pages = resizes[step]
            rec = eng.memory.apply(MemorySplit(0, slots, pages, 0), "test", "test")
            assert (eng.memory.num_slots, eng.kv.num_pages) == (slots, pages)
            assert (rec.slots_after, rec.kv_pages_after) == (slots, pages)
            eng.check_integrity()
    return out, eng.stats()["preemptions"]


@pytest.mark.parametrize("backend", ["hybrid", "offload", "static-layers"])
def test_resizing_slots_and_kv_mid_generation_keeps_greedy_tokens(ckpt: str, backend: str) -> None:
    kw = dict(model=ckpt, device="cpu", dtype="float32", moe_backend=backend, page_size=PAGE, max_model_len=128)
    base, _ = _generate(LLM(expert_cache=8, kv_pages=64, **kw), {})
    # shrink both, grow both, shrink KV until requests are preempted, grow back
    plan = {3: (4, 24), 6: (16, 100), 9: (3, 14), 14: (10, 40)}
    if backend == "static-layers":  # whole layers of 8 experts: 0, 1 or 2 layers resident
        plan = {3: (8, 24), 6: (16, 100), 9: (3, 14), 14: (9, 40)}
    got, preempted = _generate(LLM(expert_cache=8, kv_pages=64, **kw), plan)
    assert got == base
    assert preempted > 0  # 14 pages cannot hold three running contexts: the newest went back to the queue


def test_a_size_the_device_refuses_falls_back_and_keeps_everything(
    ckpt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program took the memory between the free and the new allocation: a grow returns to the old size,
    with every page and expert where it was, and the engine goes on."""
    import freetoken.cache.kv_pool as kv_pool
    import freetoken.experts.slots.cache as slot_cache

    llm = LLM(model=ckpt, device="cpu", dtype="float32", moe_backend="hybrid", page_size=PAGE, max_model_len=128,
              expert_cache=8, kv_pages=64)  # fmt: skip
    eng = llm.engine
    prompts = _prompts()
    eng.add_request("a", prompts[0], GREEDY)
    for _ in range(4):
        eng.step()
    req = eng.requests["a"]
    pages, kv_before = list(req.pages), [eng.kv.k[0][eng.kv.slots(req.pages, 0, 40)].clone()]
    resident = eng.setup.loaded.backend.cache.resident()  # type: ignore[union-attr]
    real = kv_pool.device_zeros

    def refuse_big(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if shape[0] > 64 * PAGE or (len(shape) == 3 and shape[0] > 9 and shape[1] == 64):  # KV > 64 pages, > 8 slots
            raise torch.OutOfMemoryError("refused")
        return real(shape, dtype, device)

    monkeypatch.setattr(kv_pool, "device_zeros", refuse_big)
    monkeypatch.setattr(slot_cache, "device_zeros", refuse_big)
    rec = eng.memory.apply(MemorySplit(0, 12, 100, 0), "test", "test")
    assert (rec.slots_after, rec.kv_pages_after) == (8, 64)  # 12 slots and 100 pages asked: the old sizes came
    assert (eng.memory.num_slots, eng.kv.num_pages) == (8, 64)
    assert eng.memory.split.slots == 8 and eng.memory.split.kv_pages == 64
    assert req.pages == pages and torch.equal(eng.kv.k[0][eng.kv.slots(req.pages, 0, 40)], kv_before[0])
    assert set(eng.setup.loaded.backend.cache.resident()) == set(resident)  # type: ignore[union-attr]
    eng.check_integrity()
    while eng.has_unfinished():
        eng.step()
    eng.check_integrity()


def test_a_hybrid_deltanet_model_resizes_mid_generation(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Qwen3-Next (gated DeltaNet + attention): KV pages only for its attention layers, recurrent states and
    their checkpoints beside them; resizing (preemptions included) keeps the greedy tokens."""
    d = tmp_path_factory.mktemp("elastic_next")
    save_checkpoint("qwen3_next", d, seed=16)
    kw = dict(model=str(d), device="cpu", dtype="float32", moe_backend="hybrid", page_size=PAGE, max_model_len=128)
    base, _ = _generate(LLM(expert_cache=8, kv_pages=64, **kw), {})
    got, preempted = _generate(LLM(expert_cache=8, kv_pages=64, **kw), {3: (4, 24), 6: (16, 100), 9: (3, 14)})
    assert got == base and preempted > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_regrown_offload_cache_is_warm_and_exact(device: str) -> None:
    """The whole pool resident, shrunk to one token's experts (decode cycles other experts through them), grown
    back: the cache holds every expert it held before, each slot its expert's exact bytes (CUDA: DMA runs of the
    pinned pool), the outputs match the reference, and the steps after the grow copy nothing."""
    dev = torch.device(device)
    L, E, D, I, K = 3, 16, 64, 32, 4
    g = torch.Generator().manual_seed(3)
    banks = ExpertBanks(torch.randn(L * E, 2 * I, D, generator=g) / D**0.5,
                        torch.randn(L * E, D, I, generator=g) / I**0.5, L, E)  # fmt: skip
    backend = create_backend(EngineConfig(moe_backend="offload", expert_cache=1.0), banks, dev, torch.float32)
    cache = backend.cache  # type: ignore[attr-defined]
    assert cache.num_slots == L * E
    gu, dn = banks.gate_up.to(dev), banks.down.to(dev)

    def decode(steps: int) -> None:
        for _ in range(steps):
            backend.begin_step(1, True)
            for layer in range(L):
                ids = torch.rand(1, E, generator=g).argsort(dim=1)[:, :K].to(dev)
                w = torch.softmax(torch.randn(1, K, generator=g), dim=-1).to(dev)
                x = torch.randn(1, D, generator=g).to(dev)
                out = backend.forward(layer, x, ids, w)
                torch.testing.assert_close(out, moe_reference(x, ids + layer * E, w, gu, dn), rtol=1e-5, atol=1e-5)

    decode(40)  # every expert used (and filled once)
    held = set(cache.resident())
    backend.resize_expert_cache(K)
    decode(5)
    backend.resize_expert_cache(L * E)
    assert set(cache.resident()) == held
    for eid, slot in cache.resident().items():
        assert torch.equal(cache.slot_gate_up[slot].cpu(), banks.gate_up[eid])
        assert torch.equal(cache.slot_down[slot].cpu(), banks.down[eid])
    cache.check_integrity()
    fills = backend.stats()["expert_fills"]
    decode(10)
    assert backend.stats()["expert_fills"] == fills  # warm at once: nothing copied in the steps after the grow
    cache.check_integrity()
    backend.close()
