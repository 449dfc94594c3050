"""Bytes per token (and per request) of every cache kind, computed from a Hugging Face config alone
(``memory/sizes.py``), against the tensors the engine really allocates for a tiny model of each family: the KV pool's
K/V of the full-attention layers, the recurrent-state pool's conv windows and float32 states of the DeltaNet layers
(request slots and checkpoints alike), the expert-slot cache, the layer-major activations; and the start plan's
shares equal those tensors' bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken import LLM
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.memory.sizes import model_bytes
from freetoken.models.layer_major import activation_bytes
from freetoken.models.registry import get_family
from tiny_models import FAMILIES, HYBRID_FAMILIES, MOE_FAMILIES, SIGMOID_FAMILIES, save_checkpoint

PAGE = 8


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("family", FAMILIES + HYBRID_FAMILIES + SIGMOID_FAMILIES)
def test_bytes_per_token_match_what_the_engine_allocates(tmp_path: Path, family: str) -> None:
    d = tmp_path / family
    save_checkpoint(family, d, seed=0)
    hf = load_hf_config(d)
    fam = get_family(hf.architecture)
    hybrid = family in HYBRID_FAMILIES
    b = model_bytes(hf, 4, fam.full_attention_interval if fam.deltanet_proj is not None else None)
    moe = family in MOE_FAMILIES or family in SIGMOID_FAMILIES or hybrid
    backend = "hybrid" if moe else "auto"
    llm = LLM(model=str(d), device="cpu", dtype="float32", moe_backend=backend, page_size=PAGE, max_model_len=64,
              max_running_requests=2, state_checkpoints=3 if hybrid else None,
              state_checkpoint_host_gib=0.001 if hybrid else None)  # fmt: skip
    eng = llm.engine
    kv = eng.kv
    assert b.kv_layers == len(kv.k) == len(kv.v)
    kv_tensors = _nbytes(kv.k + kv.v)
    assert kv_tensors == b.kv_per_token * kv.num_pages * PAGE == b.page_bytes(PAGE) * kv.num_pages
    plan = eng.memory.plan
    assert plan.kv_bytes == kv_tensors and plan.kv_pages == kv.num_pages
    assert b.activations_per_token == activation_bytes(1, hf.hidden_size, torch.float32)
    assert eng.layer_major.token_limit() == plan.activation_tokens == 64  # one whole context's activations
    if hybrid:
        st = eng.states
        assert st is not None and b.linear_layers == st.shape.num_layers > 0
        slots = st.num_slots + st.num_checkpoints
        assert (st.num_slots, st.num_checkpoints) == (2 + 1, 3)  # running requests + scoring, checkpoints
        assert _nbytes([st.conv, st.ssm]) == b.state_per_request * slots == plan.states_bytes
        assert b.kv_layers + b.linear_layers == hf.num_layers
        host = int(0.001 * 2**30) // b.state_per_request  # the host tier of the plan, as many as 0.001 GiB holds
        assert plan.host_checkpoints == host == llm.stats()["state_checkpoint_slots_host"] > 0
    else:
        assert eng.states is None and b.state_per_request == 0 and b.linear_layers == 0
    backend_ = eng.setup.loaded.backend
    if moe:
        cache = backend_.cache
        one = backend_.pool.expert_bytes
        assert _nbytes(list(cache.slots)) == plan.slots_bytes == (plan.slots + 1) * one  # and the scratch slot
    else:
        assert backend_ is None and plan.slots == 0


def test_the_counts_of_a_hybrid_config_without_layer_types_follow_the_family_interval(tmp_path: Path) -> None:
    d = tmp_path / "m"
    save_checkpoint("qwen3_next", d, seed=0)
    hf = load_hf_config(d)
    interval = get_family(hf.architecture).full_attention_interval
    from dataclasses import replace

    b = model_bytes(replace(hf, layer_types=None), 2, interval)
    assert (b.kv_layers, b.linear_layers) == (hf.num_layers // interval, hf.num_layers - hf.num_layers // interval)
    assert b.kv_per_token == 2 * b.kv_layers * hf.num_kv_heads * hf.head_dim * 2
    r = hf.raw
    conv = (
        (
            2 * r["linear_num_key_heads"] * r["linear_key_head_dim"]
            + r["linear_num_value_heads"] * r["linear_value_head_dim"]
        )
        * (r["linear_conv_kernel_dim"] - 1)
        * 2
    )
    ssm = r["linear_num_value_heads"] * r["linear_key_head_dim"] * r["linear_value_head_dim"] * 4
    assert b.state_per_request == b.linear_layers * (conv + ssm)
