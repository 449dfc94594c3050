"""The sampler's one-pass draw (``kernels/draw_triton.py``) against its torch reference
(``sampler.gumbel_argmax_reference``): Triton's interpreter on the CPU, the kernel on CUDA (and replayed from a CUDA
graph). Greedy rows give exactly torch.argmax (the lowest index on ties); drawn rows give the reference's token, or,
where the reference's best two ``z + g`` are within 1e-5 (the logs may differ by an ulp), a token within 1e-5 of
its best; -inf and NaN tokens are never picked; a row's draw depends on its (seed, step) only."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from devices import _NO_INTERPRETER
from freetoken.runner import noise, sampler
from freetoken.runner.sampler import Features, SamplingBatch, gumbel_argmax_reference, sample_batch

DEVICES = [
    pytest.param("cpu", marks=[pytest.mark.interp, _NO_INTERPRETER]),  # Triton's interpreter
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]),
]
NEAR = 1e-5


Seeds = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # the rows' seed halves and steps, int64


def _kernel(
    x: torch.Tensor, temp: torch.Tensor, seeds: Seeds, greedy: torch.Tensor, unit: bool = False
) -> torch.Tensor:
    """The kernel on x's device; greedy rows passed at temperature 0 (the kernel tells them by their temperature)."""
    from freetoken.kernels.draw_triton import gumbel_argmax_triton

    t = torch.where(greedy, torch.zeros_like(temp), temp)
    lo, hi, step = (v.to(x.device) for v in seeds)
    return gumbel_argmax_triton(x, t.to(x.device), lo, hi, step, unit)


def _keys(seeds: Seeds) -> torch.Tensor:
    return noise.row_keys(*(v.cpu() for v in seeds))


def _inputs(B: int, V: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, Seeds, torch.Tensor]:
    """Random logits (a third of the rows' tokens masked to -inf in every other row), temperatures 0.3 .. 1.7,
    every third row greedy, random 64-bit seeds and steps (steps past 2**32 too: their low 32 bits count)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g) * 4
    for r in range(0, B, 2):
        x[r, torch.rand(V, generator=g) < 0.33] = float("-inf")
    temp = 0.3 + 1.4 * torch.rand(B, generator=g)
    greedy = torch.arange(B) % 3 == 2
    temp = torch.where(greedy, torch.ones_like(temp), temp)
    lo, hi = (torch.randint(0, 2**32, (B,), generator=g) for _ in range(2))
    step = torch.randint(0, 2**40, (B,), generator=g)
    return x.to(device), temp.to(device), (lo, hi, step), greedy.to(device)


def _check(x: torch.Tensor, temp: torch.Tensor, seeds: Seeds, greedy: torch.Tensor, got: torch.Tensor) -> None:
    x, temp, greedy, got = (t.cpu() for t in (x, temp, greedy, got))
    keys = _keys(seeds)
    ref = gumbel_argmax_reference(x, temp, keys, greedy)
    g = -torch.log(-torch.log(noise.uniform(keys, x.shape[1])))
    v = (x - x.max(dim=-1, keepdim=True).values) / temp[:, None] + g
    for r in range(x.shape[0]):
        i, j = int(got[r]), int(ref[r])
        assert torch.isfinite(x[r, i]), (r, i)
        if bool(greedy[r]) or i == j:
            assert i == j, (r, i, j)
            continue
        top2 = v[r].topk(2).values
        assert float(top2[0] - top2[1]) <= NEAR and float(v[r, j] - v[r, i]) <= NEAR, (r, i, j, top2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B, V", [(1, 1000), (3, 1000), (8, 1000), (3, 151_936)])
def test_the_kernel_draws_the_reference_token(device: str, B: int, V: int) -> None:
    for seed in range(3 if V <= 1000 else 1):
        x, temp, seeds, greedy = _inputs(B, V, device, seed)
        _check(x, temp, seeds, greedy, _kernel(x, temp, seeds, greedy))


@pytest.mark.parametrize("device", DEVICES)
def test_the_noise_is_bit_exact(device: str) -> None:
    """Flat logits at temperature 1: the draw is the argmax of the row's uniforms (distinct 23-bit draws), so every
    row's token is exactly the reference's: the hash, its keys and the token counter as noise.py's."""
    B, V = 64, 1000
    seeds = ((torch.arange(B) * 977 + 2**32 - 40) % 2**32, torch.arange(B) % 5, torch.arange(B) * 3)
    keys = _keys(seeds)
    x, temp, greedy = torch.zeros(B, V), torch.ones(B), torch.zeros(B, dtype=torch.bool)
    got = _kernel(x.to(device), temp, seeds, greedy).cpu()
    assert got.tolist() == noise.uniform(keys, V).argmax(dim=-1).tolist()
    assert got.tolist() == gumbel_argmax_reference(x, temp, keys, greedy).tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_ties_masks_and_nan(device: str) -> None:
    V = 5000
    x = torch.randn(6, V)
    x[0, [7, 2100, 4999]] = 50.0  # greedy, a tie across blocks: the lowest index
    x[1] = float("-inf")  # all masked: 0, as torch.argmax
    x[2] = float("-inf")
    x[2, 4321] = 0.0  # one allowed token: drawn whatever the noise
    x[3, 3000] = float("nan")  # greedy: NaN skipped
    x[3, 10] = 9.0
    x[4, ::2] = float("nan")  # drawn: NaN never picked
    x[5] = 1.0  # greedy, all tied: 0
    greedy = torch.tensor([True, False, False, True, False, True])
    seeds = (torch.arange(6), torch.zeros(6, dtype=torch.int64), torch.arange(6))
    keys = _keys(seeds)
    got = _kernel(x.to(device), torch.ones(6), seeds, greedy).cpu().tolist()
    assert got[:4] + got[5:] == [7, 0, 4321, 10, 0]
    clean = torch.where(x[4].isnan(), float("-inf"), x[4])[None]
    assert got[4] % 2 == 1 and got[4] == gumbel_argmax_reference(clean, torch.ones(1), keys[4:5], greedy[4:5]).item()


@pytest.mark.parametrize("device", DEVICES)
def test_a_rows_draw_depends_on_its_seed_and_step_only(device: str) -> None:
    V = 3000
    row = torch.randn(V) * 2
    x = torch.randn(5, V)
    x[1] = x[3] = row
    lo, hi, step = torch.tensor([1, 42, 9, 42, 5]), torch.tensor([0, 3, 0, 3, 1]), torch.tensor([0, 3, 3, 3, 7])
    t = torch.full((5,), 0.8)
    mixed = _kernel(x.to(device), t, (lo, hi, step), torch.zeros(5, dtype=torch.bool))
    one = torch.zeros(1, dtype=torch.bool)
    alone = _kernel(row[None].to(device), t[:1], (lo[1:2], hi[1:2], step[1:2]), one)
    assert int(mixed[1]) == int(mixed[3]) == int(alone[0])
    steps = [(lo[1:2], hi[1:2], step[1:2] + s) for s in range(8)]  # successive steps
    assert len({int(_kernel(row[None].to(device), t[:1], s, one)[0]) for s in steps}) > 2


@pytest.mark.parametrize("device", DEVICES)
def test_unit_draws_every_row_at_temperature_one(device: str) -> None:
    """``unit`` (the draw after a top-p cut): a row at temperature 0 is drawn too, every row as at temperature 1."""
    x, temp, seeds, greedy = _inputs(6, 1000, device, 5)
    got = _kernel(x, temp, seeds, greedy, unit=True)
    _check(x, torch.ones(6), seeds, torch.zeros(6, dtype=torch.bool), got)
    assert got.cpu().tolist() != torch.argmax(x, dim=-1).cpu().tolist()


def _batch(B: int, device: str, temperature: torch.Tensor, top_p: float) -> SamplingBatch:
    f, i = torch.float32, torch.int64
    z = torch.zeros(B, dtype=i, device=device)
    return SamplingBatch(
        temperature=temperature.to(device), top_k=z, top_p=torch.full((B,), top_p, dtype=f, device=device),
        min_p=torch.zeros(B, dtype=f, device=device), seed_lo=torch.arange(B, device=device) * 11 + 3, seed_hi=z,
        step=torch.arange(B, device=device) + 5, rows=z, presence=torch.zeros(B, dtype=f, device=device),
        frequency=torch.zeros(B, dtype=f, device=device), repetition=torch.ones(B, dtype=f, device=device),
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cuts", [False, True])
def test_sample_batch_through_the_kernel(device: str, cuts: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """sample_batch's draw with and without top-p (whose cut leaves -inf outside the kept set), the dispatch forced to
    the kernel, against the torch path on the CPU."""
    B, V = 4, 2000
    x = torch.randn(B, V) * 3
    temp = torch.tensor([1.0, 0.0, 0.6, 1.3])
    f = Features(draw=True, cuts=cuts, penalties=False, logprobs=False)
    want = sample_batch(x, _batch(B, "cpu", temp, 0.9), None, f).ids
    monkeypatch.setattr(sampler, "use_triton", lambda _: True)
    got = sample_batch(x.to(device), _batch(B, device, temp, 0.9), None, f).ids.cpu()
    if cuts:  # the reference's kept set and noise, as the kernel saw them
        b = _batch(B, "cpu", temp, 0.9)
        t = torch.where(temp < 1e-5, torch.ones_like(temp), temp)
        z = sampler._cut((x - x.max(dim=-1, keepdim=True).values) / t[:, None], b)
        drawn, n = temp >= 1e-5, int((temp >= 1e-5).sum())
        seeds = (b.seed_lo[drawn], b.seed_hi[drawn], b.step[drawn])
        _check(z[drawn], torch.ones(n), seeds, torch.zeros(n, dtype=torch.bool), got[drawn])
        assert got[~drawn].tolist() == want[~drawn].tolist()
    else:
        seeds = (torch.arange(B) * 11 + 3, torch.zeros(B, dtype=torch.int64), torch.arange(B) + 5)
        _check(x, torch.where(temp < 1e-5, torch.ones_like(temp), temp), seeds, temp < 1e-5, got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("cuts", [False, True])
def test_the_draw_replays_from_a_cuda_graph(cuts: bool) -> None:
    B, V = 4, 151_936
    x = (torch.randn(B, V) * 3).cuda()
    x[0, ::3] = float("-inf")
    b = _batch(B, "cuda", torch.tensor([1.0, 0.0, 0.6, 1.3]), 0.95)
    f = Features(draw=True, cuts=cuts, penalties=False, logprobs=False)
    eager = sample_batch(x, b, None, f).ids.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sample_batch(x, b, None, f)  # warm-up (compiles) off the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sample_batch(x, b, None, f).ids
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    b.step.add_(1)  # the next step, through the same graph: what eager draws
    graph.replay()
    assert torch.equal(out, sample_batch(x, b, None, f).ids)


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs triton, compiled (not its interpreter)",
)
def test_the_draw_compiles_for_sm90_with_the_precise_log_and_32_bit_hash() -> None:
    """No GPU needed: Triton's compiler to PTX for sm_90. The hash in uint32 ops (logical shifts, no int64 vector)
    and libdevice's logf, not lg2.approx (see the module's docstring)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from freetoken.kernels import draw_triton as d

    sig = {"X": "*fp32", "T": "*fp32", "LO": "*i64", "HI": "*i64", "STEP": "*i64", "PM": "*fp32", "DM": "*fp32",
           "DI": "*i32", "V": "i32", "stride": "i32", "NB": "i32", "NB_POW": "constexpr", "BLOCK": "constexpr",
           "PRECISE": "constexpr", "UNIT": "constexpr"}  # fmt: skip
    consts = {"NB_POW": 128, "BLOCK": d.BLOCK, "PRECISE": True, "UNIT": False}
    names = d._draw_kernel.arg_names
    src = ASTSource(d._draw_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    ttir, ptx = k.asm["ttir"], k.asm["ptx"]
    assert "__nv_logf" in ttir and "lg2.approx" not in ptx
    assert "arith.shrsi" not in ttir and "arith.uitofp" in ttir and f"tensor<{d.BLOCK}xi64>" not in ttir
