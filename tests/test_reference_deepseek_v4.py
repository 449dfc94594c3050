"""DeepSeek-V4 (``DeepseekV4ForCausalLM``) against transformers' forward on a tiny random checkpoint (CPU, fp32;
``tiny_dsv4.py``: every attention kind, token-id routed layers, 4 residual streams, the MTP block present) through the
fused, offload, cpu and hybrid expert backends: prompt logits, the whole sequence scored in chunks that cut windows
and compression windows, one token a step (decode), layer-major; greedy tokens of a batch decoding past the window;
prefix reuse after an edit (the compressed rows come from the shared pages). (The load refusals by name, the names
as shipped, the FTW conversion and the memory plan: test_reference_deepseek_v4_load.py.)"""

from __future__ import annotations

import logging

import pytest
import torch

from freetoken import LLM, SamplingParams
from reference import LOGIT_MARGIN, assert_close_logits, check_scoring, reference_greedy, torch_ops
from tiny_dsv4 import SEED, STEPS, dsv4_llm, reference_case, save_dsv4_checkpoint

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

BACKENDS = [("fused", None, None), ("offload", 0.5, None), ("cpu", None, None), ("hybrid", 0.5, 0.5)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return reference_case(tmp_path_factory.mktemp("dsv4"))


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_logits_and_greedy_tokens_match(ckpt, backend, cache, fill):
    d, _, refs, full = ckpt
    llm = dsv4_llm(d, backend, cache, fill)
    # chunks of 5 cut windows and compression windows; chunks of 1: every step a decode step
    check_scoring(llm, refs, full, chunks=(5, 1), layer_major=lambda n: [3, 11, n - 14])
    outs = llm.generate([r.prompt for r in refs], PARAMS)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()


@pytest.mark.parametrize("S,every,at,resume", [(8, 8, 29, 24), (4, 4, 30, 28)])  # an HCA window's edge (24), or inside
def test_prefix_reuse_after_an_edit(ckpt, freetoken_env, S, every, at, resume):
    """An edit in the middle of a context: the request resumes from the deepest state checkpoint before the edit's page
    (a grid every ``every`` tokens: the tiny model has no anchors): the window keys and the raw rows of a compression
    window the checkpoint cuts come from its rings, the compressed entries from the shared pages; the suffix is
    prefilled, and both requests continue as transformers does."""
    d, model, _, _ = ckpt
    freetoken_env("FREETOKEN_DEBUG", "1")  # every cache checked after every step
    history = torch.randint(3, 512, (40,), generator=torch.Generator().manual_seed(77)).tolist()
    edited = list(history)
    edited[at] = (edited[at] + 1) % 500 + 3
    llm = dsv4_llm(d, page_size=S, state_checkpoint_every=every)
    first = llm.generate([history], PARAMS)[0].token_ids
    before = llm.stats()
    out = llm.generate([edited], PARAMS)[0].token_ids
    after = llm.stats()
    assert after["state_restores"] == before["state_restores"] + 1
    assert after["prefix_tokens_reused"] - before["prefix_tokens_reused"] == resume
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(edited) - resume
    for ids, got in ((history, first), (edited, out)):
        ref = reference_greedy(model, ids, STEPS)
        assert ref.min_logit_margin > LOGIT_MARGIN and got == ref.tokens
    llm.check_integrity()


def test_the_next_turn_resumes_after_the_reply(ckpt):
    """The reply (past the window and several compression windows) is checkpointed when the request finishes; the next
    turn re-prefills its new suffix and less than a page, and continues as transformers does."""
    d, model, _, _ = ckpt
    first = torch.randint(3, 512, (13,), generator=torch.Generator().manual_seed(5)).tolist()
    llm = dsv4_llm(d, page_size=4)
    reply = llm.generate([first], PARAMS)[0].token_ids
    prompt = first + reply + torch.randint(3, 512, (6,), generator=torch.Generator().manual_seed(6)).tolist()
    before = llm.stats()
    out = llm.generate([prompt], PARAMS)[0].token_ids
    refilled = llm.stats()["prefill_tokens"] - before["prefill_tokens"]
    assert refilled <= 6 + 4, refilled
    ref = reference_greedy(model, prompt, STEPS)
    assert ref.min_logit_margin > LOGIT_MARGIN and out == ref.tokens
    llm.check_integrity()


def test_mtp_block_is_skipped_and_said_once(ckpt, caplog):
    d, _, refs, full = ckpt
    with caplog.at_level(logging.INFO, logger="freetoken.loader.deepseek_v4_build"):
        llm = dsv4_llm(d, "cpu")
    said = [r for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert len(said) == 1 and "4 tensors" in said[0].getMessage()
    assert_close_logits(llm.engine.score(refs[0].prompt), refs[0].prompt_logits)


def test_hash_layers_route_by_token_id(ckpt):
    """The first two layers' experts are ``tid2eid[input_ids]`` whatever the hidden state; the others route by score."""
    d, model, _, _ = ckpt
    llm = dsv4_llm(d)
    layers = llm.engine.setup.loaded.model.layers
    ids = torch.tensor([7, 300, 7])
    x = torch.randn((3, 64), generator=torch.Generator().manual_seed(3))
    for i, layer in enumerate(layers):
        experts, w = layer.ffn.choose(x, ids)
        table = model.model.layers[i].mlp.gate
        if i < 2:
            assert torch.equal(experts, table.tid2eid[ids])
        else:
            assert layer.ffn.tid2eid is None
        torch.testing.assert_close(w.sum(dim=-1), torch.full((3,), 1.5))  # renormalised, times the scaling factor


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_moe_layer_matches_transformers_where_the_clamp_binds(ckpt, backend, cache, fill):
    """A token-id routed layer (0) and a score-routed one (2), MoE part alone, on inputs wide enough that the
    clamped SiLU binds (routed and shared experts): transformers' ``DeepseekV4SparseMoeBlock`` is the oracle."""
    d, model, _, _ = ckpt
    llm = dsv4_llm(d, backend, cache, fill)
    ids = torch.randint(3, 512, (12,), generator=torch.Generator().manual_seed(8))
    x = torch.randn((12, 64), generator=torch.Generator().manual_seed(7)) * 40.0
    for i in (0, 2):
        moe = llm.engine.setup.loaded.model.layers[i].ffn
        block = model.model.layers[i].mlp
        with torch.no_grad():
            want = block(x[None], input_ids=ids[None])[0]
            gu = torch.einsum("td,efd->tef", x, block.experts.gate_up_proj)
        assert float(gu[..., :32].max()) > 10.0 and float(gu[..., 32:].abs().max()) > 10.0  # the clamps bind
        llm.engine.setup.loaded.backend.begin_step(12, False)
        got = moe.forward_ids(x, ids)
        torch.testing.assert_close(got, want, atol=1e-4 * max(1.0, float(want.abs().max())), rtol=0)


def test_yarn_compress_rope_matches(tmp_path):
    """The compressed layers' rope under YaRN (as DeepSeek-V4-Flash ships it: without YaRN's magnitude scale), the
    sliding layers' plain: logits of a whole sequence and of it in chunks."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
            "beta_slow": 1}  # fmt: skip
    model = save_dsv4_checkpoint(tmp_path, SEED, rope_parameters=yarn, max_position_embeddings=256)
    assert model.config.rope_parameters["compress"]["rope_type"] == "yarn"
    ids = torch.randint(3, 512, (45,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad(), torch_ops(model):
        ref = model(torch.tensor([ids]), use_cache=False).logits[0].float()
    llm = dsv4_llm(tmp_path)
    assert_close_logits(llm.engine.score(ids), ref)
    assert_close_logits(llm.engine.score(ids, chunk=7), ref)


def test_preempted_requests_keep_their_tokens(ckpt, freetoken_env):
    """A KV pool too small for the batch: requests are preempted and resumed (their rows recomputed or reused from
    the tree), and the tokens do not change."""
    d, _, refs, _ = ckpt
    freetoken_env("FREETOKEN_DEBUG", "1")
    llm = dsv4_llm(d, page_size=4, kv_pages=14, max_batched_tokens=16)
    outs = llm.generate([r.prompt for r in refs], PARAMS)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()


@pytest.mark.gpu
@pytest.mark.parametrize("backend,cache,fill", [("fused", None, None), ("hybrid", 0.5, 0.5)])
def test_cuda_logits_and_greedy_tokens_match(ckpt, backend, cache, fill):
    """The same on a GPU (fp32): the torch attention on CUDA, the Triton expert GEMMs under the dsv4 activation, decode
    steps through the step graphs (``layers/v4_decode.py``; graphed == eager: ``test_dsv4_step_graph.py``)."""
    d, _, refs, full = ckpt
    llm = LLM(model=str(d), device="cuda", dtype="float32", moe_backend=backend, expert_cache=cache, fill_fraction=fill)
    for r, ref in zip(refs, full):
        assert_close_logits(llm.engine.score(r.prompt), r.prompt_logits)
        assert_close_logits(llm.engine.score(r.prompt + r.tokens, chunk=5), ref)
    outs = llm.generate([r.prompt for r in refs], PARAMS)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()
