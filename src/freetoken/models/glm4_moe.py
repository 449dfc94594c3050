"""GLM-4.5, 4.6 and 4.7 (``Glm4MoeForCausalLM``): the first ``first_k_dense_replace`` layers dense, then routed
experts plus ``n_shared_experts`` shared ones, routed DeepSeek-V3 style (sigmoid, correction bias, group limits,
scaling); q/k/v biases (``attention_bias``, none on o_proj), per-head q/k norms when ``use_qk_norm``, half the head
rotary unless config.json says otherwise. The multi-token-prediction layer (``model.layers.{N}.*``,
``num_nextn_predict_layers``) is not used."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("Glm4MoeForCausalLM",),
    naming=Naming(shared_expert="shared_experts."),
    qk_norm="head",
    qk_norm_key="use_qk_norm",
    qkv_bias_key="attention_bias",
    partial_rotary=0.5,
    mtp_keys=("num_nextn_predict_layers",),
    routing="sigmoid",
)
