"""Start-up: time to the first token from process start, safetensors vs FTW, beside the raw O_DIRECT read of the
same bytes in the same run; peak RSS against the pool plus the non-expert weights.

``ft bench load`` (``python -m freetoken.bench.ftw_load``). Writes (or reuses) ``ft bench e2e``'s synthetic
checkpoint (``--preset``, ``--layers``, ``--dir``; or ``--model DIR``) and its FTW form beside it (``--ftw``).
Each repeat runs, in turn and with the page cache of every file of both directories dropped first
(``posix_fadvise(DONTNEED)``, no root needed): the raw read (every file of the FTW directory, O_DIRECT, the
loader's threads and chunk size, into reused buffers: the floor), then a fresh process per format that imports
the engine, builds ``LLM(DIR)`` and generates one token (the expert backend ``auto``; FTW's checksums in the
background, as by default). Medians over ``--repeats``.

    python -m freetoken.bench.ftw_load --preset qwen3-30b-a3b --layers 12 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

_GB = 1e9


def _files(*dirs: Path) -> list[Path]:
    return [f for d in dirs for f in sorted(d.iterdir()) if f.is_file()]


def raw_read_seconds(paths: list[Path]) -> tuple[float, int]:
    """Every byte of ``paths`` read with O_DIRECT on the loader's threads and chunks, into reused buffers."""
    import threading

    import torch

    from freetoken.checkpoint.ftw_io import CHUNK, aligned_empty, byte_view, read_threads
    from freetoken.checkpoint.ftw_manifest import round_up

    local = threading.local()
    fds = {p: os.open(p, os.O_RDONLY | getattr(os, "O_DIRECT", 0)) for p in paths}
    jobs = [(p, off, min(CHUNK, round_up(p.stat().st_size) - off))
            for p in paths for off in range(0, round_up(p.stat().st_size), CHUNK)]  # fmt: skip

    def one(job: tuple[Path, int, int]) -> int:
        if not hasattr(local, "buf"):
            local.buf = aligned_empty((CHUNK,), torch.uint8)
        p, off, n = job
        return os.preadv(fds[p], [byte_view(local.buf, 0, n)], off)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(read_threads()) as pool:
        total = sum(pool.map(one, jobs))
    secs = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return secs, total


def raw_fresh_seconds(paths: list[Path]) -> float:
    """The same bytes read by the loader's reader into fresh (unfaulted) memory: the floor with page faults."""
    import torch

    from freetoken.checkpoint.ftw_io import Read, aligned_empty, byte_view, read_parts
    from freetoken.checkpoint.ftw_manifest import round_up

    t0 = time.perf_counter()
    bufs = [aligned_empty((round_up(p.stat().st_size),), torch.uint8) for p in paths]
    read_parts([Read(p, byte_view(b, 0, len(b)), p.stat().st_size) for p, b in zip(paths, bufs)])
    return time.perf_counter() - t0


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(model: str, device: str, dtype: str, backend: str, cache: float | None) -> dict[str, Any]:
    """In a fresh process: import, load, one greedy token; wall-clock timestamps and memory."""
    import torch  # noqa: F401  (the imports count in their own figure)

    import freetoken.loader.model_build as mb
    from freetoken import LLM, SamplingParams

    t_imports, base = time.time(), _rss()
    bank_read = [0.0]
    original = mb.read_ftw_banks

    def timed(*a: Any, **k: Any) -> Any:  # the FTW bank read alone
        t = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            bank_read[0] = time.perf_counter() - t

    mb.read_ftw_banks = timed
    llm = LLM(model, device=device, dtype=dtype, kv_pages=64, moe_backend=backend, expert_cache=cache)
    t_loaded = time.time()
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    t_first = time.time()
    peak = _peak_rss()
    tokens = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))[0].token_ids
    loaded = llm.engine.setup.loaded
    pool = loaded.banks.pool_bytes if loaded.banks is not None else 0
    host = _host_weight_bytes(loaded.model)
    return {"t_imports": t_imports, "t_loaded": t_loaded, "t_first": t_first, "peak_rss": peak, "base_rss": base,
            "pool_bytes": pool, "non_expert_host_bytes": host, "bank_read_s": bank_read[0],
            "backend": llm.stats().get("moe_backend"), "tokens": tokens}  # fmt: skip


def _host_weight_bytes(model: Any) -> int:
    """Bytes of the distinct CPU tensors the model's own objects hold (the expert backend, whose pool is counted
    apart, is not walked)."""
    import torch

    from freetoken.experts.base import ExpertBackend

    seen: set[int] = set()
    visited: set[int] = set()
    stack, total = [model], 0
    while stack:
        o = stack.pop()
        if id(o) in visited or isinstance(o, ExpertBackend):
            continue
        visited.add(id(o))
        if isinstance(o, torch.Tensor):
            storage = o.untyped_storage()
            if o.device.type == "cpu" and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif type(o).__module__.startswith("freetoken") and hasattr(o, "__dict__"):
            stack.extend(vars(o).values())
    return total


def _spawn(model: Path, device: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "freetoken.bench.ftw_load", "--child", str(model), "--device", device,
           "--dtype", args.dtype, "--moe-backend", args.moe_backend]  # fmt: skip
    cmd += ["--expert-cache", str(args.expert_cache)] if args.expert_cache is not None else []
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ}, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"load of {model} failed: {r.stderr[-8000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["ttft_s"] = res["t_first"] - t0
    res["load_s"] = res["t_loaded"] - res["t_imports"]
    res["imports_s"] = res["t_imports"] - t0
    return res


def run(args: argparse.Namespace) -> int:
    if args.child:
        print(json.dumps(child(args.child, args.device, args.dtype, args.moe_backend, args.expert_cache)))
        return 0
    import torch

    from freetoken.bench.e2e import checkpoint
    from freetoken.checkpoint.ftw_io import drop_page_cache
    from freetoken.checkpoint.ftw_manifest import is_ftw
    from freetoken.loader.ftw_convert import convert

    src = checkpoint(args)
    ftw = Path(args.ftw) if args.ftw else src.parent / (src.name + "-ftw")
    if not is_ftw(ftw):
        t0 = time.perf_counter()
        convert(src, ftw)
        print(f"# converted {src} -> {ftw} in {time.perf_counter() - t0:.0f} s", flush=True)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    files = _files(src, ftw)
    os.sync()
    rows: dict[str, list[dict[str, Any]]] = {"raw": [], "safetensors": [], "ftw": []}
    _spawn(ftw, device, args)  # untimed: builds the CPU expert kernel on first use, fills Python's caches
    for rep in range(args.repeats):
        for f in files:
            drop_page_cache(f)
        secs, nbytes = raw_read_seconds(_files(ftw))
        for f in files:
            drop_page_cache(f)
        rows["raw"].append({"read_s": secs, "bytes": nbytes, "fresh_s": raw_fresh_seconds(_files(ftw))})
        for name, d in (("safetensors", src), ("ftw", ftw)):
            for f in files:
                drop_page_cache(f)
            rows[name].append(_spawn(d, device, args))
        fw, st, raw = rows["ftw"][-1], rows["safetensors"][-1], rows["raw"][-1]
        print(f"# repeat {rep + 1}: raw {secs:.2f} s (into fresh memory {raw['fresh_s']:.2f} s); FTW bank read "
              f"{fw['bank_read_s']:.2f} s, load {fw['load_s']:.2f} s; to the first token: safetensors "
              f"{st['ttft_s']:.2f} s, FTW {fw['ttft_s']:.2f} s", flush=True)  # fmt: skip
    report(rows, src, ftw, device, args)
    return 0


def report(rows: dict[str, list[dict[str, Any]]], src: Path, ftw: Path, device: str, args: argparse.Namespace) -> None:
    med = statistics.median
    raw_s = med(r["read_s"] for r in rows["raw"])
    fresh_s = med(r["fresh_s"] for r in rows["raw"])
    nbytes = rows["raw"][0]["bytes"]
    print(f"# {src.name} ({nbytes / _GB:.2f} GB as FTW), {device} {args.dtype}, {args.moe_backend} cache "
          f"{args.expert_cache}; medians of {args.repeats}; page cache dropped before each; raw O_DIRECT read "
          f"{raw_s:.2f} s ({nbytes / raw_s / _GB:.2f} GB/s; into fresh memory {fresh_s:.2f} s)")  # fmt: skip
    print("| format | to first token s | imports s | load s | bank read s | load / raw | peak RSS GB | "
          "pool + non-expert GB | peak / (pool + non-expert) | (peak - imports) / (pool + non-expert) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    same = all(r["tokens"] == rows["safetensors"][0]["tokens"] for r in rows["safetensors"] + rows["ftw"])
    print(f"# 16 greedy tokens, FTW equal to safetensors: {same}; backend {rows['ftw'][0]['backend']}")
    out = {"raw_read_s": raw_s, "raw_fresh_s": fresh_s, "bytes": nbytes, "tokens_equal": same}
    for name in ("safetensors", "ftw"):
        rs = rows[name]
        weights = rs[0]["pool_bytes"] + rs[0]["non_expert_host_bytes"]
        peak = med(r["peak_rss"] for r in rs)
        base = med(r["base_rss"] for r in rs)
        load = med(r["load_s"] for r in rs)
        bank = med(r["bank_read_s"] for r in rs)
        print(f"| {name} | {med(r['ttft_s'] for r in rs):.2f} | {med(r['imports_s'] for r in rs):.2f} | {load:.2f} | "
              f"{bank:.2f} | {load / raw_s:.2f} | {peak / _GB:.2f} | {weights / _GB:.2f} | {peak / weights:.3f} | "
              f"{(peak - base) / weights:.3f} |")  # fmt: skip
        out[name] = rs
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from freetoken.bench.presets import PRESETS

    p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS), help="per-layer model shape")
    p.add_argument("--layers", type=int, default=12, help="layers of the synthetic checkpoint")
    p.add_argument("--model", default=None, help="a checkpoint directory instead of the synthetic one")
    p.add_argument("--dir", default=None, help="where the synthetic checkpoint is written (default: the cache)")
    p.add_argument("--ftw", default=None, help="its FTW directory (default: beside it, '-ftw'); converted if absent")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--moe-backend", default="auto")
    p.add_argument("--expert-cache", type=float, default=None, help="slot cache: fraction of the pool")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="ft bench load", description=__doc__.split("\n")[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
