"""DeepSeek sparse attention's lightning indexer (``layers/dsa.py``) read from a checkpoint: ``indexer.wq_b``,
``indexer.wk``, ``indexer.k_norm`` (weight and bias), ``indexer.weights_proj`` beside each layer's MLA tensors, and
the config's ``index_topk``, ``index_n_heads``, ``index_head_dim``, each checked (a missing tensor, a non-positive
field, a model without a q LoRA, GLM-5's shared-indexer layers: refused naming it). GLM-5's indexer rotates its first
``qk_rope_head_dim`` dims in the interleaved layout: those rows of ``wq_b`` (per head), ``wk`` and ``k_norm`` are
permuted into rotate-half order, which changes no score."""

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
    shared = [i for i, t in enumerate(hf.raw.get("indexer_types") or []) if t != "full"]
    if shared:
        kind = hf.raw["indexer_types"][shared[0]]
        raise CheckpointError(f"{where}: indexer_types[{shared[0]}] is {kind!r}: layers reusing another layer's top-k "
                              "(GLM-5's shared indexers) are not implemented")  # fmt: skip
    return heads, head_dim, topk


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
