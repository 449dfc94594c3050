"""Assemble DeepSeek-V4 (``models/deepseek_v4*.py``) from a checkpoint: the switches checked from config.json first,
then the non-expert weights by name, every layer's routing (score-routed, or the ``tid2eid`` table checked), the
unread tensors refused (the multi-token-prediction block skipped, said once), then the routed experts banked
(``eid = layer * E + expert``, every layer is MoE) and the backend made over them, under the clamped SiLU (``dsv4``).
Every layer keeps its window keys and raw compressor rows in rings of a request's state slot (``memory/sizes.py``
``v4_state_rings``) and its compressed entries in KV pages: prefix reuse resumes from a state checkpoint.
The release's quantisation (``quant/dsv4_layout.py``): FP8 weights dequantised at load, the MXFP4 routed experts
banked packed as stored (``ExpertBanks.fmt`` MXFP4), whatever else refused by name before a weight is read."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable

import torch

from freetoken.cache.state_pool import StateShape
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_manifest import read_manifest
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.quantization import check_supported
from freetoken.checkpoint.safetensors_io import SafetensorsReader
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.reference import DSV4_LIMIT
from freetoken.layers.v4_moe import V4MoE
from freetoken.layers.v4_rope import InterleavedRope
from freetoken.loader.ftw_load import read_ftw_banks
from freetoken.loader.model_build import LoadedModel, expert_format
from freetoken.memory.sizes import v4_state_rings
from freetoken.models import deepseek_v4_blocks as blocks
from freetoken.models.base import Family
from freetoken.models.blocks import expert_reads
from freetoken.models.deepseek_v4 import ACTIVATION, checkpoint_layout, v4_config
from freetoken.models.deepseek_v4_decoder import V4DecoderModel, V4Layer
from freetoken.quant.base import QuantizationError
from freetoken.quant.dsv4_layout import Dsv4Layout, check_tensors

log = logging.getLogger(__name__)


def check_config(hf: HFConfig) -> None:
    """Every switch and the weight format refused by name from config.json alone (``hub_support.py`` asks too)."""
    v4_config(hf)
    checkpoint_layout(hf)


def checkpoint_family(reader: SafetensorsReader) -> Family:
    """The family as this checkpoint names its tensors (``ftw_convert.py`` reads its experts by it)."""
    return blocks.V4Names(CheckpointWeights(reader, torch.device("cpu"), torch.float32)).family()


def build_model(
    hf: HFConfig, family: Family, device: torch.device, dtype: torch.dtype,
    make_backend: Callable[[ExpertBanks], ExpertBackend], max_positions: int, verify: str = "background",
) -> LoadedModel:  # fmt: skip
    """``model_build.build_model`` hands DeepSeek-V4 here (``Family.build``); ``family`` gives way to the one named
    after this checkpoint's own tensor names (``V4Names.family``)."""
    check_config(hf)  # before a weight is read
    c = v4_config(hf)
    ftw = read_manifest(hf.path)
    reader = SafetensorsReader(hf.path)
    layout = checkpoint_layout(hf)
    skippable = ("*.rotary_emb.inv_freq", *blocks.MTP_PATTERNS)
    read = (*skippable, "*.gate.tid2eid")  # integer tables: read by blocks.tid2eid
    if layout is not None:  # the release's own rules first: they name what is wrong more precisely
        _check_layout(reader, layout, read)
    check_supported(hf.raw, reader, read, layout)
    w = CheckpointWeights(reader, device, dtype, layout)
    names = blocks.V4Names(w)
    family = names.family()  # DeepSeek's names as shipped or transformers'
    D, V, E = hf.hidden_size, hf.vocab_size, hf.num_experts
    ropes = tuple(InterleavedRope(r, c.rot, max_positions, device) for r in (c.main_rope, c.compress_rope))
    layers: list[V4Layer] = []
    reads = []
    for i in range(hf.num_layers):
        lp, fp = names.layer(i), names.layer(i) + "ffn."
        attn = blocks.attention(w, names, hf, c, i, ropes)
        hash_table = blocks.tid2eid(w, fp + "gate.tid2eid", hf) if c.hash_layers[i] else None
        bias = None if c.hash_layers[i] else w.get(fp + "gate.bias", (E,), torch.float32)
        moe = V4MoE(w.get(fp + "gate.weight", (E, D)), hf.top_k, True, i, None,  # type: ignore[arg-type]
                    bias=bias, scoring=c.scoring, scale=c.scale, tid2eid=hash_table,
                    shared_mlp=blocks.shared_expert(w, fp + "shared_experts.", hf, DSV4_LIMIT))  # fmt: skip
        reads += expert_reads(w, family, hf, i, i) if ftw is None else []
        layers.append(V4Layer(w.get(lp + "attn_norm.weight", (D,), torch.float32), attn,
                              w.get(lp + "ffn_norm.weight", (D,), torch.float32), moe,
                              blocks.hyper_connection(w, lp + "hc_attn", hf, c),
                              blocks.hyper_connection(w, lp + "hc_ffn", hf, c)))  # fmt: skip
    embed = w.get(names.embed, (V, D))
    lm_head = w.get(names.head, (V, D)) if names.head in w and not hf.tie_word_embeddings else embed
    head = blocks.hyper_head(w, names, hf, c)
    final_norm = w.get(names.norm, (D,), torch.float32)
    scales = [s for r in reads if w.is_packed(r[0]) for s in w.side_tensors(r[0])] if layout is not None else []
    w.claim([r[0] for r in reads] + scales)
    mtp = [n for n in reader.tensors if any(fnmatch.fnmatchcase(n, p) for p in blocks.MTP_PATTERNS)]
    if mtp:
        log.info("%s: the multi-token-prediction block (%d tensors, mtp.*) is not used: skipped", hf.path, len(mtp))
    w.check_all_used(hf.architecture, skippable)
    check = None
    if ftw is not None:
        banks, check = read_ftw_banks(ftw, hf, dtype, verify)
    else:
        efmt = expert_format(w, layout.expert_format if layout is not None else None, reads, hf)
        banks = ExpertBanks.empty(hf.num_layers, E, D, hf.moe_intermediate_size, dtype, efmt)
        for name, bank, index, shape, scale_index in reads:
            if efmt.quantized:  # MXFP4 bytes and e8m0 scales as stored
                w.read_packed_into(name, getattr(banks, bank)[index], getattr(banks, bank + "_scale")[scale_index],
                                   shape)  # fmt: skip
            else:
                w.read_into(name, getattr(banks, bank)[index], shape)
    banks.top_k = hf.top_k
    banks.activation = ACTIVATION
    backend = make_backend(banks)
    for layer in layers:
        assert isinstance(layer.ffn, V4MoE)
        layer.ffn.backend = backend
    model = V4DecoderModel(embed, layers, final_norm, lm_head, hf.rms_eps, head, c.streams)
    states = StateShape(0, 0, 0, 0, 0, 0, row_rings=tuple(v4_state_rings(hf)))  # window and raw rows, per request
    return LoadedModel(hf, model, banks, backend, hf.num_layers, states, check)


def _check_layout(reader: SafetensorsReader, layout: Dsv4Layout, skippable: tuple[str, ...]) -> None:
    """The release's per-tensor rules (``quant/dsv4_layout.check_tensors``) over the tensors the model reads."""
    headers = {n: (t.dtype_name, tuple(t.shape)) for n, t in reader.tensors.items()
               if not any(fnmatch.fnmatchcase(n, p) for p in skippable)}  # fmt: skip
    try:
        check_tensors(layout, headers)
    except QuantizationError as exc:
        raise CheckpointError(f"{reader.directory}: {exc}") from exc
