"""Which gated delta rule kernels a DeltaNet layer gets (``gated_delta_fla.kernels``), without a GPU: fla's only on
CUDA for 16-bit models with FREETOKEN_FLA not 0 and fla-core importable (never even imported otherwise), the torch
path with one log line per reason otherwise. And the layer's fla plumbing (one variable-length launch per round of
segments, checkpoint captures, slot writes) against its torch path, with fla's calling convention served by our
reference (fla's kernels themselves are checked on CUDA, ``test_fla_gpu.py``)."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from freetoken.cache.state_pool import StatePool, StateShape
from freetoken.kernels import gated_delta_fla
from freetoken.kernels.gated_delta import chunk_gated_delta, l2norm
from freetoken.layers.attention import AttnBatch, SeqAttn
from freetoken.layers.deltanet import DeltaNetWeights, GatedDeltaNet, _segments

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.fixture
def fresh_choice():
    """The import attempt and the once-only messages start over (functools caches)."""
    for f in (gated_delta_fla._import, gated_delta_fla._say_once):
        f.cache_clear()
    yield
    for f in (gated_delta_fla._import, gated_delta_fla._say_once):
        f.cache_clear()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_never_on_the_cpu(fresh_choice, dtype):
    assert gated_delta_fla.kernels(CPU, dtype) is None
    assert gated_delta_fla._import.cache_info().misses == 0  # not even tried


def test_float32_models_keep_the_reference(fresh_choice, caplog):
    with caplog.at_level(logging.INFO, logger="freetoken.kernels.gated_delta_fla"):
        for _ in range(3):
            assert gated_delta_fla.kernels(CUDA, torch.float32) is None
    assert gated_delta_fla._import.cache_info().misses == 0
    assert [r.getMessage() for r in caplog.records] == [
        "a torch.float32 model: the gated DeltaNet layers run our torch ops (fla's kernels are for 16-bit)"
    ]


def test_turned_off_by_the_environment(fresh_choice, freetoken_env, caplog):
    freetoken_env("FREETOKEN_FLA", "0")
    with caplog.at_level(logging.INFO, logger="freetoken.kernels.gated_delta_fla"):
        assert gated_delta_fla.kernels(CUDA, torch.bfloat16) is None
        assert gated_delta_fla.kernels(CUDA, torch.bfloat16) is None
    assert gated_delta_fla._import.cache_info().misses == 0
    assert [r.getMessage() for r in caplog.records] == ["FREETOKEN_FLA=0: the gated DeltaNet layers run our torch ops"]


def test_not_importable_falls_back_said_once(fresh_choice, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)  # what a box without fla-core sees
    with caplog.at_level(logging.INFO, logger="freetoken.kernels.gated_delta_fla"):
        for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
            assert gated_delta_fla.kernels(CUDA, dtype) is None
    [record] = caplog.records
    assert record.getMessage().startswith("fla-core is not importable (")
    assert record.getMessage().endswith("): the gated DeltaNet layers run our torch ops on CUDA")


def test_a_cpu_layer_runs_the_torch_path(fresh_choice):
    layer = _layer(torch.bfloat16)
    assert layer.fla is None and gated_delta_fla._import.cache_info().misses == 0


def test_segments_cut_at_the_captures():
    s = SeqAttn(0, 30, 40, 2, captures=[(5, 4), (0, 5), (30, 6), (5, 7)])
    assert _segments(s) == [(0, 5), (5, 30)]
    assert _segments(SeqAttn(0, 9)) == [(0, 9)]
    assert _segments(SeqAttn(0, 1, captures=[(1, 3)])) == [(0, 1)]


# The layer's fla path (prefill and mixed steps) with fla's calling convention served by our reference: [1, T, Hk,
# dk] inputs, q/k normalised in the kernel, value head i on key head i // (H/Hk), cu_seqlens for several sequences.
def _chunk_like_fla(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                    cu_seqlens=None, cu_seqlens_cpu=None):  # fmt: skip
    assert output_final_state and use_qk_l2norm_in_kernel and q.shape[0] == 1
    assert (cu_seqlens is None) == (initial_state.shape[0] == 1)
    bounds = [0, q.shape[1]] if cu_seqlens_cpu is None else cu_seqlens_cpu.tolist()
    assert cu_seqlens is None or cu_seqlens.tolist() == bounds
    rep = v.shape[2] // q.shape[2]
    q, k = (l2norm(t[0].float()).repeat_interleave(rep, dim=1) for t in (q, k))
    outs, finals = [], []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        o, s = chunk_gated_delta(q[a:b] * scale, k[a:b], v[0, a:b].float(), g[0, a:b], beta[0, a:b].float(),
                                 initial_state[i])  # fmt: skip
        outs.append(o)
        finals.append(s)
    return torch.cat(outs)[None].to(v.dtype), torch.stack(finals)


HK, H, DK, DV, K, D = 2, 4, 16, 8, 4, 32


def _layer(dtype: torch.dtype) -> GatedDeltaNet:
    g = torch.Generator().manual_seed(0)
    C = 2 * HK * DK + H * DV
    w = DeltaNetWeights(
        in_proj=(torch.randn(C + H * DV + 2 * H, D, generator=g) * 0.2).to(dtype),
        conv=(torch.randn(C, K, generator=g) * 0.5).to(dtype),
        A_log=torch.randn(H, generator=g) * 0.5, dt_bias=torch.randn(H, generator=g) * 0.5,
        norm=(torch.rand(DV, generator=g) + 0.5).to(dtype), out=(torch.randn(D, H * DV, generator=g) * 0.2).to(dtype),
    )  # fmt: skip
    return GatedDeltaNet(w, 0, HK, H, DK, DV, 1e-6)


def test_fla_plumbing_matches_the_torch_path():
    ref, fla = _layer(torch.float32), _layer(torch.float32)
    fla.fla = gated_delta_fla.FlaKernels(_chunk_like_fla)
    shape = StateShape(1, 2 * HK * DK + H * DV, K - 1, H, DK, DV)
    pools = [StatePool(shape, 4, torch.float32, CPU, num_checkpoints=6) for _ in range(2)]
    g = torch.Generator().manual_seed(1)
    for t in (pools[0].conv, pools[0].ssm):
        t.copy_(torch.randn(t.shape, generator=g))  # stale slot contents: fresh sequences must not read them
    pools[1].conv.copy_(pools[0].conv)
    pools[1].ssm.copy_(pools[0].ssm)

    def same(batch: AttnBatch, T: int) -> None:
        x = torch.randn(T, D, generator=g)
        torch.testing.assert_close(fla.forward(x, batch, pools[1]), ref.forward(x, batch, pools[0]))
        torch.testing.assert_close(pools[1].ssm, pools[0].ssm)
        torch.testing.assert_close(pools[1].conv, pools[0].conv)

    def prefill(seqs: list[SeqAttn]) -> None:
        T = sum(s.q_len for s in seqs)
        same(AttnBatch(torch.zeros(T, dtype=torch.long), torch.zeros(T, dtype=torch.long), seqs=seqs), T)

    # a fresh 70-token sequence, one continuing, one continuing with checkpoints at 0, 5 and its end
    prefill([SeqAttn(0, 70, 0, 0), SeqAttn(70, 9, 12, 1), SeqAttn(79, 30, 40, 2, captures=[(5, 4), (0, 5), (30, 6)])])
    prefill([SeqAttn(0, 20, 70, 0)])  # alone: no cu_seqlens
    # two rounds for one sequence, three for the other: the later rounds' rows are not contiguous
    prefill([SeqAttn(0, 10, 79, 1, captures=[(3, 7)]), SeqAttn(10, 65, 0, 3, captures=[(64, 8), (2, 9)])])
