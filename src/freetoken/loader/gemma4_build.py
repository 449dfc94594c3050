"""Assemble a Gemma-4 model (``models/gemma4.py``) from a checkpoint, in ``model_build.build_model``'s order: headers
checked, the non-expert weights read onto the compute device, every unread tensor refused, then the routed experts read
into their banks and the backend made over them. KV: the full layers that compute K/V get a KV page layer each, the
sliding ones a ring each (``window_ring``); KV-shared layers get neither (they read their source's)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_manifest import Manifest
from freetoken.checkpoint.ftw_progress import tracked
from freetoken.checkpoint.ftw_verify import WeightsCheck
from freetoken.checkpoint.gemma4_config import FULL, SLIDING, Gemma4Config, gemma4_config
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.layers.moe import MoELayer
from freetoken.loader.ftw_load import read_ftw_banks
from freetoken.loader.model_build import LoadedModel, expert_format, open_checkpoint
from freetoken.models import gemma4
from freetoken.models.base import Family
from freetoken.models.blocks import ExpertRead
from freetoken.models.gemma4_layers import GemmaLayer, GemmaModel, GemmaMoE
from freetoken.models.hybrid_blocks import state_shape
from freetoken.quant import WeightFormat

MOE_NORMS = ("post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2")


def build_model(
    hf: HFConfig,
    family: Family,
    device: torch.device,
    dtype: torch.dtype,
    make_backend: Callable[[ExpertBanks], ExpertBackend],
    max_positions: int,
    verify: str = "background",
) -> LoadedModel:
    g = gemma4_config(hf)
    ftw, fmt, w, skippable = open_checkpoint(hf, family, device, dtype)
    n, D, V = family.naming, hf.hidden_size, hf.vocab_size
    rot = gemma4.rotaries(g, max_positions, device)
    pages = {i: k for k, i in enumerate(g.kv_layers(FULL))}  # layer -> its KV page layer / ring
    rings = {i: k for k, i in enumerate(g.kv_layers(SLIDING))}
    sources = {lay.source for j, lay in enumerate(g.layers) if lay.source != j}
    reads: list[ExpertRead] = []
    parts = []
    for i, lay in enumerate(g.layers):
        p = n.layer.format(i=i)
        index = (pages if lay.kind == FULL else rings)[lay.source]
        attn = gemma4.attention(w, family, hf, g, i, index, i in sources, rot[lay.kind])
        moe = None
        if g.moe:
            router, per_expert = gemma4.router(w, p, hf, g)
            moe = (router, per_expert, *(w.get(p + name + ".weight", (D,)) for name in MOE_NORMS))
            reads += gemma4.expert_reads(family, g, hf, i, i) if ftw is None else []
        parts.append((
            w.get(p + "input_layernorm.weight", (D,)), attn, w.get(p + "pre_feedforward_layernorm.weight", (D,)),
            gemma4.dense_mlp(w, p + n.mlp, hf, g, i), w.get(p + "post_attention_layernorm.weight", (D,)),
            w.get(p + "post_feedforward_layernorm.weight", (D,)), moe, gemma4.ple_weights(w, p, hf, g),
            w.get(p + "layer_scalar", (1,)),
        ))  # fmt: skip
    embed = w.get(n.embed, (V, D))
    ple = gemma4.per_layer_inputs(w, family, hf, g)
    tied = hf.tie_word_embeddings or n.lm_head not in w
    lm_head = embed if tied else w.get(n.lm_head, (V, D))
    w.claim([r[0] for r in reads] + ([n.lm_head] if n.lm_head in w else []))
    final_norm = w.get(n.final_norm, (D,))
    w.check_all_used(hf.architecture, skippable)
    banks = backend = check = None
    if g.moe:
        banks, check = _banks(w, hf, g, fmt, reads, ftw, dtype, verify)
        backend = make_backend(banks)
    layers = []
    for i, (attn_norm, attn, ffn_norm, mlp, post_attn, post_ffn, moe, ple_w, scalar) in enumerate(parts):
        gm = None
        if moe is not None:
            assert backend is not None
            router, per_expert, post1, pre2, post2 = moe
            gm = GemmaMoE(MoELayer(router, g.top_k, True, i, backend), per_expert, post1, pre2, post2,
                          torch.ones(D, dtype=dtype, device=device))  # fmt: skip
        layers.append(GemmaLayer(attn_norm, attn, ffn_norm, mlp, post_attn, post_ffn, gm, ple_w, scalar))
    model = GemmaModel(embed, layers, final_norm, lm_head, hf.rms_eps, ple, g.softcap)
    states = state_shape(hf, 0, len(rings)) if rings else None
    return LoadedModel(hf, model, banks, backend, len(pages), states, check)


def _banks(
    w: CheckpointWeights, hf: HFConfig, g: Gemma4Config, fmt: WeightFormat | None, reads: list[ExpertRead],
    ftw: Manifest | None, dtype: torch.dtype, verify: str,
) -> tuple[ExpertBanks, WeightsCheck | None]:  # fmt: skip
    """The routed experts of every layer (``eid = layer * E + expert``), from an FTW directory or read into banks
    in the compute dtype; their activation Gemma-4's."""
    check = None
    if ftw is not None:
        banks, check = read_ftw_banks(ftw, hf, dtype, verify)
    else:
        efmt = expert_format(w, fmt, reads, hf)
        if efmt.quantized:
            raise CheckpointError(f"{hf.path}: quantised Gemma-4 experts ({efmt.name}) are not supported yet")
        banks = ExpertBanks.empty(hf.num_layers, g.num_experts, hf.hidden_size, g.moe_intermediate, dtype, efmt)
        with tracked(sum(getattr(banks, r[1])[r[2]].nbytes for r in reads), "reading the experts") as progress:
            for name, bank, rows, shape, _ in reads:
                dst = getattr(banks, bank)[rows]
                w.read_into(name, dst, shape)
                progress.advance(dst.nbytes)
    banks.top_k, banks.activation = g.top_k, gemma4.ACTIVATION
    return banks, check
