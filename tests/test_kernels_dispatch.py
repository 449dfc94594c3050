"""Each op's one dispatch point (``kernels/``) on a CPU: float32 rows take the C++ op (the result is that op's, bit
for bit) and match the torch reference; other dtypes take the reference itself. The prepared bf16 weight copies are
the linear op's, made once and dropped with their weight. The attention-backend registry: the choice by device, the
backends by name, an unknown name refused with the known ones listed. The Triton paths of the same dispatch points
run on CUDA (the ``gpu`` tests of each kernel's own file)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from freetoken.checkpoint.hf_config import RopeConfig
from freetoken.kernels import cpu_step, gated_delta, linear, norm, route
from freetoken.kernels.attention import DecodeMeta, PrefillMeta
from freetoken.kernels.attention.decode_reference import paged_decode_reference
from freetoken.kernels.attention.prefill_reference import paged_prefill_reference
from freetoken.kernels.attention.registry import BACKENDS, UnknownAttentionBackend, auto_name, get, select
from freetoken.kernels.triton_support import triton_available, use_triton
from freetoken.layers.attention import Attention, AttentionWeights, AttnBatch
from freetoken.layers.rope import Rotary

pytestmark = pytest.mark.skipif(cpu_step._lib() is None, reason="no C++ compiler")
G = torch.Generator


def test_no_op_takes_triton_on_a_cpu() -> None:
    assert not use_triton(torch.zeros(1)) and not use_triton(torch.device("cpu"))
    assert use_triton(torch.device("cuda")) == triton_available()  # the device's kind decides, not a GPU here


def test_linear_reads_the_ops_bf16_copy_at_decode_sizes() -> None:
    g = G().manual_seed(1)
    w = torch.randn(64, 32, generator=g).bfloat16().float()  # a bf16 checkpoint's weight under float32 steps
    x, b = torch.randn(3, 32, generator=g), torch.randn(64, generator=g)
    prepared = linear.PreparedWeights(cpu_step.bf16_copy)
    big = torch.randn(cpu_step.LINEAR_ROWS + 1, 32, generator=g)
    assert torch.equal(linear.linear(big, w, b), F.linear(big, w, b))  # prefill-sized: F.linear itself
    assert linear.BF16_COPIES.held(w) is None  # ... and nothing prepared for it
    out = linear.linear(x, w, b)
    w16 = linear.BF16_COPIES.held(w)
    assert w16 is not None and w16.dtype == torch.bfloat16 and torch.equal(w16.float(), w)
    assert torch.equal(out, cpu_step.linear(x, w, prepared.get(w), b))  # the C++ op's result
    torch.testing.assert_close(out, linear.linear_reference(x, w, b), rtol=1e-5, atol=1e-5)
    other = w + 1e-3  # not every value a bf16: no copy, F.linear exactly
    assert torch.equal(linear.linear(x, other), F.linear(x, other)) and linear.BF16_COPIES.held(other) is None
    assert torch.equal(linear.linear(x.double(), w.double()), F.linear(x.double(), w.double()))


def test_prepared_weights_are_made_once_and_dropped_with_their_weight() -> None:
    made: list[tuple[int, ...]] = []  # the shapes made (holding the weights would keep them alive)

    def make(w: torch.Tensor) -> torch.Tensor | None:
        made.append(tuple(w.shape))
        return cpu_step.bf16_copy(w)

    prepared = linear.PreparedWeights(make)
    w = torch.randn(8, 4).bfloat16().float()
    first = prepared.get(w)
    assert first is not None and prepared.get(w) is first and len(made) == 1 and len(prepared) == 1
    other = prepared.get(w + 1e-3)  # not every value a bf16: nothing to make
    assert other is None and len(made) == 2
    assert len(prepared) == 1  # a temporary: its entry went with it
    del w, first
    gc.collect()
    assert len(prepared) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_norms_take_the_cpp_op_in_float32_else_the_reference(dtype: torch.dtype) -> None:
    g = G().manual_seed(2)
    h, d, w = (torch.randn(5, 96, generator=g, dtype=dtype) for _ in range(3))
    w = w[0]
    ids, embed = torch.tensor([3, 0, 7]), torch.randn(10, 96, generator=g, dtype=dtype)
    ref_s = h + d
    cases = [
        (norm.rms_norm(h, w, 1e-6), norm.rms_norm_reference(h, w, 1e-6)),
        (norm.add_rms_norm(h, d, w, 1e-6)[1], norm.rms_norm_reference(ref_s, w, 1e-6)),
        (norm.embed_rms_norm(ids, embed, w, 1e-6)[1], norm.rms_norm_reference(embed[ids], w, 1e-6)),
    ]
    for got, ref in cases:
        if dtype == torch.float32:
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(got, ref)
    if dtype == torch.float32:  # the C++ op's own results
        assert torch.equal(norm.rms_norm(h, w, 1e-6), cpu_step.add_rms_norm(h, None, w, 1e-6)[1])
        s, y = norm.add_rms_norm(h, d, w, 1e-6)
        cs, cy = cpu_step.add_rms_norm(h, d, w, 1e-6)
        assert torch.equal(s, cs) and torch.equal(y, cy)
    x, z = torch.randn(5, 4, 24, generator=g, dtype=dtype), torch.randn(5, 4, 24, generator=g, dtype=dtype)
    torch.testing.assert_close(
        norm.gated_rms_norm(x, z, w[:24], 1e-6), norm.gated_rms_norm_reference(x, z, w[:24], 1e-6), rtol=1e-5,
        atol=1e-6,
    )  # fmt: skip


@pytest.mark.parametrize("norm_topk", [True, False])
def test_route_takes_the_cpp_op_in_float32_else_the_reference(norm_topk: bool) -> None:
    g = G().manual_seed(3)
    x, router = torch.randn(4, 32, generator=g), torch.randn(16, 32, generator=g)
    ids, w = route.route(x, router, 3, norm_topk)
    c_ids, c_w = cpu_step.route(F.linear(x, router), 3, norm_topk)
    assert torch.equal(ids, c_ids) and torch.equal(w, c_w)
    r_ids, r_w = route.route_reference(F.linear(x, router), 3, norm_topk, x.dtype)
    assert torch.equal(ids, r_ids)
    torch.testing.assert_close(w, r_w, rtol=1e-6, atol=1e-7)
    xb, rb = x.bfloat16(), router.bfloat16()
    b_ids, b_w = route.route(xb, rb, 3, norm_topk)
    rb_ids, rb_w = route.route_reference(F.linear(xb, rb), 3, norm_topk, torch.bfloat16)
    assert torch.equal(b_ids, rb_ids) and torch.equal(b_w, rb_w)


def test_deltanet_step_takes_the_reference_on_a_cpu() -> None:
    g = G().manual_seed(4)
    B, Hk, dk, H, dv, K, S = 2, 2, 8, 4, 8, 4, 5
    C = 2 * Hk * dk + H * dv
    mixed, b, a = torch.randn(B, C, generator=g), torch.randn(B, H, generator=g), torch.randn(B, H, generator=g)
    conv, ssm = torch.randn(S, C, K - 1, generator=g), torch.randn(S, H, dk, dv, generator=g)
    slots, positions = torch.tensor([3, 1]), torch.tensor([0, 7])
    conv_w, A_log, dt_bias = torch.randn(C, K, generator=g), torch.randn(H, generator=g), torch.randn(H, generator=g)
    pools = [(conv.clone(), ssm.clone()) for _ in range(2)]
    outs = [
        fn(mixed, b, a, cp, sp, slots, positions, conv_w, A_log, dt_bias, Hk, dk)
        for fn, (cp, sp) in zip((gated_delta.deltanet_step, gated_delta.deltanet_step_reference), pools, strict=True)
    ]
    assert torch.equal(outs[0], outs[1]) and outs[0].dtype == torch.float32
    assert all(torch.equal(p, q) for p, q in zip(pools[0], pools[1], strict=True))


def test_attention_backends_by_device_and_by_name() -> None:
    assert sorted(BACKENDS) == ["cpu", "torch", "triton"]
    assert select(torch.device("cpu")).name == "cpu" and auto_name(torch.device("cpu")) == "cpu"
    assert auto_name(torch.device("cuda")) == ("triton" if triton_available() else "torch")
    assert auto_name(torch.device("meta")) == "torch"
    assert select(torch.device("cpu"), "torch") is get("torch")
    assert all(get(name).name == name for name in BACKENDS)
    with pytest.raises(UnknownAttentionBackend, match="unknown attention backend 'flashinfer'; known: cpu, torch, "
                       "triton"):  # fmt: skip
        select(torch.device("cpu"), "flashinfer")
    with pytest.raises(ValueError):  # also a ValueError: callers that catch bad arguments catch it
        get("")


def _paged(lens: list[int], hkv: int, hd: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    page = 16
    pages = [-(-n // page) for n in lens]
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = torch.arange(at, at + n, dtype=torch.int32)
        at += n
    return table, torch.randn(at * page, hkv, hd, generator=g), torch.randn(at * page, hkv, hd, generator=g)


def test_the_cpu_and_torch_backends_run_the_reference() -> None:
    g = G().manual_seed(5)
    lens, H, Hkv, hd = [5, 40], 4, 2, 16
    table, k, v = _paged(lens, Hkv, hd, g)
    meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32), 16)
    q = torch.randn(len(lens), H, hd, generator=g)
    ref = paged_decode_reference(q, k, v, DecodeMeta(table, meta.seq_lens, 16), 0.25, 8)
    qs = torch.randn(sum(lens), H, hd, generator=g)
    pmeta = PrefillMeta(torch.tensor([0, 5], dtype=torch.int32), torch.tensor(lens, dtype=torch.int32),
                        torch.tensor(lens, dtype=torch.int32), table, 16, max(lens))  # fmt: skip
    pref = paged_prefill_reference(qs, k, v, pmeta, 0.25, None)
    for name in ("cpu", "torch"):
        backend = get(name)
        assert torch.equal(backend.decode(q, k, v, DecodeMeta(table, meta.seq_lens, 16), 0.25, 8), ref)
        assert torch.equal(backend.prefill(qs, k, v, pmeta, 0.25, None), pref)


class _KV:
    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = [k], [v]


def test_the_attention_layer_chooses_through_the_registry() -> None:
    """A float32 CPU decode step: the CPU backend's fused C++ call; the torch backend by name: the reference path
    (q/k norms, rotary and KV write in torch, then the paged reference); both agree, bf16 steps take no fused call."""
    g = G().manual_seed(6)
    H, Hkv, hd, D, lens = 4, 2, 16, 32, [3, 20]

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.3

    weights = AttentionWeights(q=w(H * hd, D), k=w(Hkv * hd, D), v=w(Hkv * hd, D), o=w(D, H * hd), q_norm=1 + w(hd),
                               k_norm=1 + w(hd))  # fmt: skip
    rotary = Rotary(RopeConfig(kind="default", theta=10000.0, params={}), hd, 256, torch.device("cpu"))
    layers = {name: Attention(weights, 0, H, Hkv, hd, 1e-6, rotary, backend=name) for name in ("auto", "torch")}
    assert layers["auto"].backend.name == "cpu" and layers["torch"].backend.name == "torch"
    table, k, v = _paged(lens, Hkv, hd, g)
    pos = torch.tensor([n - 1 for n in lens])
    slots = table.long()[torch.arange(len(lens)), pos // 16] * 16 + pos % 16
    x = torch.randn(len(lens), D, generator=g)
    outs, kvs = {}, {}
    for name, layer in layers.items():
        kvs[name] = _KV(k.clone(), v.clone())
        meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32), 16)
        batch = AttnBatch(positions=pos, slot_mapping=slots, decode=meta)
        outs[name] = layer.forward(x, batch, kvs[name])  # type: ignore[arg-type]
        assert batch.meta_checked == (name == "auto")  # only the fused call checks the step's metadata
    torch.testing.assert_close(outs["auto"], outs["torch"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kvs["auto"].k[0], kvs["torch"].k[0], rtol=1e-5, atol=1e-6)
    qkv = torch.randn(2, (H + 2 * Hkv) * hd, generator=g).bfloat16()
    rope = layers["auto"]._rope(AttnBatch(positions=pos, slot_mapping=slots))
    meta = DecodeMeta(table, torch.tensor(lens, dtype=torch.int32), 16)
    assert get("cpu").decode_fused(qkv, rope, (k.bfloat16(), v.bfloat16()), meta, 0.25, None, False) is None
    assert get("cpu").qkv_rope(qkv, rope, (k, v)) is None and get("torch").qkv_rope(qkv, rope, (k, v)) is None
