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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module

import torch

from freetoken.cache.state_pool import StateShape
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_manifest import Manifest, read_manifest
from freetoken.checkpoint.ftw_progress import tracked
from freetoken.checkpoint.ftw_verify import WeightsCheck
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.quantization import check_supported
from freetoken.checkpoint.safetensors_io import SafetensorsReader
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.layers.mlp import DenseMLP
from freetoken.layers.moe import MoELayer
from freetoken.layers.rope import Rotary
from freetoken.loader.ftw_load import read_ftw_banks
from freetoken.models import gpt_oss
from freetoken.models.base import Family, skip_patterns
from freetoken.models.blocks import (
    ExpertRead,
    MoEParts,
    attention,
    dense_mlp,
    dense_prefix,
    expert_reads,
    moe_parts,
    norm,
    rope,
    window_attention,
)
from freetoken.models.decoder import DecoderLayer, DecoderModel, Mixer
from freetoken.models.hybrid_blocks import LINEAR, SLIDING, deltanet, layer_kinds, state_shape
from freetoken.models.mla_blocks import mla_attention, mla_dims
from freetoken.models.routing import sigmoid_routing
from freetoken.quant import BF16, QuantizationError, WeightFormat, format_from_config


@dataclass
class LoadedModel:
    hf: HFConfig
    model: DecoderModel
    banks: ExpertBanks | None
    backend: ExpertBackend | None
    kv_layers: int  # layers with a KV cache (full attention)
    states: StateShape | None = None  # the recurrent state of the linear-attention layers, if any
    weights_check: WeightsCheck | None = None  # an FTW directory's checksums (``loader/ftw_load.py``)


def weight_format(reader: SafetensorsReader, hf: HFConfig) -> WeightFormat | None:
    """The format ``quantization_config`` declares (None: none); what is not implemented fails here."""
    try:
        return format_from_config(hf.raw)
    except QuantizationError as exc:
        raise CheckpointError(f"{reader.directory}: {exc}") from exc


def expert_format(
    w: CheckpointWeights, fmt: WeightFormat | None, reads: list[ExpertRead], hf: HFConfig
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


def _gated_experts(banks: ExpertBanks, family: Family, ffns: Sequence[object]) -> None:
    """gpt-oss: the banks' activation and the gate/up biases of every MoE layer, in eid order (float32 rows)."""
    if not family.gpt_oss_experts:
        return
    biases = [ffn.gate_up_bias for ffn in ffns if isinstance(ffn, MoEParts) and ffn.gate_up_bias is not None]
    banks.activation = gpt_oss.ACTIVATION
    banks.gate_up_bias = torch.cat(biases).contiguous()


def family_hook(family: Family, name: str) -> Callable[..., object] | None:
    """The function ``name`` of the family's own assembly module (``Family.build``), where it has one: its
    ``build_model``; ``check_config(hf)``, config.json refused by name before any weight; ``checkpoint_family(reader)``,
    the family as this checkpoint names its tensors (DeepSeek-V4)."""
    fn: Callable[..., object] | None = getattr(import_module(family.build), name, None) if family.build else None
    return fn


def open_checkpoint(
    hf: HFConfig, family: Family, device: torch.device, dtype: torch.dtype
) -> tuple[Manifest | None, WeightFormat | None, CheckpointWeights, tuple[str, ...]]:
    """The checkpoint's FTW manifest (the routed experts pre-banked; None: plain safetensors), its weight format, its
    checked reads and the tensor patterns the family may leave unread (multi-token prediction layers, ...), after
    every tensor was found readable — before any weight is read."""
    ftw = read_manifest(hf.path)
    reader = SafetensorsReader(hf.path)
    fmt = weight_format(reader, hf)
    skippable = skip_patterns(family, hf.raw, hf.num_layers)
    check_supported(hf.raw, reader, skippable, fmt)
    return ftw, fmt, CheckpointWeights(reader, device, dtype, fmt), skippable


def build_model(
    hf: HFConfig,
    family: Family,
    device: torch.device,
    dtype: torch.dtype,
    make_backend: Callable[[ExpertBanks], ExpertBackend],
    max_positions: int,
    verify: str = "background",
) -> LoadedModel:
    own = family_hook(family, "build_model")
    if own is not None:  # a family with its own assembly (Gemma-4, DeepSeek-V4)
        built = own(hf, family, device, dtype, make_backend, max_positions, verify)
        assert isinstance(built, LoadedModel)
        return built
    ftw, fmt, w, skippable = open_checkpoint(hf, family, device, dtype)
    if family.gpt_oss_experts:
        gpt_oss.check_activation(hf)
    n = family.naming
    D, V = hf.hidden_size, hf.vocab_size
    mla = family.attention in ("mla", "dsa")  # DSA: MLA with an indexer (``models/mla_blocks.py``)
    rotary = Rotary(rope(family, hf), mla_dims(hf).rope_dim if mla else hf.head_dim, max_positions, device)
    sigmoid = sigmoid_routing(hf, family)  # checked before any weight is read
    moe_ids = hf.moe_layer_ids
    parts: list[tuple[torch.Tensor, Mixer, torch.Tensor, DenseMLP | MoEParts]] = []
    reads: list[ExpertRead] = []
    kinds = layer_kinds(hf, family)
    kv_layers, linear_layers, rings = 0, 0, 0
    for i in range(hf.num_layers):
        lp = n.layer.format(i=i)
        ffn: DenseMLP | MoEParts
        if i in moe_ids:
            ffn = moe_parts(w, family, hf, i)
            if family.gpt_oss_experts:
                ffn.gate_up_bias, ffn.down_bias = gpt_oss.expert_biases(w, hf, i)
                reads += gpt_oss.expert_reads(w, hf, i, moe_ids.index(i)) if ftw is None else []
            else:
                reads += expert_reads(w, family, hf, i, moe_ids.index(i)) if ftw is None else []
        else:
            ffn = dense_mlp(w, dense_prefix(w, family, i), D, hf.intermediate_size, bool(hf.raw.get("mlp_bias", False)))
        mixer: Mixer
        if kinds[i] == LINEAR:
            mixer, linear_layers = deltanet(w, family, hf, i, linear_layers), linear_layers + 1
        elif kinds[i] == SLIDING:
            mixer, rings = window_attention(w, family, hf, i, rings, rotary), rings + 1
        elif mla:
            mixer, kv_layers = mla_attention(w, family, hf, i, kv_layers, rotary), kv_layers + 1
        else:
            mixer, kv_layers = attention(w, family, hf, i, kv_layers, rotary), kv_layers + 1
        parts.append((norm(w, family, lp + n.attn_norm, (D,)), mixer, norm(w, family, lp + n.ffn_norm, (D,)), ffn))
    embed = w.get(n.embed, (V, D))
    tied = hf.tie_word_embeddings or n.lm_head not in w
    lm_head = embed if tied else w.get(n.lm_head, (V, D))
    scales = [s for r in reads if w.is_packed(r[0]) for s in w.side_tensors(r[0])] if w.layout is not None else []
    w.claim([r[0] for r in reads] + scales + ([n.lm_head] if n.lm_head in w else []))  # a tied head's copy is not read
    final_norm = norm(w, family, n.final_norm, (D,))
    w.check_all_used(hf.architecture, skippable)
    banks = backend = check = None
    if moe_ids and ftw is not None:
        banks, check = read_ftw_banks(ftw, hf, dtype, verify)
        _gated_experts(banks, family, [p[3] for p in parts])
        backend = make_backend(banks)
    elif moe_ids:
        efmt = expert_format(w, fmt, reads, hf)
        banks = ExpertBanks.empty(len(moe_ids), hf.num_experts, D, hf.moe_intermediate_size, dtype, efmt)
        banks.top_k = hf.top_k
        total = sum(getattr(banks, bank)[index].nbytes for _, bank, index, _, _ in reads)
        with tracked(total, "reading the experts") as progress:  # a bar on a terminal, or the caller's spinner
            for name, bank, index, shape, scale_index in reads:
                scale_bank, dst = getattr(banks, bank + "_scale"), getattr(banks, bank)[index]
                if family.gpt_oss_experts:  # MXFP4 blocks or float, gate/up interleaved
                    scale_rows = None if scale_bank is None else scale_bank[scale_index]
                    gpt_oss.read_expert_bank(w, name, bank, dst, shape, scale_rows)
                elif efmt.quantized:
                    w.read_packed_into(name, dst, scale_bank[scale_index], shape)
                else:
                    w.read_into(name, dst, shape)
                progress.advance(dst.nbytes)
        _gated_experts(banks, family, [p[3] for p in parts])
        backend = make_backend(banks)
    layers = []
    for i, (attn_norm, attn, ffn_norm, ffn) in enumerate(parts):
        if isinstance(ffn, MoEParts):
            assert backend is not None
            norm_topk = hf.norm_topk_prob or family.always_norm_topk
            moe = MoELayer(ffn.router, hf.top_k, norm_topk, moe_ids.index(i), backend, ffn.shared, ffn.shared_gate,
                           sigmoid=sigmoid, bias=ffn.bias, router_bias=ffn.router_bias,
                           down_bias=ffn.down_bias)  # fmt: skip
            layers.append(DecoderLayer(attn_norm, attn, ffn_norm, moe))
        else:
            layers.append(DecoderLayer(attn_norm, attn, ffn_norm, ffn))
    states = state_shape(hf, linear_layers, rings) if linear_layers or rings else None
    model = DecoderModel(embed, layers, final_norm, lm_head, hf.rms_eps)
    return LoadedModel(hf, model, banks, backend, kv_layers, states, check)
