"""DeepSeek-V4's attention kind per layer from config.json (transformers 5.23's ``DeepseekV4Config``), in one place:
pure (no torch), so the memory sizes (``memory/sizes.py``: each layer's KV row) and the model's assembly
(``models/deepseek_v4.py``) read the same kinds.

``layer_types`` names each layer's kind; older configs give ``compress_ratios`` (0 / 4 / 128, as transformers reads
them); neither: transformers' default, two heavily compressed layers, then compressed sparse / heavily compressed
alternating. Compression rates: ``compress_rates``."""

from __future__ import annotations

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
KINDS = (SLIDING, CSA, HCA)
LEGACY_RATIOS = {0: SLIDING, 4: CSA, 128: HCA}  # ``compress_ratios`` as transformers reads them


def _fail(hf: HFConfig, msg: str) -> CheckpointError:
    return CheckpointError(f"{hf.path / 'config.json'}: {msg}")


def layer_kinds(hf: HFConfig) -> tuple[str, ...]:
    """The attention kind of every layer, checked (a clear error naming ``layer_types`` / ``compress_ratios``)."""
    n = hf.num_layers
    types = hf.raw.get("layer_types")
    if types is None and hf.raw.get("compress_ratios") is not None:
        ratios = list(hf.raw["compress_ratios"])
        bad = [r for r in ratios if r not in LEGACY_RATIOS]
        if bad:
            raise _fail(hf, f"compress_ratios {bad} are compression rates the engine does not implement "
                            f"(implemented: {sorted(LEGACY_RATIOS)})")  # fmt: skip
        types = [LEGACY_RATIOS[r] for r in ratios]
    if types is None:  # transformers' default: two HCA layers, then CSA / HCA alternating
        types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    types = list(types)[:n]
    bad = [t for t in types if t not in KINDS]
    if len(types) != n or bad:
        raise _fail(hf, f"layer_types must name {n} layers among {KINDS}; got {types}")
    return tuple(types)


def compress_rates(hf: HFConfig) -> dict[str, int]:
    """The compression rate of each compressed kind (``compress_rates``; older configs: ``compress_rate_csa`` /
    ``compress_rate_hca``; neither: 4 and 128), checked."""
    rates = dict(hf.raw.get("compress_rates") or {CSA: 4, HCA: 128})
    for kind, legacy in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):
        if hf.raw.get(legacy) is not None:
            rates[kind] = hf.raw[legacy]
    for kind, rate in rates.items():
        if kind not in (CSA, HCA):
            raise _fail(hf, f"compress_rates names {kind!r}; DeepSeek-V4 compresses {CSA} and {HCA} only")
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
            raise _fail(hf, f"compression rate {rate!r} of {kind} is not implemented (an integer >= 1 is)")
    missing = sorted({k for k in layer_kinds(hf) if k != SLIDING} - set(rates))
    if missing:
        raise _fail(hf, f"compress_rates gives no rate for {missing}, a kind layer_types names")
    return rates
