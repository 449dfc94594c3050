"""The transformers oracle: greedy continuations with logits and router margins (near-tie rule, DESIGN §8);
DeepSeek-V4's router and indexer margins (``margins``)."""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

LOGIT_MARGIN = 1e-3
ROUTER_MARGIN = 1e-4
INDEX_MARGIN = 1e-4


@dataclass
class RefRun:
    prompt: list[int]
    tokens: list[int]  # greedy continuation
    prompt_logits: torch.Tensor  # [n, V] float32
    min_logit_margin: float  # smallest top1 - top2 over the generated steps
    min_router_margin: float  # smallest k-th minus (k+1)-th router prob over all tokens and MoE layers


def _top2_margin(x: torch.Tensor) -> torch.Tensor:
    top = torch.topk(x, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


# transformers binds these to an installed kernel package (fla, causal-conv1d) when it imports one, its own torch
# function otherwise; the oracle is the torch function (fla's kernels do not run on the CPU and multiply in TF32).
KERNEL_FUNCTIONS = {"chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule",
                    "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update",
                    "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"}


@contextlib.contextmanager
def torch_ops(model: Any) -> Iterator[None]:
    """While inside: ``model``'s modeling modules and layers call transformers' torch functions in place of any
    kernel package's (``inspect.unwrap`` of what they are bound to)."""
    owners: list[Any] = [sys.modules[type(m).__module__] for m in model.modules()] + list(model.modules())
    saved: list[tuple[Any, str, Any]] = []
    for owner in {id(o): o for o in owners}.values():
        for name in KERNEL_FUNCTIONS & set(vars(owner)):
            fn = vars(owner)[name]
            if callable(fn) and inspect.unwrap(fn) is not fn:
                saved.append((owner, name, fn))
                setattr(owner, name, inspect.unwrap(fn))
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


@torch.no_grad()
def reference_greedy(model, prompt: list[int], steps: int, top_k: int | None = None) -> RefRun:
    with torch_ops(model):
        return _reference_greedy(model, prompt, steps, top_k)


def _reference_greedy(model, prompt: list[int], steps: int, top_k: int | None) -> RefRun:
    ids = list(prompt)
    first_logits = None
    margins = []
    for _ in range(steps):
        out = model(torch.tensor([ids]), use_cache=False)
        logits = out.logits[0].float()
        if first_logits is None:
            first_logits = logits
        margins.append(float(_top2_margin(logits[-1])))
        ids.append(int(torch.argmax(logits[-1])))
    router_margin = float("inf")
    if top_k:
        out = model(torch.tensor([ids[:-1]]), use_cache=False, output_router_logits=True)
        sigmoid = sigmoid_routers(model)
        for i, rl in enumerate(out.router_logits):
            if sigmoid:
                bias, n_group, topk_group = sigmoid[i]
                router_margin = min(router_margin, sigmoid_router_margin(rl, bias, top_k, n_group, topk_group))
                continue
            probs = torch.softmax(rl.float().reshape(-1, rl.shape[-1]), dim=-1)
            top = torch.topk(probs, top_k + 1, dim=-1).values
            router_margin = min(router_margin, float((top[:, top_k - 1] - top[:, top_k]).min()))
    assert first_logits is not None
    return RefRun(prompt, ids[len(prompt):], first_logits, min(margins), router_margin)


def fp4_logit_rel() -> float:
    """``assert_close_logits``' relative tolerance for FP4 experts run by the C++ kernel on this machine: its AVX2 and
    AVX-512 paths dot int16 operand blocks (``quantize_q16i``: 3-6e-5 of a product's max each; 1.1-2.4e-4 of the
    logits' max after the tiny gpt-oss's and DeepSeek-V4's layers), the AVX512-BF16 path a bf16 hi/lo split (~5e-6),
    whichever ISA the engine takes for FP4 banks here (``auto_isa``: the AVX-512 integer path on Intel cores with
    AVX-512, the best ISA elsewhere)."""
    from freetoken.experts.cpu.defaults import auto_isa
    from freetoken.experts.cpu.kernel import CpuExpertKernel, load_library

    if load_library() is None:
        return 1e-4  # the torch reference path
    isa = auto_isa(True)
    if isa == "auto":
        kern = CpuExpertKernel(num_threads=1)
        isa = kern.isa
        kern.close()
    return 5e-4 if isa in ("avx2", "avx2vnni", "avx512", "avx512vbmi") else 1e-4


def assert_close_logits(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4) -> None:
    tol = rel * max(1.0, float(ref.abs().max()))
    err = float((ours - ref).abs().max())
    assert err <= tol, f"logits differ by {err:.3g} > {tol:.3g}"


def sigmoid_routers(model: Any) -> list[tuple[torch.Tensor, int, int]]:
    """A sigmoid-routed model's MoE layers in order: (correction bias, n_group, topk_group); [] for softmax routing.
    The bias sits on the router (GLM, DeepSeek-V3) or on the MoE block (MiniMax-M2)."""
    found = []
    for m in model.modules():
        bias = dict(m.named_buffers(recurse=False)).get("e_score_correction_bias")
        if bias is not None:
            found.append((bias, int(getattr(m, "num_group", 1)), int(getattr(m, "topk_group", 1))))
    return found


def sigmoid_router_margin(logits: torch.Tensor, bias: torch.Tensor, top_k: int, n_group: int = 1,
                          topk_group: int = 1) -> float:  # fmt: skip
    """The near-tie rule for sigmoid routing with a correction bias and group limits (DESIGN §8, extended): the
    smallest gap a choice depends on, over tokens: the k-th minus the (k+1)-th biased score inside the chosen groups,
    and, where groups limit the choice, the ``topk_group``-th minus the next group score."""
    choice = logits.float().reshape(-1, logits.shape[-1]).sigmoid() + bias.float()
    T, E = choice.shape
    margin = float("inf")
    if n_group > 1 and topk_group < n_group:
        groups = choice.view(T, n_group, E // n_group).topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
        top = groups.topk(topk_group + 1, dim=-1)
        margin = float((top.values[:, topk_group - 1] - top.values[:, topk_group]).min())
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, top.indices[:, :topk_group], True)
        choice = choice.view(T, n_group, -1).masked_fill(~keep.unsqueeze(-1), float("-inf")).view(T, E)
    if top_k < E:
        top = choice.topk(top_k + 1, dim=-1).values
        gap = top[:, top_k - 1] - top[:, top_k]
        margin = min(margin, float(gap[torch.isfinite(gap)].min()) if bool(torch.isfinite(gap).any()) else margin)
    return margin


@torch.no_grad()
def margins(model: Any, ids: list[int]) -> tuple[float, float]:
    """(router, indexer) near-tie margins of transformers' forward over ``ids`` (DESIGN §8): the k-th minus the
    (k+1)-th biased score of every score-routed token; the last kept minus the first dropped indexer score of every
    query that sees more entries than it keeps."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Indexer, DeepseekV4TopKRouter

    router, index = float("inf"), float("inf")
    hooks = []

    def on_router(mod: Any, args: Any, out: Any) -> None:
        nonlocal router
        scores = mod.score_fn(out[0].float()) + mod.e_score_correction_bias
        top = scores.topk(mod.top_k + 1, dim=-1).values
        router = min(router, float((top[:, -2] - top[:, -1]).min()))

    seen: list[torch.Tensor] = []
    topk = torch.Tensor.topk

    def record(self: torch.Tensor, *a: Any, **kw: Any) -> Any:
        if self.dim() == 3 and self.shape[1] == len(ids) and recording:
            seen.append(self.clone())
        return topk(self, *a, **kw)

    for m in model.modules():
        if isinstance(m, DeepseekV4TopKRouter):
            hooks.append(m.register_forward_hook(on_router))
    recording = False

    def pre(mod: Any, args: Any) -> None:
        nonlocal recording
        recording = True

    def post(mod: Any, args: Any, out: Any) -> None:
        nonlocal recording
        recording = False

    for m in model.modules():
        if isinstance(m, DeepseekV4Indexer):
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    torch.Tensor.topk = record  # type: ignore[method-assign]
    try:
        with torch_ops(model):
            model(torch.tensor([ids]), use_cache=False)
    finally:
        torch.Tensor.topk = topk  # type: ignore[method-assign]
        for h in hooks:
            h.remove()
    k = model.config.index_topk
    for scores in seen:
        for row in scores[0]:
            ok = row[torch.isfinite(row)].sort(descending=True).values
            if ok.numel() > k:
                index = min(index, float(ok[k - 1] - ok[k]) / max(1.0, float(ok.abs().max())))
    return router, index


def float32_llm(d: Any, backend: str = "auto", cache: float | None = None, fill: float | None = None,
                device: str = "cpu", **kw: Any) -> Any:  # fmt: skip
    """The engine on a reference test's checkpoint ``d``, in float32 (the oracle's precision): ``backend`` with its
    expert-cache share ``cache`` and fill fraction ``fill``."""
    from freetoken import LLM

    return LLM(model=str(d), device=device, dtype="float32", moe_backend=backend, expert_cache=cache,
               fill_fraction=fill, **kw)  # fmt: skip


def check_reuse_after_an_edit(llm: Any, reference: Any, history: list[int], at: int, params: Any) -> None:
    """``history``, then ``history`` with token ``at`` changed, through ``llm`` (page size ``S``): the second reuses
    the pages before the edit's and prefills the rest; both continue as ``reference(prompt)`` does."""
    S = llm.engine.config.page_size
    edited = list(history)
    edited[at] = (edited[at] + 1) % 500 + 3
    first = llm.generate([history], params)[0].token_ids
    before = llm.stats()
    out = llm.generate([edited], params)[0].token_ids
    after = llm.stats()
    assert after["prefix_tokens_reused"] - before["prefix_tokens_reused"] == at // S * S
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(edited) - at // S * S
    assert first == reference(history).tokens
    assert out == reference(edited).tokens
    llm.check_integrity()


def check_preemption_keeps_tokens(llm: Any, refs: list[RefRun], params: Any) -> None:
    """Every reference prompt at once through ``llm`` (a KV pool too small for them): requests are preempted and
    resumed, and each gives the reference's tokens."""
    outs = llm.generate([r.prompt for r in refs], params)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    assert llm.stats()["preemptions"] > 0
    llm.check_integrity()


def check_scoring(llm: Any, refs: list[RefRun], full: list[torch.Tensor], chunks: tuple[int, ...] = (1, 7),
                  layer_major: int | Callable[[int], list[int]] = 7) -> None:  # fmt: skip
    """Each reference's logits (``full``: at every position of prompt + continuation) through ``llm.engine.score``:
    the prompt alone, then prompt + continuation in chunks of each size in ``chunks`` (1: every step a decode step)
    and layer by layer in chunks of ``layer_major`` (a size, or a function of the length giving the sizes)."""
    for r, ref in zip(refs, full):
        assert_close_logits(llm.engine.score(r.prompt), ref[: len(r.prompt)])
        seq = r.prompt + r.tokens
        for chunk in chunks:
            assert_close_logits(llm.engine.score(seq, chunk=chunk), ref)
        cut = layer_major(len(seq)) if callable(layer_major) else layer_major
        assert_close_logits(llm.engine.score(seq, chunk=cut, layer_major=True), ref)
    llm.check_integrity()


def check_batched_greedy(llm: Any, refs: list[RefRun], params: Any) -> None:
    """Every reference prompt at once (chunked prompts sharing steps with decode rows under the engine's step
    budget), then the last alone in pages the batch used: the references' tokens, and every page free after."""
    outs = llm.generate([r.prompt for r in refs], params)
    assert [o.token_ids for o in outs] == [r.tokens for r in refs]
    assert llm.generate([refs[-1].prompt], params)[0].token_ids == refs[-1].tokens
    llm.check_integrity()
    assert llm.stats()["kv_pages_used"] == 0
