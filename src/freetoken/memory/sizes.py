"""What each cache kind costs for a model, from its Hugging Face config alone (pure: no torch, no allocation).

Cache kinds: full-attention layers keep K and V per token in the paged KV pool (a sliding-window layer keeps them in the
same pages, except where its family keeps a ring: gpt-oss's window layers keep K and V of a request's last W tokens in
its state slot, ``window_ring``); multi-head latent attention layers (a config with ``kv_lora_rank``) keep one latent of
``kv_lora_rank + qk_rope_head_dim`` per token instead (``kv_geometry``; DeepSeek-V4: its compressed entries, one row per
m tokens, ``v4_entry_layouts``, its per-token rows in rings per request, ``v4_state_rings``); gated DeltaNet
(linear-attention) layers keep one recurrent state per request - the last K-1 conv inputs in the model dtype and a [H,
dk, dv] float32 state - and state checkpoints are copies of that state (rings included); a layer-major prefill keeps two
hidden vectors (``h`` and ``x``) per token. ``tests/test_memory_sizes.py`` checks these numbers against the tensors the
engine allocates for a tiny model of every family.
"""

from __future__ import annotations

from dataclasses import dataclass

from freetoken.checkpoint.dsv4_config import CSA, HCA, compress_rates, layer_kinds
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.gemma4_config import gemma4_config, is_gemma4
from freetoken.checkpoint.hf_config import HFConfig

FULL, LINEAR, SLIDING = "full_attention", "linear_attention", "sliding_attention"
SSM_BYTES = 4  # the recurrent state is kept in float32 whatever the model dtype


@dataclass(frozen=True)
class KVGeometry:
    """One attention layer's rows per token in the KV pool: ``heads`` x (``k_dim`` + ``v_dim``); where the layers'
    K widths differ (DeepSeek-V4), ``layer_k_dims`` gives each layer's (``k_dim``: the widest)."""

    heads: int
    k_dim: int
    v_dim: int
    layer_k_dims: tuple[int, ...] = ()
    layer_entries: tuple[tuple[int, int], ...] = ()  # per layer (rate m, width): a row per m tokens (0, 0: none)

    @property
    def per_token(self) -> int:
        """Elements per token and layer (the widest layer's where widths differ)."""
        return self.heads * (self.k_dim + self.v_dim)

    def elements(self, layers: int) -> int:
        """Elements per token over ``layers`` layers (each layer's own width where widths differ)."""
        if self.layer_k_dims:
            return self.heads * (sum(self.layer_k_dims) + len(self.layer_k_dims) * self.v_dim)
        return layers * self.per_token


def kv_geometry(hf: HFConfig) -> KVGeometry:
    """GQA: K and V heads of ``head_dim``; MLA (``kv_lora_rank`` set): one latent row of ``kv_lora_rank +
    qk_rope_head_dim`` (the compressed K/V and the shared rotary key), no V; DSA (``index_topk`` set) widens that row
    by the indexer's key of ``index_head_dim``; DeepSeek-V4: one row per layer of its own kind's width, no V."""
    if hf.architecture == "DeepseekV4ForCausalLM":  # its per-token rows in state rings: only its entries in pages
        return KVGeometry(1, 0, 0, (0,) * hf.num_layers, tuple(v4_entry_layouts(hf)))
    if is_gemma4(hf):  # its full layers' (its sliding layers keep rings): one geometry for all, checked here
        geos = {(lay.kv_heads, lay.head_dim) for lay in gemma4_config(hf).layers if lay.kind == FULL}
        if len(geos) != 1:
            raise CheckpointError(f"{hf.path / 'config.json'}: Gemma-4 full-attention layers of differing KV heads or "
                                  f"head dims ({sorted(geos)}) are not supported")  # fmt: skip
        (heads, dim), = geos
        return KVGeometry(heads, dim, dim)
    if hf.raw.get("kv_lora_rank"):
        index = _raw_int(hf, "index_head_dim") if "index_topk" in hf.raw else 0  # DSA: the indexer's key beside it
        return KVGeometry(1, _raw_int(hf, "kv_lora_rank") + _raw_int(hf, "qk_rope_head_dim") + index, 0)
    return KVGeometry(hf.num_kv_heads, hf.head_dim, hf.head_dim)


def _v4_dims(hf: HFConfig) -> tuple[tuple[str, ...], int, int]:
    kinds = layer_kinds(hf)
    return kinds, hf.head_dim, int(hf.raw.get("index_head_dim", 128)) if CSA in kinds else 0


def v4_row_widths(hf: HFConfig) -> list[int]:
    """DeepSeek-V4's row per token of each layer (``layers/v4_compressor.py`` ``RowLayout``): the window key d; a
    heavily compressed layer adds its raw kv and gate (3 d); a compressed sparse layer its two series' raw kv and
    gate, and its indexer's raw kv and gate (2 di each) (5 d + 4 di)."""
    kinds, d, di = _v4_dims(hf)
    return [{SLIDING: d, HCA: 3 * d, CSA: 5 * d + 4 * di}[k] for k in kinds]


def v4_state_rings(hf: HFConfig) -> list[tuple[int, int]]:
    """DeepSeek-V4's rings of per-token rows in a request's state slot (``cache/state_pool.py`` ``row_rings``), two a
    layer: the window keys of its last W positions (W, d), then the raw compressor rows (``v4_row_widths`` past the
    window key) of the positions a window not yet closed pools: m on a heavily compressed layer, 2 m on a compressed
    sparse one (its entries pool the window before too); (0, 0) on a sliding layer."""
    kinds, d, _ = _v4_dims(hf)
    rates, W = compress_rates(hf), int(hf.raw.get("sliding_window") or 128)
    rings: list[tuple[int, int]] = []
    for k, width in zip(kinds, v4_row_widths(hf)):
        span = 0 if k == SLIDING else rates[k] * (2 if k == CSA else 1)
        rings += [(W, d), (span, width - d if span else 0)]
    return rings


def v4_entry_layouts(hf: HFConfig) -> list[tuple[int, int]]:
    """DeepSeek-V4's compressed entries of each layer: (rate m, width), a row per m tokens (``KVPool`` ``entries``):
    a heavily compressed layer's entry (d), a compressed sparse layer's entry and its indexer's key (d + di); a
    sliding layer has none (0, 0)."""
    kinds, d, di = _v4_dims(hf)
    rates = compress_rates(hf)
    return [(rates[k], {HCA: d, CSA: d + di}[k]) if k != SLIDING else (0, 0) for k in kinds]


@dataclass(frozen=True)
class ModelBytes:
    kv_layers: int  # full-attention layers (each keeps K and V per token)
    linear_layers: int  # gated DeltaNet layers (each keeps a recurrent state per request)
    kv_per_token: int  # K and V (MLA: the latent; V4: its rows, not its entries) of one token, every attention layer
    state_per_request: int  # one request's recurrent state, every linear-attention layer (a checkpoint: the same)
    activations_per_token: int  # what a layer-major pass keeps per token (``h`` and ``x``)
    ring_layers: int = 0  # sliding-window layers keeping a KV ring per request (in ``state_per_request``)
    entries: tuple[tuple[int, int], ...] = ()  # (rate m, bytes of a row) per layer keeping a row per m tokens (V4)

    def page_bytes(self, page_size: int) -> int:
        """One KV page: every token's rows, and each entry layer's ceil(S / m) rows (``KVPool``)."""
        rows = sum(-(-page_size // m) * row for m, row in self.entries if m)
        return self.kv_per_token * page_size + rows

    def bytes_per_token(self, page_size: int) -> float:
        return self.page_bytes(page_size) / page_size


def layer_counts(hf: HFConfig, full_attention_interval: int | None) -> tuple[int, int]:
    """(full-attention layers, linear-attention layers). ``full_attention_interval``: the family's (a hybrid family
    without ``layer_types`` in its config has every interval-th layer full attention); None: no linear layers."""
    if full_attention_interval is None:
        return hf.num_layers, 0
    if hf.layer_types is not None:
        kinds = list(hf.layer_types)
    else:
        kinds = [FULL if (i + 1) % full_attention_interval == 0 else LINEAR for i in range(hf.num_layers)]
    linear = sum(1 for k in kinds if k == LINEAR)
    return len(kinds) - linear, linear


def ring_layer_count(hf: HFConfig) -> int:
    """Layers ``layer_types`` names sliding, where the config has a window: those a ``window_ring`` family rings."""
    if hf.layer_types is None or not hf.sliding_window:
        return 0
    return sum(1 for k in hf.layer_types if k == SLIDING)


def ring_bytes_per_layer(hf: HFConfig, dtype_bytes: int) -> int:
    """One window layer's ring: K and V of the window's tokens."""
    return 2 * int(hf.sliding_window or 0) * hf.num_kv_heads * hf.head_dim * dtype_bytes


def _raw_int(hf: HFConfig, key: str) -> int:
    try:
        return int(hf.raw[key])
    except KeyError:
        raise CheckpointError(f"{hf.path / 'config.json'}: required field {key!r} is missing") from None


def state_bytes_per_layer(hf: HFConfig, dtype_bytes: int) -> int:
    """One linear-attention layer's recurrent state: conv window [2*Hk*dk + H*dv, K-1] in the model dtype and the
    delta-rule state [H, dk, dv] in float32."""
    hk, h = _raw_int(hf, "linear_num_key_heads"), _raw_int(hf, "linear_num_value_heads")
    dk, dv = _raw_int(hf, "linear_key_head_dim"), _raw_int(hf, "linear_value_head_dim")
    k = _raw_int(hf, "linear_conv_kernel_dim")
    return (2 * hk * dk + h * dv) * (k - 1) * dtype_bytes + h * dk * dv * SSM_BYTES


def model_bytes(
    hf: HFConfig, dtype_bytes: int, full_attention_interval: int | None = None, window_ring: bool = False
) -> ModelBytes:
    """The bytes of every cache kind of this model in a ``dtype_bytes``-byte compute dtype. ``window_ring``: the
    family keeps its sliding layers' KV as a ring per request (a state), not in KV pages."""
    kv_layers, linear = layer_counts(hf, full_attention_interval)
    rings = ring_layer_count(hf) if window_ring else 0
    kv_layers -= rings
    if is_gemma4(hf):  # KV-shared layers keep nothing: they read an earlier layer's KV
        g = gemma4_config(hf)
        kv_layers, rings = len(g.kv_layers(FULL)), len(g.kv_layers(SLIDING))
    geo = kv_geometry(hf)
    kv = geo.elements(kv_layers) * dtype_bytes
    entries = tuple((m, w * dtype_bytes) for m, w in geo.layer_entries)
    state = linear * state_bytes_per_layer(hf, dtype_bytes) if linear else 0
    state += rings * ring_bytes_per_layer(hf, dtype_bytes)
    acts = 2 * hf.hidden_size * dtype_bytes
    if hf.architecture == "DeepseekV4ForCausalLM":  # its residual is hc_mult streams (the normed input is not kept)
        state += sum(n * w for n, w in v4_state_rings(hf)) * dtype_bytes
        acts = max(2, int(hf.raw.get("hc_mult", 4))) * hf.hidden_size * dtype_bytes
    return ModelBytes(kv_layers, linear, kv, state, acts, rings, entries)
