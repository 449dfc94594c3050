"""Per-layer shapes of the MoE models the benchmarks emulate (routed experts only; bf16, or the checkpoint's
quantised format for the ``-fp8`` presets: the same shape in fp8 e4m3 with 128x128 block scales; ``-nvfp4`` and
``deepseek-v4-flash-experts``, ``gpt-oss-20b``: FP4 experts, ``quant/nvfp4.py`` and ``quant/mxfp4.py``).

Synthetic runs keep a preset's per-layer shape exact and may run fewer layers (``--layers``) to fit
the machine; reports say how many ran.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from freetoken.quant import WeightFormat, format_by_name


@dataclass(frozen=True)
class HybridShape:
    """The token mixers of a hybrid model (Qwen3.5/3.6-MoE): gated DeltaNet layers, every ``interval``-th layer gated
    full attention; and its shared expert."""

    heads: int = 16
    kv_heads: int = 2
    head_dim: int = 256
    linear_k_heads: int = 16
    linear_v_heads: int = 32
    linear_k_dim: int = 128
    linear_v_dim: int = 128
    conv_kernel: int = 4
    interval: int = 4  # 3 DeltaNet : 1 full attention
    shared_inter: int = 512
    partial_rotary: float = 0.25


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention's shapes (DeepSeek-V3, GLM-5), and DeepSeek sparse attention's indexer where
    ``index_heads`` > 0 (``bench/synthetic_mla.py`` writes them)."""

    q_lora: int
    nope_dim: int
    v_dim: int
    kv_lora: int = 512
    rope_dim: int = 64
    index_heads: int = 0
    index_dim: int = 128
    index_topk: int = 2048


@dataclass(frozen=True)
class FrontierShape:
    """The rest of a sigmoid-routed frontier model (GLM-4.5 to 4.7, GLM-5, MiniMax-M2, DeepSeek-V3/V3.2) as its config
    ships it: attention, the first dense layers, shared experts, routing (``bench/synthetic_frontier.py`` writes such a
    checkpoint). ``mla``: latent attention of those shapes (heads = query heads; kv_heads and head_dim unused)."""

    family: str  # "glm4_moe" | "minimax_m2" | "deepseek_v3" | "deepseek_v32" | "glm_moe_dsa"
    heads: int
    kv_heads: int
    head_dim: int
    partial_rotary: float
    dense_layers: int = 0  # first_k_dense_replace
    dense_inter: int = 0  # their MLP's intermediate size
    shared_experts: int = 0  # n_shared_experts, each of the routed experts' width
    n_group: int = 1
    topk_group: int = 1
    scale: float = 1.0  # routed_scaling_factor
    rope_theta: float = 1e6
    mla: MLAShape | None = None


@dataclass(frozen=True)
class GptOssShape:
    """The rest of gpt-oss as its config ships it (``bench/synthetic_gpt_oss.py`` writes such a checkpoint):
    attention with biases and sinks, sliding-window layers alternating with full ones, its vocabulary."""

    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 64
    window: int = 128
    vocab: int = 201088


GLM_4_7 = FrontierShape("glm4_moe", 96, 8, 128, 0.5, dense_layers=3, dense_inter=12288, shared_experts=1, scale=2.5)
MINIMAX_M2 = FrontierShape("minimax_m2", 48, 8, 128, 0.5, rope_theta=5e6)  # rotary_dim 64 of 128
# DeepSeek-V3/V3.2: 128 heads, q LoRA 1536, the latent 512 + 64, 8 groups of 32 experts (4 kept); V3.2's indexer
# 64 heads of 128. GLM-5: 64 heads, q LoRA 2048, no-rope 192, values 256, one group, its indexer 32 heads of 128.
DEEPSEEK_MLA = MLAShape(q_lora=1536, nope_dim=128, v_dim=128)
DEEPSEEK_V3 = FrontierShape("deepseek_v3", 128, 128, 64, 1.0, dense_layers=3, dense_inter=18432, shared_experts=1,
                            n_group=8, topk_group=4, scale=2.5, rope_theta=1e4, mla=DEEPSEEK_MLA)  # fmt: skip
DEEPSEEK_V32 = replace(DEEPSEEK_V3, family="deepseek_v32", mla=replace(DEEPSEEK_MLA, index_heads=64))
GLM_5 = FrontierShape("glm_moe_dsa", 64, 64, 64, 1.0, dense_layers=3, dense_inter=12288, shared_experts=1, scale=2.5,
                      mla=MLAShape(q_lora=2048, nope_dim=192, v_dim=256, index_heads=32))  # fmt: skip


@dataclass(frozen=True)
class DeepseekV4Shape:
    """DeepSeek-V4-Flash's non-expert shapes (``models/deepseek_v4.py``; ``bench/synthetic_dsv4.py`` writes such a
    checkpoint in the released layout), as its published config.json has them (the defaults of transformers 5.23's
    ``DeepseekV4Config`` too): 64 heads of 512, one KV head, q LoRA 1024, 8 output groups of 1024, a 128-token
    window, CSA at rate 4 with a 64-head indexer of 128 keeping 512, HCA at rate 128; the release's schedule
    (``compress_ratios``): two sliding-window layers, then CSA / HCA alternating; the first 3 layers routed by token
    id; 4 residual streams."""

    heads: int = 64
    head_dim: int = 512  # one KV head, K = V
    rope_dim: int = 64
    q_lora: int = 1024
    o_groups: int = 8
    o_lora: int = 1024
    window: int = 128
    csa_rate: int = 4
    hca_rate: int = 128
    index_heads: int = 64
    index_dim: int = 128
    index_topk: int = 512
    hc_mult: int = 4
    hash_layers: int = 3  # routed by token id (``tid2eid``)
    shared_experts: int = 1
    scale: float = 1.5  # routed_scaling_factor (sqrtsoftplus scores)
    vocab: int = 129280


@dataclass(frozen=True)
class KimiLinearShape:
    """Kimi-Linear-48B-A3B's non-expert shapes (``models/kimi_linear.py``; ``bench/synthetic_kimi.py`` writes such a
    checkpoint), from moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (its published values; the defaults of
    transformers 5.23's ``KimiLinearConfig`` too): KDA layers beside NoPE latent-attention layers, 1-indexed as
    ``linear_attn_config`` lists them; a dense first layer; one shared expert; sigmoid routing, one group."""

    heads: int = 32  # num_attention_heads (MLA; num_key_value_heads 32 too)
    kv_lora: int = 512  # kv_lora_rank (q_lora_rank null: a plain q_proj)
    nope_dim: int = 128  # qk_nope_head_dim
    rope_dim: int = 64  # qk_rope_head_dim: in the shapes, unrotated (mla_use_nope)
    v_dim: int = 128  # v_head_dim
    kda_heads: int = 32  # linear_attn_config.num_heads
    kda_head_dim: int = 128  # linear_attn_config.head_dim (keys and values alike)
    conv_kernel: int = 4  # linear_attn_config.short_conv_kernel_size
    full_attn_layers: tuple[int, ...] = (4, 8, 12, 16, 20, 24, 27)  # linear_attn_config.full_attn_layers: 7 of 27
    dense_layers: int = 1  # first_k_dense_replace
    dense_inter: int = 9216  # intermediate_size (the dense layer's MLP)
    shared_experts: int = 1  # num_shared_experts, each of the routed experts' width
    scale: float = 2.446  # routed_scaling_factor
    vocab: int = 163840


@dataclass(frozen=True)
class Gemma4Shape:
    """Gemma-4 26B-A4B's non-expert shapes (``models/gemma4.py``; ``bench/synthetic_gemma4.py`` writes such a
    checkpoint), from google/gemma-4-26B-A4B-it's ``text_config`` as public copies of its config.json give it
    (transformers 5.23's ``Gemma4TextConfig`` names the release; its defaults are another size's): 5 sliding-window
    layers to 1 full, the last full; full layers of their own head dim and KV heads, keys equal values there
    (``attention_k_eq_v``); a dense GELU MLP beside the experts in every layer; no KV-shared layers and no per-layer
    input embeddings (``num_kv_shared_layers`` 0, ``hidden_size_per_layer_input`` 0); tied embeddings (the synthetic
    checkpoint unties them: ``synthetic_gemma4.py`` says why)."""

    heads: int = 16  # num_attention_heads
    kv_heads: int = 8  # num_key_value_heads (sliding layers)
    head_dim: int = 256  # head_dim (sliding layers)
    global_kv_heads: int = 2  # num_global_key_value_heads (full layers)
    global_head_dim: int = 512  # global_head_dim (full layers)
    k_eq_v: bool = True  # attention_k_eq_v: full layers have no v_proj
    window: int = 1024  # sliding_window
    pattern: int = 6  # every 6th layer full ("sliding_attention" x 5, "full_attention")
    dense_inter: int = 2112  # intermediate_size (the dense MLP beside the experts)
    softcap: float = 30.0  # final_logit_softcapping
    vocab: int = 262144


@dataclass(frozen=True)
class MoEShape:
    name: str
    hidden: int  # D
    inter: int  # I, one routed expert's intermediate size
    experts: int  # E per layer
    top_k: int
    layers: int  # MoE layers of the real model
    note: str = ""
    weights: str = "bf16"  # the routed experts' format (``quant.format_by_name``)
    hybrid: HybridShape | None = None  # synthetic checkpoints: a Qwen3.5-MoE with these mixers (None: Qwen3-MoE)
    frontier: FrontierShape | None = None  # synthetic checkpoints: that family's own layers instead
    gpt_oss: GptOssShape | None = None  # synthetic checkpoints: a gpt-oss (its experts in ``weights``)
    dsv4: DeepseekV4Shape | None = None  # synthetic checkpoints: a DeepSeek-V4 in the released layout
    kimi: KimiLinearShape | None = None  # synthetic checkpoints: a Kimi-Linear (KDA + NoPE MLA)
    gemma4: Gemma4Shape | None = None  # synthetic checkpoints: a Gemma-4 (sliding / full layers, MLP beside MoE)
    e2e_layers: int = 12  # ``ft bench e2e``'s synthetic layers when --layers is not given (dense layers count)

    @property
    def fmt(self) -> WeightFormat:
        return format_by_name(self.weights)

    def expert_bytes(self, itemsize: int = 2) -> int:
        """One expert as banked: packed bytes and scales (``itemsize``: the unquantised dtype's)."""
        f, D, I = self.fmt, self.hidden, self.inter
        return f.row_bytes(2 * I, D, itemsize) + f.row_bytes(D, I, itemsize)

    def pool_bytes(self, layers: int, itemsize: int = 2) -> int:
        return layers * self.experts * self.expert_bytes(itemsize)


PRESETS: dict[str, MoEShape] = {
    s.name: s
    for s in (
        MoEShape("qwen3-30b-a3b", 2048, 768, 128, 8, 48),
        MoEShape("qwen3-30b-a3b-fp8", 2048, 768, 128, 8, 48, "Qwen3-30B-A3B-FP8's experts", "fp8_block"),
        MoEShape("qwen3.6-35b-a3b", 2048, 512, 256, 8, 40, "e2e: DeltaNet 3 : 1 gated attention, shared expert",
                 hybrid=HybridShape()),
        MoEShape("qwen3.6-35b-a3b-fp8", 2048, 512, 256, 8, 40, "the FP8 release's experts; e2e: hybrid as above",
                 "fp8_block", HybridShape()),
        MoEShape("qwen3.6-35b-a3b-nvfp4", 2048, 512, 256, 8, 40, "the NVFP4 release's experts; e2e: hybrid as above",
                 "nvfp4", HybridShape()),
        # MoE only: 43 all-MoE layers, 256 routed experts, top-6, MXFP4 experts as shipped (D 4096, I 2048: the
        # published config.json's hidden_size and moe_intermediate_size)
        MoEShape("deepseek-v4-flash-experts", 4096, 2048, 256, 6, 43, "DeepSeek-V4-Flash's routed experts, MoE only",
                 "mxfp4"),
        # DeepSeek-V4-Flash itself (models/deepseek_v4.py): D 4096, I 2048, 43 layers x 256 experts, top-6, MXFP4
        # experts and FP8 attention as released (bench/synthetic_dsv4.py); attention and streams: DeepseekV4Shape.
        # 9 layers = the real model's first 9 (2 sliding, 4 CSA, 3 HCA; 3 hash-routed): 34 GB with its 129280-token
        # vocabulary (3.6 GB a layer, 3.4 of it the routed experts)
        MoEShape("deepseek-v4-flash", 4096, 2048, 256, 6, 43, "DeepSeek-V4-Flash: CSA/HCA + 128-token window, mHC",
                 "mxfp4", dsv4=DeepseekV4Shape(), e2e_layers=9),
        # gpt-oss-20b: 24 layers, all MoE, 32 experts of 2880, top-4; MXFP4 experts as shipped (14 GB with its
        # 201088-token vocabulary: every layer fits); the bf16 one is the same model with bf16 experts
        MoEShape("gpt-oss-20b", 2880, 2880, 32, 4, 24, "gpt-oss-20b as shipped: MXFP4 experts, sinks, windows",
                 "mxfp4", gpt_oss=GptOssShape(), e2e_layers=24),
        MoEShape("gpt-oss-20b-bf16", 2880, 2880, 32, 4, 24, "bf16 experts (the checkpoint ships MXFP4)",
                 gpt_oss=GptOssShape()),
        # Kimi-Linear-48B-A3B (moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json, the defaults of transformers'
        # KimiLinearConfig too): 27 layers, the first dense; 256 experts of 1024 + 1 shared, top-8; bf16. e2e: its
        # KDA and NoPE MLA layers (KimiLinearShape); 10 layers = the real model's first 10 (MLA at 4 and 8, 1-indexed;
        # 1 dense + 9 MoE): 35 GB with its 163840-token vocabulary
        MoEShape("kimi-linear", 2304, 1024, 256, 8, 26, "Kimi-Linear-48B-A3B: KDA 3 : 1 NoPE MLA, 1 dense layer first",
                 kimi=KimiLinearShape(), e2e_layers=10),
        # GLM-4.5/4.6/4.7: 92 layers, the first 3 dense (intermediate 12288); 160 experts + 1 shared; FP8 as shipped
        # (every projection). 12 layers = 3 dense + 9 MoE: 37 GB with the bench's 32000-token vocabulary.
        MoEShape("glm-4.7", 5120, 1536, 160, 8, 89, "GLM-4.7-FP8: 3 dense layers first, 96 heads, 8 KV heads",
                 "fp8_block", frontier=GLM_4_7, e2e_layers=12),
        # MiniMax-M2/M2.1/M2.5: 62 layers, 256 experts of 1536; FP8 as shipped. 10 layers: 37 GB.
        MoEShape("minimax-m2", 3072, 1536, 256, 8, 62, "MiniMax-M2 (FP8): 48 heads, 8 KV heads, rotary_dim 64",
                 "fp8_block", frontier=MINIMAX_M2, e2e_layers=10),
        # DeepSeek-V3/V3.1/V3.2: 61 layers, the first 3 dense (18432); 256 experts of 2048 + 1 shared; FP8 as
        # shipped. 6 layers = 3 dense + 3 MoE: 36 GB.
        MoEShape("deepseek-v3", 7168, 2048, 256, 8, 58, "DeepSeek-V3 (FP8): MLA, 128 heads, 3 dense layers first",
                 "fp8_block", frontier=DEEPSEEK_V3, e2e_layers=6),
        MoEShape("deepseek-v3.2", 7168, 2048, 256, 8, 58, "DeepSeek-V3.2 (FP8): V3 with sparse attention (top 2048)",
                 "fp8_block", frontier=DEEPSEEK_V32, e2e_layers=6),
        # GLM-5: 78 layers, the first 3 dense (12288); 256 experts of 2048 + 1 shared; FP8. 6 layers: 31 GB.
        MoEShape("glm-5", 6144, 2048, 256, 8, 75, "GLM-5 (FP8): MLA + sparse attention (top 2048), 64 heads",
                 "fp8_block", frontier=GLM_5, e2e_layers=6),
        # Gemma-4 26B-A4B: 30 layers, each a dense MLP beside 128 experts of 704, top-8 (D 2816; transformers 5.23's
        # Gemma4TextConfig names the release, public configs give the sizes). e2e: its own layers (Gemma4Shape);
        # 18 layers = 3 x (5 sliding + 1 full): 32 GB with its 262144-token vocabulary (the head untied)
        MoEShape("gemma-4", 2816, 704, 128, 8, 30, "Gemma-4 26B-A4B: 5 sliding : 1 full attention, MLP beside MoE",
                 gemma4=Gemma4Shape(), e2e_layers=18),
    )
}


def get_preset(name: str) -> MoEShape:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]
