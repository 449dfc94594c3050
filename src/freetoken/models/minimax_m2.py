"""MiniMax-M2 (``MiniMaxM2ForCausalLM``): every layer MoE (``block_sparse_moe`` with w1/w3/w2 experts of
``intermediate_size``), routed by sigmoid scores with a correction bias (``block_sparse_moe.e_score_correction_bias``),
no groups and no scaling, top-k weights always renormalised; q/k RMSNorm over the whole projection (all heads at
once, [H*hd] and [Hkv*hd]); partial rotary (``rotary_dim`` of ``head_dim``)."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("MiniMaxM2ForCausalLM",),
    naming=Naming(
        moe="block_sparse_moe.",
        experts=("experts.{e}.w1.weight", "experts.{e}.w3.weight", "experts.{e}.w2.weight"),
        router_bias="e_score_correction_bias",
    ),
    qk_norm="full",
    always_norm_topk=True,
    routing="sigmoid",
    routing_groups=False,
)
