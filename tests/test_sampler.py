"""Sampling: greedy, seeded reproducibility, top-k / top-p restrict the support."""

from __future__ import annotations

import torch

from freetoken.engine.sampler import make_generator, sample
from freetoken.engine.sampling_params import SamplingParams


def test_greedy_is_argmax():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample(logits, SamplingParams(temperature=0.0), None) == 1


def test_seed_reproducible_and_top_k_top_p_support():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = SamplingParams(temperature=1.0, seed=3)
    a = [sample(logits, p, g) for g in [make_generator(3, torch.device("cpu"))] for _ in range(50)]
    b = [sample(logits, p, g) for g in [make_generator(3, torch.device("cpu"))] for _ in range(50)]
    assert a == b and len(set(a)) > 1
    g = make_generator(0, torch.device("cpu"))
    assert {sample(logits, SamplingParams(top_k=2), g) for _ in range(200)} == {0, 1}
    # top_p 0.7: 0.5 alone < 0.7, so tokens 0 and 1 stay; token 2 starts after 0.8 of mass
    assert {sample(logits, SamplingParams(top_p=0.7), g) for _ in range(200)} == {0, 1}


def test_bad_params_raise():
    import pytest

    for kwargs in ({"max_tokens": 0}, {"temperature": -1}, {"top_p": 0.0}, {"stop": [""]}):
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)
