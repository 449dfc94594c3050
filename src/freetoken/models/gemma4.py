"""Gemma-4 (``Gemma4ForCausalLM``; the text model of ``Gemma4ForConditionalGeneration``, under
``model.language_model.``, its vision and audio towers skipped at load), as transformers 5.23 defines it.

A layer: ``h += post_attn_norm(attn(input_norm(h)))``; then the dense GELU(tanh) MLP on ``pre_ffn_norm(h)``, and where
``enable_moe_block`` is set the routed experts beside it on ``pre_ffn_norm_2(h)`` (routed on the unscaled RMS norm of
``h`` times ``router.scale / sqrt(D)``, softmax top-k renormalised, times ``router.per_expert_scale``), each output
normed (``post_ffn_norm_1`` / ``_2``) and summed; ``h += post_ffn_norm(that)``; then the per-layer input (PLE):
``h += post_ple_norm(proj(gelu(gate(h)) * ple_i))``; finally ``h *= layer_scalar``. Attention: q/k RMS-normed per head
with weights, v without, scores unscaled; 5:1 sliding-window (KV rings, ``layers/window_attention.py``) and full
layers (KV pages, their own head dim and KV heads), each kind with its rotary (the full layers' "proportional").
Embeddings scaled by sqrt(D) (rounded to the model dtype, as transformers does); logits soft-capped. Norms scale by
``w`` (not ``1 + w``). The block classes are in ``gemma4_layers.py``, the assembly in ``loader/gemma4_build.py``.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from freetoken.checkpoint.gemma4_config import FULL, Gemma4Config, Gemma4Layer
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.layers.attention import AttentionWeights
from freetoken.layers.mlp import DenseMLP
from freetoken.layers.rope import Rotary
from freetoken.models.base import Family, Naming
from freetoken.models.blocks import ExpertRead
from freetoken.models.gemma4_layers import GemmaAttention, GemmaWindowAttention, PerLayerInputs

FAMILY = Family(
    architectures=("Gemma4ForCausalLM",),
    naming=Naming(router="router.proj.weight", moe=""),
    window_ring=True,
    build="freetoken.loader.gemma4_build",
    anchor_starts=("<|turn>", "<|channel>", "<|tool_call>", "<|tool_response>"),
    anchor_ends=("<turn|>", "<channel|>", "<tool_call|>", "<tool_response|>"),
)

VL_FAMILY = replace(
    FAMILY,
    architectures=("Gemma4ForConditionalGeneration",),
    naming=replace(
        FAMILY.naming,
        embed="model.language_model.embed_tokens.weight",
        final_norm="model.language_model.norm.weight",
        layer="model.language_model.layers.{i}.",
    ),
    skippable=FAMILY.skippable + ("model.vision_tower.*", "model.audio_tower.*", "model.embed_vision.*",
                                  "model.embed_audio.*"),  # fmt: skip
)

log = logging.getLogger(__name__)
ACTIVATION = "gelu_tanh"  # the experts' activation by its kernel name (``experts/reference.py``)


def model_prefix(fam: Family) -> str:
    """``model.`` or ``model.language_model.``: where the model-wide tensors beside the embeddings live."""
    return fam.naming.embed.removesuffix("embed_tokens.weight")


def rotaries(g: Gemma4Config, max_pos: int, device: torch.device) -> dict[str, Rotary]:
    """One rotary table per layer kind, over that kind's head dim."""
    dims = {lay.kind: lay.head_dim for lay in g.layers}
    return {kind: Rotary(g.rope[kind], hd, max_pos, device) for kind, hd in dims.items()}


def _attn_weights(w: CheckpointWeights, p: str, hf: HFConfig, lay: Gemma4Layer, reads_only: bool) -> AttentionWeights:
    D, H, hd, Hkv = hf.hidden_size, hf.num_heads, lay.head_dim, lay.kv_heads
    q = w.get(p + "q_proj.weight", (H * hd, D))
    if reads_only:  # a KV-shared layer: no k/v projections, no k norm
        empty = q.new_zeros((0, D))
        k = v = empty
        k_norm = None
    else:
        k = w.get(p + "k_proj.weight", (Hkv * hd, D))
        v = k if lay.k_eq_v else w.get(p + "v_proj.weight", (Hkv * hd, D))
        k_norm = w.get(p + "k_norm.weight", (hd,))
    return AttentionWeights(q=q, k=k, v=v, o=w.get(p + "o_proj.weight", (D, H * hd)),
                            q_norm=w.get(p + "q_norm.weight", (hd,)), k_norm=k_norm)  # fmt: skip


def attention(
    w: CheckpointWeights, fam: Family, hf: HFConfig, g: Gemma4Config, i: int, index: int, keeps: bool,
    rotary: Rotary,
) -> GemmaAttention | GemmaWindowAttention:  # fmt: skip
    """Layer ``i``'s attention: ``index`` is its KV page layer (full) or ring (sliding), its source's where it is
    KV-shared; ``keeps``: a later KV-shared window layer reads this step's keys (``GemmaWindowAttention``)."""
    lay = g.layers[i]
    reads_only = lay.source != i
    aw = _attn_weights(w, fam.naming.layer.format(i=i) + fam.naming.attn, hf, lay, reads_only)
    H, hd, Hkv = hf.num_heads, lay.head_dim, lay.kv_heads
    if lay.kind == FULL:
        return GemmaAttention(aw, index, H, Hkv, hd, hf.rms_eps, rotary, reads_only)
    return GemmaWindowAttention(aw, index, H, Hkv, hd, rotary, g.window, hf.rms_eps, i, lay.source, keeps)


def dense_mlp(w: CheckpointWeights, p: str, hf: HFConfig, g: Gemma4Config, i: int) -> DenseMLP:
    """The dense GELU(tanh) MLP (twice as wide on KV-shared layers under ``use_double_wide_mlp``)."""
    D = hf.hidden_size
    inter = hf.intermediate_size * (2 if g.double_wide and g.layers[i].source != i else 1)
    return DenseMLP(gate=w.get(p + "gate_proj.weight", (inter, D)), up=w.get(p + "up_proj.weight", (inter, D)),
                    down=w.get(p + "down_proj.weight", (D, inter)), act="gelu_tanh")  # fmt: skip


PLE_DEVICE_SHARE = 0.25  # the most of the device's free memory the PLE table may take; more: it stays in host RAM


def ple_device(device: torch.device, nbytes: int) -> torch.device:
    """Where the PLE table lives: the compute device, or the host where it would take more than ``PLE_DEVICE_SHARE``
    of the device memory free now (before the caches are planned: what it takes, they lose)."""
    if device.type != "cuda":
        return device
    free, _ = torch.cuda.mem_get_info(device)
    if nbytes <= PLE_DEVICE_SHARE * free:
        return device
    log.info("Gemma-4 per-layer input table (%.1f GiB) kept in host RAM: more than %d%% of the free device memory",
             nbytes / 2**30, int(PLE_DEVICE_SHARE * 100))  # fmt: skip
    return torch.device("cpu")


def per_layer_inputs(w: CheckpointWeights, fam: Family, hf: HFConfig, g: Gemma4Config) -> PerLayerInputs | None:
    """The per-layer input embeddings (PLE): the packed table [V', L*P] (on the compute device, or in host RAM:
    ``ple_device``), the context projection [L*P, D] and its norm [P]."""
    if not g.ple_dim:
        return None
    m, L, P, D = model_prefix(fam), hf.num_layers, g.ple_dim, hf.hidden_size
    name = m + "embed_tokens_per_layer.weight"
    table = w.get(name, (g.ple_vocab, L * P), device=ple_device(w.device, g.ple_vocab * L * P * w.dtype.itemsize))
    return PerLayerInputs(
        table=table,
        proj=w.get(m + "per_layer_model_projection.weight", (L * P, D)),
        norm=w.get(m + "per_layer_projection_norm.weight", (P,)),
        num_layers=L, dim=P, hidden=D, eps=hf.rms_eps,
    )  # fmt: skip


def ple_weights(w: CheckpointWeights, p: str, hf: HFConfig, g: Gemma4Config) -> tuple[torch.Tensor, ...] | None:
    """A layer's PLE gate [P, D], projection [D, P] and norm [D]."""
    if not g.ple_dim:
        return None
    D, P = hf.hidden_size, g.ple_dim
    return (w.get(p + "per_layer_input_gate.weight", (P, D)), w.get(p + "per_layer_projection.weight", (D, P)),
            w.get(p + "post_per_layer_input_norm.weight", (D,)))  # fmt: skip


def router(w: CheckpointWeights, p: str, hf: HFConfig, g: Gemma4Config) -> tuple[torch.Tensor, torch.Tensor]:
    """(router [E, D] with ``router.scale / sqrt(D)`` folded into its columns, per-expert scale [E] float32): the
    logits of ``proj(norm(x) * scale / sqrt(D))`` are those of ``(proj * scale / sqrt(D)) @ norm(x)``."""
    E, D = g.num_experts, hf.hidden_size
    proj = w.get(p + "router.proj.weight", (E, D), torch.float32)
    scale = w.get(p + "router.scale", (D,), torch.float32) * D**-0.5
    per_expert = w.get(p + "router.per_expert_scale", (E,), torch.float32)
    return (proj * scale[None, :]).to(w.dtype), per_expert


def expert_reads(fam: Family, g: Gemma4Config, hf: HFConfig, i: int, li: int) -> list[ExpertRead]:
    """Layer ``i``'s routed experts (transformers-5 layout: ``gate_up_proj`` [E, 2I, D], gate rows first, as the
    banks have them; ``down_proj`` [E, D, I]) into bank rows [li*E, (li+1)*E)."""
    p = fam.naming.layer.format(i=i) + "experts."
    E, D, I = g.num_experts, hf.hidden_size, g.moe_intermediate
    rows = (slice(li * E, (li + 1) * E),)
    return [(p + "gate_up_proj", "gate_up", rows, (E, 2 * I, D), rows),
            (p + "down_proj", "down", rows, (E, D, I), rows)]  # fmt: skip
