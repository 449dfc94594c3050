"""DeepSeek sparse attention's CUDA paths against the torch path they replace, at GLM-5's shapes (64 heads, latent
512 + rope 64, indexer 32 heads of 128, top-2048; bf16 cache): a decode step's selection (``decode_selection`` vs
``decode_selection_triton``: the indexer's scores and top-k) at contexts of 8k / 32k / 128k tokens, batch 1 and 4; one
layer's prefill of a new chunk (selection + sparse attention: ``prefill_selection`` + ``dsa_prefill_reference`` vs
``prefill_selection_triton`` + ``dsa_prefill_triton``). A decode step in a graph captured at ``max_model_len``'s page
table scored every position it reaches: the 128k row is that cost for a 128k limit, whatever the context (the step
graphs per page-table width, ``runner/step_graph.py``, bound it by twice the context). Milliseconds, medians of 5
(decode: of 20 calls each). Prints a markdown table. ``PYTHONPATH=src python bench/gpu/dsa_time.py``"""

from __future__ import annotations

from collections.abc import Callable

import torch
from event_time import median_ms

from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.kernels.attention.dsa_reference import decode_selection, dsa_prefill_reference, prefill_selection
from freetoken.kernels.attention.dsa_triton import (
    decode_selection_triton,
    dsa_prefill_triton,
    prefill_selection_triton,
)

H, R, DR, HI, DI, TOPK, PAGE = 64, 512, 64, 32, 128, 2048, 16
L = R + DR


def _ms(fn: Callable[[], object], calls: int = 1, repeats: int = 5) -> float:
    def run() -> None:
        for _ in range(calls):
            fn()

    return median_ms(run, repeats) / calls


def _pool(B: int, ctx: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 cache of B sequences of ``ctx`` tokens, pages in random order."""
    pages = -(-ctx // PAGE)
    cache = torch.randn((B * pages * PAGE, 1, L + DI), device=dev).bfloat16()
    table = torch.randperm(B * pages, device=dev).view(B, pages).to(torch.int32)
    return cache, table


def _decode(cache: torch.Tensor, meta: DecodeMeta, iq: torch.Tensor, iw: torch.Tensor) -> tuple[float, float]:
    ref = _ms(lambda: decode_selection(cache, meta, L, iq, iw, TOPK), calls=20)
    tri = _ms(lambda: decode_selection_triton(cache, meta, L, iq, iw, TOPK), calls=20)
    return ref, tri


def decode_rows(dev: torch.device) -> list[str]:
    rows = []
    for ctx in (8192, 32768, 131072):
        for B in (1, 4):
            cache, table = _pool(B, ctx, dev)
            meta = DecodeMeta(table.long(), torch.full((B,), ctx, dtype=torch.int64, device=dev), PAGE)
            iq, iw = torch.randn((B, HI, DI), device=dev).bfloat16(), torch.randn((B, HI), device=dev)
            ref, tri = _decode(cache, meta, iq, iw)
            rows.append(f"| decode selection | {ctx:,} | {B} | {ref:.3f} | {tri:.3f} | {ref / tri:.1f} |")
    return rows


def _prefill(cache: torch.Tensor, meta: PrefillMeta, q: torch.Tensor, iq: torch.Tensor, iw: torch.Tensor
             ) -> tuple[float, float]:  # fmt: skip
    def ref() -> object:
        return dsa_prefill_reference(q, cache, prefill_selection(cache, meta, L, iq, iw, TOPK, H), 0.07, R)

    def tri() -> object:
        return dsa_prefill_triton(q, cache, prefill_selection_triton(cache, meta, L, iq, iw, TOPK, H), 0.07, R)

    return _ms(ref, repeats=3), _ms(tri, repeats=3)


def prefill_rows(dev: torch.device, cases: tuple[tuple[int, int], ...] = ((8192, 8192), (32768, 2048))) -> list[str]:
    rows = []
    for ctx, n in cases:
        cache, table = _pool(1, ctx, dev)
        meta = PrefillMeta(*(torch.tensor([v], dtype=torch.int32, device=dev) for v in (0, n, ctx)), table, PAGE, n)
        q = torch.randn((n, H, L), device=dev).bfloat16()
        iq, iw = torch.randn((n, HI, DI), device=dev).bfloat16(), torch.randn((n, HI), device=dev)
        a, b = _prefill(cache, meta, q, iq, iw)
        rows.append(f"| prefill (selection + attention) | {ctx:,} ({n:,} new) | 1 | {a:.1f} | {b:.1f} | {a / b:.1f} |")
    return rows


def main() -> None:
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)}; GLM-5's DSA: {H} heads, latent {R} + {DR}, indexer {HI} x {DI}, "
          f"top-{TOPK}, bf16, pages of {PAGE}")  # fmt: skip
    table = ["| path | context | batch | torch ms | Triton ms | torch / Triton |", "|---|---|---|---|---|---|"]
    table += decode_rows(dev)
    table += prefill_rows(dev)
    print("\n".join(table))


if __name__ == "__main__":
    main()
