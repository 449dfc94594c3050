"""``ft bench e2e``'s ``kimi-linear`` and ``gemma-4`` presets write their real architecture
(``bench/synthetic_kimi.py``, ``bench/synthetic_gemma4.py``): at the preset's layer count the checkpoint fits the GPU
box's disk and RAM, its config.json is the release's (Kimi-Linear's against the published one; Gemma-4's read back per
layer by ``checkpoint/gemma4_config.py``); a scaled-down one, every expert drawn, loads in transformers with no tensor
missing or left over and in the engine, whose logits and greedy tokens match transformers' (CPU, fp32) on the offload
and hybrid backends; and ``ft bench e2e --preset`` writes one (scaled down) and decodes it end to end."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from freetoken import SamplingParams
from freetoken.bench.e2e_checkpoint import ATTENTION
from freetoken.bench.presets import PRESETS, Gemma4Shape, KimiLinearShape, MoEShape
from freetoken.bench.synthetic_gemma4 import gemma4_bytes, gemma4_config, write_gemma4
from freetoken.bench.synthetic_kimi import kimi_bytes, kimi_config, write_kimi
from freetoken.checkpoint.gemma4_config import FULL, SLIDING
from freetoken.checkpoint.gemma4_config import gemma4_config as read_gemma4
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.cli.main import main
from reference import LOGIT_MARGIN, ROUTER_MARGIN, assert_close_logits, float32_llm, reference_greedy, torch_ops
from test_reference_gemma4 import router_margin
from test_reference_kimi_linear import REAL as KIMI_REAL

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

WRITERS = {"kimi-linear": (write_kimi, kimi_bytes), "gemma-4": (write_gemma4, gemma4_bytes)}
# google/gemma-4-26B-A4B-it's text_config as public copies of its config.json give it (the fields the shape sets)
GEMMA4_26B = {"hidden_size": 2816, "intermediate_size": 2112, "num_attention_heads": 16, "num_key_value_heads": 8,
              "num_global_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512, "attention_k_eq_v": True,
              "sliding_window": 1024, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
              "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "use_double_wide_mlp": False,
              "final_logit_softcapping": 30.0, "vocab_size": 262144, "tie_word_embeddings": True}  # fmt: skip


@pytest.mark.parametrize("name", list(WRITERS))
def test_real_shapes_fit_the_gpu_box(name):
    """The preset's e2e layers: 30-37 GB (the frontier presets' budget), the first dense layer counted."""
    s = PRESETS[name]
    size = WRITERS[name][1](s, s.e2e_layers)
    assert 30e9 < size <= 37e9 and s.fmt.name == "bf16"


def test_kimi_config_is_the_release_one(tmp_path):
    """All 27 layers: the published config.json's fields (``test_reference_kimi_linear.REAL``), read as the 48B-A3B
    (20 KDA, 7 MLA layers, the first dense); at the preset's 10 layers, the real model's first 10."""
    s = PRESETS["kimi-linear"]
    assert s.kimi == KimiLinearShape()
    cfg = kimi_config(s, KimiLinearShape(), 27, 1048576)
    assert {k: cfg[k] for k in KIMI_REAL} == KIMI_REAL
    cfg = kimi_config(s, KimiLinearShape(), s.e2e_layers, ATTENTION["max_positions"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = load_hf_config(tmp_path)
    assert hf.layer_types is not None and [i for i, t in enumerate(hf.layer_types) if t == "full_attention"] == [3, 7]
    assert hf.moe_layer_ids == list(range(1, 10)) and (hf.num_experts, hf.top_k) == (256, 8)


def test_gemma4_config_is_the_release_one(tmp_path):
    """All 30 layers: the release's text_config (the head tied as there; the bench writes it untied, nothing else
    differing); read per layer, 25 sliding layers of 8 KV heads of 256 and 5 full ones of 2 KV heads of 512, keys
    equal values there; at the preset's 18 layers, three 5 : 1 groups."""
    s = PRESETS["gemma-4"]
    assert s.gemma4 == Gemma4Shape()
    for n, full in ((30, [5, 11, 17, 23, 29]), (s.e2e_layers, [5, 11, 17])):
        cfg = gemma4_config(s, Gemma4Shape(), n, ATTENTION["max_positions"], tied=True)
        assert {k: cfg[k] for k in GEMMA4_26B} == GEMMA4_26B
        untied = gemma4_config(s, Gemma4Shape(), n, ATTENTION["max_positions"])
        assert {k for k in cfg if cfg[k] != untied[k]} == {"tie_word_embeddings"}
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        g = read_gemma4(load_hf_config(tmp_path))
        assert [i for i, lay in enumerate(g.layers) if lay.kind == FULL] == full
        kinds = {(lay.kind, lay.head_dim, lay.kv_heads, lay.k_eq_v, lay.source == i) for i, lay in enumerate(g.layers)}
        assert kinds == {(SLIDING, 256, 8, False, True), (FULL, 512, 2, True, True)}
        got = (g.window, g.num_experts, g.top_k, g.moe_intermediate, g.ple_dim, g.softcap)
        assert got == (1024, 128, 8, 704, 0, 30)


# scaled down: the families' features kept (Kimi: MLA at 2 and 4 of 4, the first layer dense; Gemma-4: 2 x (2 sliding
# + 1 full) with an 8-token window, full layers of their own head dim and one KV head, k = v)
TINY = {
    "kimi-linear": dict(kimi=KimiLinearShape(heads=4, kv_lora=32, nope_dim=16, rope_dim=16, v_dim=24, kda_heads=4,
                                             kda_head_dim=16, full_attn_layers=(2, 4), dense_inter=96, vocab=512)),
    "gemma-4": dict(gemma4=Gemma4Shape(heads=4, kv_heads=2, head_dim=16, global_kv_heads=1, global_head_dim=32,
                                       window=8, pattern=3, dense_inter=96, vocab=512)),
}  # fmt: skip
LAYERS = {"kimi-linear": 4, "gemma-4": 6}
SEEDS = {"kimi-linear": 0, "gemma-4": 2}  # picked so the reference has no near ties (asserted below)


def _tiny(name: str) -> MoEShape:
    return replace(PRESETS[name], hidden=64, inter=32, experts=8, top_k=2, e2e_layers=LAYERS[name], **TINY[name])


@pytest.mark.parametrize("name", list(WRITERS))
def test_scaled_down_checkpoint_matches_transformers(tmp_path, name):
    import transformers as tf

    write, nbytes = WRITERS[name]
    shape, n = _tiny(name), LAYERS[name]
    written = write(tmp_path, shape, n, 256, 1.0, SEEDS[name], same_experts=False, std=0.3)
    assert written == nbytes(shape, n) <= sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    model, info = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32,
                                                          output_loading_info=True)  # fmt: skip
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    g = torch.Generator().manual_seed(0)
    refs = [reference_greedy(model.eval(), torch.randint(3, 500, (t,), generator=g).tolist(), 10,
                             top_k=2 if name == "kimi-linear" else None) for t in (5, 19)]  # fmt: skip
    for r in refs:  # the near-tie rule
        assert r.min_logit_margin > LOGIT_MARGIN
        margin = r.min_router_margin if name == "kimi-linear" else router_margin(model, r.prompt + r.tokens[:-1], 2)
        assert margin > ROUTER_MARGIN
    with torch.no_grad(), torch_ops(model):  # transformers' torch functions, not an installed fla's (the GPU box)
        full = [model(torch.tensor([r.prompt + r.tokens]), use_cache=False).logits[0] for r in refs]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    for backend in ("offload", "hybrid"):
        llm = float32_llm(tmp_path, backend, 0.5, 0.5 if backend == "hybrid" else None, max_batched_tokens=16)
        for r, ref in zip(refs, full):
            assert_close_logits(llm.engine.score(r.prompt + r.tokens, chunk=7), ref)
        assert [o.token_ids for o in llm.generate([r.prompt for r in refs], params)] == [r.tokens for r in refs]
        llm.check_integrity()


@pytest.mark.parametrize("name", list(WRITERS))
def test_bench_e2e_writes_the_preset_and_decodes(tmp_path, monkeypatch, capsys, name):
    """``ft bench e2e --preset NAME`` (the preset scaled down): writes the family's checkpoint, decodes it on the
    offload and hybrid backends beside the MoE layers alone; a second call reuses it; a Qwen3-MoE-shaped checkpoint
    found in ``--dir`` (what these presets wrote before) is refused."""
    monkeypatch.setitem(PRESETS, name, _tiny(name))
    d, out = tmp_path / "ckpt", tmp_path / "e2e.json"
    argv = ["bench", "e2e", "--preset", name, "--dir", str(d), "--device", "cpu", "--policies", "offload,hybrid"]
    argv += ["--batch", "1", "--tokens", "4", "--warmup", "2", "--repeats", "1", "--moe-steps", "4", "--no-bound"]
    argv += ["--expert-cache", "0.5", "--json", str(out)]
    assert main(argv) == 0
    assert "# wrote" in capsys.readouterr().out
    arch = {"kimi-linear": "KimiLinearForCausalLM", "gemma-4": "Gemma4ForCausalLM"}[name]
    assert json.loads((d / "config.json").read_text())["architectures"] == [arch]
    rows = json.loads(out.read_text())["rows"]
    assert [r["policy"] for r in rows] == ["offload", "hybrid"]
    assert all(r["e2e_tok_s"] > 0 and r["moe_tok_s"] > 0 for r in rows)
    assert {r["moe_layers"] for r in rows} == {LAYERS[name] - (name == "kimi-linear")}  # Kimi's first layer dense
    assert main(argv[:-2]) == 0 and "# wrote" not in capsys.readouterr().out
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"]}))
    (old / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(SystemExit, match=f"Qwen3MoeForCausalLM checkpoint, not the {arch}"):
        main([*argv[:4], "--dir", str(old), *argv[6:]])


def test_cache_dirs_name_the_kind(monkeypatch, freetoken_env, tmp_path):
    """Without --dir the checkpoint lives in the cache under the layer count and the family's kind: the Qwen3-MoE
    ones these presets wrote before (``-v2``) are not picked up."""
    from freetoken.bench.e2e import add_arguments
    from freetoken.bench.e2e_checkpoint import checkpoint

    freetoken_env("FREETOKEN_CACHE", str(tmp_path))
    for name, kind in (("kimi-linear", "kimi"), ("gemma-4", "gemma4")):
        monkeypatch.setitem(PRESETS, name, _tiny(name))
        stale = tmp_path / "bench" / f"{name}-{LAYERS[name]}layers-v2"
        stale.mkdir(parents=True)
        args = add_arguments(argparse.ArgumentParser()).parse_args(["--preset", name])
        assert checkpoint(args) == tmp_path / "bench" / f"{name}-{LAYERS[name]}layers-{kind}"


@pytest.mark.parametrize("name", list(WRITERS))
def test_routing_trace_routes_every_moe_layer(tmp_path, name):
    """``--routing-trace`` on these families: every MoE layer routes by the trace (Gemma-4's experts sit beside its
    dense MLP, not in the layer's ``ffn``), one trace token further per decode step."""
    from freetoken.bench import routing_trace

    shape = _tiny(name)
    write = WRITERS[name][0]
    write(tmp_path / "m", shape, LAYERS[name], 256, 1.0)
    llm = float32_llm(tmp_path / "m", "cpu")
    L = len(llm.engine.hf.moe_layer_ids)
    rng = np.random.default_rng(1)
    trace = np.sort(np.stack([[rng.choice(8, 2, replace=False) for _ in range(L)] for _ in range(20)]), -1)
    np.save(tmp_path / "t.npy", trace.astype(np.uint8))
    assert len(routing_trace.install(llm, str(tmp_path / "t.npy")).ids[0]) == L == len(routing_trace.moe_layers(
        llm.engine.setup.loaded.model))  # fmt: skip
    backend = llm.engine.setup.loaded.backend
    seen: list[list[list[int]]] = []
    real = backend.forward
    backend.forward = lambda layer, x, ids, w: seen.append(ids.tolist()) or real(layer, x, ids, w)
    llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    steps = [seen[i : i + L] for i in range(0, len(seen), L)]
    assert len(steps) == 4 and all(steps[s][j] == [trace[s, j].tolist()] for s in (1, 2, 3) for j in range(L))


def test_positions_raised_under_kimis_own_field(tmp_path):
    """A prompt longer than the written context raises it in the field the config has: Kimi-Linear's
    ``model_max_length`` (no ``max_position_embeddings`` added beside it), read back as the model's limit."""
    from freetoken.bench.e2e_checkpoint import allow_positions

    cfg = kimi_config(PRESETS["kimi-linear"], KimiLinearShape(), 4, 64)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    allow_positions(tmp_path, 100)
    got = json.loads((tmp_path / "config.json").read_text())
    assert got["model_max_length"] == 100 and "max_position_embeddings" not in got
    assert load_hf_config(tmp_path).max_position_embeddings == 100
