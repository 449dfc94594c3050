"""Prefill tok/s with whole-layer double buffering vs on-demand fills vs serial copies, against the PCIe bound.

``ft bench prefill`` (``python -m freetoken.bench.prefill``).

A synthetic MoE stack of exact per-layer shape (``bench/presets.py``, ``--layers`` of them) runs prompts
of each ``--tokens`` length in ``--chunk``-token prefill steps, from a cold expert cache each time, under
each ``--modes`` entry:
- ``stream``: whole layers double-buffered through the slot pool (copy layer l+1 while computing l);
- ``serial``: whole layers, but a layer's copy starts only after the previous layer's compute;
- ``ondemand``: today's per-step fills (rounds of LRU victims).
The bound (BENCH.md) per chunk is ``expert_pool_bytes / B_P,layer``, with ``B_P,layer`` measured in this
process: one whole-layer pinned host->device copy into the slots. Only the routed-expert path runs (no
attention, embeddings or sampling), like ``bench/decode.py``.

    python -m freetoken.bench.prefill --preset qwen3-30b-a3b --layers 12 --tokens 1024,4096,8192,16384
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from freetoken.bench.presets import PRESETS, MoEShape, get_preset
from freetoken.bench.synthetic import SyntheticRouter, random_banks, rms_norm
from freetoken.config import EngineConfig
from freetoken.experts.backends.registry import create_backend
from freetoken.experts.backends.slot_backend import SlotBackend

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
STREAMER_MODE = {"stream": "stream", "serial": "serial", "ondemand": "off"}


@dataclass
class PrefillResult:
    mode: str
    tokens: int  # prompt length
    chunks: int
    tok_s: float
    chunk_ms: float  # mean over the prompt's chunks
    chunk_ms_each: list[float]
    pcie_gb_per_chunk: float  # streamed layers + on-demand fills
    layers_streamed: int
    bound_chunk_ms: float | None = None
    of_bound: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def layer_copy_gbps(backend: SlotBackend, repeats: int = 5) -> float:
    """B_P,layer: one whole layer (E experts, every bank) pinned pool -> slots, best of ``repeats``."""
    c, E = backend.cache, backend.pool.num_experts
    n = min(E, c.num_slots)
    pairs = [(dst[:n], src[:n]) for dst, src in zip(c.slots, c.pool.tensors)]
    dev, best = c.device, math.inf
    for _ in range(repeats + 1):  # the first is a warm-up
        _sync(dev)
        t0 = time.perf_counter()
        for dst, src in pairs:
            dst.copy_(src, non_blocking=True)
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    c.evict(list(range(c.pool.num_rows)))  # the slots were overwritten: nothing is resident
    return n * backend.pool.expert_bytes / best / 1e9


def prefill_chunk(backend: SlotBackend, router: SyntheticRouter, layers: int, x: torch.Tensor) -> None:
    """One prefill step of x [T, D] through every MoE layer (x <- rms_norm(x + moe(x)))."""
    backend.begin_step(x.shape[0], False)
    for layer in range(layers):
        ids, w = router.route(layer, x)
        x = rms_norm(x + backend.forward(layer, x, ids, w))


def run_prompt(
    backend: SlotBackend, router: SyntheticRouter, args: argparse.Namespace, n: int, g: torch.Generator
) -> tuple[list[float], dict[str, int | float], dict[str, int | float]]:
    """A cold cache, then the prompt's chunks; per-chunk seconds and the stats before and after."""
    dev, D = backend.device, backend.pool.banks.hidden_size
    backend.streamer.finish()  # the last prompt's stream is still open: close it before touching the cache
    backend.cache.evict(list(range(backend.pool.num_rows)))
    x = torch.randn(n, D, generator=g, device=dev).to(backend.dtype)
    s0 = backend.stats()
    times = []
    for start in range(0, n, args.chunk):
        _sync(dev)
        t0 = time.perf_counter()
        prefill_chunk(backend, router, args.layers, x[start : start + args.chunk])
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return times, s0, backend.stats()


def run_mode(
    mode: str, shape: MoEShape, banks: Any, args: argparse.Namespace, dev: torch.device, dtype: torch.dtype
) -> tuple[list[PrefillResult], float]:
    """Every prompt length under one mode, and B_P,layer (GB/s) measured on this backend's slots."""
    cfg = EngineConfig(moe_backend=args.backend, expert_cache=args.slots)
    backend = create_backend(cfg, banks, dev, dtype)
    if not isinstance(backend, SlotBackend):
        raise SystemExit(f"backend {backend.name!r} ran instead of {args.backend!r} (the pool could not be pinned)")
    backend.streamer.mode = STREAMER_MODE[mode]
    router = SyntheticRouter(shape, args.layers, dev, dtype, seed=args.seed)
    out: list[PrefillResult] = []
    try:
        bw = layer_copy_gbps(backend)
        g = torch.Generator(device=dev).manual_seed(args.seed)
        run_prompt(backend, router, args, min(args.chunk, min(args.token_list)), g)  # warm-up (kernels)
        eb = banks.expert_bytes
        for n in args.token_list:
            runs = sorted(
                (run_prompt(backend, router, args, n, g) for _ in range(args.repeats)), key=lambda r: sum(r[0])
            )
            times, s0, s1 = runs[len(runs) // 2]  # the median repeat (each from a cold cache)
            d = {k: s1[k] - s0[k] for k in s1 if isinstance(s1[k], (int, float))}
            copied = d.get("prefill_experts_streamed", 0) + d.get("expert_fills", 0)
            out.append(
                PrefillResult(
                    mode=mode,
                    tokens=n,
                    chunks=len(times),
                    tok_s=n / sum(times),
                    chunk_ms=sum(times) / len(times) * 1e3,
                    chunk_ms_each=[round(t * 1e3, 2) for t in times],
                    pcie_gb_per_chunk=copied * eb / len(times) / 1e9,
                    layers_streamed=int(d.get("prefill_layers_streamed", 0)),
                    stats=s1,
                )
            )
            print(f"#   {mode} {n} tokens: {out[-1].tok_s:.1f} tok/s", file=sys.stderr)
        backend.check_integrity()
    finally:
        backend.close()
    return out, bw


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS), help="per-layer model shape")
    p.add_argument("--layers", type=int, default=12, help="MoE layers to build (the preset's shape per layer)")
    p.add_argument("--tokens", default="1024,4096,8192,16384", help="comma-separated prompt lengths")
    p.add_argument("--chunk", type=int, default=2048, help="prefill chunk (tokens per step)")
    p.add_argument("--modes", "--mode", default="stream,ondemand,serial", help="comma list of stream, ondemand, serial")
    p.add_argument("--backend", default="offload", choices=["offload", "hybrid"], help="slot backend")
    p.add_argument(
        "--expert-cache", type=int, default=None, help="expert slots (default: two whole layers, 2E, the minimum)"
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=sorted(_DTYPES), help="default: bfloat16 (cuda), float32 (cpu)")
    p.add_argument("--repeats", type=int, default=1, help="runs per prompt length (each cold); the median is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    return p


def run(args: argparse.Namespace) -> int:
    shape = get_preset(args.preset)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = _DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    args.token_list = [int(t) for t in args.tokens.split(",") if t.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if bad := [m for m in modes if m not in STREAMER_MODE]:
        raise SystemExit(f"unknown modes {bad}; choose from {', '.join(STREAMER_MODE)}")
    N = args.layers * shape.experts
    args.slots = min(args.expert_cache or 2 * shape.experts, N)
    t0 = time.perf_counter()
    banks = random_banks(shape, args.layers, dtype, seed=args.seed)
    print(
        f"# {shape.name}: {args.layers} of {shape.layers} MoE layers, E={shape.experts}, top-{shape.top_k}, "
        f"expert {banks.expert_bytes / 1e6:.2f} MB, pool {banks.pool_bytes / 1e9:.2f} GB "
        f"(built in {time.perf_counter() - t0:.1f} s); {dev} {str(dtype).removeprefix('torch.')}; "
        f"{args.backend}, {args.slots} slots; chunk {args.chunk}; cold cache per prompt"
    )
    results: list[PrefillResult] = []
    bws: dict[str, float] = {}
    for mode in modes:
        rs, bws[mode] = run_mode(mode, shape, banks, args, dev, dtype)
        results += rs
    bw = max(bws.values())  # B_P,layer: the best of the per-mode measurements
    for r in results:
        r.bound_chunk_ms = banks.pool_bytes / (bw * 1e9) * 1e3  # every layer's experts over PCIe once
        r.of_bound = r.bound_chunk_ms / r.chunk_ms
    how = "pinned host -> device" if dev.type == "cuda" else "host memcpy: no PCIe on the CPU"
    per_mode = ", ".join(f"{m} {v:.1f}" for m, v in bws.items())
    print(f"# B_P,layer {bw:.2f} GB/s (one whole layer, {how}; best of the modes: {per_mode})")
    print_table(results)
    if args.json:
        meta = {
            "preset": asdict(shape), "layers": args.layers, "chunk": args.chunk, "slots": args.slots,
            "backend": args.backend, "device": str(dev), "dtype": str(dtype), "b_p_layer_gbps": bw,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": [asdict(r) for r in results]}, f, indent=2, default=str)
    return 0


def print_table(results: list[PrefillResult]) -> None:
    head = f"{'mode':<10}{'tokens':>8}{'chunks':>7}{'tok/s':>10}{'ms/chunk':>10}{'PCIe GB/chunk':>14}"
    print(head + f"{'layers streamed':>16}{'bound ms/chunk':>15}{'of bound':>9}")
    for r in results:
        bound = f"{r.bound_chunk_ms:15.1f}{r.of_bound:9.0%}" if r.bound_chunk_ms and r.of_bound else ""
        print(
            f"{r.mode:<10}{r.tokens:>8}{r.chunks:>7}{r.tok_s:10.1f}{r.chunk_ms:10.1f}{r.pcie_gb_per_chunk:14.2f}"
            f"{r.layers_streamed:>16}{bound}"
        )


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = add_arguments(argparse.ArgumentParser(prog="ft bench prefill", description=doc.split("\n")[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
