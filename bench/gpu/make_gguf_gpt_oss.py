"""A random-weight GGUF of gpt-oss-20b's shape for the llama.cpp peer of ``ft bench e2e --preset gpt-oss-20b``:
llama.cpp's ``gpt-oss`` architecture (``src/models/openai-moe.cpp``) with the routed experts in MXFP4 as shipped.

Shape (``presets.GptOssShape``): D 2880, 32 experts of 2880, top-4; 64 heads, 8 KV heads, head dim 64, a sink per
head, q/k/v/o biases, sliding window 128 on even layers (llama.cpp's default swa pattern 2), the biased router, the
experts' biases, YaRN rope (theta 150000, factor 32 over 4096), vocab 201088. Types: experts MXFP4 (ggml's
``block_mxfp4``: one e8m0 byte, then 16 bytes of 32 e2m1 nibbles = 17 bytes per 32 weights); the attention
projections, router, embeddings and head bf16; norms, biases and sinks f32.

Values: random e2m1 nibbles under e8m0 scales of 2^-8..2^-6 (byte 119..121: weights of std ~0.02 like the bf16
ones and like ``synthetic_gpt_oss.py``'s experts, so activations stay finite; never 0xFF, e8m0's NaN); bf16
weights std 0.02 (the router 0.5). Tokenizer: llama.cpp's ``llama`` (SentencePiece) vocab of placeholder pieces
``<unk> <s> </s> t3 ...`` -- no merges or scores to ship, and llama-bench feeds random token ids anyway.

Memory stays bounded: the header is written from tensor infos, then each tensor's bytes in chunks (one expert
tensor, ~141 MB, is the largest array held); the same random chunk repeats along the big tensors (speed does not
depend on the values). 24 layers: 13.75 GB (2.32 of them the embeddings and head).

    PYTHONPATH=llama.cpp/gguf-py python3 bench/gpu/make_gguf_gpt_oss.py OUT.gguf LAYERS
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator

import gguf
import numpy as np

D, I, E, K, NH, NKV, HD, WINDOW, V = 2880, 2880, 32, 4, 64, 8, 64, 128, 201088
BF, F32, MX = gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.MXFP4
QK, BLOCK = gguf.GGML_QUANT_SIZES[MX]  # 32 weights, 17 bytes
CHUNK_ROWS = 4096  # rows of a vocab-sized tensor per write (4096 x 2880 bf16 = 24 MB)

rng = np.random.default_rng(0)


def bf16(shape: tuple[int, ...], std: float = 0.02) -> np.ndarray:
    a = rng.standard_normal(int(np.prod(shape)), dtype=np.float32).reshape(shape) * std
    return (a.view(np.uint32) >> 16).astype(np.uint16)


def mxfp4(rows: int, cols: int) -> np.ndarray:
    """One [E, rows, cols] expert tensor as ggml's MXFP4 bytes [E, rows, cols/32 * 17]: e8m0 scale, then nibbles."""
    b = rng.integers(0, 256, (E * rows * (cols // QK), BLOCK), dtype=np.uint8)
    b[:, 0] = rng.integers(119, 122, b.shape[0], dtype=np.uint8)  # 2^-8..2^-6
    return b.reshape(E, rows, cols // QK * BLOCK)


Gen = Callable[[], Iterator[np.ndarray]]


class Plan:
    """Tensor infos first (the header needs every shape and size), their bytes later, in the same order."""

    def __init__(self) -> None:
        self.tensors: list[tuple[str, Gen]] = []

    def add(self, w: gguf.GGUFWriter, name: str, shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType,
            gen: Gen) -> None:  # fmt: skip
        """``shape`` in numpy order, in elements (the writer stores ggml's reversed ne)."""
        if qtype == MX:  # the writer takes MXFP4's byte shape [..., cols/32 * 17] and stores the elements' one
            byte_shape = (*shape[:-1], shape[-1] // QK * BLOCK)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=MX)
        else:
            dt = np.dtype(np.uint16 if qtype == BF else np.float32)
            w.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize, raw_dtype=qtype)
        self.tensors.append((name, gen))


def once(a: np.ndarray) -> Gen:
    return lambda: iter((a,))


def repeated(chunk: np.ndarray, rows: int) -> Gen:
    """``rows`` rows made of ``chunk``'s rows over and over (the vocab-sized embeddings and head)."""

    def gen() -> Iterator[np.ndarray]:
        for r in range(0, rows, len(chunk)):
            yield chunk[: min(len(chunk), rows - r)]

    return gen


def main(path: str, layers: int) -> None:
    t = time.time()
    w = gguf.GGUFWriter(path, "gpt-oss")
    w.add_block_count(layers)
    w.add_context_length(131072)
    w.add_embedding_length(D)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(150000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_rope_scaling_yarn_beta_fast(32.0)
    w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_sliding_window(WINDOW)
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    w.add_expert_feed_forward_length(I)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([2, 3, 3] + [1] * (V - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    p = Plan()
    ones = np.ones(D, np.float32)
    vocab_chunk = bf16((CHUNK_ROWS, D))
    p.add(w, "token_embd.weight", (V, D), BF, repeated(vocab_chunk, V))
    p.add(w, "output_norm.weight", (D,), F32, once(ones))
    p.add(w, "output.weight", (V, D), BF, repeated(vocab_chunk, V))
    Q, KV = NH * HD, NKV * HD
    attn = {n: bf16(s) for n, s in (("attn_q", (Q, D)), ("attn_k", (KV, D)), ("attn_v", (KV, D)),
                                     ("attn_output", (D, Q)), ("ffn_gate_inp", (E, D)))}  # fmt: skip
    attn["ffn_gate_inp"] = bf16((E, D), 0.5)
    biases = {n: rng.standard_normal(s, dtype=np.float32) * 0.02
              for n, s in (("attn_q", (Q,)), ("attn_k", (KV,)), ("attn_v", (KV,)), ("attn_output", (D,)),
                           ("ffn_gate_inp", (E,)), ("ffn_gate_exps", (E, I)), ("ffn_up_exps", (E, I)),
                           ("ffn_down_exps", (E, D)))}  # fmt: skip
    sinks = rng.standard_normal(NH, dtype=np.float32) * 0.02

    def expert(rows: int, cols: int) -> Gen:  # fresh random bytes per tensor, made when it is written
        return lambda: iter((mxfp4(rows, cols),))

    for i in range(layers):
        b = f"blk.{i}."
        p.add(w, b + "attn_norm.weight", (D,), F32, once(ones))
        p.add(w, b + "post_attention_norm.weight", (D,), F32, once(ones))
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            p.add(w, b + n + ".weight", attn[n].shape, BF, once(attn[n]))
            p.add(w, b + n + ".bias", biases[n].shape, F32, once(biases[n]))
        p.add(w, b + "attn_sinks.weight", (NH,), F32, once(sinks))
        p.add(w, b + "ffn_gate_inp.weight", (E, D), BF, once(attn["ffn_gate_inp"]))
        p.add(w, b + "ffn_gate_inp.bias", (E,), F32, once(biases["ffn_gate_inp"]))
        # ggml ne: gate/up {D, I, E}, down {I, D, E} -> numpy [E, I, D] and [E, D, I]
        for n, rows, cols in (("ffn_gate_exps", I, D), ("ffn_up_exps", I, D), ("ffn_down_exps", D, I)):
            p.add(w, b + n + ".weight", (E, rows, cols), MX, expert(rows, cols))
            p.add(w, b + n + ".bias", biases[n].shape, F32, once(biases[n]))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None and len(w.fout) == 1
    fout = w.fout[0]
    infos = w.tensors[0]
    total = 0
    for name, gen in p.tensors:
        nbytes, written = infos[name].nbytes, 0
        w.write_padding(fout, fout.tell())
        for part in gen():
            part.tofile(fout)
            written += part.nbytes
        if written != nbytes:
            raise RuntimeError(f"{name}: wrote {written} bytes, its info says {nbytes}")
        w.write_padding(fout, nbytes)
        total += nbytes
    w.close()
    print(f"wrote {path} layers={layers} ({total / 1e9:.2f} GB of tensors) in {time.time() - t:.1f}s")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: make_gguf_gpt_oss.py OUT.gguf LAYERS")
    main(sys.argv[1], int(sys.argv[2]))
