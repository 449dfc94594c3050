"""flash-linear-attention's gated delta rule kernels (``kernels/gated_delta_fla.py``) on CUDA against our references
on the same bf16 inputs, at the fast-step issue's bf16 tolerance: chunked prefill against the float32 chunked
reference (one sequence and variable-length batches, from given initial states), and inside the engine on tiny
Qwen3-Next / Qwen3.5-MoE models in bf16 through fused and hybrid, every prefill call against a float64 recurrence
(decode steps run ``deltanet_triton``, ``test_deltanet_step.py``). The GPU box, with fla-core on PYTHONPATH: ``bash
bench/gpu/run.sh tests gpu1|gpu2``, which installs the carried fla-core wheel."""

from __future__ import annotations

import pytest
import torch

from devices import assert_bf16_close
from freetoken import LLM, SamplingParams
from freetoken.kernels import gated_delta_fla
from freetoken.kernels.gated_delta import chunk_gated_delta, heads, l2norm, recurrent_gated_delta
from freetoken.layers.deltanet import GatedDeltaNet

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")
BF16 = torch.bfloat16
SHAPES = [(16, 32, 128, 128), (2, 4, 64, 32), (2, 4, 16, 16)]  # (Hk, H, dk, dv): Qwen3.6-35B-A3B's, a small GVA one,
# the tiny test checkpoints' (their model-level fla run measured 0.29 relative l2 off the torch path)


def _fla() -> gated_delta_fla.FlaKernels:
    fla = gated_delta_fla.kernels(CUDA, BF16)
    assert fla is not None, "fla-core is not importable here (PYTHONPATH=src:.carry/pylib)"
    return fla


_close = assert_bf16_close  # the shared bf16 tolerance


def _inputs(T: int, hk: int, h: int, dk: int, dv: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """bf16 q/k/v as the conv leaves them; the gates as the model makes them: g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b)."""
    q, k = (torch.randn(T, hk, dk, generator=g).to(CUDA, BF16) for _ in range(2))
    v = torch.randn(T, h, dv, generator=g).to(CUDA, BF16)
    a, b = (torch.randn(T, h, generator=g).to(CUDA, BF16) for _ in range(2))
    A_log, dt_bias = torch.rand(h, generator=g).to(CUDA) * 2 - 1, torch.rand(h, generator=g).to(CUDA)
    decay = -A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    return q, k, v, decay, torch.sigmoid(b).float()


def _reference_heads(q: torch.Tensor, k: torch.Tensor, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    rep = h // q.shape[1]
    return (l2norm(q.float()).repeat_interleave(rep, dim=1) * q.shape[-1] ** -0.5,
            l2norm(k.float()).repeat_interleave(rep, dim=1))  # fmt: skip


@pytest.mark.parametrize("hk,h,dk,dv", SHAPES)
@pytest.mark.parametrize("lengths", [[1000], [1, 63, 64, 65, 300], [7, 129]])
def test_chunk_matches_reference(hk, h, dk, dv, lengths):
    fla, g = _fla(), torch.Generator().manual_seed(sum(lengths) + dk)
    T = sum(lengths)
    q, k, v, decay, beta = _inputs(T, hk, h, dk, dv, g)
    state = (torch.randn(len(lengths), h, dk, dv, generator=g) * 0.5).to(CUDA)  # states carried from before
    out, final = gated_delta_fla.chunk(fla, q, k, v, decay, beta, state, lengths)
    assert out.shape == (T, h, dv) and final.shape == state.shape and final.dtype == torch.float32
    rq, rk = _reference_heads(q, k, h)
    start = 0
    for i, n in enumerate(lengths):
        rows = slice(start, start + n)
        ref, ref_state = chunk_gated_delta(rq[rows], rk[rows], v[rows].float(), decay[rows], beta[rows], state[i])
        _close(out[rows], ref, f"sequence {i} ({n} tokens) out")
        _close(final[i], ref_state, f"sequence {i} ({n} tokens) state")
        start += n


# Model level: tiny random checkpoints in bf16 through the engine (mixed steps, variable-length prefill in 64-token
# chunks from the slots' states, graphed decode), every fla prefill call checked against a float64 recurrence on its
# own inputs and initial states. Not fla's model against the torch path's: these random tiny models move their logits
# 0.02-0.11 (relative l2) for 4e-3 of row-wise noise on the DeltaNet output with the routing pinned, up to 0.35 free
# (the torch path, ``python3 bench/gpu/fla_model.py --device cpu --noise 4e-3``), so their logits cannot tell a bf16
# kernel (fla: 2-5e-3 from the float64 recurrence per call, H100) from a wrong one (2026-12-05).
SEEDS = {"qwen3_next": 16, "qwen3_5_moe": 2}
BACKENDS = [("fused", None, None), ("hybrid", 1.0, 0.5)]
PROMPT_LENGTHS, STEPS = (1, 9, 30, 200), 16


def float64_recurrence(
    layer: GatedDeltaNet, convolved: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, seqs: list, init: list
) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill call's truth, token by token in float64 from each sequence's initial state: the output [T, H, dv]
    and the final states [N, H, dk, dv]."""
    q, k, v = (t.double() for t in heads(convolved, layer.hk, layer.dk, layer.h))
    core = torch.zeros(q.shape[0], layer.h, layer.dv, dtype=torch.float64, device=q.device)
    finals = []
    for s, st in zip(seqs, init):
        st = st.double()[None]
        for t in range(s.q_start, s.q_start + s.q_len):
            o, st = recurrent_gated_delta(q[t][None], k[t][None], v[t][None], g[t][None].double(),
                                          beta[t][None].double(), st)  # fmt: skip
            core[t] = o[0]
        finals.append(st[0])
    return core, torch.stack(finals)


class Checked:
    """``GatedDeltaNet._chunks_fla`` wrapped: per layer, each call's output and the states it left in the sequences'
    slots, beside the float64 recurrence's."""

    def __init__(self, chunks_fla) -> None:
        self.chunks_fla = chunks_fla
        self.calls: dict[int, list[tuple[torch.Tensor, ...]]] = {}

    def __call__(self, layer: GatedDeltaNet, fla, convolved, g, beta, seqs, states) -> torch.Tensor:
        ssm = states.ssm[layer.layer]
        init = [torch.zeros_like(ssm[s.state_slot]) if s.start == 0 else ssm[s.state_slot].clone() for s in seqs]
        core = self.chunks_fla(layer, fla, convolved, g, beta, seqs, states)
        truth, finals = float64_recurrence(layer, convolved, g, beta, seqs, init)
        left = torch.stack([ssm[s.state_slot] for s in seqs])
        self.calls.setdefault(layer.layer, []).append((core, truth, left, finals))
        return core


@pytest.fixture(scope="module", params=sorted(SEEDS))
def bf16_ckpt(request, tmp_path_factory):
    from tiny_models import save_checkpoint

    family = request.param
    d = tmp_path_factory.mktemp(family)
    save_checkpoint(family, d, seed=SEEDS[family])
    g = torch.Generator().manual_seed(1000 + SEEDS[family])
    return d, [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@pytest.mark.parametrize("backend,cache,fill", BACKENDS)
def test_fla_prefill_in_the_engine_matches_a_float64_recurrence(bf16_ckpt, backend, cache, fill, freetoken_env,
                                                                monkeypatch):  # fmt: skip
    """Every prompt at once (mixed steps, varlen prefill in 64-token chunks, graphed decode): per DeltaNet layer,
    fla's outputs over all its prefill calls and the states it left in the slots agree with the float64 recurrence
    at the bf16 tolerance; the decode steps then run from those states to the end."""
    d, prompts = bf16_ckpt
    freetoken_env("FREETOKEN_FLA", "1")
    checked = Checked(GatedDeltaNet._chunks_fla)
    monkeypatch.setattr(GatedDeltaNet, "_chunks_fla", lambda self, *args: checked(self, *args))
    llm = LLM(model=str(d), device="cuda", dtype="bfloat16", moe_backend=backend, expert_cache=cache,
              fill_fraction=fill, max_batched_tokens=64)  # fmt: skip
    mixers = [layer.attn for layer in llm.engine.runner.model.layers if isinstance(layer.attn, GatedDeltaNet)]
    assert mixers and all(m.fla is not None for m in mixers)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [STEPS] * len(prompts)
    assert llm.stats()["step_graph_replays"] > 0  # the decode steps ran from captured step graphs
    llm.check_integrity()
    assert sorted(checked.calls) == sorted(m.layer for m in mixers)
    for layer, calls in checked.calls.items():
        core, truth, left, finals = (torch.cat([c[i].flatten() for c in calls]) for i in range(4))
        _close(core, truth, f"layer {layer}: fla's output over its {len(calls)} prefill calls")
        _close(left, finals, f"layer {layer}: the states fla left in the slots")
