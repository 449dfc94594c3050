"""``ft bench e2e``'s ``deepseek-v4-flash`` preset writes DeepSeek-V4 in the released layout
(``bench/synthetic_dsv4.py``: MXFP4 routed experts, FP8 attention and shared expert, DeepSeek's names): at the
preset's layer count the checkpoint fits the GPU box's disk and RAM, its config.json is the published one; a
scaled-down one, every expert drawn, loads in transformers (its own dequantising FP8 load) with no tensor missing or
left over and in the engine, whose logits and greedy tokens match transformers' (CPU, fp32) on the offload and hybrid
backends; and ``ft bench e2e --preset`` writes one (scaled down) and decodes it end to end."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from freetoken import SamplingParams
from freetoken.bench.presets import PRESETS, DeepseekV4Shape, MoEShape
from freetoken.bench.synthetic_dsv4 import dsv4_bytes, dsv4_config, write_dsv4
from freetoken.checkpoint.hf_config import load_hf_config
from freetoken.cli.main import main
from reference import (
    INDEX_MARGIN,
    LOGIT_MARGIN,
    ROUTER_MARGIN,
    assert_close_logits,
    float32_llm,
    fp4_logit_rel,
    margins,
    reference_greedy,
    torch_ops,
)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

# deepseek-ai/DeepSeek-V4-Flash's config.json as published (the fields the preset sets; compress_ratios' 44th entry
# is the multi-token-prediction block's, not a layer's)
RATIOS = [0, 0] + [4, 128] * 20 + [4, 0]
REAL = {"hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43, "num_attention_heads": 64,
        "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8,
        "qk_rope_head_dim": 64, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
        "topk_method": "noaux_tc", "scoring_func": "sqrtsoftplus", "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "index_topk": 512, "index_n_heads": 64, "index_head_dim": 128,
        "compress_rope_theta": 160000, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_hash_layers": 3,
        "swiglu_limit": 10.0, "expert_dtype": "fp4", "sliding_window": 128, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                         "type": "yarn"},
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "vocab_size": 129280}  # fmt: skip


def test_real_shapes_fit_the_gpu_box():
    """The preset's e2e layers: at most 35 GB, MXFP4 experts."""
    s = PRESETS["deepseek-v4-flash"]
    assert 30e9 < dsv4_bytes(s, s.e2e_layers) <= 35e9 and s.fmt.name == "mxfp4"


def test_config_is_the_release_one(tmp_path):
    """All 43 layers: the published config.json's fields; at the preset's 9 layers, the real model's first 9, read
    by the engine as 2 sliding, 4 CSA and 3 HCA layers, the first 3 hash-routed, in the released quantisation."""
    from freetoken.models.deepseek_v4 import checkpoint_layout, v4_config

    s = PRESETS["deepseek-v4-flash"]
    assert s.dsv4 == DeepseekV4Shape()
    cfg = dsv4_config(s, DeepseekV4Shape(), 43, 1048576)
    assert {k: cfg[k] for k in REAL} == REAL and cfg["compress_ratios"] == RATIOS[:43]
    (tmp_path / "config.json").write_text(json.dumps(dsv4_config(s, DeepseekV4Shape(), s.e2e_layers, 131072)))
    hf = load_hf_config(tmp_path)
    c = v4_config(hf)
    assert [k[0] for k in c.kinds] == ["s", "s", "c", "h", "c", "h", "c", "h", "c"]
    assert c.hash_layers == (True,) * 3 + (False,) * 6 and c.rates == {"compressed_sparse_attention": 4,
                                                                       "heavily_compressed_attention": 128}
    layout = checkpoint_layout(hf)
    assert layout is not None and layout.scale_fmt == "ue8m0"


# scaled down: 5 layers (2 sliding, CSA, HCA at rate 8, CSA), 2 of them hash-routed, an 8-token window
TINY = DeepseekV4Shape(heads=4, head_dim=32, rope_dim=8, q_lora=32, o_groups=2, o_lora=16, window=8, hca_rate=8,
                       index_heads=16, index_dim=16, index_topk=3, hash_layers=2, vocab=512)  # fmt: skip
LAYERS = 5


def _tiny() -> MoEShape:
    return replace(PRESETS["deepseek-v4-flash"], hidden=64, inter=32, experts=8, top_k=2, e2e_layers=LAYERS,
                   dsv4=TINY)  # fmt: skip


def _transformers(d):
    import transformers as tf

    model, info = tf.AutoModelForCausalLM.from_pretrained(
        str(d), dtype=torch.float32, output_loading_info=True,
        quantization_config=tf.FineGrainedFP8Config(dequantize=True))  # fmt: skip
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.float().eval()


def test_scaled_down_checkpoint_matches_transformers(tmp_path):
    shape = _tiny()
    written = write_dsv4(tmp_path, shape, LAYERS, 256, 1.0, 0, same_experts=False, std=0.3)
    assert written == dsv4_bytes(shape, LAYERS) <= sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    model = _transformers(tmp_path)
    g = torch.Generator().manual_seed(0)
    refs = [reference_greedy(model, torch.randint(3, 500, (t,), generator=g).tolist(), 10) for t in (5, 19)]
    for r in refs:  # the near-tie rule
        assert r.min_logit_margin > LOGIT_MARGIN
        router, index = margins(model, r.prompt + r.tokens)
        assert router > ROUTER_MARGIN and index > INDEX_MARGIN, (router, index)
    with torch.no_grad(), torch_ops(model):
        full = [model(torch.tensor([r.prompt + r.tokens]), use_cache=False).logits[0] for r in refs]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    for backend in ("offload", "hybrid"):
        llm = float32_llm(tmp_path, backend, 0.5, 0.5 if backend == "hybrid" else None, max_batched_tokens=16)
        assert llm.engine.setup.loaded.banks.fmt.name == "mxfp4"
        for r, ref in zip(refs, full):
            assert_close_logits(llm.engine.score(r.prompt + r.tokens, chunk=7), ref, fp4_logit_rel())
        assert [o.token_ids for o in llm.generate([r.prompt for r in refs], params)] == [r.tokens for r in refs]
        llm.check_integrity()


def test_bench_e2e_writes_the_preset_and_decodes(tmp_path, monkeypatch, capsys):
    """``ft bench e2e --preset deepseek-v4-flash`` (scaled down): writes the released layout, decodes it on the
    offload and hybrid backends beside the MoE layers alone, printing each layer's misses per step (the prefetched hash
    layers': 0); a second call reuses it; a Qwen3-MoE-shaped checkpoint found in ``--dir`` is refused."""
    monkeypatch.setitem(PRESETS, "deepseek-v4-flash", _tiny())
    d, out = tmp_path / "ckpt", tmp_path / "e2e.json"
    argv = ["bench", "e2e", "--preset", "deepseek-v4-flash", "--dir", str(d), "--device", "cpu", "--policies"]
    argv += ["offload,hybrid", "--batch", "1", "--tokens", "4", "--warmup", "2", "--repeats", "1", "--moe-steps", "4"]
    argv += ["--no-bound", "--expert-cache", "0.5", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "# wrote" in printed
    for policy in ("offload", "hybrid"):  # the hash layers' experts were filled ahead: they never miss
        line = next(x for x in printed.splitlines() if x.startswith(f"# {policy} batch 1: "))
        per_layer = [float(v) for v in line.split("by MoE layer: ")[1].split()]
        assert len(per_layer) == LAYERS and per_layer[: TINY.hash_layers] == [0.0] * TINY.hash_layers, line
        assert max(per_layer[TINY.hash_layers :]) > 0, line  # ... where the routed layers do
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV4ForCausalLM"] and cfg["expert_dtype"] == "fp4"
    rows = json.loads(out.read_text())["rows"]
    assert [r["policy"] for r in rows] == ["offload", "hybrid"]
    assert all(r["e2e_tok_s"] > 0 and r["moe_tok_s"] > 0 for r in rows)
    assert {r["moe_layers"] for r in rows} == {LAYERS} and all(r["prefetched"] > 0 for r in rows)
    assert main(argv[:-2]) == 0 and "# wrote" not in capsys.readouterr().out
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"]}))
    (old / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(SystemExit, match="Qwen3MoeForCausalLM checkpoint, not the DeepseekV4ForCausalLM"):
        main([*argv[:4], "--dir", str(old), *argv[6:]])
