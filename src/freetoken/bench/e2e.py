"""End-to-end decode tok/s through the engine (the whole model: attention, MoE, sampling), beside the
MoE layers alone on the same backend in the same process.

``ft bench e2e`` (``python -m freetoken.bench.e2e``). Writes (or reuses) a synthetic checkpoint
(``e2e_checkpoint.py``) whose ``qwen3-30b-a3b`` preset is the model of ``bench/gpu/make_gguf.py`` (32 heads, 4 KV
heads, head dim 128, vocab 32000; every layer real; ``qwen3.6-35b-a3b``: its own hybrid layers, 3 gated DeltaNet
to 1 gated attention, and shared expert, vocab 32000; ``gpt-oss-20b``: gpt-oss itself, MXFP4 experts as shipped,
sinks, windows and its own vocabulary, ``synthetic_gpt_oss.py``; the frontier presets their own families;
``kimi-linear``: KDA and NoPE MLA layers, ``synthetic_kimi.py``; ``gemma-4``: sliding / full layers, the MLP beside
the experts, ``synthetic_gemma4.py``), or takes ``--model DIR`` (``--model default``: the embedded model).
Per CPU-thread count, policy and batch size: B requests with random prompts decode
greedily through ``LLM``'s engine; the timed tokens are those after a warm-up (which includes the CUDA
graph captures). ``--prefill`` / ``--itl-prompt``: time to first token of long prompts and running streams'
inter-token latency beside a long prefill (``e2e_prefill.py``; ``--no-decode`` leaves the decode rows out). The
MoE-only figure drives the same backend with ``ft bench decode``'s step (routing
from a synthetic router, or the same trace). ``--transformers``: transformers' own ``generate`` on the
same checkpoint, interleaved (CPU). Every decode row is held to BENCH.md's bandwidth bound (``e2e_bound.py``,
``bound.py``); ``--peer-llama-cpp BIN GGUF``: llama-bench alternating with the batch-1 rows (``llama_peer.py``).

    python -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 \
        --policies fused,offload,hybrid --cpu-threads 6,16 --batch 1,4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from freetoken.bench import e2e_bound, e2e_prefill, llama_peer, routing_trace
from freetoken.bench.e2e_checkpoint import checkpoint
from freetoken.bench.e2e_row import BoundBandwidths, Row
from freetoken.bench.placements import PLACEMENTS, register
from freetoken.bench.presets import PRESETS, MoEShape
from freetoken.config import FLAGS, EngineConfig, Flag, add_config_args, config_kwargs

# the engine's settings this command passes on as they are (``--overlap``: overlap_steps)
ENGINE_FLAGS = ("device", "dtype", "expert_cache", "max_batched_tokens", "prefill_order", "prefill_interleave_ms",
                "overlap_steps")  # fmt: skip
ENGINE_DEFAULTS = {"expert_cache": 0.25, "prefill_interleave_ms": None}  # None: the engine's
def decode_tok_s(
    llm: Any, batch: int, prompt: int, tokens: int, warmup: int, seed: int, temperature: float = 0.0,
    timed: list[dict[str, Any]] | None = None, top_k: int = 0, top_p: float = 1.0,
) -> float:
    """Generated tokens per second of ``batch`` concurrent requests, after ``warmup`` tokens each: greedy, or
    sampled at ``temperature`` (seeded: a random-weight model then emits varied tokens, as llama-bench feeds
    random tokens, where greedy decoding repeats a few tokens and so their experts), with ``top_k`` and ``top_p``
    cuts when given (Qwen's recommended 20 and 0.8). ``timed``: gets the
    ``LLM.stats()`` and the per-layer counts (``e2e_bound.snapshot``) before and after the timed tokens (outside
    the timing)."""
    from freetoken.runner.sampling_params import SamplingParams

    eng = llm.engine
    vocab = eng.hf.vocab_size
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=warmup + tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            ignore_eos=True, seed=seed)  # fmt: skip
    for b in range(batch):
        ids = torch.randint(3, vocab, (prompt,), generator=g).tolist()
        eng.add_request(f"bench-{seed}-{b}", ids, params)
    produced: dict[str, int] = {}
    while min(produced.values(), default=0) < warmup or len(produced) < batch:
        for out in eng.step():
            produced[out.request_id] = produced.get(out.request_id, 0) + len(out.new_token_ids)
    _sync(eng.device)
    before = e2e_bound.snapshot(llm) if timed is not None else {}
    t0, n = time.perf_counter(), 0
    while eng.has_unfinished():
        for out in eng.step():
            n += len(out.new_token_ids)
    _sync(eng.device)
    elapsed = time.perf_counter() - t0
    if timed is not None:
        timed += [before, e2e_bound.snapshot(llm)]
    return n / elapsed


@torch.inference_mode()
def moe_only_tok_s(llm: Any, batch: int, steps: int, trace: str | None, seed: int) -> float | None:
    """The same backend driven by ``ft bench decode``'s step: MoE layers alone, no attention."""
    from freetoken.bench.decode import decode_step
    from freetoken.bench.synthetic import SyntheticRouter, TraceRouter

    backend = llm.engine.setup.loaded.backend
    hf = llm.engine.hf
    if backend is None:
        return None
    layers = len(hf.moe_layer_ids)
    shape = MoEShape("checkpoint", hf.hidden_size, hf.moe_intermediate_size, hf.num_experts, hf.top_k, layers)
    dev, dtype = llm.engine.device, llm.engine.dtype
    router: Any = (
        TraceRouter(trace, shape, layers, batch, dev) if trace else SyntheticRouter(shape, layers, dev, dtype, seed)
    )
    g = torch.Generator(device=dev).manual_seed(seed)
    xs = [torch.randn(batch, shape.hidden, generator=g, device=dev).to(dtype) for _ in range(8)]
    for i in range(max(8, steps // 4)):
        decode_step(backend, router, layers, xs[i % 8])
    _sync(dev)
    t0 = time.perf_counter()
    for i in range(steps):
        decode_step(backend, router, layers, xs[i % 8])
    _sync(dev)
    return steps * batch / (time.perf_counter() - t0)


def transformers_tok_s(path: Path, tokens: int, prompt: int, seed: int) -> float:
    """transformers' own greedy ``generate`` on the CPU, batch 1 (the dev box's peer)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (1, prompt), generator=g)
    kw: dict[str, Any] = {"do_sample": False, "min_new_tokens": tokens, "pad_token_id": 0}
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, **kw | {"min_new_tokens": 4})
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=tokens, **kw)
    return (out.shape[1] - prompt) / (time.perf_counter() - t0)


def decode_row(
    llm: Any, path: Path, args: argparse.Namespace, policy: str, threads: int | None, batch: int,
    threads_list: list[int | None], policies: list[str], peer: list[float],
) -> Row:  # fmt: skip
    """One row of the decode table (and transformers' figure beside the first, when asked)."""
    runs: list[float] = []
    before = llm.stats()
    timed: list[dict[str, Any]] = []
    peer_ncm = _peer_n_cpu_moe(llm, before) if args.peer_llama_cpp and batch == 1 else None
    peer_runs: list[float] = []
    for rep in range(args.repeats):
        runs.append(decode_tok_s(llm, batch, args.prompt_tokens, args.tokens, args.warmup, rep, args.temperature,
                                 timed, args.top_k, args.top_p))  # fmt: skip
        if args.transformers and batch == 1 and threads is threads_list[0] and policy == policies[0]:
            peer.append(transformers_tok_s(path, args.tokens, args.prompt_tokens, rep))
        if peer_ncm is not None:
            binary, gguf = args.peer_llama_cpp
            got = llama_peer.try_peer(binary, gguf, peer_ncm, threads, args.tokens)
            peer_runs += [] if got is None else [got]
    st = {k: v - before.get(k, 0) for k, v in llm.stats().items() if isinstance(v, (int, float))}
    seen = st.get("expert_hits", 0) + st.get("expert_fills", 0) + st.get("expert_cpu_runs", 0)
    hits = st.get("expert_hits", 0) / seen if seen else None
    moe = moe_only_tok_s(llm, batch, args.moe_steps, args.routing_trace, 0) if args.moe_only else None
    after = llm.stats()
    replays = int(after.get("step_graph_replays", 0))
    reasons0 = before.get("step_graph_eager_fallback_reasons", {})
    eager = {k: int(v) - int(reasons0.get(k, 0)) for k, v in after.get("step_graph_eager_fallback_reasons", {}).items()}
    r = Row(policy, threads, batch, statistics.median(runs), moe, replays, runs, hits,
            len(llm.engine.hf.moe_layer_ids), str(llm.stats().get("moe_backend", "")),
            expert_bytes=e2e_bound.expert_bytes_of(llm), peer_runs=peer_runs, peer_n_cpu_moe=peer_ncm,
            prefetched=int(st.get("expert_prefetches", 0)),
            eager_steps={k: v for k, v in eager.items() if v})  # fmt: skip
    for b, a in zip(timed[::2], timed[1::2]):
        for k, v in e2e_bound.timed_counts(b, a).items():
            r.counts[k] = r.counts.get(k, 0) + v
        for k, vs in e2e_bound.timed_layer_counts(b, a).items():
            r.layer_counts[k] = [x + y for x, y in zip(r.layer_counts.get(k, [0] * len(vs)), vs)]
    shown = [round(x, 1) for x in runs]
    print(f"#   threads {threads} {policy} batch {batch}: e2e {r.e2e_tok_s:.1f} tok/s {shown}, "
          f"MoE only {moe or 0:.1f}", file=sys.stderr, flush=True)  # fmt: skip
    return r


def _peer_n_cpu_moe(llm: Any, stats: dict[str, Any]) -> int:
    hf = llm.engine.hf
    layers = len(hf.moe_layer_ids)
    share = llama_peer.gpu_share(stats, str(stats.get("moe_backend", "")), layers, hf.num_experts)
    return llama_peer.n_cpu_moe_for(share, layers)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _load(
    path: Path, args: argparse.Namespace, dev: str, dtype: str, policy: str, threads: int | None, batches: list[int]
) -> Any:
    from freetoken import LLM

    llm = LLM(str(path), **config_kwargs(EngineConfig, args) | dict(
        device=dev, dtype=dtype, moe_backend=policy, cpu_threads=threads,
        max_running_requests=max(*batches, args.itl_streams + 1),
        cuda_graphs=args.cuda_graphs, moe_cuda_graphs=args.cuda_graphs,
    ))  # fmt: skip
    if args.routing_trace:
        routing_trace.install(llm, args.routing_trace)
    return llm


def _close(llm: Any) -> None:
    close = getattr(llm.engine.setup.loaded.backend, "close", None)
    if close is not None:
        close()


def _fused_tok_s(path: Path, args: argparse.Namespace, dev: str, dtype: str, batches: list[int]) -> dict[int, float]:
    """One short fused run per batch (T_gpu of the bound when the command has no fused rows)."""
    llm = _load(path, args, dev, dtype, "fused", None, batches)
    try:
        return {b: decode_tok_s(llm, b, args.prompt_tokens, args.tokens, args.warmup, 0, args.temperature, None,
                                args.top_k, args.top_p) for b in batches}  # fmt: skip
    finally:
        _close(llm)
        del llm


def run(args: argparse.Namespace) -> int:
    register()  # the placements, when a policy names one
    path = checkpoint(args)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if dev == "cuda" else "float32")
    batches = [int(b) for b in str(args.batch).split(",")]
    threads_list: list[int | None] = [int(t) for t in str(args.cpu_threads).split(",")] if args.cpu_threads else [None]
    policies = [p for p in args.policies.split(",") if p]
    routing = args.routing_trace or "from the model"
    print(f"# {path.name}: {dev} {dtype}; cache {args.expert_cache}; routing {routing}; {args.tokens} timed "
          f"tokens per request after {args.warmup}; medians of {args.repeats}", flush=True)  # fmt: skip
    rows: list[Row] = []
    peer: list[float] = []
    seen_bw: dict[Any, BoundBandwidths] = {}
    ttft: list[Any] = []
    itl: list[Any] = []
    lengths = [int(n) for n in str(args.prefill).split(",")] if args.prefill else []
    for threads in threads_list:
        for policy in policies:
            llm = _load(path, args, dev, dtype, policy, threads, batches)
            try:
                for batch in batches if args.decode else []:
                    rows.append(decode_row(llm, path, args, policy, threads, batch, threads_list, policies, peer))
                    if args.bound and rows[-1].backend != "fused":
                        rows[-1].bandwidths = e2e_bound.bandwidths(args, llm, threads, seen_bw)
                if lengths:
                    ttft += e2e_prefill.ttft_rows(llm, policy, lengths, args.repeats)
                if args.itl_prompt:
                    itl.append(e2e_prefill.itl_row(llm, policy, args.itl_prompt, args.itl_streams,
                                                   args.itl_solo_tokens, 0))  # fmt: skip
            finally:
                _close(llm)
                del llm
    if rows and args.bound:
        e2e_bound.bound_rows(rows, args, lambda bs: _fused_tok_s(path, args, dev, dtype, bs))
    if rows:
        print("| threads | policy | batch | end to end tok/s (runs) | MoE layers alone tok/s | e2e / MoE-only "
              "| step graph replays | expert hit rate | bound tok/s | e2e / bound |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            runs_s = ", ".join(f"{x:.1f}" for x in r.runs)
            moe_s = f"{r.moe_tok_s:.1f}" if r.moe_tok_s else "–"
            ratio = f"{r.ratio:.2f}" if r.ratio else "–"
            hit = "–" if r.hit_rate is None else f"{r.hit_rate:.2f}"
            print(f"| {r.threads or 'default'} | {r.policy} | {r.batch} | {r.e2e_tok_s:.1f} ({runs_s}) | {moe_s} "
                  f"| {ratio} | {r.graph_cell()} | {hit} | {e2e_bound.cells(r)} |")  # fmt: skip
    for r in rows:  # models whose first layers route by token id (DeepSeek-V4): the prefetch's effect, per layer
        per_layer = r.layer_misses_per_step()
        if r.prefetched and per_layer:
            print(f"# {r.policy} batch {r.batch}: {r.prefetched} experts filled ahead; misses per step by MoE layer: "
                  + " ".join(f"{m:.2f}" for m in per_layer))  # fmt: skip
    llama_peer.print_table(rows)
    e2e_prefill.print_tables(ttft, itl)
    if peer:
        ours = statistics.median(next(r for r in rows if r.batch == 1).runs)
        theirs = statistics.median(peer)
        print(f"transformers generate, batch 1: {theirs:.1f} tok/s ({', '.join(f'{x:.1f}' for x in peer)}); "
              f"ours / transformers {ours / theirs:.2f}x")  # fmt: skip
    if args.json:
        out = {"rows": [asdict(r) for r in rows], "transformers": peer, "ttft": [asdict(r) for r in ttft],
               "itl": [asdict(r) for r in itl]}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS), help="per-layer model shape")
    p.add_argument("--layers", type=int, default=None,
                   help="layers of the synthetic checkpoint (default: the preset's, 12 for most)")  # fmt: skip
    p.add_argument("--model", default=None, help="a checkpoint directory instead ('default': the embedded model)")
    p.add_argument("--dir", default=None, help="where the synthetic checkpoint is written (default: the cache)")
    p.add_argument("--policies", default="fused,offload,hybrid",
                   help=f"comma-separated MoE backends (or placements: {', '.join(PLACEMENTS)})")  # fmt: skip
    p.add_argument("--cpu-threads", default=None, help="CPU expert threads; a comma list runs each in turn")
    p.add_argument("--batch", default="1,4", help="concurrent requests; a comma list")
    p.add_argument("--tokens", type=int, default=64, help="timed tokens per request")
    p.add_argument("--warmup", type=int, default=16, help="untimed tokens per request first")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy; > 0: seeded sampling (varied tokens, so varied routing, on random weights)")
    p.add_argument("--top-k", type=int, default=0, help="sampled rows' top-k (0: none; Qwen recommends 20)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampled rows' top-p (1: none; Qwen recommends 0.8)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--routing-trace", default=None, help="replay [tokens, layers, k] uint8 routing (.npy)")
    p.add_argument("--moe-only", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the MoE layers alone on the same backend")  # fmt: skip
    p.add_argument("--moe-steps", type=int, default=128)
    p.add_argument("--transformers", action="store_true", help="also time transformers' generate (batch 1)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--json", default=None)
    p.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True, help="the decode rows")
    p.add_argument("--peer-llama-cpp", nargs=2, metavar=("BIN", "GGUF"), default=None,
                   help="alternate each batch-1 row's runs with llama-bench BIN on GGUF (llama_peer.py)")
    e2e_bound.add_arguments(p)
    e2e_prefill.add_arguments(p)
    add_config_args(p, EngineConfig, only=ENGINE_FLAGS, defaults=ENGINE_DEFAULTS, flags=FLAGS | {
        "overlap_steps": Flag(name="--overlap"),
    })  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="ft bench e2e", description=__doc__.split("\n")[0]))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
