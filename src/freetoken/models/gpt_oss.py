"""gpt-oss (``GptOssForCausalLM``): GQA attention with q/k/v/o biases and a learned sink logit per head, sliding-window
layers alternating with full attention (``layer_types``), every layer MoE with a biased router (softmax over the top-k
logits: the top-k of the softmax renormalised) and clamped gated experts with biases.

The routed experts are stored transposed with gate and up interleaved: ``gate_up_proj`` [E, D, 2I] (column 2j is gate
j, 2j + 1 is up j), ``gate_up_proj_bias`` [E, 2I] likewise, ``down_proj`` [E, I, D], ``down_proj_bias`` [E, D]. They
are banked in the engine's layout (``gate_up[eid]`` [2I, D], gate rows then up rows; ``down[eid]`` [D, I]), the gate/up
biases beside the banks (``ExpertBanks.gate_up_bias``) and the down biases on the MoE layer (``layers/moe.py``).
This file holds bf16 (or float) experts; MXFP4 ones (``*_blocks`` / ``*_scales``) are the FP4 formats' part.
"""

from __future__ import annotations

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.experts.reference import GPTOSS_ALPHA, GPTOSS_LIMIT
from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("GptOssForCausalLM",),
    naming=Naming(router="router.weight", fused_experts=("experts.gate_up_proj", "experts.down_proj")),
    always_norm_topk=True,
    attn_sinks=True,
    router_bias=True,
    gpt_oss_experts=True,
    window_ring=True,
    anchor_starts=("<|start|>", "<|channel|>"),
    anchor_ends=("<|end|>", "<|call|>", "<|return|>"),
)

ACTIVATION = "gptoss"  # the experts' activation by its kernel name (``experts/cpu/reference.py``)


def check_activation(hf: HFConfig) -> None:
    """The kernels compute the clamped activation with gpt-oss's constants: another ``swiglu_alpha`` or
    ``swiglu_limit`` is refused, naming the field."""
    for key, want in (("swiglu_alpha", GPTOSS_ALPHA), ("swiglu_limit", GPTOSS_LIMIT)):
        got = hf.raw.get(key, want)
        if not isinstance(got, (int, float)) or abs(float(got) - want) > 1e-6:
            raise CheckpointError(f"{hf.path / 'config.json'}: {key} is {got!r}; only gpt-oss's {want} is supported")


def deinterleave(t: torch.Tensor) -> torch.Tensor:
    """[..., 2I] with gate and up interleaved -> [..., 2I] gate half, then up half."""
    return torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)


def expert_biases(w: CheckpointWeights, hf: HFConfig, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``i``'s (gate/up biases [E, 2I] float32 on the host, gate half first; down biases [E, D] on the compute
    device)."""
    p = FAMILY.naming.layer.format(i=i) + FAMILY.naming.moe + "experts."
    E, D, I = hf.num_experts, hf.hidden_size, hf.moe_intermediate_size
    gate_up = deinterleave(w.get(p + "gate_up_proj_bias", (E, 2 * I))).to(device="cpu", dtype=torch.float32)
    return gate_up.contiguous(), w.get(p + "down_proj_bias", (E, D))


def expert_reads(hf: HFConfig, i: int, li: int) -> list[tuple[str, str, tuple[slice], tuple[int, ...]]]:
    """(tensor, bank, bank rows, stored shape) of layer ``i``'s routed experts, banked at rows [li*E, (li+1)*E)."""
    p = FAMILY.naming.layer.format(i=i) + FAMILY.naming.moe
    E, D, I = hf.num_experts, hf.hidden_size, hf.moe_intermediate_size
    rows = (slice(li * E, (li + 1) * E),)
    gate_up, down = FAMILY.naming.fused_experts
    return [(p + gate_up, "gate_up", rows, (E, D, 2 * I)), (p + down, "down", rows, (E, I, D))]


def read_expert_bank(w: CheckpointWeights, name: str, bank: str, dst: torch.Tensor, shape: tuple[int, ...]) -> None:
    """One layer's stored experts into its bank rows ``dst`` ([E, 2I, D] or [E, D, I]): transposed, gate/up split."""
    got = w.reader.shape(name)
    if got != shape:
        raise CheckpointError(
            f"{w.reader.directory}: tensor {name} has shape {list(got)}, expected {list(shape)} from config.json"
        )
    t = w.reader.read(name, dst.dtype)
    dst.copy_(deinterleave(t).transpose(1, 2) if bank == "gate_up" else t.transpose(1, 2))
    w.claim([name])
