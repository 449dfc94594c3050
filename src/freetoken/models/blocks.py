"""A family's blocks, read from a checkpoint by its names (``models/base.py`` ``Naming``) into the layers' weights:
attention, the RMSNorms, a dense MLP, a MoE layer's non-expert parts and where its routed experts' tensors go in the
expert banks. The model's assembly (``loader/model_build.py``) composes them layer by layer."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from freetoken.checkpoint.hf_config import HFConfig, RopeConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.layers.attention import Attention, AttentionWeights
from freetoken.layers.mlp import DenseMLP, fuse_inputs
from freetoken.layers.rope import Rotary
from freetoken.layers.window_attention import WindowAttention
from freetoken.models.base import Family
from freetoken.models.hybrid_blocks import split_gated_q


@dataclass
class MoEParts:
    """A MoE layer's non-expert weights, read before its backend exists."""

    router: torch.Tensor
    shared: DenseMLP | None
    shared_gate: torch.Tensor | None
    bias: torch.Tensor | None = None  # [E] float32: sigmoid routing's correction bias
    router_bias: torch.Tensor | None = None  # [E] (gpt-oss)
    gate_up_bias: torch.Tensor | None = None  # [E, 2I] the experts' gate/up biases, gate half then up half (gpt-oss)
    down_bias: torch.Tensor | None = None  # [E, D]


def layer_window(hf: HFConfig, i: int) -> int | None:
    """Layer ``i``'s sliding window: where ``layer_types`` names sliding layers (gpt-oss alternates them with full
    attention) only those layers have it; otherwise every layer has the config's window, if any."""
    types = hf.layer_types
    if types is not None and "sliding_attention" in types:
        return hf.sliding_window if i < len(types) and types[i] == "sliding_attention" else None
    return hf.sliding_window


def attention(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int, kv_index: int, rotary: Rotary) -> Attention:
    """Layer i's attention over the KV pages (the ``kv_index``-th layer of the pool)."""
    aw = attention_weights(w, fam, hf, i)
    clip = hf.raw.get(fam.clip_qkv_key) if fam.clip_qkv_key else None
    H, Hkv, hd = hf.num_heads, hf.num_kv_heads, hf.head_dim
    return Attention(aw, kv_index, H, Hkv, hd, hf.rms_eps, rotary, float(clip) if clip else None, layer_window(hf, i),
                     sinks=attention_sinks(w, fam, hf, i))  # fmt: skip


def window_attention(
    w: CheckpointWeights, fam: Family, hf: HFConfig, i: int, ring: int, rotary: Rotary
) -> WindowAttention:
    """Layer i's sliding-window attention over a KV ring, the ``ring``-th ring of the state pool."""
    aw = attention_weights(w, fam, hf, i)
    window = int(hf.sliding_window or 0)
    return WindowAttention(aw, ring, hf.num_heads, hf.num_kv_heads, hf.head_dim, rotary, window,
                           attention_sinks(w, fam, hf, i))  # fmt: skip


def attention_sinks(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int) -> torch.Tensor | None:
    """Layer i's sink logits [H] float32 (families with ``attn_sinks``)."""
    if not fam.attn_sinks:
        return None
    return w.get(fam.naming.layer.format(i=i) + fam.naming.attn + "sinks", (hf.num_heads,)).float()


def attention_weights(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int) -> AttentionWeights:
    p = fam.naming.layer.format(i=i) + fam.naming.attn
    D, H, Hkv, hd = hf.hidden_size, hf.num_heads, hf.num_kv_heads, hf.head_dim
    # Llama's attention_bias covers o_proj too; Qwen2's qkv_bias only q/k/v.
    bias = hf.attention_bias or bool(fam.qkv_bias_key and hf.raw.get(fam.qkv_bias_key, False))
    o_bias = bool(hf.raw.get("attention_bias", False)) and fam.qkv_bias_key is None
    qk_norm = fam.qk_norm if fam.qk_norm_key is None or hf.raw.get(fam.qk_norm_key) else "none"
    norm_q = {"none": None, "head": (hd,), "full": (H * hd,)}[qk_norm]
    norm_k = {"none": None, "head": (hd,), "full": (Hkv * hd,)}[qk_norm]
    gated = fam.attn_output_gate
    q, gate = w.get(p + "q_proj.weight", (H * hd * (2 if gated else 1), D)), None
    if gated:
        q, gate = split_gated_q(q, H, hd)
    q_bias = w.get(p + "q_proj.bias", (H * hd * (2 if gated else 1),)) if bias else None
    if gated and q_bias is not None:
        q_bias = split_gated_q(q_bias, H, hd)[0]  # a gate bias is not read: no family has one
    aw = AttentionWeights(
        q=q,
        k=w.get(p + "k_proj.weight", (Hkv * hd, D)),
        v=w.get(p + "v_proj.weight", (Hkv * hd, D)),
        o=w.get(p + "o_proj.weight", (D, H * hd)),
        o_bias=w.get(p + "o_proj.bias", (D,)) if o_bias else None,
        q_bias=q_bias,
        k_bias=w.get(p + "k_proj.bias", (Hkv * hd,)) if bias else None,
        v_bias=w.get(p + "v_proj.bias", (Hkv * hd,)) if bias else None,
        q_norm=norm(w, fam, p + fam.naming.q_norm, norm_q) if norm_q else None,
        k_norm=norm(w, fam, p + fam.naming.k_norm, norm_k) if norm_k else None,
        gate=gate,
    )
    return aw


def rope(fam: Family, hf: HFConfig) -> RopeConfig:
    """The config's rotary settings, with the family's partial rotary share where config.json names none."""
    if "partial_rotary_factor" in hf.rope.params or fam.partial_rotary == 1.0:
        return hf.rope
    return replace(hf.rope, params={**hf.rope.params, "partial_rotary_factor": fam.partial_rotary})


def norm(w: CheckpointWeights, fam: Family, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """An RMSNorm weight as our norm applies it: ``1 + w`` for families whose norms scale by it."""
    t = w.get(name, shape)
    return t + fam.norm_offset if fam.norm_offset else t


def dense_prefix(w: CheckpointWeights, fam: Family, i: int) -> str:
    """Layer i's dense MLP prefix: the family's, or its alternative where only that one is in the checkpoint."""
    n = fam.naming
    p = n.layer.format(i=i) + n.mlp
    return p if n.mlp_alt is None or p + "gate_proj.weight" in w else n.layer.format(i=i) + n.mlp_alt


def dense_mlp(w: CheckpointWeights, prefix: str, D: int, inter: int, bias: bool = False) -> DenseMLP:
    return DenseMLP(
        gate=w.get(prefix + "gate_proj.weight", (inter, D)),
        up=w.get(prefix + "up_proj.weight", (inter, D)),
        down=w.get(prefix + "down_proj.weight", (D, inter)),
        gate_bias=w.get(prefix + "gate_proj.bias", (inter,)) if bias else None,
        up_bias=w.get(prefix + "up_proj.bias", (inter,)) if bias else None,
        down_bias=w.get(prefix + "down_proj.bias", (D,)) if bias else None,
    )


def moe_parts(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int) -> MoEParts:
    n, D = fam.naming, hf.hidden_size
    mp = n.layer.format(i=i) + n.moe
    shared = shared_gate = None
    if n.shared_expert and hf.shared_expert_intermediate_size:
        shared = dense_mlp(w, mp + n.shared_expert, D, hf.shared_expert_intermediate_size)
        shared, shared_gate = fuse_inputs(shared, w.opt(mp + (n.shared_expert_gate or ""), (1, D)))
    if fam.routing == "sigmoid":
        # sigmoid routing runs its GEMM in float32 as the references do: the router kept in float32 (no cast a
        # step); the correction bias too (its differences between experts are far below bf16's resolution)
        router = w.get(mp + n.router, (hf.num_experts, D), torch.float32)
        return MoEParts(router, shared, shared_gate, w.get(mp + n.router_bias, (hf.num_experts,), torch.float32))
    parts = MoEParts(w.get(mp + n.router, (hf.num_experts, D)), shared, shared_gate)
    if fam.router_bias:
        parts.router_bias = w.get(mp + n.router.replace(".weight", ".bias"), (hf.num_experts,))
    return parts


# One read of routed-expert weights: (tensor name, "gate_up" or "down", index into that bank, expected shape,
# index into its scale bank: the same rows in blocks).
Index = tuple[int | slice, ...]
ExpertRead = tuple[str, str, Index, tuple[int, ...], Index]


def expert_reads(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int, li: int) -> list[ExpertRead]:
    """What to read for layer i's routed experts into bank rows [li*E, (li+1)*E): the fused layout when the
    checkpoint has it, else one tensor per expert and projection (gate rows first, then up rows)."""
    n = fam.naming
    p = n.layer.format(i=i) + n.moe
    E, D, I = hf.num_experts, hf.hidden_size, hf.moe_intermediate_size
    if p + n.fused_experts[0] in w:
        rows = (slice(li * E, (li + 1) * E),)
        return [(p + n.fused_experts[0], "gate_up", rows, (E, 2 * I, D), rows),
                (p + n.fused_experts[1], "down", rows, (E, D, I), rows)]  # fmt: skip
    gate_n, up_n, down_n = (p + t for t in n.experts)
    sI = w.layout.scale_shape(I, D)[0] if w.layout is not None else 0  # gate's block rows (whole blocks)
    reads: list[ExpertRead] = []
    for e in range(E):
        row = li * E + e
        reads += [(gate_n.format(e=e), "gate_up", (row, slice(0, I)), (I, D), (row, slice(0, sI))),
                  (up_n.format(e=e), "gate_up", (row, slice(I, 2 * I)), (I, D), (row, slice(sI, 2 * sI))),
                  (down_n.format(e=e), "down", (row,), (D, I), (row,))]  # fmt: skip
    return reads
