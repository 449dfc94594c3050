"""Mixtral: ``block_sparse_moe`` with w1 (gate) / w3 (up) / w2 (down); top-k weights always renormalised."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("MixtralForCausalLM",),
    naming=Naming(
        moe="block_sparse_moe.",
        experts=("experts.{e}.w1.weight", "experts.{e}.w3.weight", "experts.{e}.w2.weight"),
    ),
    always_norm_topk=True,
)
