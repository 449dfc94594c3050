"""Engine level: the same greedy tokens as transformers through ``LLM`` for every expert backend (tiny qwen3_moe,
fp32), and an expert cache below top-k refused when the engine starts."""

from __future__ import annotations

import pytest
import torch

from devices import DEVICES
from random_experts import SLOT_BACKENDS, assert_did_work

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


# -- engine level: the same greedy tokens through LLM for every backend (tiny qwen3_moe, fp32) ----------
ENGINE_STEPS = 12


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from reference import LOGIT_MARGIN, ROUTER_MARGIN, reference_greedy
    from tiny_models import save_checkpoint

    d = tmp_path_factory.mktemp("qwen3_moe")
    model = save_checkpoint("qwen3_moe", d, seed=1)  # 2 MoE layers x 8 experts, top-2
    g = torch.Generator().manual_seed(1001)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (5, 13)]
    refs = [reference_greedy(model, p, ENGINE_STEPS, top_k=2) for p in prompts]
    for r in refs:  # the near-tie rule (DESIGN §8): this seed is free of ties
        assert r.min_logit_margin > LOGIT_MARGIN and r.min_router_margin > ROUTER_MARGIN
    return str(d), prompts, refs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("expert_cache", [0.2, 0.5])
@pytest.mark.parametrize("name", ["fused", *SLOT_BACKENDS])
def test_engine_greedy_tokens_match(tiny_moe: tuple, name: str, expert_cache: float, device: str) -> None:
    from freetoken import LLM, SamplingParams

    path, prompts, refs = tiny_moe
    fill = 0.5 if name == "hybrid" else None
    llm = LLM(path, device=device, dtype="float32", moe_backend=name, expert_cache=expert_cache, fill_fraction=fill)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=ENGINE_STEPS, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    llm.check_integrity()
    s = llm.stats()
    assert s["moe_backend"] == name
    assert_did_work(name, s)


def test_cache_below_top_k_is_refused_when_the_engine_starts(tmp_path) -> None:
    from freetoken import LLM
    from tiny_models import save_checkpoint

    save_checkpoint("qwen3_moe", tmp_path, seed=1)  # top-2
    with pytest.raises(ValueError, match="fewer than the 2 experts"):
        LLM(str(tmp_path), device="cpu", moe_backend="offload", expert_cache=1)
