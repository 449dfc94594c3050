"""The lightning indexer's Triton decode scores (``kernels/attention/index_triton.py``) against the torch reference
(``dsa_reference.index_scores`` over the keys gathered through the page table): DSA's addressing (a key per token)
and DeepSeek-V4's (an entry per m tokens, R rows a page, m below and above the page size); head counts and dims that
are not powers of two; sequences that see no key, a few, and every one the table reaches; -inf exactly past each
one's visible keys. Triton's interpreter on the CPU (float32: exact products), the kernel itself on CUDA (bf16 too)."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER, assert_bf16_close
from freetoken.kernels.attention.dsa_reference import index_scores

# (page size S, rate m, rows a page R): DSA; V4's CSA at 16-token pages; an entry per 8 tokens over 4-token pages
LAYOUTS = [(4, 1, 4), (16, 4, 4), (4, 8, 1)]


def _case(S: int, m: int, R: int, hi: int, di: int, dtype: torch.dtype, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    P, pages = 6, 40
    B = 4
    E = P * S // m
    table = torch.stack([torch.randperm(pages, generator=g)[:P] for _ in range(B)]).to(torch.int32)
    visible = torch.tensor([0, 1, E // 2 + 1, E], dtype=torch.int32)
    keys = torch.randn((pages * R, di + 5), generator=g)[:, 3 : 3 + di]  # a strided view, as a cache's columns are
    q = torch.randn((B, hi, di), generator=g)
    w = torch.randn((B, hi), generator=g)
    to = dict(device=device)
    return (q.to(dtype).to(**to), w.to(**to), keys.to(dtype).to(**to), table.to(**to), visible.to(**to)), E


def _reference(q, w, keys, table, visible, S: int, m: int, R: int) -> torch.Tensor:
    E = table.shape[1] * S // m
    pos = torch.arange(E, device=q.device) * m + m - 1
    rows = table.long()[:, pos // S] * R + (pos % S) // m  # [B, E]
    s = index_scores(q.float()[:, None], w[:, None], keys.float()[rows])[:, 0]  # [B, E]
    seen = torch.arange(E, device=q.device)[None] < visible.long()[:, None]
    return s.masked_fill(~seen, float("-inf"))


def _check(device: str, dtype: torch.dtype, S: int, m: int, R: int, hi: int, di: int) -> None:
    from freetoken.kernels.attention.index_triton import index_scores_paged

    (q, w, keys, table, visible), E = _case(S, m, R, hi, di, dtype, device, seed=S + m + hi)
    out = index_scores_paged(q, w, keys, table, visible, S, m, R)
    ref = _reference(q, w, keys, table, visible, S, m, R)
    assert out.shape == (4, E) and out.dtype == torch.float32
    assert torch.equal(torch.isinf(out), torch.isinf(ref))  # -inf exactly past each sequence's visible keys
    fin = torch.isfinite(ref)
    if dtype == torch.float32:  # exact products in the interpreter and on a GPU ("ieee" dots)
        torch.testing.assert_close(out[fin], ref[fin], rtol=1e-5, atol=1e-5 * float(ref[fin].abs().max()))
    else:  # bf16 keys and queries against the float32 reference of the same bf16 values
        assert_bf16_close(out[fin], ref[fin], (S, m, R, hi, di))


@TRITON_INTERPRETER
@pytest.mark.parametrize("S,m,R", LAYOUTS)
@pytest.mark.parametrize("hi,di", [(4, 16), (6, 24)])
def test_index_scores_in_the_interpreter(S: int, m: int, R: int, hi: int, di: int) -> None:
    _check("cpu", torch.float32, S, m, R, hi, di)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("S,m,R", LAYOUTS)
@pytest.mark.parametrize("hi,di", [(6, 24), (64, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_scores_on_cuda(S: int, m: int, R: int, hi: int, di: int, dtype: torch.dtype) -> None:
    _check("cuda", dtype, S, m, R, hi, di)


@TRITON_INTERPRETER
def test_dsa_selection_with_triton_scores_is_the_reference_selection() -> None:
    """``decode_selection_triton`` keeps the reference's slots, best first, and the same counts."""
    from freetoken.kernels.attention import DecodeMeta
    from freetoken.kernels.attention.dsa_reference import decode_selection
    from freetoken.kernels.attention.dsa_triton import decode_selection_triton
    from test_mla_attention import PAGE, _pool

    g = torch.Generator().manual_seed(3)
    lens, width, hi, di = [1, 17, 40], 48, 6, 24
    cache, table = _pool(lens, width + di, torch.float32, "cpu", g)
    iq, iw = torch.randn((3, hi, di), generator=g), torch.randn((3, hi), generator=g)
    for topk in (5, 64):
        meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32), PAGE)
        sel, counts = decode_selection_triton(cache, meta, width, iq, iw, topk)
        ref, ref_counts = decode_selection(cache, DecodeMeta(table, meta.seq_lens, PAGE), width, iq, iw, topk)
        assert torch.equal(counts, ref_counts)
        for b, n in enumerate(counts.tolist()):
            assert sel[b, :n].tolist() == ref[b, :n].tolist(), (topk, b)


@TRITON_INTERPRETER
@pytest.mark.parametrize("family", ["deepseek_v4", "glm_moe_dsa"])
def test_triton_paths_keep_the_engine_tokens(family: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny DeepSeek-V4 (its CSA layers' indexer over compressed entries, prefill and decode; the hyper-connection
    weights, its norms; the rotary) and GLM-5 (DSA: scores, selection and sparse attention, prefill and decode; the
    rotary) past the indexer's top-k, with their CUDA paths forced on the CPU (Triton's interpreter): the torch path's
    greedy tokens."""
    from freetoken import LLM, SamplingParams
    from freetoken.layers import dsa, hyper_connections, rope, v4_attention, v4_decode, v4_rope

    if family == "deepseek_v4":
        from tiny_dsv4 import save_dsv4_checkpoint

        save_dsv4_checkpoint(tmp_path, seed=0)
    else:
        from tiny_dsa import save_dsa_checkpoint

        save_dsa_checkpoint(family, tmp_path, seed=0)
    prompts = [[5, 40, 77, 100, 9, 30], [7, 44, 70, 102, 9, 31, 8, 300], [(11 * i) % 400 + 3 for i in range(23)]]
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)

    def tokens() -> list[list[int]]:
        llm = LLM(model=str(tmp_path), device="cpu", dtype="float32", page_size=4, max_running_requests=3)
        return [r.token_ids for r in llm.generate(prompts, params)]

    want = tokens()
    v4 = (v4_decode, v4_attention, hyper_connections, v4_rope)
    for module in v4 if family == "deepseek_v4" else (dsa, rope):
        monkeypatch.setattr(module, "use_triton", lambda where: True)
    assert tokens() == want
