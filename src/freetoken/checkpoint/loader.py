"""Build a model from a checkpoint directory: read each tensor once, into its final place.

Non-expert weights go to the compute device; routed experts are read straight into the expert
banks (``[L*E, ...]`` rows, the host pool's layout), which an expert backend then serves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.safetensors_io import SafetensorsReader
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.layers.attention import Attention, AttentionWeights
from freetoken.layers.mlp import DenseMLP
from freetoken.layers.moe import MoELayer
from freetoken.layers.rope import Rotary
from freetoken.models.base import Family
from freetoken.models.decoder import DecoderLayer, DecoderModel


@dataclass
class LoadedModel:
    hf: HFConfig
    model: DecoderModel
    banks: ExpertBanks | None
    backend: ExpertBackend | None


class _Reader:
    """Checked reads: shape against the config, dtype conversion, placement."""

    def __init__(self, reader: SafetensorsReader, device: torch.device, dtype: torch.dtype) -> None:
        self.r, self.device, self.dtype = reader, device, dtype

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        got = self.r.shape(name)
        if got != shape:
            raise CheckpointError(
                f"{self.r.directory}: tensor {name} has shape {list(got)}, expected {list(shape)} from config.json"
            )
        return self.r.read(name, self.dtype).to(self.device)

    def opt(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        return self.get(name, shape) if name in self.r else None


def _attention(rd: _Reader, fam: Family, hf: HFConfig, i: int, rotary: Rotary) -> Attention:
    p = fam.naming.layer.format(i=i) + fam.naming.attn
    D, H, Hkv, hd = hf.hidden_size, hf.num_heads, hf.num_kv_heads, hf.head_dim
    # Llama's attention_bias covers o_proj too; Qwen2's qkv_bias only q/k/v.
    bias = hf.attention_bias or bool(fam.qkv_bias_key and hf.raw.get(fam.qkv_bias_key, False))
    o_bias = bool(hf.raw.get("attention_bias", False)) and fam.qkv_bias_key is None
    norm_q = {"none": None, "head": (hd,), "full": (H * hd,)}[fam.qk_norm]
    norm_k = {"none": None, "head": (hd,), "full": (Hkv * hd,)}[fam.qk_norm]
    w = AttentionWeights(
        q=rd.get(p + "q_proj.weight", (H * hd, D)),
        k=rd.get(p + "k_proj.weight", (Hkv * hd, D)),
        v=rd.get(p + "v_proj.weight", (Hkv * hd, D)),
        o=rd.get(p + "o_proj.weight", (D, H * hd)),
        o_bias=rd.get(p + "o_proj.bias", (D,)) if o_bias else None,
        q_bias=rd.get(p + "q_proj.bias", (H * hd,)) if bias else None,
        k_bias=rd.get(p + "k_proj.bias", (Hkv * hd,)) if bias else None,
        v_bias=rd.get(p + "v_proj.bias", (Hkv * hd,)) if bias else None,
        q_norm=rd.get(p + fam.naming.q_norm, norm_q) if norm_q else None,
        k_norm=rd.get(p + fam.naming.k_norm, norm_k) if norm_k else None,
    )
    clip = hf.raw.get(fam.clip_qkv_key) if fam.clip_qkv_key else None
    return Attention(w, i, H, Hkv, hd, hf.rms_eps, rotary, float(clip) if clip else None)


def _dense(rd: _Reader, prefix: str, D: int, inter: int, bias: bool = False) -> DenseMLP:
    return DenseMLP(
        gate=rd.get(prefix + "gate_proj.weight", (inter, D)),
        up=rd.get(prefix + "up_proj.weight", (inter, D)),
        down=rd.get(prefix + "down_proj.weight", (D, inter)),
        gate_bias=rd.get(prefix + "gate_proj.bias", (inter,)) if bias else None,
        up_bias=rd.get(prefix + "up_proj.bias", (inter,)) if bias else None,
        down_bias=rd.get(prefix + "down_proj.bias", (D,)) if bias else None,
    )


def _fill_experts(reader: SafetensorsReader, fam: Family, hf: HFConfig, i: int, li: int, banks: ExpertBanks) -> None:
    """Read layer i's routed experts into bank rows [li*E, (li+1)*E)."""
    n = fam.naming
    p = n.layer.format(i=i) + n.moe
    E, D, I = hf.num_experts, hf.hidden_size, hf.moe_intermediate_size
    rows = slice(li * E, (li + 1) * E)
    if p + n.fused_experts[0] in reader:
        reader.read_into(p + n.fused_experts[0], banks.gate_up[rows], (E, 2 * I, D))
        reader.read_into(p + n.fused_experts[1], banks.down[rows], (E, D, I))
        return
    gate_n, up_n, down_n = (p + t for t in n.experts)
    for e in range(E):
        row = li * E + e
        reader.read_into(gate_n.format(e=e), banks.gate_up[row, :I], (I, D))
        reader.read_into(up_n.format(e=e), banks.gate_up[row, I:], (I, D))
        reader.read_into(down_n.format(e=e), banks.down[row], (D, I))


def load_model(
    hf: HFConfig,
    family: Family,
    device: torch.device,
    dtype: torch.dtype,
    make_backend: Callable[[ExpertBanks], ExpertBackend],
    max_positions: int,
) -> LoadedModel:
    reader = SafetensorsReader(hf.path)
    rd = _Reader(reader, device, dtype)
    n = family.naming
    D, V = hf.hidden_size, hf.vocab_size
    rotary = Rotary(hf.rope, hf.head_dim, max_positions, device)
    moe_ids = hf.moe_layer_ids
    banks = None
    if moe_ids:
        banks = ExpertBanks.empty(len(moe_ids), hf.num_experts, D, hf.moe_intermediate_size, dtype)
        banks.top_k = hf.top_k
        for li, i in enumerate(moe_ids):
            _fill_experts(reader, family, hf, i, li, banks)
    backend = make_backend(banks) if banks is not None else None
    layers: list[DecoderLayer] = []
    for i in range(hf.num_layers):
        lp = n.layer.format(i=i)
        ffn: DenseMLP | MoELayer
        if i in moe_ids:
            assert backend is not None
            mp = lp + n.moe
            shared = shared_gate = None
            if n.shared_expert and hf.shared_expert_intermediate_size:
                shared = _dense(rd, mp + n.shared_expert, D, hf.shared_expert_intermediate_size)
                shared_gate = rd.opt(mp + (n.shared_expert_gate or ""), (1, D))
            ffn = MoELayer(
                router=rd.get(mp + n.router, (hf.num_experts, D)),
                top_k=hf.top_k,
                norm_topk_prob=hf.norm_topk_prob or family.always_norm_topk,
                moe_index=moe_ids.index(i),
                backend=backend,
                shared=shared,
                shared_gate=shared_gate,
            )
        else:
            ffn = _dense(rd, lp + n.mlp, D, hf.intermediate_size, bool(hf.raw.get("mlp_bias", False)))
        layers.append(
            DecoderLayer(
                attn_norm=rd.get(lp + n.attn_norm, (D,)),
                attn=_attention(rd, family, hf, i, rotary),
                ffn_norm=rd.get(lp + n.ffn_norm, (D,)),
                ffn=ffn,
            )
        )
    embed = rd.get(n.embed, (V, D))
    lm_head = embed if hf.tie_word_embeddings or n.lm_head not in reader else rd.get(n.lm_head, (V, D))
    model = DecoderModel(embed, layers, rd.get(n.final_norm, (D,)), lm_head, hf.rms_eps)
    return LoadedModel(hf, model, banks, backend)
