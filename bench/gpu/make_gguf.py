"""A random-weight GGUF of Qwen3-30B-A3B's per-layer shape for the llama.cpp peer, experts in bf16 or Q8_0
(random normal weights, std 0.02; 32 heads, 4 KV heads, head dim 128, 128 experts top-8, vocab 32000), the routed
experts' type as an argument: Q8_0 is the peer of our fp8-block experts, one byte per weight plus a scale per 32.
``bash bench/gpu/run.sh llamacpp`` writes both and times them.

    PYTHONPATH=llama.cpp/gguf-py python3 bench/gpu/make_gguf.py OUT.gguf LAYERS [bf16|q8_0]
"""

import sys
import time

import gguf
import numpy as np

path, layers = sys.argv[1], int(sys.argv[2])
experts = sys.argv[3] if len(sys.argv) > 3 else "bf16"
H, NH, NKV, HD, FF_EXP, E, K, V = 2048, 32, 4, 128, 768, 128, 8, 32000
t = time.time()
rng = np.random.default_rng(0)
BF, Q8 = gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.Q8_0


def f32(shape: tuple[int, ...], std: float = 0.02) -> np.ndarray:
    return rng.standard_normal(int(np.prod(shape)), dtype=np.float32).reshape(shape) * std


def bf16(a: np.ndarray) -> np.ndarray:
    return (a.view(np.uint32) >> 16).astype(np.uint16)


def expert_tensor(shape: tuple[int, ...]) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    a = f32(shape)
    return (gguf.quants.quantize(a, Q8), Q8) if experts == "q8_0" else (bf16(a), BF)


w = gguf.GGUFWriter(path, "qwen3moe")
w.add_block_count(layers)
w.add_context_length(32768)
w.add_embedding_length(H)
w.add_feed_forward_length(6144)
w.add_head_count(NH)
w.add_head_count_kv(NKV)
w.add_key_length(HD)
w.add_value_length(HD)
w.add_rope_freq_base(1e6)
w.add_layer_norm_rms_eps(1e-6)
w.add_expert_count(E)
w.add_expert_used_count(K)
w.add_expert_feed_forward_length(FF_EXP)
w.add_tokenizer_model("llama")
toks = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(V - 3)]
w.add_token_list(toks)
w.add_token_scores([0.0] * V)
w.add_token_types([2, 3, 3] + [1] * (V - 3))
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_tensor("token_embd.weight", bf16(f32((V, H))), raw_dtype=BF)
w.add_tensor("output_norm.weight", np.ones(H, np.float32))
w.add_tensor("output.weight", bf16(f32((V, H))), raw_dtype=BF)
(gate, gt), (up, ut), (down, dt) = (expert_tensor((E, FF_EXP, H)), expert_tensor((E, FF_EXP, H)),
                                    expert_tensor((E, H, FF_EXP)))  # fmt: skip
q, k, v, o = (bf16(f32(s)) for s in ((NH * HD, H), (NKV * HD, H), (NKV * HD, H), (H, NH * HD)))
router = bf16(f32((E, H), 0.5))
for i in range(layers):
    p = f"blk.{i}."
    for n in ("attn_norm", "ffn_norm"):
        w.add_tensor(p + n + ".weight", np.ones(H, np.float32))
    for n, a in (("attn_q", q), ("attn_k", k), ("attn_v", v), ("attn_output", o), ("ffn_gate_inp", router)):
        w.add_tensor(p + n + ".weight", a, raw_dtype=BF)
    for n in ("attn_q_norm", "attn_k_norm"):
        w.add_tensor(p + n + ".weight", np.ones(HD, np.float32))
    w.add_tensor(p + "ffn_gate_exps.weight", gate, raw_dtype=gt)
    w.add_tensor(p + "ffn_up_exps.weight", up, raw_dtype=ut)
    w.add_tensor(p + "ffn_down_exps.weight", down, raw_dtype=dt)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file(progress=False)
w.close()
print(f"wrote {path} layers={layers} experts={experts} in {time.time() - t:.1f}s")
