"""The synthetic checkpoint ``ft bench e2e`` (and the benches that share it) measures: ``--model DIR``, the embedded
model, or the preset's written once into the cache and reused (``--dir``: there). A preset of a family of its own
writes that family (``synthetic_gpt_oss.py``, ``synthetic_frontier.py``, ``synthetic_kimi.py``,
``synthetic_gemma4.py``, ``synthetic_dsv4.py``), the rest a Qwen3-MoE (``synthetic_checkpoint.py``; with ``hybrid``:
a Qwen3.5-MoE)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from freetoken.bench.presets import MoEShape, get_preset
from freetoken.config import env

# the peer's model (bench/gpu/make_gguf.py): attention and vocabulary of Qwen3-30B-A3B
ATTENTION = {"heads": 32, "kv_heads": 4, "hd": 128, "vocab": 32000, "max_positions": 131072}


def checkpoint(args: argparse.Namespace) -> Path:
    """The benchmark's checkpoint: --model, the embedded model, or the preset written once and reused."""
    if args.model == "default":
        from freetoken.loader.model_setup import default_model_path

        return Path(default_model_path())
    if args.model:
        return Path(args.model)
    shape = get_preset(args.preset)
    cache = Path(env().cache_dir)
    layers = args.layers or shape.e2e_layers
    # gpt-oss, Kimi-Linear and Gemma-4 presets were Qwen3-MoE-shaped under "v2": their own kinds are not reused so
    kind = "gptoss" if shape.gpt_oss else "kimi" if shape.kimi else "gemma4" if shape.gemma4 else "v2"
    kind = "dsv4" if shape.dsv4 else kind
    d = Path(args.dir) if args.dir else cache / "bench" / f"{shape.name}-{layers}layers-{kind}"
    if not (d / "model.safetensors.index.json").exists():
        t0 = time.perf_counter()
        written = _write(d, shape, layers)
        print(f"# wrote {d} ({written / 1e9:.1f} GB) in {time.perf_counter() - t0:.0f} s", flush=True)
    _check_architecture(d, shape)
    allow_positions(d, _positions_needed(args))
    return d


def _write(d: Path, shape: MoEShape, layers: int) -> int:
    """The preset's synthetic checkpoint at ``layers`` layers in ``d``; the bytes written."""
    a = ATTENTION
    if shape.gpt_oss is not None:
        from freetoken.bench.synthetic_gpt_oss import write_gpt_oss

        return write_gpt_oss(d, shape, layers, None, a["max_positions"], EMBED_STD, shape.fmt)
    if shape.frontier is not None:
        from freetoken.bench.synthetic_frontier import write_frontier

        return write_frontier(d, shape, layers, a["vocab"], a["max_positions"], EMBED_STD, shape.fmt)
    if shape.kimi is not None:
        from freetoken.bench.synthetic_kimi import write_kimi

        return write_kimi(d, shape, layers, a["max_positions"], EMBED_STD)
    if shape.dsv4 is not None:
        from freetoken.bench.synthetic_dsv4 import write_dsv4

        return write_dsv4(d, shape, layers, a["max_positions"], EMBED_STD)
    if shape.gemma4 is not None:
        from freetoken.bench.synthetic_gemma4 import write_gemma4

        return write_gemma4(d, shape, layers, a["max_positions"], EMBED_STD)
    from freetoken.bench.synthetic_checkpoint import write_qwen3_moe

    return write_qwen3_moe(
        d, num_layers=layers, hidden=shape.hidden, num_experts=shape.experts, moe_inter=shape.inter,
        vocab=a["vocab"], heads=a["heads"], kv_heads=a["kv_heads"], hd=a["hd"], top_k=shape.top_k,
        max_positions=a["max_positions"], shared_experts=True, fmt=shape.fmt, embed_std=EMBED_STD,
        hybrid=shape.hybrid,
    )  # fmt: skip


ARCHITECTURES = {"gpt_oss": "GptOssForCausalLM", "kimi": "KimiLinearForCausalLM", "gemma4": "Gemma4ForCausalLM",
                 "dsv4": "DeepseekV4ForCausalLM"}  # fmt: skip


def _check_architecture(d: Path, shape: MoEShape) -> None:
    """A checkpoint found in ``d`` (``--dir``, reused) is of the preset's family: an older Qwen3-MoE-shaped one of a
    gpt-oss, Kimi-Linear, Gemma-4 or DeepSeek-V4 preset is refused, not measured as that model."""
    want = next((arch for field, arch in ARCHITECTURES.items() if getattr(shape, field) is not None), None)
    got = json.loads((d / "config.json").read_text()).get("architectures", [None])[0]
    if want is not None and got != want:
        raise SystemExit(f"ft bench e2e: {d} holds a {got} checkpoint, not the {want} preset {shape.name} writes; "
                         "remove it or pass another --dir")  # fmt: skip


def _positions_needed(args: argparse.Namespace) -> int:
    from freetoken.bench.e2e_prefill import WARM_SUFFIX

    prefill, itl = getattr(args, "prefill", None), getattr(args, "itl_prompt", 0) or 0  # other benches' args lack them
    lengths = [int(n) for n in str(prefill).split(",")] if prefill else []
    return max([*lengths, itl, 0]) + WARM_SUFFIX + 8


def allow_positions(d: Path, positions: int) -> None:
    """A synthetic checkpoint written for a shorter context (an older preset) gets the positions the prompts need:
    only the rotary tables depend on it."""
    cfg_path = d / "config.json"
    cfg = json.loads(cfg_path.read_text())
    key = "model_max_length" if "model_max_length" in cfg else "max_position_embeddings"  # Kimi-Linear's own name
    if cfg.get(key, positions) < positions:
        cfg[key] = positions
        cfg_path.write_text(json.dumps(cfg, indent=1))
        print(f"# {d}: {key} raised to {positions}", flush=True)


# Embeddings of this scale keep each token's own part of the residual above the attention's slowly varying part:
# consecutive sampled tokens then route to nearly independent experts, as uniform routing (BENCH.md) has it; at the
# usual 0.02 a random model's deeper layers route consecutive tokens to mostly the same experts
# (docs/benchmarks.md, "the synthetic checkpoint's routing").
EMBED_STD = 1.0
