"""gpt-oss (``GptOssForCausalLM``): GQA attention with q/k/v/o biases and a learned sink logit per head, sliding-window
layers alternating with full attention (``layer_types``), every layer MoE with a biased router (softmax over the top-k
logits: the top-k of the softmax renormalised) and clamped gated experts with biases.

The routed experts are stored transposed with gate and up interleaved: ``gate_up_proj`` [E, D, 2I] (column 2j is gate
j, 2j + 1 is up j), ``gate_up_proj_bias`` [E, 2I] likewise, ``down_proj`` [E, I, D], ``down_proj_bias`` [E, D]. They
are banked in the engine's layout (``gate_up[eid]`` [2I, D], gate rows then up rows; ``down[eid]`` [D, I]), the gate/up
biases beside the banks (``ExpertBanks.gate_up_bias``) and the down biases on the MoE layer (``layers/moe.py``).

As shipped (``quant_method: mxfp4``) the experts are MXFP4, already in [out, in] orientation: ``gate_up_proj_blocks``
[E, 2I, D/32, 16] uint8 (rows interleaved as above; 16 bytes = 32 e2m1 codes a block, the even element in the low
nibble), ``gate_up_proj_scales`` [E, 2I, D/32] uint8 (e8m0, bias 127), ``down_proj_blocks`` [E, D, I/32, 16],
``down_proj_scales`` [E, D, I/32] (transformers' ``integrations/mxfp4.py``). They are banked packed, as they are:
the blocks' last two dimensions flattened into the bank's bytes, gate/up rows de-interleaved in the bytes and in
the scales alike; no weight is dequantised (``quant/mxfp4.py``'s bank layout is the same bytes).
"""

from __future__ import annotations

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.errors import FreeTokenError
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


ExpertRead = tuple[str, str, tuple[slice], tuple[int, ...], tuple[slice]]


def expert_reads(w: CheckpointWeights, hf: HFConfig, i: int, li: int) -> list[ExpertRead]:
    """(tensor, bank, bank rows, stored shape, scale bank rows) of layer ``i``'s routed experts, banked at rows
    [li*E, (li+1)*E): ``<name>_blocks`` where the checkpoint has it (MXFP4, shape: the unpacked [out, in]), else the
    float tensor (shape: as stored, [in, out])."""
    p = FAMILY.naming.layer.format(i=i) + FAMILY.naming.moe
    E, D, I = hf.num_experts, hf.hidden_size, hf.moe_intermediate_size
    rows = (slice(li * E, (li + 1) * E),)
    gate_up, down = FAMILY.naming.fused_experts
    reads: list[ExpertRead] = []
    for name, bank, stored, packed in ((gate_up, "gate_up", (E, D, 2 * I), (E, 2 * I, D)),
                                       (down, "down", (E, I, D), (E, D, I))):  # fmt: skip
        blocks = p + name + "_blocks"
        reads.append((blocks, bank, rows, packed, rows) if blocks in w else (p + name, bank, rows, stored, rows))
    return reads


def read_expert_bank(
    w: CheckpointWeights,
    name: str,
    bank: str,
    dst: torch.Tensor,
    shape: tuple[int, ...],
    scale_dst: torch.Tensor | None = None,
) -> None:
    """One layer's stored experts into its bank rows ``dst`` ([E, 2I, D] or [E, D, I]): transposed, gate/up split;
    MXFP4 blocks (``scale_dst``: the scale bank's rows) kept packed."""
    if scale_dst is not None:
        _read_packed(w, name, bank, dst, scale_dst, shape)
        return
    got = w.reader.shape(name)
    if got != shape:
        raise CheckpointError(
            f"{w.reader.directory}: tensor {name} has shape {list(got)}, expected {list(shape)} from config.json"
        )
    t = w.reader.read(name, dst.dtype)
    dst.copy_(deinterleave(t).transpose(1, 2) if bank == "gate_up" else t.transpose(1, 2))
    w.claim([name])


def _read_packed(
    w: CheckpointWeights, name: str, bank: str, dst: torch.Tensor, scale_dst: torch.Tensor, shape: tuple[int, ...]
) -> None:
    """MXFP4 ``<x>_blocks`` [E, rows, cols/32, 16] and ``<x>_scales`` [E, rows, cols/32] (``shape``: [E, rows, cols])
    into packed bank rows ``dst`` [E, rows, cols/2] and ``scale_dst`` [E, rows, cols/32], gate/up de-interleaved.
    Shapes and dtypes are refused naming the tensor (the scales' were checked with the headers)."""
    where = w.reader.directory
    if w.layout is None or w.layout.name != "mxfp4":
        fmt = w.layout.name if w.layout is not None else "no quantization_config"
        raise CheckpointError(f"{where}: tensor {name} holds MXFP4 blocks, but the checkpoint declares {fmt}")
    got = tuple(w.reader.shape(name))
    E, rows, cols = shape
    if len(got) == 4 and got[:2] == (E, rows) and got[2] * got[3] * 2 == cols and got[3] != _BLOCK_BYTES:
        raise CheckpointError(f"{where}: tensor {name} has blocks of {got[3] * 2} elements; mxfp4 has blocks of "
                              f"{_BLOCK_BYTES * 2}")  # fmt: skip
    want = (E, rows, cols // (_BLOCK_BYTES * 2), _BLOCK_BYTES)
    if got != want:
        raise CheckpointError(f"{where}: tensor {name} has shape {list(got)}, expected {list(want)} from config.json")
    scale_name = w.layout.scale_name(name)
    want_s = want[:-1]
    if tuple(w.reader.shape(scale_name)) != want_s:
        raise CheckpointError(f"{where}: scale tensor {scale_name} has shape {list(w.reader.shape(scale_name))}, "
                              f"expected {list(want_s)} for {name}")  # fmt: skip
    blocks = w.reader.read(name).view(torch.uint8).reshape(E, rows, cols // 2)
    try:
        scales = w.layout.bank_scale(w.reader.read(scale_name))
    except FreeTokenError as exc:  # quant/'s QuantizationError: a scale dtype mxfp4 does not have
        raise CheckpointError(f"{where}: scales of {name}: {exc}") from exc
    if bank == "gate_up":  # interleaved rows (2j gate j, 2j + 1 up j) -> gate rows, then up rows
        blocks, scales = (torch.cat((t[:, 0::2], t[:, 1::2]), dim=1) for t in (blocks, scales))
    dst.copy_(blocks)
    scale_dst.copy_(scales.view(scale_dst.shape))
    w.claim([name, scale_name])


_BLOCK_BYTES = 16  # an MXFP4 block: 32 e2m1 codes, two a byte
