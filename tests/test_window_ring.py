"""gpt-oss's window layers keep only their window of KV: a ring of a request's last W tokens in its state slot, not KV
pages. The KV pool holds the full-attention layers alone, the memory plan counts the rings as per-request state (the
same bytes at any context length), and a request resumed from a window checkpoint (after an edit, or the next turn
after its reply) gives the next-token logits of a fresh prefill (fp32, 1e-4) while re-prefilling only the new suffix."""

from __future__ import annotations

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.bench.agent_edits import common_prefix
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.memory.sizes import model_bytes
from reference import assert_close_logits
from test_reference_gpt_oss import WINDOW
from tiny_models import gpt_oss_model

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

PAGE = 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt_oss_ring")
    gpt_oss_model(0).save_pretrained(d)
    return d


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _text(seed: int, n: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_rings_not_pages_in_the_memory_plan(ckpt):
    hf = load_hf_config(ckpt)
    b = model_bytes(hf, 4, None, window_ring=True)
    ring = 2 * WINDOW * hf.num_kv_heads * hf.head_dim * 4
    assert (b.kv_layers, b.ring_layers, b.linear_layers) == (2, 2, 0)
    assert b.state_per_request == 2 * ring
    assert b.kv_per_token == 2 * 2 * hf.num_kv_heads * hf.head_dim * 4  # the two full layers only
    for context in (32, 256):  # the rings' bytes do not grow with the context
        llm = LLM(model=str(ckpt), device="cpu", dtype="float32", page_size=PAGE, max_model_len=context,
                  max_running_requests=2, state_checkpoints=3)  # fmt: skip
        eng = llm.engine
        assert len(eng.kv.k) == 2 and eng.states is not None
        st = eng.states
        assert tuple(st.ring_k.shape) == (2, 2 + 1 + 3, WINDOW, hf.num_kv_heads, hf.head_dim)
        held = st.num_slots + st.num_checkpoints
        assert _nbytes(st.tensors) == b.state_per_request * held == eng.memory.plan.states_bytes
        assert _nbytes(eng.kv.k + eng.kv.v) == eng.memory.plan.kv_bytes == b.page_bytes(PAGE) * eng.kv.num_pages


def _capture_logits(llm: LLM) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    model = llm.engine.runner.model
    real = model.logits
    model.logits = lambda h: seen.append(real(h)) or seen[-1]  # type: ignore[method-assign]
    return seen


def test_an_edited_prompt_resumes_from_a_window_checkpoint(ckpt):
    """Checkpoints every 8 tokens (a grid: the tiny tokenizer-less model has no harmony anchors); the edit keeps the
    first 29 tokens: the request resumes from the deepest checkpoint before it, past several windows."""
    first = _text(1, 41)
    prompt = first[:29] + _text(2, 11)
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", page_size=PAGE, state_checkpoint_every=8)
    fresh = llm.engine.score(prompt)[-1]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([first], params)
    seen = _capture_logits(llm)
    before = llm.stats()
    llm.generate([prompt], params)
    after = llm.stats()
    assert after["state_restores"] == before["state_restores"] + 1
    reused = after["prefix_tokens_reused"] - before["prefix_tokens_reused"]
    refilled = after["prefill_tokens"] - before["prefill_tokens"]
    assert reused == 24 and refilled == len(prompt) - 24  # the checkpoint at 24 (< 29, the grid's deepest)
    assert reused > 2 * WINDOW
    assert_close_logits(seen[-1][0].cpu(), fresh)
    llm.check_integrity()


def test_the_next_turn_resumes_after_the_reply(ckpt):
    """The reply (23 tokens: the ring turns over almost three times) is checkpointed when the request finishes; the
    next turn re-prefills its new suffix and less than a page, with the logits of a fresh prefill."""
    first = _text(3, 19)
    llm = LLM(model=str(ckpt), device="cpu", dtype="float32", page_size=PAGE)
    reply = llm.generate([first], SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True))[0].token_ids
    prompt = first + reply + _text(4, 9)
    fresh = llm.engine.score(prompt)[-1]
    seen = _capture_logits(llm)
    before = llm.stats()
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    refilled = llm.stats()["prefill_tokens"] - before["prefill_tokens"]
    assert refilled <= len(prompt) - common_prefix(first + reply, prompt) + PAGE, refilled
    assert_close_logits(seen[-1][0].cpu(), fresh)
    llm.check_integrity()


def test_decode_steps_through_the_ring_capture_and_replay(ckpt, monkeypatch):
    """The ring layers' decode step is capturable (fixed shapes, no host read): the step graphs capture it under the
    capture checker (an op a CUDA capture refuses raises) and replay it past the window, with the eager tokens."""
    from capture_check import FakeCapture
    from freetoken.layers.rope import Rotary
    from freetoken.runner.step_graph import StepGraphs

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    body, tables = StepGraphs._body, Rotary._tables

    def fresh_body(self, st, f):
        st.batch.decode.gathered.clear()
        return body(self, st, f)

    def fresh_tables(self, positions, dtype):
        self._last = None
        return tables(self, positions, dtype)

    monkeypatch.setattr(StepGraphs, "_body", fresh_body)
    monkeypatch.setattr(Rotary, "_tables", fresh_tables)
    kw = dict(
        device="cpu", dtype="float32", max_running_requests=4, page_size=PAGE, moe_backend="fused", state_checkpoints=0
    )  # fmt: skip (a step that takes a checkpoint runs eagerly)
    graphed, eager = LLM(model=str(ckpt), **kw), LLM(model=str(ckpt), **kw)
    eng = graphed.engine
    backend = eng.setup.loaded.backend
    monkeypatch.setattr(backend, "step_capturable", lambda tokens, top_k: True)
    for hook in ("begin_step_capture", "end_step_capture", "before_step_replay"):
        monkeypatch.setattr(backend, hook, lambda *a: None)
    state = eng.sampler.state
    cap = FakeCapture(keep=lambda: [state.counts, state.seen])
    eng.runner.graphs = StepGraphs(eng.setup.loaded.model, eng.kv, backend, eng.sampler, 4,
                                   eng.kv.pages_for(eng.max_model_len), eng.hf.top_k, capture=cap)  # fmt: skip
    prompts = [_text(10 + i, 5 + 3 * i) for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=3 * WINDOW, ignore_eos=True)
    got = [r.token_ids for r in graphed.generate(prompts, params)]
    assert got == [r.token_ids for r in eager.generate(prompts, params)]
    stats = graphed.stats()
    assert stats["step_graph_captures"] >= 1 and stats["step_graph_eager_fallbacks"] == 0
    assert stats["step_graph_replays"] == stats["step_graph_decode_steps"] - stats["step_graph_captures"] > 2 * WINDOW
