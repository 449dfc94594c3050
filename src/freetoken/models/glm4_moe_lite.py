"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``): DeepSeek-V3's multi-head latent attention and routing on GLM's layer
plan (``mlp_layer_types``: the first layer dense), shared experts. The multi-token-prediction layer stored after the
decoder's is not used."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("Glm4MoeLiteForCausalLM",),
    naming=Naming(shared_expert="shared_experts."),
    attention="mla",
    routing="sigmoid",
    mtp_keys=("num_nextn_predict_layers", "num_mtp_layers"),
)
