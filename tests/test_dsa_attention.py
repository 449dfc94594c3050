"""DeepSeek sparse attention's kernels (``kernels/attention/dsa_*.py``) against a float64 brute force over paged
latents: each query's indexer scores, its top-k of the positions it sees, attention over those alone (decode
and prefill absorbed; contexts shorter and longer than index_topk); the Triton decode over the kept latents
against the float32 reference (Triton's interpreter on the CPU, the kernel itself on CUDA)."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER, assert_bf16_close
from freetoken.kernels.attention import DecodeMeta, PrefillMeta, dsa_reference
from freetoken.kernels.attention.dsa_reference import (
    decode_selection,
    dense_meta,
    dsa_decode_reference,
    dsa_prefill_reference,
    index_scores,
    prefill_selection,
)
from test_mla_attention import PAGE, _pool, _weights

HI, DI = 4, 16  # indexer heads and head dim


def _brute(q_nope, q_rope, rows, w_uk, w_uv, iq, iw, scale, topk, first: int):
    """Float64, one query at a time: query j (position first + j) keeps the topk best of positions 0..first+j."""
    R = w_uk.shape[2]
    L = R + q_rope.shape[-1]
    c, kr, ik = rows[:, :R].double(), rows[:, R:L].double(), rows[:, L:].double()
    out = []
    for j in range(q_nope.shape[0]):
        n = first + j + 1
        score = (iw[j].double()[:, None] * torch.relu(iq[j].double() @ ik[:n].T)).sum(0)  # [n]
        kept = score.topk(min(topk, n)).indices
        k_nope = torch.einsum("hdr,tr->htd", w_uk.double(), c[kept])
        v = torch.einsum("hdr,tr->htd", w_uv.double(), c[kept])
        s = torch.einsum("hd,htd->ht", q_nope[j].double(), k_nope) + q_rope[j].double() @ kr[kept].T
        out.append(torch.einsum("ht,htd->hd", torch.softmax(s * scale, dim=-1), v))
    return torch.stack(out)  # [n, H, dv]


def _rows(cache, table, s: int, n: int):
    pos = torch.arange(n)
    return cache[table[s, pos // PAGE].long() * PAGE + pos % PAGE, 0]


@pytest.mark.parametrize("topk", [5, 64])
def test_decode_keeps_the_top_k_positions(topk: int) -> None:
    H, R, dr, dn, dv = 3, 32, 16, 24, 16
    g = torch.Generator().manual_seed(topk)
    lens = [1, 17, 40]
    cache, table = _pool(lens, R + dr + DI, torch.float32, "cpu", g)
    _, w_uk, w_uv = _weights(H, dn, dv, R, g)
    B = len(lens)
    q_nope, q_rope = torch.randn((B, H, dn), generator=g), torch.randn((B, H, dr), generator=g)
    iq, iw = torch.randn((B, HI, DI), generator=g), torch.randn((B, HI), generator=g)
    q_abs = torch.cat((torch.einsum("bhd,hdr->bhr", q_nope, w_uk), q_rope), dim=-1)
    meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32), PAGE)
    sel = decode_selection(cache, meta, R + dr, iq, iw, topk)
    o_lat = dsa_decode_reference(q_abs, cache, sel, 0.2, R)
    out = torch.einsum("bhr,hdr->bhd", o_lat.double(), w_uv.double())
    for b, n in enumerate(lens):
        ref = _brute(q_nope[b : b + 1], q_rope[b : b + 1], _rows(cache, table, b, n), w_uk, w_uv, iq[b : b + 1],
                     iw[b : b + 1], 0.2, topk, n - 1)  # fmt: skip
        torch.testing.assert_close(out[b], ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("elements", [None, 2000])  # 2000: blocks of a few queries
def test_prefill_keeps_each_query_s_top_k_of_what_it_sees(elements: int | None, monkeypatch: pytest.MonkeyPatch):
    if elements is not None:
        monkeypatch.setattr(dsa_reference, "ELEMENTS", elements)
    H, R, dr, dn, dv, topk = 3, 32, 16, 24, 16, 6
    g = torch.Generator().manual_seed(3)
    lens, news = [9, 30, 21], [9, 12, 1]  # a first chunk, a later chunk, one token
    cache, table = _pool(lens, R + dr + DI, torch.float32, "cpu", g)
    _, w_uk, w_uv = _weights(H, dn, dv, R, g)
    T = sum(news)
    q_nope, q_rope = torch.randn((T, H, dn), generator=g), torch.randn((T, H, dr), generator=g)
    iq, iw = torch.randn((T, HI, DI), generator=g), torch.randn((T, HI), generator=g)
    starts = [0, news[0], news[0] + news[1]]
    meta = PrefillMeta(torch.tensor(starts, dtype=torch.int32), torch.tensor(news, dtype=torch.int32),
                       torch.tensor(lens, dtype=torch.int32), table, PAGE, max(news))  # fmt: skip
    q_abs = torch.cat((torch.einsum("thd,hdr->thr", q_nope, w_uk), q_rope), dim=-1)
    o_lat = dsa_prefill_reference(q_abs, cache, prefill_selection(cache, meta, R + dr, iq, iw, topk, H), 0.2, R)
    out = torch.einsum("thr,hdr->thd", o_lat.double(), w_uv.double())
    # contexts within topk keep everything they see: marked dense, for MLA's prefill (``layers/dsa.py``)
    blocks = prefill_selection(cache, meta, R + dr, iq, iw, 21, H)
    assert [b.seq for b in blocks if b.slots is None] == [0, 2]
    dense = dense_meta(meta, blocks)
    assert dense is not None and dense.q_start.tolist() == [0, 21] and dense.max_q_len == 9
    for s, (q0, n, ctx) in enumerate(zip(starts, news, lens)):
        sl = slice(q0, q0 + n)
        ref = _brute(q_nope[sl], q_rope[sl], _rows(cache, table, s, ctx), w_uk, w_uv, iq[sl], iw[sl], 0.2, topk,
                     ctx - n)  # fmt: skip
        torch.testing.assert_close(out[sl].double(), ref, rtol=1e-5, atol=1e-5)


def _check_triton(device: str, dtype: torch.dtype, H: int, R: int, dr: int, topk: int) -> None:
    from freetoken.kernels.attention.dsa_triton import dsa_decode_triton

    g = torch.Generator().manual_seed(H + R + topk)
    for lens in ([1, 33, 70], [16, 32, 5, 100]):
        cache, table = _pool(lens, R + dr + DI, dtype, device, g)
        B = len(lens)
        q = torch.randn((B, H, R + dr), generator=g).to(dtype).to(device)
        iq, iw = (torch.randn(s, generator=g).to(device) for s in ((B, HI, DI), (B, HI)))
        meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32, device=device), PAGE)
        sel = decode_selection(cache, meta, R + dr, iq, iw, topk)
        ref = dsa_decode_reference(q.float(), cache.float(), sel, 0.1, R)
        out = dsa_decode_triton(q, cache, sel, 0.1, R).float()
        rel = float((out - ref).norm() / ref.norm())
        if dtype == torch.float32:  # exact in the interpreter; TF32 products on a GPU
            assert rel < (1e-5 if device == "cpu" else 5e-3), (lens, rel)
        else:
            assert_bf16_close(out, ref, lens)


@TRITON_INTERPRETER
@pytest.mark.parametrize("H,R,dr,topk", [(4, 32, 16, 8), (20, 48, 8, 40)])
def test_triton_dsa_decode_in_the_interpreter(H: int, R: int, dr: int, topk: int) -> None:
    _check_triton("cpu", torch.float32, H, R, dr, topk)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("H,R,dr,topk", [(16, 512, 64, 32), (4, 32, 16, 2048)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_dsa_decode_on_cuda(H: int, R: int, dr: int, topk: int, dtype: torch.dtype) -> None:
    _check_triton("cuda", dtype, H, R, dr, topk)


def _dense(blocks: list) -> list[tuple[int, int, int]]:
    return [(b.seq, b.start, b.stop) for b in blocks if b.slots is None]


def _rows_of(blocks: list) -> dict[int, tuple]:
    """Each sparse row of a selection: its block and its index there."""
    return {r: (b, r - b.start) for b in blocks if b.slots is not None for r in range(b.start, b.stop)}


def _check_triton_prefill(device: str, dtype: torch.dtype, H: int, R: int, dr: int, topk: int) -> None:
    """The Triton prefill path (``dsa_triton.py``) against the reference: the same dense blocks, each sparse row's
    kept positions (its visible ones, best first) and counts; its attention over the reference's own selection."""
    from freetoken.kernels.attention.dsa_triton import dsa_prefill_triton, prefill_selection_triton

    g = torch.Generator().manual_seed(H + R + topk)
    lens, news = [9, 70, 41, 3], [9, 12, 41, 1]  # a first chunk, a later chunk, a whole prompt, one token
    cache, table = _pool(lens, R + dr + DI, dtype, device, g)
    T = sum(news)
    starts = [sum(news[:i]) for i in range(len(news))]
    meta = PrefillMeta(*(torch.tensor(v, dtype=torch.int32, device=device) for v in (starts, news, lens)), table,
                       PAGE, max(news))  # fmt: skip
    q = torch.randn((T, H, R + dr), generator=g).to(dtype).to(device)
    iq, iw = (torch.randn(s, generator=g).to(device) for s in ((T, HI, DI), (T, HI)))
    iq = iq.to(dtype).float()  # the queries the kernel reads (bf16: rounded)
    ref_sel = prefill_selection(cache.float(), meta, R + dr, iq, iw, topk, H)
    sel = prefill_selection_triton(cache, meta, R + dr, iq.to(dtype), iw, topk, H)
    assert _dense(sel) == _dense(ref_sel)
    got, want = _rows_of(sel), _rows_of(ref_sel)
    assert sorted(got) == sorted(want)
    for r, (b, i) in want.items():  # the same count; kept positions of the same scores (ties at 0 in any order)
        gb, gi = got[r]
        assert gb.kept is not None and b.kept is not None and torch.equal(gb.kept[gi], b.kept[i]), r
        n = int(b.kept[i].sum())
        scores = [index_scores(iq[r : r + 1].float(), iw[r : r + 1], cache[sl[:n], 0, R + dr :].float())[0]
                  for sl in (gb.slots[gi], b.slots[i])]  # fmt: skip
        close = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(scores[0].sort().values, scores[1].sort().values, **close, msg=str(r))
    ref = dsa_prefill_reference(q.float(), cache.float(), ref_sel, 0.1, R)
    out = dsa_prefill_triton(q, cache, ref_sel, 0.1, R).float()
    if dtype == torch.float32:
        rel = float((out - ref).norm() / ref.norm())
        assert rel < (1e-5 if device == "cpu" else 5e-3), rel
    else:
        assert_bf16_close(out, ref, "prefill")


@TRITON_INTERPRETER
@pytest.mark.parametrize("elements", [None, 3000])  # 3000: blocks of a few rows
def test_triton_dsa_prefill_in_the_interpreter(elements: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if elements is not None:
        from freetoken.kernels.attention import dsa_triton

        monkeypatch.setattr(dsa_triton, "ELEMENTS", elements)
    _check_triton_prefill("cpu", torch.float32, 4, 32, 16, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("H,R,dr,topk", [(16, 512, 64, 32), (4, 32, 16, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_dsa_prefill_on_cuda(H: int, R: int, dr: int, topk: int, dtype: torch.dtype) -> None:
    _check_triton_prefill("cuda", dtype, H, R, dr, topk)
