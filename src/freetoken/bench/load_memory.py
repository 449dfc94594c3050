"""Peak host memory while loading: max RSS minus RSS after imports, against the loaded weight bytes.

Run as ``python -m freetoken.bench.load_memory DIR [--dtype bfloat16]`` (a fresh process, so the
peak belongs to the load alone). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) so import-time transients do not count."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    import torch  # noqa: F401  (imports count as baseline)

    from freetoken.config import EngineConfig
    from freetoken.engine.engine import LLMEngine

    _reset_peak()
    base = _rss_bytes()
    t0 = time.perf_counter()
    eng = LLMEngine(EngineConfig(model=args.model, device="cpu", dtype=args.dtype, kv_pages=16))
    secs = time.perf_counter() - t0
    peak = _peak_bytes()
    m = eng.setup.loaded.model
    weights = sum(
        t.numel() * t.element_size()
        for t in [m.embed, m.lm_head, m.final_norm]
        + [v for layer in m.layers for v in vars(layer.attn.w).values() if v is not None]
        + [layer.attn_norm for layer in m.layers] + [layer.ffn_norm for layer in m.layers]
    )
    weights += sum(
        t.numel() * t.element_size()
        for layer in m.layers
        for t in vars(layer.ffn).values()
        if hasattr(t, "numel") and layer.ffn is not None
    )
    banks = eng.setup.loaded.banks
    if banks is not None:
        weights += banks.gate_up.numel() * banks.gate_up.element_size() + banks.down.numel() * banks.down.element_size()
    print(json.dumps({"weights_bytes": weights, "peak_minus_base": peak - base,
                      "ratio": (peak - base) / weights, "load_seconds": round(secs, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
