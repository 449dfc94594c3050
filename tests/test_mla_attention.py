"""MLA over paged latents (``kernels/attention/mla_*.py``): the absorbed decode reference and the expanded prefill
reference against plain per-head attention with K/V expanded from the latents (float64); the Triton absorbed decode
against the float32 reference (Triton's interpreter on the CPU, the kernel itself on CUDA): lengths across page and
block edges, head counts that do not fill a head block, latent dims that are not powers of two, splits."""

from __future__ import annotations

import pytest
import torch

from devices import TRITON_INTERPRETER, assert_bf16_close
from freetoken.kernels.attention import DecodeMeta, PrefillMeta, mla_reference
from freetoken.kernels.attention.mla_reference import (
    attend_flash_cpu,
    attend_in_row_blocks,
    mla_decode_reference,
    mla_prefill_reference,
)

PAGE = 16


def _pool(lens: list[int], width: int, dtype: torch.dtype, device: str, g: torch.Generator):
    """Latent rows [slots, 1, width] and a page table scattering each sequence's pages in random order."""
    pages = [-(-n // PAGE) for n in lens]
    total = sum(pages) + 2
    perm = torch.randperm(total, generator=g).tolist()
    table = torch.zeros((len(lens), max(pages)), dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = torch.tensor(perm[at : at + n])
        at += n
    cache = torch.randn((total * PAGE, 1, width), generator=g).to(dtype).to(device)
    return cache, table.to(device)


def _expanded(q_nope, q_rope, lat, w_uk, w_uv, scale, causal_from: int):
    """Plain attention per head in float64: q [n, H, dn] / [n, H, dr], the context's latents [ctx, R + dr]."""
    R = w_uk.shape[2]
    c, kr = lat[:, :R].double(), lat[:, R:].double()
    k_nope = torch.einsum("hdr,tr->htd", w_uk.double(), c)  # [H, ctx, dn]
    v = torch.einsum("hdr,tr->htd", w_uv.double(), c)  # [H, ctx, dv]
    s = torch.einsum("nhd,htd->hnt", q_nope.double(), k_nope) + torch.einsum("nhd,td->hnt", q_rope.double(), kr)
    n, ctx = q_nope.shape[0], lat.shape[0]
    mask = torch.arange(ctx)[None, :] <= (causal_from + torch.arange(n))[:, None]
    p = torch.softmax((s * scale).masked_fill(~mask, float("-inf")), dim=-1)
    return torch.einsum("hnt,htd->nhd", p, v)  # [n, H, dv]


def _weights(H: int, dn: int, dv: int, R: int, g: torch.Generator):
    kv_b = torch.randn((H * (dn + dv), R), generator=g) * R**-0.5
    per_head = kv_b.view(H, dn + dv, R)
    return kv_b, per_head[:, :dn], per_head[:, dn:]


@pytest.mark.parametrize("H,R,dr,dn,dv", [(4, 32, 16, 24, 16), (3, 48, 8, 16, 40)])
def test_absorbed_decode_equals_expanded_attention(H: int, R: int, dr: int, dn: int, dv: int) -> None:
    g = torch.Generator().manual_seed(H)
    lens = [1, 17, 40]
    cache, table = _pool(lens, R + dr, torch.float32, "cpu", g)
    kv_b, w_uk, w_uv = _weights(H, dn, dv, R, g)
    q_nope, q_rope = torch.randn((len(lens), H, dn), generator=g), torch.randn((len(lens), H, dr), generator=g)
    scale = (dn + dr) ** -0.5
    q = torch.cat((torch.einsum("bhd,hdr->bhr", q_nope, w_uk), q_rope), dim=-1)
    meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32), PAGE)
    o_lat = mla_decode_reference(q, cache, meta, scale, R)
    out = torch.einsum("bhr,hdr->bhd", o_lat, w_uv)
    for b, n in enumerate(lens):
        pos = torch.arange(n)
        lat = cache[table[b, pos // PAGE].long() * PAGE + pos % PAGE, 0]
        ref = _expanded(q_nope[b : b + 1], q_rope[b : b + 1], lat, w_uk, w_uv, scale, n - 1)[0]
        torch.testing.assert_close(out[b].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("H,R,dr,dn,dv", [(4, 32, 16, 24, 16), (2, 16, 8, 8, 32)])
@pytest.mark.parametrize("key_block", [None, 7])
def test_expanded_prefill_is_causal_over_the_context(
    H: int, R: int, dr: int, dn: int, dv: int, key_block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One key block, or the context before the new tokens expanded 7 keys at a time (the blocks merged by their
    log-sum-exps)."""
    if key_block is not None:
        monkeypatch.setattr(mla_reference, "KV_BLOCK_ELEMENTS", key_block * H * (dn + dr + dv))
    g = torch.Generator().manual_seed(7)
    ctx, new = [9, 40], [9, 5]  # a whole prompt; a chunk after 35 cached tokens
    cache, table = _pool(ctx, R + dr, torch.float32, "cpu", g)
    kv_b, w_uk, w_uv = _weights(H, dn, dv, R, g)
    T = sum(new)
    q = torch.randn((T, H, dn + dr), generator=g)
    starts = torch.tensor([0, new[0]], dtype=torch.int32)
    meta = PrefillMeta(starts, torch.tensor(new, dtype=torch.int32), torch.tensor(ctx, dtype=torch.int32), table,
                       PAGE, max(new))  # fmt: skip
    scale = (dn + dr) ** -0.5
    out = mla_prefill_reference(q, cache, kv_b, meta, scale, (dn, dv))
    for s, (q0, n, c) in enumerate(zip(starts.tolist(), new, ctx)):
        pos = torch.arange(c)
        lat = cache[table[s, pos // PAGE].long() * PAGE + pos % PAGE, 0]
        qs = q[q0 : q0 + n]
        ref = _expanded(qs[..., :dn], qs[..., dn:], lat, w_uk, w_uv, scale, c - n)
        torch.testing.assert_close(out[q0 : q0 + n].double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_row_blocks_equal_the_cpu_flash_kernel(causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device path of the expanded prefill (rows in blocks, float32) against the CPU one, output and
    log-sum-exp, with blocks of 16 rows; query/key and value head dims that differ."""
    monkeypatch.setattr(mla_reference, "rows_per_block", lambda heads, keys: 16)
    g = torch.Generator().manual_seed(5)
    n, m = 37, 37 if causal else 50
    q, k, v = (torch.randn(shape, generator=g) for shape in ((3, n, 24), (3, m, 24), (3, m, 40)))
    o1, lse1 = attend_in_row_blocks(q, k, v, 0.2, causal)
    o2, lse2 = attend_flash_cpu(q, k, v, 0.2, causal)
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse1, lse2, rtol=1e-5, atol=1e-5)


def _check_kernel(device: str, dtype: torch.dtype, H: int, R: int, dr: int, splits: int | None) -> None:
    from freetoken.kernels.attention.mla_triton_decode import mla_decode_triton

    g = torch.Generator().manual_seed(H + R)
    for lens in ([1, 33, 70], [16, 32, 5, 100]):
        cache, table = _pool(lens, R + dr, dtype, device, g)
        q = torch.randn((len(lens), H, R + dr), generator=g).to(dtype).to(device)
        meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32, device=device), PAGE)
        scale = 0.1
        ref = mla_decode_reference(q.float(), cache.float(), meta, scale, R)
        out = mla_decode_triton(q, cache, meta, scale, R, splits=splits).float()
        rel = float((out - ref).norm() / ref.norm())
        if dtype == torch.float32:  # exact in the interpreter; TF32 products on a GPU
            assert rel < (1e-5 if device == "cpu" else 5e-3), (lens, rel)
        else:
            assert_bf16_close(out, ref, lens)


@TRITON_INTERPRETER
@pytest.mark.parametrize("H,R,dr,splits", [(4, 32, 16, 1), (20, 48, 8, 3), (4, 512, 64, 2)])
def test_triton_mla_decode_in_the_interpreter(H: int, R: int, dr: int, splits: int) -> None:
    _check_kernel("cpu", torch.float32, H, R, dr, splits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("H,R,dr", [(16, 512, 64), (20, 512, 64), (4, 32, 16)])
@pytest.mark.parametrize("splits", [1, 4, None])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_mla_decode_on_cuda(H: int, R: int, dr: int, splits: int | None, dtype: torch.dtype) -> None:
    _check_kernel("cuda", dtype, H, R, dr, splits)


def test_latent_pool_resizes_keeping_the_used_rows() -> None:
    """A KV pool of latents (one row per token, no V: ``value_dim=0``): its bytes, and a shrink that moves the used
    pages below the new size with their rows."""
    from freetoken.cache.kv_pool import KVPool

    kv = KVPool(2, 8, 4, 1, 6, torch.float32, torch.device("cpu"), value_dim=0)
    assert kv.page_bytes == 2 * 4 * 6 * 4 and kv.v[0].shape == (32, 1, 0)
    pages = kv.allocate(8, "r")
    kv.free(pages[:6], "r")
    kept = pages[6:]
    for layer in kv.k:
        layer.copy_(torch.arange(layer.numel(), dtype=torch.float32).view_as(layer))
    rows = {p: [t[p * 4 : (p + 1) * 4].clone() for t in kv.k] for p in kept}
    moves = kv.resize(3)
    assert kv.num_pages == 3 and kv.k[0].shape == (12, 1, 6) and kv.v[1].shape == (12, 1, 0)
    for p in kept:
        q = moves.get(p, p)
        assert all(torch.equal(t[q * 4 : (q + 1) * 4], r) for t, r in zip(kv.k, rows[p]))
    kv.check_integrity({"r": [moves.get(p, p) for p in kept]})
