"""DeepSeek-V4's tensors by name, read and checked against the config (``deepseek_v4.py``).

Names are DeepSeek's own (``layers.{i}.attn.wq_a.weight``, ``layers.{i}.ffn.experts.{e}.w1.weight``, ``hc_head_fn``,
``embed.weight``, ``head.weight``), which transformers also writes back on ``save_pretrained`` (it adds ``model.``
before the layers, the norm and ``embed_tokens`` / ``hc_head.hc_fn``, and names the attention's KV norm ``attn.norm``
where the release has ``attn.kv_norm``): both spellings are read. The hyper-connection
projections, sinks, ``ape`` biases and router biases are read in float32 (transformers keeps them so). A tensor whose
shape disagrees with the config is refused naming it; the residual-stream tensors name ``hc_mult``; a ``tid2eid``
table shorter than the vocabulary or with an entry outside [0, n_routed_experts) is refused naming it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.checkpoint.weights import CheckpointWeights
from freetoken.layers.hyper_connections import HyperConnection, HyperHead
from freetoken.layers.v4_attention import V4Attention, V4AttentionWeights
from freetoken.layers.v4_compressor import CSA, Compressor, Indexer, RowLayout
from freetoken.layers.v4_moe import ClampedMLP
from freetoken.layers.v4_rope import InterleavedRope
from freetoken.models.base import Family
from freetoken.models.deepseek_v4 import FAMILY, V4Config

F32 = torch.float32
MTP_PATTERNS = ("mtp.*", "model.mtp.*")  # the multi-token-prediction block: not used


class V4Names:
    """Where this checkpoint keeps each tensor (``model.``-prefixed as transformers saves, bare as DeepSeek ships)."""

    def __init__(self, w: CheckpointWeights) -> None:
        self.w = w
        self.prefix = "model." if "model.layers.0.attn_norm.weight" in w else ""

    def layer(self, i: int) -> str:
        return f"{self.prefix}layers.{i}."

    def first(self, *names: str) -> str:
        """The first of ``names`` the checkpoint has (the first, to be refused as missing, when none)."""
        return next((n for n in names if n in self.w), names[0])

    @property
    def embed(self) -> str:
        return self.first("model.embed_tokens.weight", "embed.weight", "model.embed.weight")

    @property
    def head(self) -> str:
        return self.first("head.weight", "lm_head.weight", "model.head.weight")

    @property
    def norm(self) -> str:
        return self.first("model.norm.weight", "norm.weight")

    def hc_head(self, part: str) -> str:
        return self.first(f"model.hc_head.hc_{part}", f"hc_head_{part}", f"model.hc_head_{part}")

    def family(self) -> Family:
        """The family with this checkpoint's layer prefix and DeepSeek's expert names (w1 gate, w3 up, w2 down)."""
        naming = replace(FAMILY.naming, layer=self.prefix + "layers.{i}.", moe="ffn.",
                         experts=("experts.{e}.w1.weight", "experts.{e}.w3.weight", "experts.{e}.w2.weight"),
                         fused_experts=("experts.gate_up_proj", "experts.down_proj"))  # fmt: skip
        return replace(FAMILY, naming=naming)


def _hc_shape(w: CheckpointWeights, name: str, want: tuple[int, ...], streams: int) -> None:
    got = tuple(w.reader.shape(name)) if name in w else None
    if got is not None and got != want:
        raise CheckpointError(f"{w.reader.directory}: tensor {name} has shape {list(got)}, but hc_mult {streams} "
                              f"in config.json implies {list(want)}: the residual-stream settings disagree with the "
                              "weights")  # fmt: skip


def hyper_connection(w: CheckpointWeights, p: str, hf: HFConfig, c: V4Config) -> HyperConnection:
    """``{p}_fn`` / ``_base`` / ``_scale`` (p: ``layers.{i}.hc_attn`` or ``hc_ffn``)."""
    n, D = c.streams, hf.hidden_size
    shapes = {"fn": ((2 + n) * n, n * D), "base": ((2 + n) * n,), "scale": (3,)}
    for part, shape in shapes.items():
        _hc_shape(w, f"{p}_{part}", shape, n)
    fn, base, scale = (w.get(f"{p}_{part}", shape, F32) for part, shape in shapes.items())
    return HyperConnection(fn, base, scale, n, c.sinkhorn_iters, c.hc_eps, hf.rms_eps)


def hyper_head(w: CheckpointWeights, names: V4Names, hf: HFConfig, c: V4Config) -> HyperHead:
    n, D = c.streams, hf.hidden_size
    shapes = {"fn": (n, n * D), "base": (n,), "scale": (1,)}
    for part, shape in shapes.items():
        _hc_shape(w, names.hc_head(part), shape, n)
    fn, base, scale = (w.get(names.hc_head(part), shape, F32) for part, shape in shapes.items())
    return HyperHead(fn, base, scale, c.hc_eps, hf.rms_eps)


def _compressor(w: CheckpointWeights, p: str, hf: HFConfig, rate: int, dim: int, overlap: bool) -> Compressor:
    s, D = 2 if overlap else 1, hf.hidden_size
    ape = p + "ape"
    if ape in w and tuple(w.reader.shape(ape))[1:] == (s * dim,) and w.reader.shape(ape)[0] != rate:
        raise CheckpointError(f"{w.reader.directory}: tensor {ape} has {w.reader.shape(ape)[0]} rows, but the "
                              f"compression rate in config.json is {rate}")  # fmt: skip
    return Compressor(w.get(p + "wkv.weight", (s * dim, D)), w.get(p + "wgate.weight", (s * dim, D)),
                      w.get(ape, (rate, s * dim), F32), w.get(p + "norm.weight", (dim,), F32), rate, dim, overlap,
                      hf.rms_eps)  # fmt: skip


def attention(
    w: CheckpointWeights, names: V4Names, hf: HFConfig, c: V4Config, i: int, ropes: tuple[InterleavedRope, ...]
) -> V4Attention:
    """Layer i's attention (the KV pool's i-th layer: every V4 layer keeps rows there)."""
    p, kind = names.layer(i) + "attn.", c.kinds[i]
    D, H, d, G = hf.hidden_size, hf.num_heads, hf.head_dim, c.groups
    aw = V4AttentionWeights(
        wq_a=w.get(p + "wq_a.weight", (c.q_rank, D)), q_norm=w.get(p + "q_norm.weight", (c.q_rank,), F32),
        wq_b=w.get(p + "wq_b.weight", (H * d, c.q_rank)), wkv=w.get(p + "wkv.weight", (d, D)),
        kv_norm=w.get(names.first(p + "kv_norm.weight", p + "norm.weight"), (d,), F32),
        wo_a=w.get(p + "wo_a.weight", (G * c.o_rank, H * d // G)),
        wo_b=w.get(p + "wo_b.weight", (D, G * c.o_rank)), sinks=w.get(p + "attn_sink", (H,), F32),
    )  # fmt: skip
    layout = RowLayout(kind, d, c.index_dim)
    rope = ropes[0] if kind == "sliding_attention" else ropes[1]
    comp = idx = None
    if kind != "sliding_attention":
        comp = _compressor(w, p + "compressor.", hf, c.rates[kind], d, kind == CSA)
    if kind == CSA:
        di, Hi = c.index_dim, c.index_heads
        idx = Indexer(_compressor(w, p + "indexer.compressor.", hf, c.rates[kind], di, True),
                      w.get(p + "indexer.wq_b.weight", (Hi * di, c.q_rank)),
                      w.get(p + "indexer.weights_proj.weight", (Hi, D)), Hi, c.index_topk)  # fmt: skip
    return V4Attention(aw, i, layout, H, G, c.window, hf.rms_eps, rope, comp, idx)


def tid2eid(w: CheckpointWeights, name: str, hf: HFConfig) -> torch.Tensor:
    """A hash layer's token -> experts table [V, k] int64 on the compute device, checked."""
    where = w.reader.directory
    if name not in w:
        raise CheckpointError(f"{where}: tensor {name} is missing (a hash_moe layer's token-id routing table)")
    shape = tuple(w.reader.shape(name))
    V, k, E = hf.vocab_size, hf.top_k, hf.num_experts
    if len(shape) != 2 or shape[1] != k:
        raise CheckpointError(f"{where}: tensor {name} has shape {list(shape)}, expected [vocab, {k}] (top-k {k})")
    if shape[0] < V:
        raise CheckpointError(f"{where}: tensor {name} has {shape[0]} rows, shorter than the vocabulary ({V})")
    t = w.reader.read(name)
    if t.is_floating_point():
        raise CheckpointError(f"{where}: tensor {name} is {t.dtype}; token-id routing tables hold integers")
    t = t.long()
    if bool((t < 0).any()) or bool((t >= E).any()):
        bad = int(t.max()) if bool((t >= E).any()) else int(t.min())
        raise CheckpointError(f"{where}: tensor {name} routes to expert {bad}, outside [0, {E}) (n_routed_experts)")
    w.claim([name])
    return t[:V].contiguous().to(w.device)


def shared_expert(w: CheckpointWeights, p: str, hf: HFConfig, limit: float) -> ClampedMLP:
    D, I = hf.hidden_size, hf.moe_intermediate_size
    return ClampedMLP(w.get(p + "w1.weight", (I, D)), w.get(p + "w3.weight", (I, D)), w.get(p + "w2.weight", (D, I)),
                      limit)  # fmt: skip
