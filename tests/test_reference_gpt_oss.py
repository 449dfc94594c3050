"""gpt-oss (``GptOssForCausalLM``, bf16-style experts) against transformers' forward on a tiny random checkpoint (CPU,
fp32) through the fused, offload, cpu and hybrid expert backends: prefill logits, prefill in chunks that cut the
sliding window (and layer-major, and one token a step: the window rings' decode path), greedy tokens of a batch
decoding well past the 8-token window; the MoE layer alone on inputs large enough that the clamp of the gated
activation binds; which layers slide; the FTW form; a config whose activation constants the kernels do not have is
refused naming the field."""

from __future__ import annotations

import json

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.checkpoint.errors import CheckpointError
from reference import LOGIT_MARGIN, ROUTER_MARGIN, assert_close_logits, check_scoring, reference_greedy, torch_ops
from reference import float32_llm as _llm
from tiny_models import gpt_oss_model, make_model

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

SEED = 0
PROMPT_LENGTHS = (5, 13, 29)
STEPS = 24  # every sequence decodes past the 8-token window
WINDOW = 8
BACKENDS = [("fused", None, None), ("offload", 0.5, None), ("cpu", None, None), ("hybrid", 0.5, 0.5)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt_oss")
    model = gpt_oss_model(SEED)
    model.save_pretrained(d)
    g = torch.Generator().manual_seed(1000 + SEED)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    refs = [reference_greedy(model, p, STEPS, 2) for p in prompts]
    for r in refs:  # the near-tie rule: this seed must be free of ties, else pick another seed
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        assert r.min_router_margin > ROUTER_MARGIN, f"seed has a router near-tie ({r.min_router_margin:.2g})"
    with torch.no_grad(), torch_ops(model):  # logits at every position of prompt + continuation
        full = [model(torch.tensor([r.prompt + r.tokens]), use_cache=False).logits[0].float() for r in refs]
    return d, model, refs, full


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_logits_and_greedy_tokens_match(ckpt, backend, cache, fill):
    d, _, refs, full = ckpt
    llm = _llm(d, backend, cache, fill)
    check_scoring(llm, refs, full, chunks=(5, 1), layer_major=lambda n: [3, 11, n - 14])  # chunks cut the window
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate([r.prompt for r in refs], params)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_moe_layer_matches_transformers_where_the_clamp_binds(ckpt, backend, cache, fill):
    """Layer 0's MoE part (router with bias, softmax over the top-k, interleaved gate/up with biases, clamped
    activation, down biases) on wide inputs: transformers' ``GptOssMLP`` is the oracle."""
    d, model, _, _ = ckpt
    llm = _llm(d, backend, cache, fill)
    moe = llm.engine.setup.loaded.model.layers[0].ffn
    mlp = model.model.layers[0].mlp
    x = torch.randn((12, 64), generator=torch.Generator().manual_seed(7)) * 3.0
    with torch.no_grad():
        want = mlp(x[None])[0][0]
        gu = torch.einsum("td,edf->tef", x, mlp.experts.gate_up_proj) + mlp.experts.gate_up_proj_bias
    assert float(gu[..., 0::2].max()) > 7.0 and float(gu[..., 1::2].abs().max()) > 7.0  # the clamps bind
    llm.engine.setup.loaded.backend.begin_step(12, False)
    got = moe.forward(x)
    torch.testing.assert_close(got, want, atol=1e-4 * max(1.0, float(want.abs().max())), rtol=0)


def test_sliding_layers_follow_layer_types(ckpt):
    d, model, _, _ = ckpt
    llm = _llm(d, "fused", None, None)
    windows = [layer.attn.window for layer in llm.engine.setup.loaded.model.layers]
    kinds = model.config.layer_types
    assert kinds == ["sliding_attention", "full_attention"] * 2
    assert windows == [WINDOW if k == "sliding_attention" else None for k in kinds]
    assert all(layer.attn.sinks is not None for layer in llm.engine.setup.loaded.model.layers)


@pytest.mark.parametrize("key,value", [("swiglu_limit", 5.0), ("swiglu_alpha", 2.0)])
def test_other_activation_constants_are_refused(tmp_path, key, value):
    model = make_model("gpt_oss", SEED)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=key):
        LLM(model=str(tmp_path), device="cpu", dtype="float32")


def test_ftw_conversion_keeps_the_layout_and_the_biases(ckpt, tmp_path):
    """``ft convert``: the banks are written de-interleaved and transposed as the loader banks them; the expert
    biases stay with the other tensors and are read from there at load."""
    from freetoken.loader.ftw_convert import convert

    d, _, refs, full = ckpt
    convert(d, tmp_path / "ftw")
    llm = LLM(model=str(tmp_path / "ftw"), device="cpu", dtype="float32", moe_backend="cpu")
    banks = llm.engine.setup.loaded.banks
    assert banks is not None and banks.activation == "gptoss" and banks.gate_up_bias is not None
    r = refs[2]
    assert_close_logits(llm.engine.score(r.prompt + r.tokens), full[2])
