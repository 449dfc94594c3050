"""Assemble a ``DecoderModel`` from a checkpoint's weights by a family's names, and give its MoE layers a backend.

The order keeps a bad checkpoint cheap to refuse: the quantisation/dtype check reads headers only; then the
non-expert weights (small) are read onto the compute device and the routed experts' names are claimed; every
tensor left unread is refused (``CheckpointWeights.check_all_used``) before the expert banks, the bulk of the
bytes, are read straight into their host layout (``[L*E, ...]`` rows: ``eid = moe_layer * E + expert``); only
then is the expert backend created over them. A quantised checkpoint (``quantization_config``, read into a
``quant/`` format first) has its non-expert weights dequantised at load and its routed experts banked packed, with
their scales (``ExpertBanks.fmt``): the pool, the slots and both kernels read them packed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from freetoken.cache.state_pool import StateShape
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_manifest import read_manifest
from freetoken.checkpoint.ftw_verify import WeightsCheck
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.quantization import check_supported
from freetoken.checkpoint.safetensors_io import SafetensorsReader
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.engine.ftw_load import read_ftw_banks
from freetoken.engine.hybrid_build import LINEAR, deltanet, layer_kinds, split_gated_q, state_shape
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.layers.attention import Attention, AttentionWeights
from freetoken.layers.deltanet import GatedDeltaNet
from freetoken.layers.mlp import DenseMLP
from freetoken.layers.moe import MoELayer
from freetoken.layers.rope import Rotary
from freetoken.models.base import Family
from freetoken.models.decoder import DecoderLayer, DecoderModel
from freetoken.quant import BF16, QuantizationError, WeightFormat, format_from_config


@dataclass
class LoadedModel:
    hf: HFConfig
    model: DecoderModel
    banks: ExpertBanks | None
    backend: ExpertBackend | None
    kv_layers: int  # layers with a KV cache (full attention)
    states: StateShape | None = None  # the recurrent state of the linear-attention layers, if any
    weights_check: WeightsCheck | None = None  # an FTW directory's checksums (``engine/ftw_load.py``)


@dataclass
class _MoEParts:
    """A MoE layer's non-expert weights, read before its backend exists."""

    router: torch.Tensor
    shared: DenseMLP | None
    shared_gate: torch.Tensor | None


def _attention(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int, kv_index: int, rotary: Rotary) -> Attention:
    p = fam.naming.layer.format(i=i) + fam.naming.attn
    D, H, Hkv, hd = hf.hidden_size, hf.num_heads, hf.num_kv_heads, hf.head_dim
    # Llama's attention_bias covers o_proj too; Qwen2's qkv_bias only q/k/v.
    bias = hf.attention_bias or bool(fam.qkv_bias_key and hf.raw.get(fam.qkv_bias_key, False))
    o_bias = bool(hf.raw.get("attention_bias", False)) and fam.qkv_bias_key is None
    norm_q = {"none": None, "head": (hd,), "full": (H * hd,)}[fam.qk_norm]
    norm_k = {"none": None, "head": (hd,), "full": (Hkv * hd,)}[fam.qk_norm]
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
        q_norm=_norm(w, fam, p + fam.naming.q_norm, norm_q) if norm_q else None,
        k_norm=_norm(w, fam, p + fam.naming.k_norm, norm_k) if norm_k else None,
        gate=gate,
    )
    clip = hf.raw.get(fam.clip_qkv_key) if fam.clip_qkv_key else None
    return Attention(aw, kv_index, H, Hkv, hd, hf.rms_eps, rotary, float(clip) if clip else None, hf.sliding_window)


def _norm(w: CheckpointWeights, fam: Family, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """An RMSNorm weight as our norm applies it: ``1 + w`` for families whose norms scale by it."""
    t = w.get(name, shape)
    return t + fam.norm_offset if fam.norm_offset else t


def _dense(w: CheckpointWeights, prefix: str, D: int, inter: int, bias: bool = False) -> DenseMLP:
    return DenseMLP(
        gate=w.get(prefix + "gate_proj.weight", (inter, D)),
        up=w.get(prefix + "up_proj.weight", (inter, D)),
        down=w.get(prefix + "down_proj.weight", (D, inter)),
        gate_bias=w.get(prefix + "gate_proj.bias", (inter,)) if bias else None,
        up_bias=w.get(prefix + "up_proj.bias", (inter,)) if bias else None,
        down_bias=w.get(prefix + "down_proj.bias", (D,)) if bias else None,
    )


def _moe_parts(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int) -> _MoEParts:
    n, D = fam.naming, hf.hidden_size
    mp = n.layer.format(i=i) + n.moe
    shared = shared_gate = None
    if n.shared_expert and hf.shared_expert_intermediate_size:
        shared = _dense(w, mp + n.shared_expert, D, hf.shared_expert_intermediate_size)
        shared_gate = w.opt(mp + (n.shared_expert_gate or ""), (1, D))
    return _MoEParts(w.get(mp + n.router, (hf.num_experts, D)), shared, shared_gate)


# One read of routed-expert weights: (tensor name, "gate_up" or "down", index into that bank, expected shape,
# index into its scale bank: the same rows in blocks).
_Index = tuple[int | slice, ...]
_ExpertRead = tuple[str, str, _Index, tuple[int, ...], _Index]


def _expert_reads(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int, li: int) -> list[_ExpertRead]:
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
    reads: list[_ExpertRead] = []
    for e in range(E):
        row = li * E + e
        reads += [(gate_n.format(e=e), "gate_up", (row, slice(0, I)), (I, D), (row, slice(0, sI))),
                  (up_n.format(e=e), "gate_up", (row, slice(I, 2 * I)), (I, D), (row, slice(sI, 2 * sI))),
                  (down_n.format(e=e), "down", (row,), (D, I), (row,))]  # fmt: skip
    return reads


def _weight_format(reader: SafetensorsReader, hf: HFConfig) -> WeightFormat | None:
    """The format ``quantization_config`` declares (None: none); what is not implemented fails here."""
    try:
        return format_from_config(hf.raw)
    except QuantizationError as exc:
        raise CheckpointError(f"{reader.directory}: {exc}") from exc


def _expert_format(
    w: CheckpointWeights, fmt: WeightFormat | None, reads: list[_ExpertRead], hf: HFConfig
) -> WeightFormat:
    """The routed experts' bank format: ``fmt`` when they are stored packed, bf16 when not; refused when they mix
    or are not whole blocks."""
    packed = [r[0] for r in reads if w.is_packed(r[0])]
    if not packed or fmt is None:
        return BF16
    if len(packed) != len(reads):
        plain = next(r[0] for r in reads if not w.is_packed(r[0]))
        raise CheckpointError(f"{w.reader.directory}: routed experts mix formats: {packed[0]} is {fmt.name}, "
                              f"{plain} is not")  # fmt: skip
    D, I = hf.hidden_size, hf.moe_intermediate_size
    try:
        fmt.check_expert_shape(I, D, f"routed expert weight {packed[0]}")
        fmt.check_expert_shape(D, I, "routed expert down_proj")
    except QuantizationError as exc:
        raise CheckpointError(f"{w.reader.directory}: {exc}") from exc
    return fmt


def build_model(
    hf: HFConfig,
    family: Family,
    device: torch.device,
    dtype: torch.dtype,
    make_backend: Callable[[ExpertBanks], ExpertBackend],
    max_positions: int,
    verify: str = "background",
) -> LoadedModel:
    ftw = read_manifest(hf.path)  # FTW: the routed experts come pre-banked, the rest is safetensors as usual
    reader = SafetensorsReader(hf.path)
    fmt = _weight_format(reader, hf)
    check_supported(hf.raw, reader, family.skippable, fmt)
    w = CheckpointWeights(reader, device, dtype, fmt)
    n = family.naming
    D, V = hf.hidden_size, hf.vocab_size
    rotary = Rotary(hf.rope, hf.head_dim, max_positions, device)
    moe_ids = hf.moe_layer_ids
    parts: list[tuple[torch.Tensor, Attention | GatedDeltaNet, torch.Tensor, DenseMLP | _MoEParts]] = []
    reads: list[_ExpertRead] = []
    kinds = layer_kinds(hf, family)
    kv_layers, linear_layers = 0, 0
    for i in range(hf.num_layers):
        lp = n.layer.format(i=i)
        ffn: DenseMLP | _MoEParts
        if i in moe_ids:
            ffn = _moe_parts(w, family, hf, i)
            reads += _expert_reads(w, family, hf, i, moe_ids.index(i)) if ftw is None else []
        else:
            ffn = _dense(w, lp + n.mlp, D, hf.intermediate_size, bool(hf.raw.get("mlp_bias", False)))
        mixer: Attention | GatedDeltaNet
        if kinds[i] == LINEAR:
            mixer, linear_layers = deltanet(w, family, hf, i, linear_layers), linear_layers + 1
        else:
            mixer, kv_layers = _attention(w, family, hf, i, kv_layers, rotary), kv_layers + 1
        parts.append((_norm(w, family, lp + n.attn_norm, (D,)), mixer, _norm(w, family, lp + n.ffn_norm, (D,)), ffn))
    embed = w.get(n.embed, (V, D))
    tied = hf.tie_word_embeddings or n.lm_head not in w
    lm_head = embed if tied else w.get(n.lm_head, (V, D))
    scales = [w.layout.scale_name(r[0]) for r in reads if w.is_packed(r[0])] if w.layout is not None else []
    w.claim([r[0] for r in reads] + scales + ([n.lm_head] if n.lm_head in w else []))  # a tied head's copy is not read
    final_norm = _norm(w, family, n.final_norm, (D,))
    w.check_all_used(hf.architecture, family.skippable)
    banks = backend = check = None
    if moe_ids and ftw is not None:
        banks, check = read_ftw_banks(ftw, hf, dtype, verify)
        backend = make_backend(banks)
    elif moe_ids:
        efmt = _expert_format(w, fmt, reads, hf)
        banks = ExpertBanks.empty(len(moe_ids), hf.num_experts, D, hf.moe_intermediate_size, dtype, efmt)
        banks.top_k = hf.top_k
        for name, bank, index, shape, scale_index in reads:
            if efmt.quantized:
                scale_bank = getattr(banks, bank + "_scale")
                w.read_packed_into(name, getattr(banks, bank)[index], scale_bank[scale_index], shape)
            else:
                w.read_into(name, getattr(banks, bank)[index], shape)
        backend = make_backend(banks)
    layers = []
    for i, (attn_norm, attn, ffn_norm, ffn) in enumerate(parts):
        if isinstance(ffn, _MoEParts):
            assert backend is not None
            norm_topk = hf.norm_topk_prob or family.always_norm_topk
            moe = MoELayer(ffn.router, hf.top_k, norm_topk, moe_ids.index(i), backend, ffn.shared, ffn.shared_gate)
            layers.append(DecoderLayer(attn_norm, attn, ffn_norm, moe))
        else:
            layers.append(DecoderLayer(attn_norm, attn, ffn_norm, ffn))
    states = state_shape(hf, linear_layers) if linear_layers else None
    model = DecoderModel(embed, layers, final_norm, lm_head, hf.rms_eps)
    return LoadedModel(hf, model, banks, backend, kv_layers, states, check)
