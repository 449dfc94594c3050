"""DeepSeek sparse attention's lightning indexer (``layers/dsa.py``) read from a checkpoint: ``indexer.wq_b``,
``indexer.wk``, ``indexer.k_norm`` (weight and bias), ``indexer.weights_proj`` beside each layer's MLA tensors, and
the config's ``index_topk``, ``index_n_heads``, ``index_head_dim``, each checked (a missing tensor, a non-positive
field, a model without a q LoRA: refused naming it); which layers share another's selection (GLM-5,
``indexer_kinds``). GLM-5's indexer rotates its first ``qk_rope_head_dim`` dims in the interleaved layout: those rows
of ``wq_b`` (per head), ``wk`` and ``k_norm`` are permuted into rotate-half order, which changes no score."""

from __future__ import annotations

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.layers.dsa import IndexerWeights
from freetoken.models.base import Family

INDEXER_TENSORS = ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")


def _positive(hf: HFConfig, key: str) -> int:
    value = hf.raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(f"{hf.path / 'config.json'}: DSA field {key!r} must be a positive integer, not {value!r} "
                              f"({hf.architecture})")  # fmt: skip
    return value


def dsa_fields(hf: HFConfig) -> tuple[int, int, int]:
    """(index_n_heads, index_head_dim, index_topk), checked."""
    heads, head_dim, topk = (_positive(hf, k) for k in ("index_n_heads", "index_head_dim", "index_topk"))
    where = hf.path / "config.json"
    if head_dim < int(hf.raw.get("qk_rope_head_dim") or 0):
        raise CheckpointError(f"{where}: index_head_dim = {head_dim} is smaller than qk_rope_head_dim")
    if not hf.raw.get("q_lora_rank"):
        raise CheckpointError(f"{where}: DSA's indexer reads the q LoRA: q_lora_rank must be set ({hf.architecture})")
    return heads, head_dim, topk


def indexer_kinds(hf: HFConfig, fam: Family) -> list[str]:
    """Each layer's indexer: "full" (its own) or "shared" (the last full layer's selection), as transformers'
    ``GlmMoeDsaConfig`` derives it: ``indexer_types``, else ``index_topk_pattern`` ("F"/"S"), else every
    ``index_topk_freq``-th layer from ``index_skip_topk_offset`` on (defaults 1 and 2: all full). DeepSeek-V3.2: all
    full. The first layer must be full."""
    n, raw, where = hf.num_layers, hf.raw, hf.path / "config.json"
    if not fam.indexer_sharing:
        return ["full"] * n
    kinds, field = raw.get("indexer_types"), "indexer_types"
    if kinds is None and raw.get("index_topk_pattern") is not None:
        pattern, field = raw["index_topk_pattern"], "index_topk_pattern"
        kinds = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else pattern
    if kinds is None:
        freq, offset = raw.get("index_topk_freq", 1), raw.get("index_skip_topk_offset", 2)
        if not isinstance(freq, int) or not isinstance(offset, int) or isinstance(freq, bool) or offset < 0:
            raise CheckpointError(f"{where}: index_topk_freq / index_skip_topk_offset must be integers, not "
                                  f"{freq!r} / {offset!r}")  # fmt: skip
        return ["full" if max(i - offset + 1, 0) % max(freq, 1) == 0 else "shared" for i in range(n)]
    if not isinstance(kinds, list) or len(kinds) < n:
        raise CheckpointError(f"{where}: {field} must list an indexer kind for each of the {n} layers, not {kinds!r}")
    for i, k in enumerate(kinds[:n]):
        if k not in ("full", "shared") or (i == 0 and k != "full"):
            raise CheckpointError(f"{where}: {field}[{i}] is {k!r}: each layer's indexer is 'full' or 'shared' "
                                  "(the first 'full')")  # fmt: skip
    return list(kinds[:n])


def indexer_weights(w: CheckpointWeights, fam: Family, hf: HFConfig, i: int, rope_dim: int) -> IndexerWeights:
    heads, dim, topk = dsa_fields(hf)
    p = fam.naming.layer.format(i=i) + fam.naming.attn + "indexer."
    for t in INDEXER_TENSORS:
        if p + t not in w:
            raise CheckpointError(f"{w.reader.directory}: tensor {p + t} is missing: DSA's lightning indexer needs it "
                                  f"({hf.architecture})")  # fmt: skip
    D, ql = hf.hidden_size, int(hf.raw["q_lora_rank"])
    wq_b, wk = w.get(p + "wq_b.weight", (heads * dim, ql)), w.get(p + "wk.weight", (dim, D))
    k_norm, k_bias = w.get(p + "k_norm.weight", (dim,)), w.get(p + "k_norm.bias", (dim,))
    if fam.indexer_rope_interleave:
        dims = torch.cat((torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2), torch.arange(rope_dim, dim)))
        rows = (torch.arange(heads)[:, None] * dim + dims[None, :]).reshape(-1)
        wq_b = wq_b[rows.to(wq_b.device)].contiguous()
        dims = dims.to(wk.device)
        wk, k_norm, k_bias = wk[dims].contiguous(), k_norm[dims].contiguous(), k_bias[dims].contiguous()
    return IndexerWeights(wq_b, wk, k_norm, k_bias, w.get(p + "weights_proj.weight", (heads, D), torch.float32),
                          heads, dim, topk)  # fmt: skip
