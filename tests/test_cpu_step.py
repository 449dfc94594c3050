"""The CPU decode step's C++ ops (``kernels/cpu_step``) against their torch references in float32: the residual
add + RMSNorm, the router's softmax + top-k, and a decode layer's attention (q/k norms, rotary, KV write, paged
attention: GQA, windows, partial rotary, pages scattered over the pool, lengths across page edges); bad metadata
is refused."""

from __future__ import annotations

import math

import pytest
import torch

from freetoken.checkpoint.hf_config import RopeConfig
from freetoken.kernels import cpu_step
from freetoken.kernels.attention import DecodeMeta
from freetoken.kernels.attention.decode_reference import paged_decode_reference
from freetoken.kernels.norm import rms_norm_reference
from freetoken.kernels.route import route_reference
from freetoken.layers.attention import Attention, AttentionWeights, AttnBatch
from freetoken.layers.rope import Rotary

pytestmark = pytest.mark.skipif(cpu_step._lib() is None, reason="no C++ compiler")
PAGE = 16


@pytest.mark.parametrize("rows,n", [(1, 256), (4, 64), (7, 1000), (3, 5)])
def test_add_rms_norm_matches_the_reference(rows: int, n: int) -> None:
    g = torch.Generator().manual_seed(rows * n)
    h, d, w = torch.randn(rows, n, generator=g), torch.randn(rows, n, generator=g), torch.randn(n, generator=g)
    s, y = cpu_step.add_rms_norm(h, d, w, 1e-6)
    assert torch.equal(s, h + d)
    torch.testing.assert_close(y, rms_norm_reference(h + d, w, 1e-6), rtol=1e-6, atol=1e-6)
    same, y1 = cpu_step.add_rms_norm(h, None, w, 1e-5)
    assert same is h
    torch.testing.assert_close(y1, rms_norm_reference(h, w, 1e-5), rtol=1e-6, atol=1e-6)


def test_norm_takes_only_contiguous_float32_rows() -> None:
    x, w = torch.randn(2, 8), torch.randn(8)
    assert cpu_step.norm_takes(x, w)
    assert not cpu_step.norm_takes(x.double(), w.double())
    assert not cpu_step.norm_takes(x.t(), torch.randn(2))
    assert not cpu_step.norm_takes(x[None], w)
    assert not cpu_step.norm_takes(x, torch.randn(1))


@pytest.mark.parametrize("T,E,k,norm", [(1, 16, 4, True), (5, 64, 8, False), (3, 7, 7, True), (2, 128, 1, False)])
def test_route_matches_the_reference(T: int, E: int, k: int, norm: bool) -> None:
    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(E)) * 3
    ids, w = cpu_step.route(logits, k, norm)
    ref_ids, ref_w = route_reference(logits, k, norm, torch.float32)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(w, ref_w, rtol=1e-6, atol=1e-7)
    tied = torch.zeros(1, E)  # ties: the lower expert first
    assert cpu_step.route(tied, k, norm)[0].tolist() == [list(range(k))]
    with pytest.raises(ValueError, match="top_k"):
        cpu_step.route(logits, E + 1, norm)


@pytest.mark.parametrize("T,I,O", [(1, 256, 512), (3, 100, 7), (8, 16, 2048), (9, 64, 64)])
def test_bf16_linear_matches_f_linear(T: int, I: int, O: int) -> None:
    g = torch.Generator().manual_seed(T * I + O)
    w = torch.randn(O, I, generator=g).bfloat16().float()  # a bf16 checkpoint's weight under float32 steps
    x, b = torch.randn(T, I, generator=g), torch.randn(O, generator=g)
    w16 = cpu_step.bf16_copy(w)
    assert w16 is not None and w16.dtype == torch.bfloat16
    for bias in (None, b):
        out = cpu_step.linear(x, w, w16, bias)  # T > LINEAR_ROWS: F.linear itself
        torch.testing.assert_close(out, torch.nn.functional.linear(x, w, bias), rtol=1e-5, atol=1e-5)
    assert cpu_step.bf16_copy(w + 1e-3) is None  # not every value a bf16: no copy, F.linear
    assert cpu_step.bf16_copy(w.double()) is None


def _pages(lens: list[int], g: torch.Generator) -> tuple[torch.Tensor, int]:
    """A page table [B, P] of each sequence's pages scattered over the pool in random order, and the pool's pages."""
    each = [math.ceil(n / PAGE) for n in lens]
    num_pages = sum(each) + 3
    order = torch.randperm(num_pages, generator=g).tolist()
    table = torch.zeros((len(lens), max(each) + 1), dtype=torch.int32)
    at = 0
    for b, n in enumerate(each):
        table[b, :n] = torch.tensor(order[at : at + n], dtype=torch.int32)
        at += n
    return table, num_pages


def _layer(h: int, hkv: int, hd: int, qk_norm: bool, window: int | None, partial: float, g: torch.Generator):
    D = 48

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.3

    weights = AttentionWeights(
        q=w(h * hd, D), k=w(hkv * hd, D), v=w(hkv * hd, D), o=w(D, h * hd),
        q_norm=1 + w(hd) if qk_norm else None, k_norm=1 + w(hd) if qk_norm else None,
    )  # fmt: skip
    rope = RopeConfig(kind="default", theta=10000.0, params={"partial_rotary_factor": partial})
    rotary = Rotary(rope, hd, 512, torch.device("cpu"))
    return Attention(weights, 0, h, hkv, hd, 1e-6, rotary, window=window), D


class _KV:
    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = [k], [v]


@pytest.mark.parametrize("h,hkv,hd", [(4, 2, 64), (8, 8, 32), (6, 2, 16)])
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("qk_norm,partial", [(True, 1.0), (False, 1.0), (True, 0.5)])
def test_decode_attention_matches_the_torch_path(
    h: int, hkv: int, hd: int, window: int | None, qk_norm: bool, partial: float
) -> None:
    g = torch.Generator().manual_seed(h * 100 + hd)
    lens = [1, 17, 33, 300][: 4 if hd < 64 else 3]
    attn, D = _layer(h, hkv, hd, qk_norm, window, partial, g)
    table, num_pages = _pages(lens, g)
    k = torch.randn(num_pages * PAGE, hkv, hd, generator=g)
    v = torch.randn(num_pages * PAGE, hkv, hd, generator=g)
    pos = torch.tensor([n - 1 for n in lens])
    slots = table.long()[torch.arange(len(lens)), pos // PAGE] * PAGE + pos % PAGE
    meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32), PAGE)
    x = torch.randn(len(lens), D, generator=g)
    ref_kv, fast_kv = _KV(k.clone(), v.clone()), _KV(k.clone(), v.clone())
    # the torch path: _qkv_torch writes the new rows, the paged reference attends, o_proj
    qkv = torch.nn.functional.linear(x, attn.qkv_w)
    batch = AttnBatch(positions=pos, slot_mapping=slots, decode=meta)
    qh = attn._qkv_torch(qkv, batch, ref_kv.k[0], ref_kv.v[0])
    ref = attn._out(x, paged_decode_reference(qh, ref_kv.k[0], ref_kv.v[0], meta, attn.scale, window))
    out = attn.forward(x, AttnBatch(positions=pos, slot_mapping=slots, decode=DecodeMeta(table, meta.seq_lens, PAGE)),
                       fast_kv)  # type: ignore[arg-type]  # fmt: skip
    torch.testing.assert_close(fast_kv.k[0], ref_kv.k[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(fast_kv.v[0], ref_kv.v[0])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_decode_attention_refuses_out_of_range_metadata() -> None:
    g = torch.Generator().manual_seed(0)
    h, hkv, hd = 4, 2, 16
    attn, D = _layer(h, hkv, hd, True, None, 1.0, g)
    k, v = torch.zeros(2 * PAGE, hkv, hd), torch.zeros(2 * PAGE, hkv, hd)
    qkv = torch.randn(1, (h + 2 * hkv) * hd, generator=g)
    r = attn.rotary
    base = {"table": torch.tensor([[0, 1]], dtype=torch.int32), "lens": torch.tensor([3], dtype=torch.int32),
            "pos": torch.tensor([2]), "slot": torch.tensor([2])}  # fmt: skip
    i32 = torch.int32
    bad = [("slot", torch.tensor([2 * PAGE])), ("pos", torch.tensor([512])), ("lens", torch.tensor([0], dtype=i32)),
           ("lens", torch.tensor([3 * PAGE], dtype=i32)), ("table", torch.tensor([[5, 1]], dtype=i32))]  # fmt: skip
    for key, value in bad:
        a = base | {key: value}
        with pytest.raises(ValueError, match="out of range"):
            cpu_step.decode_attention(
                qkv.clone(), (h, hkv, hd), (None, None, 1e-6), (r.cos, r.sin), a["pos"], a["slot"], (k, v),
                a["table"], a["lens"], PAGE, attn.scale, None,
            )  # fmt: skip
    with pytest.raises(ValueError, match="rotary tables"):
        cpu_step.decode_attention(
            qkv, (h, hkv, hd), (None, None, 1e-6), (r.cos[:, :-1].contiguous(), r.sin[:, :-1].contiguous()),
            base["pos"], base["slot"], (k, v), base["table"], base["lens"], PAGE, attn.scale, None,
        )  # fmt: skip
    with pytest.raises(ValueError, match="block_table"):
        cpu_step.decode_attention(
            qkv, (h, hkv, hd), (None, None, 1e-6), (r.cos, r.sin), base["pos"], base["slot"], (k, v),
            base["table"].long(), base["lens"], PAGE, attn.scale, None,
        )  # fmt: skip


def test_without_the_library_the_torch_paths_run(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(8, 16).bfloat16().float()
    w16, x = cpu_step.bf16_copy(w), torch.randn(2, 16)
    monkeypatch.setattr(cpu_step, "_lib", lambda: None)
    assert not cpu_step.available(x) and cpu_step.bf16_copy(w) is None
    assert torch.equal(cpu_step.linear(x, w, w16), torch.nn.functional.linear(x, w))
    assert not cpu_step.norm_takes(x, torch.ones(16))
